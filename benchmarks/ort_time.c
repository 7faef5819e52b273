/* Times onnxruntime's C API from C (no Python in the loop), the peer of kiln/bench/kiln_time.c:

     ort_time LIBONNXRUNTIME MODEL CALLS THREADS OUT_SPECS IN_SPEC...

   SPEC = name|type|d0,d1,...[|file] (type: the ONNX element type number; an input's raw bytes from
   file, zeros when absent; OUT_SPECS: the output specs joined by ';'). The library is opened with
   dlopen (onnxruntime's Python wheel ships libonnxruntime.so but no header), the session built with
   THREADS intra-op threads (0: onnxruntime's default), inputs and outputs bound once as OrtValues
   over caller-owned buffers (what kiln_infer's DLTensors are), then CALLS calls of Run after 10
   unmeasured ones. Prints the median and p90 microseconds per call and the threads the process
   holds after the session is built (/proc/self/task: 1 with THREADS 1, a check that the thread
   count reached the session). Built by benchmarks/c_library.py.

   The API is reached through the function table OrtGetApiBase()->GetApi(version) returns: its
   entries are appended release by release and never move, so the positions below (those of
   onnxruntime_c_api.h since 1.x) hold for every later library. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void *status_t; /* OrtStatus*: NULL is success */

/* positions in OrtApi */
enum {
  API_GET_ERROR_MESSAGE = 2,
  API_CREATE_ENV = 3,
  API_CREATE_SESSION = 7,
  API_RUN = 9,
  API_CREATE_SESSION_OPTIONS = 10,
  API_SET_INTRA_OP_THREADS = 24,
  API_SET_INTER_OP_THREADS = 25,
  API_CREATE_TENSOR_WITH_DATA = 49,
  API_CREATE_CPU_MEMORY_INFO = 69,
};

typedef struct {
  const void *(*get_api)(uint32_t version);
  const char *(*version_string)(void);
} api_base_t;

static void *const *api;

