/* kiln's C API (kiln.h) over one compiled plan: the library `kiln compile --emit c` builds from
   this file and the plan's tables (kiln_model_tables.h, written by kiln.driver.emit_c), linked
   against the plan's own library (libkiln_plan.so: its kiln_run entry, the engine, the pool).

   The plan's buffer table is what the Python runtime builds (kiln.runtime.executable): slot 0
   the status word, the weights' addresses (from the weights file, mapped read-only), the arena's
   buffers at their planned offsets, the inputs' and the caller-written outputs' addresses per
   call; outputs the plan leaves in the arena (or that are weights or inputs) are copied out.

   A run-time length (KILN_LENGTH: a padded plan whose kernels take the length at run time,
   kiln.driver.extents): one dim of some inputs and outputs is any length in [KILN_LENGTH_MIN,
   KILN_LENGTH_MAX]; a run at length L computes at E = max(L, KILN_LENGTH_FLOOR) with the valid
   length L as the plan's last input, its arena laid out for E (every buffer's bytes a polynomial of
   E, kiln.lower.memory.GrowingLayout); below the floor the tensors are padded with zeros into the
   context's buffers and the outputs cut back to L. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"

typedef struct {
  const char *name;
  uint8_t code, bits;
  int32_t ndim;
  const int64_t *shape;
  int64_t slot;
  int32_t source;   /* outputs: 0 written in place (the caller's memory), 1 the arena, 2 a weight, 3 an input */
  int64_t where;    /* the arena offset, the weight's index or the input's position */
  int64_t elements; /* of one sample when batched */
  int32_t batched;  /* axis 0 is the sample-parallel dim: any size in [KILN_BATCH_MIN, KILN_BATCH_MAX], run a sample at a time */
  const int64_t *shown, *minimum, *maximum; /* what kiln_model_input/output describe */
  int32_t axis;     /* KILN_LENGTH: the dim that is the run-time length (-1: none); shape and elements at the capacity */
} kiln_io;

#include "kiln_model_tables.h"

typedef int (*kiln_host_fn)(int gap);
extern int kiln_run(void **buffers, kiln_host_fn host);
extern void kiln_set_threads(int threads);
extern void kiln_pool_start(void) __attribute__((weak));
extern int kiln_set_int8(int mode) __attribute__((weak));
extern int kiln_set_bf16(int mode) __attribute__((weak));

#define KILN_MAGIC "KILNWTS1"
#define KILN_ALIGN 64
#define KILN_WORKSPACE_BYTES kiln_workspace_bytes
static const size_t kiln_workspace_bytes = ((size_t)KILN_ARENA_BYTES + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN;

struct kiln_model {
  void *map; /* the weights file's mapping (NULL: the caller's memory, kiln_model_load_memory) */
  size_t map_bytes;
  void *table[KILN_SLOTS > 0 ? KILN_SLOTS : 1]; /* the weights' addresses; the rest filled per context and call */
  const char *weights[KILN_CONSTANTS > 0 ? KILN_CONSTANTS : 1];
};

struct kiln_context {
  const kiln_model *model;
  char *arena;
  int owns_arena; /* 0: the caller's workspace (kiln_context_create_in) */
  size_t arena_bytes; /* the workspace's bytes (a caller's may hold only runs up to some length) */
  int32_t status;
  void *table[KILN_SLOTS > 0 ? KILN_SLOTS : 1];
  int64_t valid;                                           /* KILN_LENGTH: the run's length */
  int64_t offsets[KILN_GROWING > 0 ? KILN_GROWING : 1];   /* KILN_LENGTH: the arena laid out for the run */
  char *pad[KILN_INPUTS + KILN_OUTPUTS > 0 ? KILN_INPUTS + KILN_OUTPUTS : 1]; /* tensors at the floor length */
  void *constants[KILN_LENGTH_CONSTANTS > 0 ? KILN_LENGTH_CONSTANTS : 1]; /* written per run at its length */
};

static _Thread_local char kiln_message[512];

static kiln_status kiln_fail(kiln_status status, const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(kiln_message, sizeof kiln_message, format, args);
  va_end(args);
  return status;
}

static kiln_status kiln_ok(void) {
  kiln_message[0] = 0;
  return KILN_OK;
}

const char *kiln_last_error(void) { return kiln_message; }

int kiln_abi_version(void) { return KILN_ABI_VERSION; }

void kiln_set_thread_count(int threads) { kiln_set_threads(threads < 0 ? 0 : threads); }

/* CRC-32 (IEEE, zlib's): the weights file's checksum; its table made once per process */
static uint32_t kiln_crc_table[256];
static pthread_once_t kiln_crc_once = PTHREAD_ONCE_INIT;

static void kiln_crc_init(void) {
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    kiln_crc_table[i] = c;
  }
}

