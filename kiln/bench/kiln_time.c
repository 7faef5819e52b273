/* Times kiln_infer from C (no Python in the loop): `kiln_time WEIGHTS CALLS THREADS [IN_0 .. IN_n-1]`
   (inputs as raw bytes; zeros when absent) prints the median and p90 microseconds per call over
   CALLS calls, after 10 unmeasured ones, on THREADS threads (0: every CPU); with $KILN_TIME_OUT
   set, the outputs of the last call are written to $KILN_TIME_OUT<i>.bin; with $KILN_TIME_SIZES
   set to "B" or "B,L", a dim the library describes as -1 is B on axis 0 and L past it (a batch
   range, a run-time length). Built by
   the kiln-c bench row (kiln.bench.backends.kiln_c_backend) and benchmarks/c_library.py against an
   emitted folder. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int64_t sizes[2] = {1, 1};   /* $KILN_TIME_SIZES: what a -1 dim is (axis 0, past it) */
static int64_t shapes[32][16], used = 0; /* the tensors' dims, -1 resolved */

static const int64_t *resolved(const kiln_tensor_info *info) {
  if (used >= 32 || info->ndim > 16) return info->shape;
  for (int d = 0; d < info->ndim; ++d) shapes[used][d] = info->shape[d] < 0 ? sizes[d > 0] : info->shape[d];
  return shapes[used++];
}

static void *tensor_for(const kiln_tensor_info *info, DLTensor *t, const char *path) {
  const int64_t *shape = resolved(info);
  int64_t n = 1;
  for (int d = 0; d < info->ndim; ++d) n *= shape[d];
  const size_t bytes = (size_t)n * (info->dtype.bits / 8);
  void *data = calloc(bytes ? bytes : 1, 1);
  if (data && path) {
    FILE *f = fopen(path, "rb");
    if (!f || fread(data, 1, bytes, f) != bytes) return NULL;
    fclose(f);
  }
  memset(t, 0, sizeof *t);
  t->data = data;
  t->device.device_type = kDLCPU;
  t->ndim = info->ndim;
  t->dtype = info->dtype;
  t->shape = (int64_t *)shape;
  return data;
}

int main(int argc, char **argv) {
  if (argc < 4) return fprintf(stderr, "usage: kiln_time WEIGHTS CALLS THREADS [INPUTS...]\n"), 2;
  const int calls = atoi(argv[2]);
  const char *given = getenv("KILN_TIME_SIZES");
  if (given) {
    char *rest = NULL;
    sizes[0] = sizes[1] = strtoll(given, &rest, 10);
    if (rest && *rest == ',') sizes[1] = strtoll(rest + 1, NULL, 10);
  }
  kiln_set_thread_count(atoi(argv[3]));
  kiln_model *model = NULL;
  kiln_context *context = NULL;
  if (kiln_model_load(argv[1], &model) != KILN_OK || kiln_context_create(model, &context) != KILN_OK)
    return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  const int n_in = kiln_model_input_count(model), n_out = kiln_model_output_count(model);
  DLTensor inputs[16], outputs[16];
  if (n_in > 16 || n_out > 16 || calls < 1) return 2;
  for (int i = 0; i < n_in; ++i) {
    kiln_tensor_info info;
    kiln_model_input(model, i, &info);
    if (!tensor_for(&info, &inputs[i], argc > 4 + i ? argv[4 + i] : NULL)) return fprintf(stderr, "input %d\n", i), 1;
  }
  for (int i = 0; i < n_out; ++i) {
    kiln_tensor_info info;
    kiln_model_output(model, i, &info);
    if (!tensor_for(&info, &outputs[i], NULL)) return 1;
  }
  double *times = malloc(sizeof(double) * (size_t)calls);
  for (int i = 0; i < calls + 10; ++i) {
    const double start = now();
    if (kiln_infer(context, inputs, n_in, outputs, n_out) != KILN_OK) return fprintf(stderr, "%s\n", kiln_last_error()), 1;
    if (i >= 10) times[i - 10] = now() - start;
  }
  const char *dump = getenv("KILN_TIME_OUT");
  for (int i = 0; dump && i < n_out; ++i) {
    char path[4096];
    snprintf(path, sizeof path, "%s%d.bin", dump, i);
    int64_t n = 1;
    for (int d = 0; d < outputs[i].ndim; ++d) n *= outputs[i].shape[d];
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(outputs[i].data, (size_t)(outputs[i].dtype.bits / 8), (size_t)n, f) != (size_t)n) return 3;
    fclose(f);
  }
  qsort(times, (size_t)calls, sizeof(double), compare);
  printf("%.3f %.3f\n", 1e6 * times[calls / 2], 1e6 * times[(calls * 9) / 10]);
  return 0;
}