static void check(status_t status, const char *what) {
  if (!status) return;
  const char *(*message)(const void *) = (const char *(*)(const void *))api[API_GET_ERROR_MESSAGE];
  fprintf(stderr, "onnxruntime %s: %s\n", what, message(status));
  exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int task_count(void) {
  DIR *dir = opendir("/proc/self/task");
  int n = 0;
  if (!dir) return -1;
  for (struct dirent *e; (e = readdir(dir));)
    if (e->d_name[0] != '.') ++n;
  closedir(dir);
  return n;
}

static size_t element_bytes(int type) {
  switch (type) {
    case 1: case 6: case 12: return 4; /* float, int32, uint32 */
    case 7: case 11: case 13: return 8; /* int64, double, uint64 */
    case 2: case 3: case 9: return 1; /* uint8, int8, bool */
    case 4: case 5: case 10: case 16: return 2; /* uint16, int16, float16, bfloat16 */
    default: return 0;
  }
}

typedef struct {
  char name[256];
  int type;
  int64_t shape[8];
  size_t rank, bytes;
  void *data;
  void *value; /* OrtValue* */
} tensor_t;

/* name|type|d0,d1,...[|file] */
static int parse(const char *spec, tensor_t *t) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", spec);
  char *fields[4] = {0};
  int n = 0;
  for (char *s = buf, *part; n < 4 && (part = strsep(&s, "|"));) fields[n++] = part;
  if (n < 3) return 0;
  snprintf(t->name, sizeof t->name, "%s", fields[0]);
  t->type = atoi(fields[1]);
  size_t count = 1;
  t->rank = 0;
  for (char *s = fields[2], *d; *fields[2] && (d = strsep(&s, ","));) {
    if (t->rank == 8) return 0;
    t->shape[t->rank] = atoll(d);
    count *= (size_t)t->shape[t->rank++];
  }
  t->bytes = count * element_bytes(t->type);
  if (!element_bytes(t->type)) return 0;
  t->data = calloc(t->bytes ? t->bytes : 1, 1);
  if (!t->data) return 0;
  if (n == 4 && *fields[3]) {
    FILE *f = fopen(fields[3], "rb");
    if (!f || fread(t->data, 1, t->bytes, f) != t->bytes) return 0;
    fclose(f);
  }
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 7) return fprintf(stderr, "usage: ort_time LIB MODEL CALLS THREADS OUT_SPECS IN_SPEC...\n"), 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return fprintf(stderr, "%s\n", dlerror()), 1;
  const api_base_t *(*get_base)(void) = (const api_base_t *(*)(void))dlsym(lib, "OrtGetApiBase");
  if (!get_base) return fprintf(stderr, "no OrtGetApiBase in %s\n", argv[1]), 1;
  const api_base_t *base = get_base();
  api = (void *const *)base->get_api(1); /* every release serves version 1's entries */
  if (!api) return fprintf(stderr, "no API version 1 in %s\n", argv[1]), 1;
  const int calls = atoi(argv[3]), threads = atoi(argv[4]);

  void *env = NULL, *options = NULL, *session = NULL, *memory = NULL;
  check(((status_t(*)(int, const char *, void **))api[API_CREATE_ENV])(3, "ort_time", &env), "CreateEnv");
  check(((status_t(*)(void **))api[API_CREATE_SESSION_OPTIONS])(&options), "CreateSessionOptions");
  if (threads > 0) {
    check(((status_t(*)(void *, int))api[API_SET_INTRA_OP_THREADS])(options, threads), "SetIntraOpNumThreads");
    check(((status_t(*)(void *, int))api[API_SET_INTER_OP_THREADS])(options, 1), "SetInterOpNumThreads");
  }
  check(((status_t(*)(void *, const char *, void *, void **))api[API_CREATE_SESSION])(env, argv[2], options, &session), "CreateSession");
  const int tasks = task_count();
  check(((status_t(*)(int, int, void **))api[API_CREATE_CPU_MEMORY_INFO])(0, 0, &memory), "CreateCpuMemoryInfo");

  tensor_t outs[16], ins[16];
  int n_out = 0, n_in = 0;
  char out_specs[8192];
  snprintf(out_specs, sizeof out_specs, "%s", argv[5]);
  for (char *s = out_specs, *spec; (spec = strsep(&s, ";"));) {
    if (n_out == 16 || !parse(spec, &outs[n_out++])) return fprintf(stderr, "output spec %s\n", spec), 2;
  }
  for (int i = 6; i < argc; ++i)
    if (n_in == 16 || !parse(argv[i], &ins[n_in++])) return fprintf(stderr, "input spec %s\n", argv[i]), 2;
  status_t (*tensor)(void *, void *, size_t, const int64_t *, size_t, int, void **) =
      (status_t(*)(void *, void *, size_t, const int64_t *, size_t, int, void **))api[API_CREATE_TENSOR_WITH_DATA];
  const char *in_names[16], *out_names[16];
  void *in_values[16], *out_values[16];
  for (int i = 0; i < n_in; ++i) {
    check(tensor(memory, ins[i].data, ins[i].bytes, ins[i].shape, ins[i].rank, ins[i].type, &ins[i].value), "CreateTensorWithDataAsOrtValue");
    in_names[i] = ins[i].name, in_values[i] = ins[i].value;
  }
  for (int i = 0; i < n_out; ++i) {
    check(tensor(memory, outs[i].data, outs[i].bytes, outs[i].shape, outs[i].rank, outs[i].type, &outs[i].value), "CreateTensorWithDataAsOrtValue");
    out_names[i] = outs[i].name, out_values[i] = outs[i].value;
  }
  status_t (*run)(void *, const void *, const char *const *, void *const *, size_t, const char *const *, size_t, void **) =
      (status_t(*)(void *, const void *, const char *const *, void *const *, size_t, const char *const *, size_t, void **))api[API_RUN];
  double *times = malloc(sizeof(double) * (size_t)(calls > 0 ? calls : 1));
  if (!times || calls < 1) return 2;
  for (int i = 0; i < calls + 10; ++i) {
    const double start = now();
    check(run(session, NULL, in_names, in_values, (size_t)n_in, out_names, (size_t)n_out, out_values), "Run");
    if (i >= 10) times[i - 10] = now() - start;
  }
  qsort(times, (size_t)calls, sizeof(double), compare);
  printf("%.3f %.3f %d %s\n", 1e6 * times[calls / 2], 1e6 * times[(calls * 9) / 10], tasks, base->version_string());
  return 0; /* (the process ends: onnxruntime's objects go with it) */
}