static uint64_t kiln_crc32(const unsigned char *data, size_t n) {
  pthread_once(&kiln_crc_once, kiln_crc_init);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) crc = kiln_crc_table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

static uint64_t kiln_read64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/* the best micro-kernel paths this CPU has for the plan's reduced-precision products */
static void kiln_choose_paths(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (kiln_set_int8) {
    int mode = 0;
    if (__builtin_cpu_supports("avx2")) mode = 1;
    if (KILN_INT8_VNNI && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512f")) mode = 3;
    kiln_set_int8(mode);
  }
  if (kiln_set_bf16) kiln_set_bf16(__builtin_cpu_supports("avx512bf16") ? 1 : 0);
#else
  if (kiln_set_int8) kiln_set_int8(0);
  if (kiln_set_bf16) kiln_set_bf16(0);
#endif
}

/* the header: magic, ABI, constant count, data bytes, checksum, model id, each constant's bytes */
static kiln_status kiln_check_header(const unsigned char *p, size_t size, size_t *data_at) {
  const size_t fixed = 8 + 8 + 8 + 8 + 64;
  if (size < fixed) return kiln_fail(KILN_ERROR_FILE, "the weights file is %zu bytes: truncated (no header)", size);
  if (memcmp(p, KILN_MAGIC, 8) != 0) return kiln_fail(KILN_ERROR_FILE, "not a kiln weights file (its first bytes are not " KILN_MAGIC ")");
  const uint64_t abi = kiln_read64(p + 8) & 0xffffffffu, count = kiln_read64(p + 8) >> 32;
  if (abi != KILN_ABI_VERSION) return kiln_fail(KILN_ERROR_FILE, "the weights file is of ABI version %llu, this library of %d", (unsigned long long)abi, KILN_ABI_VERSION);
  if (memcmp(p + 32, KILN_MODEL_ID, 64) != 0) return kiln_fail(KILN_ERROR_FILE, "the weights file is another model's (its model id differs from this library's)");
  if (count != KILN_CONSTANTS) return kiln_fail(KILN_ERROR_FILE, "the weights file holds %llu weights, this model %d", (unsigned long long)count, KILN_CONSTANTS);
  const size_t table = fixed + 8 * (size_t)count;
  *data_at = (table + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN;
  const uint64_t data_bytes = kiln_read64(p + 16);
  if (size < table || data_bytes != (uint64_t)(size - *data_at) || size < *data_at)
    return kiln_fail(KILN_ERROR_FILE, "the weights file is %zu bytes, its header says %llu of data after %zu: truncated or damaged", size, (unsigned long long)data_bytes, *data_at);
  return KILN_OK;
}

/* the model over the weights' bytes at p (size bytes): checked, then their addresses in the table;
   map: the file's mapping, unmapped on failure and by kiln_model_free (NULL: the caller's memory) */
static kiln_status kiln_model_over(const unsigned char *p, size_t size, void *map, kiln_model **model) {
  size_t data_at = 0;
  kiln_status status = kiln_check_header(p, size, &data_at);
  if (status == KILN_OK && kiln_crc32(p + data_at, size - data_at) != kiln_read64(p + 24))
    status = kiln_fail(KILN_ERROR_FILE, "the weights file's checksum does not match its data: damaged");
  kiln_model *m = status == KILN_OK ? (kiln_model *)calloc(1, sizeof *m) : NULL;
  if (status == KILN_OK && !m) status = kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  if (status != KILN_OK) {
    if (map) munmap(map, size);
    return status;
  }
  m->map = map, m->map_bytes = size;
  size_t at = data_at;
  for (int i = 0; i < KILN_CONSTANTS; ++i) {
    const uint64_t bytes = kiln_read64(p + 96 + 8 * (size_t)i);
    if (bytes != kiln_constant_bytes[i] || at + bytes > size) {
      if (map) munmap(map, size);
      free(m);
      return kiln_fail(KILN_ERROR_FILE, "weight %d is %llu bytes in the file, %llu in the model", i, (unsigned long long)bytes, (unsigned long long)kiln_constant_bytes[i]);
    }
    m->weights[i] = (const char *)p + at;
    m->table[kiln_constant_slots[i]] = (void *)(p + at);
    at = (at + bytes + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN;
  }
  static int started = 0;
  if (!__atomic_exchange_n(&started, 1, __ATOMIC_ACQ_REL)) {
    kiln_choose_paths();
    if (kiln_pool_start) kiln_pool_start();
  }
  *model = m;
  return kiln_ok();
}

kiln_status kiln_model_load(const char *weights_path, kiln_model **model) {
  if (!model) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_load: model is NULL");
  *model = NULL;
  if (!weights_path) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_load: weights_path is NULL");
  if (!KILN_CPU_OK()) return kiln_fail(KILN_ERROR_CPU, "this library was built for a CPU with %s; this CPU lacks some", KILN_CPU_NEEDS);
  int fd = open(weights_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return kiln_fail(KILN_ERROR_FILE, "cannot open %s: %s", weights_path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_fail(KILN_ERROR_FILE, "%s is not a regular file", weights_path);
  }
  const size_t size = (size_t)st.st_size;
  void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  close(fd);
  if (map == MAP_FAILED) return kiln_fail(KILN_ERROR_FILE, "cannot map %s (%zu bytes)", weights_path, size);
  return kiln_model_over((const unsigned char *)map, size, map, model);
}

kiln_status kiln_model_load_memory(const void *data, size_t bytes, kiln_model **model) {
  if (!model) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_load_memory: model is NULL");
  *model = NULL;
  if (!data) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_load_memory: data is NULL");
  if ((uintptr_t)data % KILN_ALIGN)
    return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_load_memory: data at %p is not 64-byte aligned (the weights are read in place: allocate with posix_memalign)", data);
  if (!KILN_CPU_OK()) return kiln_fail(KILN_ERROR_CPU, "this library was built for a CPU with %s; this CPU lacks some", KILN_CPU_NEEDS);
  return kiln_model_over((const unsigned char *)data, bytes, NULL, model);
}

void kiln_model_free(kiln_model *model) {
  if (!model) return;
  if (model->map) munmap(model->map, model->map_bytes);
  free(model);
}

int kiln_model_input_count(const kiln_model *model) { return model ? KILN_INPUTS : 0; }
int kiln_model_output_count(const kiln_model *model) { return model ? KILN_OUTPUTS : 0; }

static kiln_status kiln_describe(const kiln_io *io, kiln_tensor_info *info) {
  info->name = io->name;
  info->dtype.code = io->code, info->dtype.bits = io->bits, info->dtype.lanes = 1;
  info->ndim = io->ndim;
  info->shape = io->shown, info->min_shape = io->minimum, info->max_shape = io->maximum;
  return kiln_ok();
}

kiln_status kiln_model_input(const kiln_model *model, int index, kiln_tensor_info *info) {
  if (!model || !info) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_input: model or info is NULL");
  if (index < 0 || index >= KILN_INPUTS) return kiln_fail(KILN_ERROR_ARGUMENT, "input %d: the model has %d", index, KILN_INPUTS);
  return kiln_describe(&kiln_inputs[index], info);
}

kiln_status kiln_model_output(const kiln_model *model, int index, kiln_tensor_info *info) {
  if (!model || !info) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_output: model or info is NULL");
  if (index < 0 || index >= KILN_OUTPUTS) return kiln_fail(KILN_ERROR_ARGUMENT, "output %d: the model has %d", index, KILN_OUTPUTS);
  return kiln_describe(&kiln_outputs[index], info);
}

size_t kiln_model_workspace_size(const kiln_model *model) { return model ? KILN_WORKSPACE_BYTES : 0; }

static int64_t kiln_layout(int64_t n, int64_t *offsets);

size_t kiln_model_workspace_size_at(const kiln_model *model, int64_t length) {
  if (!model) return 0;
  if (!KILN_LENGTH) return KILN_WORKSPACE_BYTES;
  const int64_t n = length < KILN_LENGTH_FLOOR ? KILN_LENGTH_FLOOR : length > KILN_LENGTH_MAX ? KILN_LENGTH_MAX : length;
  return (size_t)kiln_layout(n, NULL);
}

static const kiln_io *kiln_io_at(int i) { return i < KILN_INPUTS ? &kiln_inputs[i] : &kiln_outputs[i - KILN_INPUTS]; }

/* KILN_LENGTH: an io's elements at length n (its shape is the capacity's) */
static int64_t kiln_elements(const kiln_io *io, int64_t n) {
  return io->axis >= 0 ? io->elements / KILN_LENGTH_CAPACITY * n : io->elements;
}

/* KILN_LENGTH: the context's own buffers: those of the constants whose values follow the length,
   and those a run below the floor pads its tensors into (at the floor) */
static kiln_status kiln_context_buffers(kiln_context *c) {
  for (int k = 0; k < KILN_LENGTH_CONSTANTS; ++k) {
    const int64_t n = kiln_length_constant_at[k + 1] - kiln_length_constant_at[k];
    const size_t bytes = (size_t)(n > 0 ? n : 1) * (size_t)(kiln_length_constant_bits[k] / 8);
    if (posix_memalign(&c->constants[k], KILN_ALIGN, bytes) != 0) return KILN_ERROR_MEMORY;
  }
  if (!KILN_LENGTH || KILN_LENGTH_MIN >= KILN_LENGTH_FLOOR) return KILN_OK;
  for (int i = 0; i < KILN_INPUTS + KILN_OUTPUTS; ++i) {
    const kiln_io *io = kiln_io_at(i);
    if (io->axis < 0) continue;
    c->pad[i] = (char *)calloc((size_t)kiln_elements(io, KILN_LENGTH_FLOOR), io->bits / 8);
    if (!c->pad[i]) return KILN_ERROR_MEMORY;
  }
  return KILN_OK;
}

/* a tensor of length `from_n` along io's axis copied into one of length `to_n` (cut, or padded
   with zeros) */
static void kiln_resize(const kiln_io *io, char *to, int64_t to_n, const char *from, int64_t from_n) {
  int64_t outer = 1, inner = io->bits / 8;
  for (int d = 0; d < io->axis; ++d) outer *= io->shape[d];
  for (int d = io->axis + 1; d < io->ndim; ++d) inner *= io->shape[d];
  const int64_t kept = (to_n < from_n ? to_n : from_n) * inner;
  for (int64_t o = 0; o < outer; ++o) {
    memcpy(to + o * to_n * inner, from + o * from_n * inner, (size_t)kept);
    if (to_n > from_n) memset(to + o * to_n * inner + kept, 0, (size_t)((to_n - from_n) * inner));
  }
}

/* KILN_LENGTH: the arena's bytes at length n (GrowingLayout.at), and each buffer's offset into
   `offsets` (if given): each buffer where the last of those below it at the capacity ends, its
   bytes c0 + c1 n + c2 n^2 rounded to 64 */
static int64_t kiln_layout(int64_t n, int64_t *offsets) {
  int64_t ends[KILN_GROWING > 0 ? KILN_GROWING : 1], total = 0;
  for (int i = 0; i < KILN_GROWING; ++i) {
    int64_t offset = 0;
    for (int k = kiln_growing_below_at[i]; k < kiln_growing_below_at[i + 1]; ++k)
      if (ends[kiln_growing_below[k]] > offset) offset = ends[kiln_growing_below[k]];
    const int64_t *z = kiln_growing_sizes[i];
    int64_t bytes = z[0] + z[1] * n + z[2] * n * n;
    bytes = bytes < 1 ? 1 : bytes;
    if (offsets) offsets[i] = offset;
    ends[i] = offset + (bytes + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN;
    total = ends[i] > total ? ends[i] : total;
  }
  return total;
}

/* KILN_LENGTH: the arena laid out for length n in the context's slots, or 0 when its workspace is
   too small for it */
static int kiln_lay_out(kiln_context *c, int64_t n) {
  if ((size_t)kiln_layout(n, c->offsets) > c->arena_bytes) return 0;
  for (int i = 0; i < KILN_GROWING; ++i) c->table[kiln_growing_slots[i]] = c->arena + c->offsets[i];
  return 1;
}

/* KILN_LENGTH: the constants whose values follow the length, at length n, in their slots */
static void kiln_length_constants(kiln_context *c, int64_t n) {
  for (int k = 0; k < KILN_LENGTH_CONSTANTS; ++k) {
    for (int j = kiln_length_constant_at[k], e = 0; j < kiln_length_constant_at[k + 1]; ++j, ++e) {
      const int64_t *t = kiln_length_constant_terms[j];
      const int64_t v = t[0] + t[1] * n + t[2] * n * n;
      switch (kiln_length_constant_bits[k]) {
        case 8: ((int8_t *)c->constants[k])[e] = (int8_t)v; break;
        case 16: ((int16_t *)c->constants[k])[e] = (int16_t)v; break;
        case 32: ((int32_t *)c->constants[k])[e] = (int32_t)v; break;
        default: ((int64_t *)c->constants[k])[e] = v; break;
      }
    }
    c->table[kiln_length_constant_slots[k]] = c->constants[k];
  }
}

/* a context over the workspace `arena` (`bytes`, zeroed here: its pages are faulted in now, not in
   the first run); owned: kiln_context_free frees it */
static kiln_status kiln_context_over(const kiln_model *model, char *arena, size_t bytes, int owned, kiln_context **context) {
  kiln_context *c = (kiln_context *)calloc(1, sizeof *c);
  if (!c) {
    if (owned) free(arena);
    return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  }
  if (bytes) memset(arena, 0, bytes);
  if (kiln_context_buffers(c) != KILN_OK) {
    if (owned) free(arena);
    kiln_context_free(c);
    return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  }
  c->model = model;
  c->arena = arena, c->owns_arena = owned, c->arena_bytes = bytes;
  memcpy(c->table, model->table, sizeof c->table);
  for (int i = 0; i < KILN_ARENA_SLOTS; ++i) c->table[kiln_arena_slots[i][0]] = c->arena + kiln_arena_slots[i][1];
  c->table[0] = &c->status;
  *context = c;
  return kiln_ok();
}

kiln_status kiln_context_create(const kiln_model *model, kiln_context **context) {
  if (!context) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create: context is NULL");
  *context = NULL;
  if (!model) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create: model is NULL");
  char *arena = NULL;
  if (KILN_WORKSPACE_BYTES && posix_memalign((void **)&arena, KILN_ALIGN, KILN_WORKSPACE_BYTES) != 0)
    return kiln_fail(KILN_ERROR_MEMORY, "out of memory for a workspace of %zu bytes", (size_t)KILN_WORKSPACE_BYTES);
  return kiln_context_over(model, arena, KILN_WORKSPACE_BYTES, 1, context);
}

kiln_status kiln_context_create_in(const kiln_model *model, void *workspace, size_t bytes, kiln_context **context) {
  if (!context) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create_in: context is NULL");
  *context = NULL;
  if (!model) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create_in: model is NULL");
  if (KILN_WORKSPACE_BYTES && !workspace) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create_in: workspace is NULL");
  if ((uintptr_t)workspace % KILN_ALIGN) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create_in: the workspace at %p is not 64-byte aligned", workspace);
  const size_t least = kiln_model_workspace_size_at(model, KILN_LENGTH_MIN); /* (no length: the whole workspace) */
  if (bytes < least)
    return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create_in: a workspace of %zu bytes, the model needs %zu (kiln_model_workspace_size)", bytes, least);
  return kiln_context_over(model, (char *)workspace, bytes > KILN_WORKSPACE_BYTES ? KILN_WORKSPACE_BYTES : bytes, 0, context);
}

void kiln_context_free(kiln_context *context) {
  if (!context) return;
  if (context->owns_arena) free(context->arena);
  for (int i = 0; i < KILN_INPUTS + KILN_OUTPUTS; ++i) free(context->pad[i]);
  for (int k = 0; k < KILN_LENGTH_CONSTANTS; ++k) free(context->constants[k]);
  free(context);
}

/* a tensor against the model's description; *samples: its size of the sample-parallel dim (a
   batched tensor's, else left as it was) */
static kiln_status kiln_check_tensor(const char *role, int index, const kiln_io *io, const DLTensor *t, int64_t *samples, int64_t *length) {
  if (!t->data) return kiln_fail(KILN_ERROR_ARGUMENT, "%s %d (%s): data is NULL", role, index, io->name);
  if (t->device.device_type != kDLCPU) return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): not a CPU tensor (device type %d)", role, index, io->name, (int)t->device.device_type);
  if (t->dtype.code != io->code || t->dtype.bits != io->bits || t->dtype.lanes != 1)
    return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dtype (code %d, %d bits, %d lanes), the model's is (code %d, %d bits)", role, index, io->name, t->dtype.code, t->dtype.bits, t->dtype.lanes, io->code, io->bits);
  if (t->ndim != io->ndim || (t->ndim && !t->shape)) return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): %d dims, the model's has %d", role, index, io->name, (int)t->ndim, (int)io->ndim);
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    const int64_t size = t->shape[d];
    if (d == 0 && io->batched) {
      if (size < KILN_BATCH_MIN || size > KILN_BATCH_MAX)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim 0 is %lld, outside the model's range %d..%d", role, index, io->name, (long long)size, KILN_BATCH_MIN, KILN_BATCH_MAX);
      if (*samples >= 0 && size != *samples)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim 0 is %lld, another tensor's is %lld", role, index, io->name, (long long)size, (long long)*samples);
      *samples = size;
    } else if (KILN_LENGTH && d == io->axis) {
      if (size < KILN_LENGTH_MIN || size > KILN_LENGTH_MAX)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, outside the model's range %d..%d", role, index, io->name, d, (long long)size, KILN_LENGTH_MIN, KILN_LENGTH_MAX);
      if (*length >= 0 && size != *length)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, another tensor's length is %lld", role, index, io->name, d, (long long)size, (long long)*length);
      *length = size;
    } else if (size != io->shape[d]) {
      return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, the model's is %lld", role, index, io->name, d, (long long)size, (long long)io->shape[d]);
    }
    if (t->strides && size > 1 && t->strides[d] != expected) return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): not C-contiguous (dim %d's stride is %lld)", role, index, io->name, d, (long long)t->strides[d]);
    expected *= size;
  }
  return KILN_OK;
}

static kiln_status kiln_ran(kiln_context *context, int code) {
  if (code == 1) {
    const int32_t at = context->status;
    return kiln_fail(KILN_ERROR_RUN, "node %s: an index input is out of range for the dimension it indexes",
                     at >= 0 && at < KILN_LABELS ? kiln_kernel_labels[at] : "?");
  }
  return code != 0 ? kiln_fail(KILN_ERROR_RUN, "the plan's entry returned %d", code) : KILN_OK;
}

/* KILN_LENGTH: one run at length n (checked), at E = max(n, floor) */
static kiln_status kiln_infer_length(kiln_context *context, const DLTensor *inputs, DLTensor *outputs, int64_t n) {
  const int64_t e = n > KILN_LENGTH_FLOOR ? n : KILN_LENGTH_FLOOR;
  if (!kiln_lay_out(context, e))
    return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: a run at length %lld needs a workspace of %lld bytes, this context's holds %zu (kiln_model_workspace_size_at)",
                     (long long)n, (long long)kiln_layout(e, NULL), context->arena_bytes);
  kiln_length_constants(context, e);
  context->valid = n;
  context->table[KILN_VALID_SLOT] = &context->valid;
  const char *given[KILN_INPUTS > 0 ? KILN_INPUTS : 1];
  for (int i = 0; i < KILN_INPUTS; ++i) {
    const kiln_io *io = &kiln_inputs[i];
    given[i] = (const char *)inputs[i].data + inputs[i].byte_offset;
    if (io->axis >= 0 && e != n) { /* below the floor: padded with zeros */
      kiln_resize(io, context->pad[i], e, given[i], n);
      given[i] = context->pad[i];
    }
    context->table[io->slot] = (void *)given[i];
  }
  for (int i = 0; i < KILN_OUTPUTS; ++i) {
    const kiln_io *io = &kiln_outputs[i];
    if (io->source == 0) context->table[io->slot] = io->axis >= 0 && e != n ? context->pad[KILN_INPUTS + i] : (char *)outputs[i].data + outputs[i].byte_offset;
  }
  context->status = 0;
  const kiln_status ran = kiln_ran(context, kiln_run(context->table, NULL));
  if (ran != KILN_OK) return ran;
  for (int i = 0; i < KILN_OUTPUTS; ++i) {
    const kiln_io *io = &kiln_outputs[i];
    char *to = (char *)outputs[i].data + outputs[i].byte_offset;
    const char *from = io->source == 0 ? (io->axis >= 0 && e != n ? context->pad[KILN_INPUTS + i] : NULL)
                     : io->source == 1 ? context->arena + context->offsets[io->where]
                     : io->source == 2 ? context->model->weights[io->where]
                     : given[io->where];
    if (!from) continue;
    if (io->axis >= 0)
      kiln_resize(io, to, n, from, e);
    else
      memmove(to, from, (size_t)io->elements * (io->bits / 8));
  }
  return kiln_ok();
}

kiln_status kiln_infer(kiln_context *context, const DLTensor *inputs, int input_count, DLTensor *outputs, int output_count) {
  if (!context) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: context is NULL");
  if (input_count != KILN_INPUTS || output_count != KILN_OUTPUTS)
    return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: %d inputs and %d outputs given, the model takes %d and %d", input_count, output_count, KILN_INPUTS, KILN_OUTPUTS);
  if ((KILN_INPUTS && !inputs) || (KILN_OUTPUTS && !outputs)) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: inputs or outputs is NULL");
  int64_t samples = -1, length = -1;
  for (int i = 0; i < KILN_INPUTS; ++i) {
    kiln_status status = kiln_check_tensor("input", i, &kiln_inputs[i], &inputs[i], &samples, &length);
    if (status != KILN_OK) return status;
  }
  for (int i = 0; i < KILN_OUTPUTS; ++i) {
    kiln_status status = kiln_check_tensor("output", i, &kiln_outputs[i], &outputs[i], &samples, &length);
    if (status != KILN_OK) return status;
  }
  if (KILN_LENGTH) return kiln_infer_length(context, inputs, outputs, length);
  if (samples < 0) samples = 1;
  const char *given[KILN_INPUTS > 0 ? KILN_INPUTS : 1];
  for (int64_t s = 0; s < samples; ++s) { /* the plan of one sample, once per sample (batched tensors: that sample's rows) */
    for (int i = 0; i < KILN_INPUTS; ++i) {
      const kiln_io *io = &kiln_inputs[i];
      const int64_t at = io->batched ? s * io->elements * (io->bits / 8) : 0;
      given[i] = (const char *)inputs[i].data + inputs[i].byte_offset + at;
      context->table[io->slot] = (void *)given[i];
    }
    for (int i = 0; i < KILN_OUTPUTS; ++i) {
      const kiln_io *io = &kiln_outputs[i];
      if (io->source == 0) context->table[io->slot] = (char *)outputs[i].data + outputs[i].byte_offset + s * io->elements * (io->bits / 8);
    }
    context->status = 0;
    const kiln_status ran = kiln_ran(context, kiln_run(context->table, NULL));
    if (ran != KILN_OK) return ran;
    for (int i = 0; i < KILN_OUTPUTS; ++i) {
      const kiln_io *io = &kiln_outputs[i];
      const size_t bytes = (size_t)io->elements * (io->bits / 8);
      const char *from = io->source == 1 ? context->arena + io->where
                       : io->source == 2 ? context->model->weights[io->where]
                       : io->source == 3 ? given[io->where] : NULL;
      if (from) memmove((char *)outputs[i].data + outputs[i].byte_offset + (size_t)s * bytes, from, bytes);
    }
  }
  return kiln_ok();
}
