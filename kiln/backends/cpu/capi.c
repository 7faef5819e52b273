/* kiln's C API (kiln.h) over one compiled plan. This file is part of the engine object every plan's
   library links (kiln.backends.cpu.c_unit.engine_source, compiled once per target), and reads the
   plan's tables from its unit (kiln_tables, kiln_plan.h): the library the Python runtime loads is
   the one a C program links, and both run the plan through the code below (contexts, the buffer
   table, the arena laid out at a run-time length, the entry's call and its errors). The Python
   runtime binds the weights it holds (kiln_model_bind) and fills the table's inputs and outputs
   itself; a C program loads a weights file and calls kiln_infer on DLPack tensors.

   A weights file (kiln.driver.emit_c) holds, after its header, the tensors' descriptions (names,
   dtypes, dims, ranges: kiln_io) and the weights. Nothing in it says where anything lives: every
   slot, byte count and offset is checked against the compiled tables, so a damaged or hostile
   file is refused, never read or written past a buffer.

   A run-time length (has_length: a padded plan whose kernels take the length at run time,
   kiln.driver.extents): a run at length L computes at E = max(L, floor) with the valid length L in
   the plan's valid slot, its arena laid out for E (every buffer's bytes a polynomial of E,
   kiln.lower.memory.GrowingLayout); kiln_infer pads tensors shorter than the floor with zeros into
   the context's buffers and cuts the outputs back to L. */
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

#ifndef KILN_H
#include "kiln.h"
#endif
#ifndef KILN_PLAN_H
#include "kiln_plan.h"
#endif

typedef int (*kiln_host_fn)(int gap);
extern int kiln_set_threads(int threads);
extern void kiln_pool_start(void);
extern int kiln_pool_call_threads(int threads);
extern int kiln_pool_reserve_threads(int threads);
extern int kiln_set_int8(int mode) __attribute__((weak));
extern int kiln_set_bf16(int mode) __attribute__((weak));

/* the Python runtime's entries (not in kiln.h: it binds the weights it holds and fills the table) */
kiln_status kiln_model_bind(void *const *addresses, int64_t count, kiln_model **model);
kiln_status kiln_context_bind(const kiln_model *model, void *workspace, size_t bytes, kiln_context **context);
void **kiln_context_table(kiln_context *context);
const int64_t *kiln_context_offsets(const kiln_context *context);
kiln_status kiln_context_run(kiln_context *context, int64_t length, kiln_host_fn host);
kiln_status kiln_context_set_threads(kiln_context *context, int threads);

#define KILN_MAGIC "KILNWTS1"
#define KILN_ALIGN 64
#define KILN_HEAD 104   /* magic, ABI | weight count, data bytes, CRC-32, model id (64), description words */
#define KILN_MAX_IO 4096
#define KILN_MAX_DIMS 16
#define KILN_MAX_CLASSES 64
#define T (*t) /* the plan a function works on: its `t` */
#define T_OF(k) (*(k)->t)


typedef struct {
  const char *name;
  uint8_t code, bits;
  int32_t ndim;
  const int64_t *shape; /* per sample when batched, at the capacity along a run-time length's axis */
  const int64_t *shown, *minimum, *maximum; /* what kiln_model_input/output describe */
  int64_t slot;
  int32_t source;   /* outputs: 0 written in place (the caller's memory), 1 the arena, 2 a weight, 3 an input */
  int64_t where;    /* the arena buffer (its offset, or its growing position), the weight's or the input's index */
  int64_t elements;
  int32_t batched;  /* axis 0 is a sample-parallel dim in [batch_min, batch_max], run a sample at a time */
  int32_t axis;     /* the length's axis (-1: none): a run-time length, or a padded class's length */
} kiln_io;

/* one plan of the model: a run-time length's (or a fixed size's) one, or a padded length's class */
typedef struct {
  const kiln_plan_tables *t;
  void **table;         /* the weights' addresses in its slots; the rest filled per context and call */
  const char **weights; /* by constant index */
  kiln_io *io;          /* inputs then outputs (none in a model bound by the Python runtime) */
  int64_t length;       /* a padded class: the length it was compiled at (0: none) */
  int64_t valid_slot;   /* a padded class: its valid-length input's slot */
  const int64_t *arrays; /* which of the file's arrays each of its weights is */
} kiln_class;

struct kiln_model {
  void *map; /* the weights file's mapping (NULL: the caller's memory or Python's weights) */
  size_t map_bytes;
  int64_t *words;       /* the descriptions, copied out of the file */
  int32_t class_count;
  kiln_class *classes;  /* by length (one: a fixed size or a run-time length) */
  int32_t inputs, outputs;
  int64_t batch_min, batch_max, length_min, length_max;
  int32_t label_count;  /* the node each status code names (from the weights file) */
  const char **labels;
  /* run-time dims (kiln.driver.spatial: an image's height and width): the plan's last input is the
     dims vector, each entry an input tensor's dim or a program of earlier entries */
  int32_t dim_count;
  const int64_t *dim_capacity;      /* each entry at the capacity (the arena's sizes) */
  const int64_t **dim_code;         /* each entry's program (postfix words; NULL: an input's dim) */
  int64_t *dim_code_length;
  int32_t equal_count;              /* groups of entries every specialized binding had equal */
  const int64_t **equal;
  int64_t *equal_length;
  const int64_t **io_dims;          /* per tensor, per dim: its entry (-1: a fixed dim) */
};

struct kiln_context {
  const kiln_model *model;
  char *arena;
  int owns_arena; /* 0: the caller's workspace (kiln_context_create_in, kiln_context_bind) */
  size_t arena_bytes;
  int32_t status;
  int threads;         /* its runs' participants (0: the library's, kiln_set_thread_count) */
  void ***tables;      /* one per class */
  int64_t valid, laid; /* a length: this run's; the run-time length the arena is laid out for */
  int64_t *offsets;    /* a run-time length: the arena laid out for the run (growing order) */
  char **pad;          /* tensors at a padded length (below a run-time length's floor, or a class's) */
  void **constants;    /* written per run at its length */
  int64_t *vector;     /* run-time dims: this run's dims vector */
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

/* bit i of kiln_tables.cpu_needs (kiln.backends.cpu.c_tables.CPU_BITS, the same order) */
static int kiln_cpu_flag(int bit) {
#if defined(__x86_64__) || defined(__i386__)
  switch (bit) {
    case 0: return __builtin_cpu_supports("avx");
    case 1: return __builtin_cpu_supports("avx2");
    case 2: return __builtin_cpu_supports("fma");
    case 3: return __builtin_cpu_supports("f16c");
    case 4: return __builtin_cpu_supports("bmi");
    case 5: return __builtin_cpu_supports("bmi2");
    case 6: return __builtin_cpu_supports("avx512f");
    case 7: return __builtin_cpu_supports("avx512bw");
    case 8: return __builtin_cpu_supports("avx512dq");
    case 9: return __builtin_cpu_supports("avx512vl");
    case 10: return __builtin_cpu_supports("avx512cd");
    case 11: return __builtin_cpu_supports("avx512vnni");
    case 12: return __builtin_cpu_supports("avx512bf16");
    case 13: return __builtin_cpu_supports("avx512vbmi");
    case 14: return __builtin_cpu_supports("avx512ifma");
    default: return 0;
  }
#else
  return bit < 0;
#endif
}

static kiln_status kiln_check_cpu(const kiln_plan_tables *t) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
#endif
  for (int bit = 0; bit < 32; ++bit)
    if ((T.cpu_needs >> bit & 1u) && !kiln_cpu_flag(bit))
      return kiln_fail(KILN_ERROR_CPU, "this library was built for instructions this CPU lacks (cpu_needs bit %d)", bit);
  return KILN_OK;
}

/* the best micro-kernel paths this CPU has for the plan's reduced-precision products */
static void kiln_choose_paths(const kiln_plan_tables *t) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (kiln_set_int8) {
    int mode = 0;
    if (__builtin_cpu_supports("avx2")) mode = 1;
    if (T.int8_vnni && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512f")) mode = 3;
    kiln_set_int8(mode);
  }
  if (kiln_set_bf16) kiln_set_bf16(__builtin_cpu_supports("avx512bf16") ? 1 : 0);
#else
  (void)t;
  if (kiln_set_int8) kiln_set_int8(0);
  if (kiln_set_bf16) kiln_set_bf16(0);
#endif
}

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

static int kiln_slot_in(int64_t slot, const int64_t *slots, int32_t count) {
  for (int32_t i = 0; i < count; ++i)
    if (slots[i] == slot) return i;
  return -1;
}

/* the library's plans (kiln_library_plans: its unit's one, or a padded length's classes), at
   most KILN_MAX_CLASSES; 0: none (a unit built without tables) */
static int32_t kiln_plans(const kiln_plan_tables *const **plans) {
  int32_t count = 0;
  *plans = kiln_library_plans(&count);
  return *plans && count > 0 && count <= KILN_MAX_CLASSES ? count : 0;
}

/* the header: magic, ABI | array count, data bytes, CRC-32 of everything after the header, the
   first plan's id, the descriptions' word count; then each array's bytes, the descriptions, the
   data (every plan's id and weights are checked against its tables with the descriptions) */
static kiln_status kiln_check_header(const unsigned char *p, size_t size, size_t *data_at) {
  if (size < KILN_HEAD) return kiln_fail(KILN_ERROR_FILE, "the weights file is %zu bytes: truncated (no header)", size);
  if (memcmp(p, KILN_MAGIC, 8) != 0) return kiln_fail(KILN_ERROR_FILE, "not a kiln weights file (its first bytes are not " KILN_MAGIC ")");
  const uint64_t abi = kiln_read64(p + 8) & 0xffffffffu, count = kiln_read64(p + 8) >> 32, words = kiln_read64(p + 96);
  if (abi != KILN_ABI_VERSION) return kiln_fail(KILN_ERROR_FILE, "the weights file is of ABI version %llu, this library of %d", (unsigned long long)abi, KILN_ABI_VERSION);
  const kiln_plan_tables *const *plans = NULL;
  if (!kiln_plans(&plans)) return kiln_fail(KILN_ERROR_FILE, "this library's plan has no tables: it is not a model's library");
  const kiln_plan_tables *t = plans[0];
  if (strlen(T.id) != 64 || memcmp(p + 32, T.id, 64) != 0) return kiln_fail(KILN_ERROR_FILE, "the weights file is another model's (its model id differs from this library's)");
  if (count > (1u << 24) || words > (1u << 24)) return kiln_fail(KILN_ERROR_FILE, "the weights file claims %llu arrays and %llu words of descriptions: damaged", (unsigned long long)count, (unsigned long long)words);
  const size_t table = KILN_HEAD + 8 * (size_t)count + 8 * (size_t)words;
  *data_at = (table + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN;
  const uint64_t data_bytes = kiln_read64(p + 16);
  if (size < *data_at || data_bytes != (uint64_t)(size - *data_at))
    return kiln_fail(KILN_ERROR_FILE, "the weights file is %zu bytes, its header says %llu of data after %zu: truncated or damaged", size, (unsigned long long)data_bytes, *data_at);
  if (kiln_crc32(p + KILN_HEAD, size - KILN_HEAD) != kiln_read64(p + 24))
    return kiln_fail(KILN_ERROR_FILE, "the weights file's checksum does not match its contents: damaged");
  return KILN_OK;
}

typedef struct {
  const int64_t *w;
  int64_t n, at;
} kiln_cursor;

static int kiln_take(kiln_cursor *c, int64_t count, const int64_t **out) {
  if (count < 0 || count > c->n - c->at) return 0;
  *out = c->w + c->at;
  c->at += count;
  return 1;
}

static int kiln_take1(kiln_cursor *c, int64_t *v) {
  const int64_t *p;
  if (!kiln_take(c, 1, &p)) return 0;
  *v = *p;
  return 1;
}

/* where an output's values are after a run: its slot is a weight's, an arena buffer's, an input's
   (the caller's memory then), or its own (written in place) */
static void kiln_source(const kiln_plan_tables *t, kiln_io *io, int32_t inputs) {
  int k;
  if ((k = kiln_slot_in(io->slot, T.constant_slots, T.constant_count)) >= 0) {
    io->source = 2, io->where = k;
  } else if ((k = kiln_slot_in(io->slot, T.input_slots, inputs)) >= 0) {
    io->source = 3, io->where = k;
  } else if (T.has_length && (k = kiln_slot_in(io->slot, T.growing_slots, T.growing_count)) >= 0) {
    io->source = 1, io->where = k;
  } else {
    io->source = 0, io->where = 0;
    for (int i = 0; i < T.arena_count; ++i)
      if (T.arena[i][0] == io->slot) io->source = 1, io->where = T.arena[i][1];
  }
}

/* one description, checked against the plan's compiled tables: its slot the plan's, its bytes its
   buffer's (a sample's; at the capacity of a run-time length, at a class's length) */
static const char *kiln_read_one(const kiln_plan_tables *t, kiln_cursor *c, kiln_io *io, int64_t want_slot, int64_t length) {
  int64_t name_bytes, v[6];
  const int64_t *name;
  if (!kiln_take1(c, &name_bytes) || name_bytes < 0 || name_bytes > 4096 || !kiln_take(c, name_bytes / 8 + 1, &name)) return "a name runs past the descriptions";
  io->name = (const char *)name;
  if (memchr(io->name, 0, (size_t)name_bytes + 1) != io->name + name_bytes) return "a name is not terminated where its length says";
  for (int i = 0; i < 6; ++i)
    if (!kiln_take1(c, &v[i])) return "the descriptions end early";
  if (v[1] != 8 && v[1] != 16 && v[1] != 32 && v[1] != 64) return "a dtype of an unknown width";
  if (v[0] < 0 || v[0] > 255 || v[2] < 0 || v[2] > KILN_MAX_DIMS) return "a dtype code or a rank out of range";
  io->code = (uint8_t)v[0], io->bits = (uint8_t)v[1], io->ndim = (int32_t)v[2], io->slot = v[3];
  io->batched = (int32_t)v[4], io->axis = (int32_t)v[5];
  if (io->slot != want_slot) return "a tensor's slot is not the plan's";
  if (!kiln_take(c, io->ndim, &io->shape) || !kiln_take(c, io->ndim, &io->shown) || !kiln_take(c, io->ndim, &io->minimum) || !kiln_take(c, io->ndim, &io->maximum))
    return "the descriptions end early";
  io->elements = 1;
  for (int d = 0; d < io->ndim; ++d) {
    if (io->shape[d] < 0 || io->shape[d] > (1ll << 31)) return "a dim out of range";
    io->elements *= io->shape[d];
    if (io->elements > (1ll << 50)) return "a tensor too large";
  }
  if (io->elements * (io->bits / 8) != T.slot_bytes[io->slot]) return "a tensor's bytes are not its buffer's";
  if (io->batched != 0 && (io->batched != 1 || io->ndim < 1 || io->shape[0] != 1 || io->axis == 0)) return "a batched tensor whose axis 0 is not one sample";
  const int64_t along = T.has_length ? T.capacity : length; /* the length the plan's buffers hold */
  if (io->axis != -1 && (along < 1 || io->axis < 0 || io->axis >= io->ndim || io->shape[io->axis] != along))
    return "a length's axis that is not the plan's";
  return NULL;
}

/* the node each status code names: a count, then each name (its bytes, its words) */
static kiln_status kiln_read_labels(kiln_model *m, kiln_cursor *c) {
  int64_t count;
  if (!kiln_take1(c, &count) || count < 0 || count > (1 << 20)) return kiln_fail(KILN_ERROR_FILE, "the weights file's node names are missing or too many: damaged");
  const char **labels = (const char **)calloc((size_t)count + 1, sizeof(char *));
  if (!labels) return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  for (int64_t i = 0; i < count; ++i) {
    int64_t bytes;
    const int64_t *text;
    if (!kiln_take1(c, &bytes) || bytes < 0 || bytes > 4096 || !kiln_take(c, bytes / 8 + 1, &text) || memchr(text, 0, (size_t)bytes + 1) != (const char *)text + bytes) {
      free(labels);
      return kiln_fail(KILN_ERROR_FILE, "the weights file's node name %lld runs past its descriptions: damaged", (long long)i);
    }
    labels[i] = (const char *)text;
  }
  free(m->labels); /* (every class names its own nodes; the last's are kept: codes past them name a kernel) */
  m->labels = labels, m->label_count = (int32_t)count;
  return KILN_OK;
}

/* one class's part of the descriptions: its length, its plan's id, which array each of its weights
   is, its tensors, its nodes */
static kiln_status kiln_read_class(kiln_model *m, kiln_class *k, kiln_cursor *c, const uint64_t *array_bytes, int64_t arrays) {
  const kiln_plan_tables *t = k->t;
  const int64_t *id;
  if (!kiln_take1(c, &k->length) || !kiln_take(c, 8, &id)) return kiln_fail(KILN_ERROR_FILE, "the weights file's descriptions end early: damaged");
  if (memcmp(id, T.id, 64) != 0) return kiln_fail(KILN_ERROR_FILE, "the weights file is another model's (a plan's id differs from this library's)");
  const int32_t plan_inputs = T.input_count - (T.has_length || k->length != 0 ? 1 : 0);
  if (m->inputs != plan_inputs || m->outputs != T.output_count)
    return kiln_fail(KILN_ERROR_FILE, "the weights file describes %d inputs and %d outputs, the plan has %d and %d: damaged or another model's", (int)m->inputs, (int)m->outputs, (int)plan_inputs, (int)T.output_count);
  if (k->length < -1 || k->length > (1ll << 31) || (k->length > 0 && (T.has_length || T.slot_bytes[T.input_slots[T.input_count - 1]] != 8)) ||
      (k->length != 0 && T.input_count < 1))
    return kiln_fail(KILN_ERROR_FILE, "the weights file's class length does not fit its plan: damaged");
  k->valid_slot = k->length != 0 ? T.input_slots[T.input_count - 1] : 0; /* (-1: the dims vector's) */
  const int64_t *map;
  int64_t mapped;
  if (!kiln_take1(c, &mapped) || mapped != T.constant_count || !kiln_take(c, T.constant_count, &map))
    return kiln_fail(KILN_ERROR_FILE, "the weights file names the arrays of %lld weights, its plan has %d: damaged or another model's", (long long)mapped, (int)T.constant_count);
  for (int i = 0; i < T.constant_count; ++i)
    if (map[i] < 0 || map[i] >= arrays || array_bytes[map[i]] != (uint64_t)T.slot_bytes[T.constant_slots[i]])
      return kiln_fail(KILN_ERROR_FILE, "weight %d of a plan is not an array of its bytes in the file: damaged or another model's", i);
  k->arrays = map;
  k->io = (kiln_io *)calloc((size_t)(m->inputs + m->outputs) + 1, sizeof(kiln_io));
  if (!k->io) return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  for (int i = 0; i < m->inputs + m->outputs; ++i) {
    kiln_io *io = &k->io[i];
    const int64_t slot = i < m->inputs ? T.input_slots[i] : T.output_slots[i - m->inputs];
    const char *why = kiln_read_one(t, c, io, slot, k->length);
    if (why) return kiln_fail(KILN_ERROR_FILE, "the weights file's tensor %d: %s: damaged or another model's", i, why);
    if (i < m->inputs) io->source = 3, io->where = i;
    else kiln_source(t, io, m->inputs);
  }
  return kiln_read_labels(m, c);
}

/* run-time dims: the entry count (0: none), each entry's capacity and program (its length, 0: an
   input's dim), the groups of equal entries, and each tensor's dims' entries */
static kiln_status kiln_read_dims(kiln_model *m, kiln_cursor *c) {
  int64_t n;
  if (!kiln_take1(c, &n) || n < 0 || n > 4096) return kiln_fail(KILN_ERROR_FILE, "the weights file's dims vector is missing or too long: damaged");
  const kiln_class *k = &m->classes[0];
  if ((n > 0) != (k->length == -1) || (n > 0 && (m->class_count != 1 || T_OF(k).slot_bytes[k->valid_slot] != 8 * n)))
    return kiln_fail(KILN_ERROR_FILE, "the weights file's dims vector is not its plan's: damaged");
  if (n == 0) return KILN_OK;
  m->dim_count = (int32_t)n;
  m->dim_code = (const int64_t **)calloc((size_t)n, sizeof(int64_t *));
  m->dim_code_length = (int64_t *)calloc((size_t)n, sizeof(int64_t));
  m->io_dims = (const int64_t **)calloc((size_t)(m->inputs + m->outputs) + 1, sizeof(int64_t *));
  if (!m->dim_code || !m->dim_code_length || !m->io_dims) return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  if (!kiln_take(c, n, &m->dim_capacity)) return kiln_fail(KILN_ERROR_FILE, "the weights file's dims vector ends early: damaged");
  for (int64_t i = 0; i < n; ++i) {
    if ((m->dim_capacity[i] < 1 && m->dim_capacity[i] != -1) || m->dim_capacity[i] > (1ll << 31)) /* (-1: a size no kernel keeps) */
      return kiln_fail(KILN_ERROR_FILE, "a dims vector entry's capacity is out of range: damaged");
    if (!kiln_take1(c, &m->dim_code_length[i]) || m->dim_code_length[i] < 0 || m->dim_code_length[i] > 4096 || !kiln_take(c, m->dim_code_length[i], &m->dim_code[i]))
      return kiln_fail(KILN_ERROR_FILE, "a dims vector entry's program runs past the descriptions: damaged");
    if (!m->dim_code_length[i]) m->dim_code[i] = NULL;
  }
  int64_t groups;
  if (!kiln_take1(c, &groups) || groups < 0 || groups > n) return kiln_fail(KILN_ERROR_FILE, "the weights file's equal dims are damaged");
  m->equal_count = (int32_t)groups;
  m->equal = (const int64_t **)calloc((size_t)groups + 1, sizeof(int64_t *));
  m->equal_length = (int64_t *)calloc((size_t)groups + 1, sizeof(int64_t));
  if (!m->equal || !m->equal_length) return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  for (int64_t g = 0; g < groups; ++g) {
    if (!kiln_take1(c, &m->equal_length[g]) || m->equal_length[g] < 0 || m->equal_length[g] > n || !kiln_take(c, m->equal_length[g], &m->equal[g]))
      return kiln_fail(KILN_ERROR_FILE, "the weights file's equal dims are damaged");
    for (int64_t e = 0; e < m->equal_length[g]; ++e)
      if (m->equal[g][e] < 0 || m->equal[g][e] >= n) return kiln_fail(KILN_ERROR_FILE, "the weights file's equal dims are damaged");
  }
  for (int i = 0; i < m->inputs + m->outputs; ++i) {
    const kiln_io *io = &k->io[i];
    if (!kiln_take(c, io->ndim, &m->io_dims[i])) return kiln_fail(KILN_ERROR_FILE, "the weights file's tensor dims end early: damaged");
    for (int d = 0; d < io->ndim; ++d) {
      const int64_t e = m->io_dims[i][d];
      if (e < -1 || e >= n || (e >= 0 && (io->shape[d] != m->dim_capacity[e] || io->batched || io->axis >= 0)))
        return kiln_fail(KILN_ERROR_FILE, "tensor %d's dim %d is not a dims vector entry at its capacity: damaged", i, d);
    }
  }
  return KILN_OK;
}

/* the descriptions after the arrays' sizes: the batch and length ranges, the counts, each class */
static kiln_status kiln_read_io(kiln_model *m, const unsigned char *p, size_t data_at) {
  const int64_t arrays = (int64_t)(kiln_read64(p + 8) >> 32), words = (int64_t)kiln_read64(p + 96);
  const unsigned char *at = p + KILN_HEAD + 8 * (size_t)arrays;
  if (at + 8 * words > p + data_at) return kiln_fail(KILN_ERROR_FILE, "the descriptions run into the weights: damaged");
  m->words = (int64_t *)calloc((size_t)words + 1, sizeof(int64_t));
  uint64_t *array_bytes = (uint64_t *)calloc((size_t)arrays + 1, sizeof(uint64_t));
  if (!m->words || !array_bytes) return free(array_bytes), kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  for (int64_t i = 0; i < words; ++i) m->words[i] = (int64_t)kiln_read64(at + 8 * i);
  for (int64_t i = 0; i < arrays; ++i) array_bytes[i] = kiln_read64(p + KILN_HEAD + 8 * i);
  kiln_cursor c = {m->words, words, 0};
  int64_t r[7];
  kiln_status status = KILN_OK;
  for (int i = 0; i < 7 && status == KILN_OK; ++i)
    if (!kiln_take1(&c, &r[i])) status = kiln_fail(KILN_ERROR_FILE, "the weights file's descriptions end early: damaged");
  const kiln_plan_tables *const *plans = NULL;
  const int32_t count = kiln_plans(&plans);
  if (status == KILN_OK && (r[6] != count || r[4] < 0 || r[5] < 0 || r[4] + r[5] > KILN_MAX_IO))
    status = kiln_fail(KILN_ERROR_FILE, "the weights file describes %lld plans and %lld tensors, this library has %d plans: damaged or another model's", (long long)r[6], (long long)(r[4] + r[5]), (int)count);
  if (status == KILN_OK && (r[0] < 1 || r[0] > r[1] || r[1] > (1ll << 31) || r[2] < 1 || r[2] > r[3] || r[3] > (1ll << 31)))
    status = kiln_fail(KILN_ERROR_FILE, "the weights file's ranges are not the plan's: damaged");
  if (status == KILN_OK) {
    m->batch_min = r[0], m->batch_max = r[1], m->length_min = r[2], m->length_max = r[3];
    m->inputs = (int32_t)r[4], m->outputs = (int32_t)r[5];
  }
  for (int32_t k = 0; status == KILN_OK && k < m->class_count; ++k) {
    status = kiln_read_class(m, &m->classes[k], &c, array_bytes, arrays);
    const int64_t before = k > 0 ? m->classes[k - 1].length : 0;
    if (status == KILN_OK && m->class_count > 1 && m->classes[k].length <= before)
      status = kiln_fail(KILN_ERROR_FILE, "the weights file's class lengths do not grow: damaged");
  }
  if (status == KILN_OK) status = kiln_read_dims(m, &c);
  const kiln_class *last = m->class_count > 0 ? &m->classes[m->class_count - 1] : NULL;
  if (status == KILN_OK && last && last->t->has_length && m->length_max > last->t->capacity)
    status = kiln_fail(KILN_ERROR_FILE, "the weights file's length range passes its plan's capacity: damaged");
  if (status == KILN_OK && last && last->length > 0 && m->length_max > last->length)
    status = kiln_fail(KILN_ERROR_FILE, "the weights file's length range passes its largest class: damaged");
  free(array_bytes);
  return status;
}

static void kiln_model_free_classes(kiln_model *m) {
  for (int32_t k = 0; m->classes && k < m->class_count; ++k) {
    free(m->classes[k].table), free((void *)m->classes[k].weights), free(m->classes[k].io);
  }
  free(m->classes);
}

/* a model of `count` plans (their tables in `plans`) */
static kiln_model *kiln_model_new(const kiln_plan_tables *const *plans, int32_t count) {
  kiln_model *m = (kiln_model *)calloc(1, sizeof *m);
  if (!m) return NULL;
  m->classes = (kiln_class *)calloc((size_t)count + 1, sizeof(kiln_class));
  m->class_count = count;
  int ok = m->classes != NULL;
  for (int32_t k = 0; ok && k < count; ++k) {
    kiln_class *c = &m->classes[k];
    c->t = plans[k];
    c->table = (void **)calloc((size_t)c->t->slots, sizeof(void *));
    c->weights = (const char **)calloc((size_t)c->t->constant_count + 1, sizeof(char *));
    ok = c->table && c->weights;
  }
  if (!ok) {
    kiln_model_free_classes(m);
    free(m);
    return NULL;
  }
  m->batch_min = m->batch_max = 1;
  m->length_min = 1, m->length_max = count > 0 ? plans[0]->capacity : 1;
  return m;
}

void kiln_model_free(kiln_model *model) {
  if (!model) return;
  if (model->map) munmap(model->map, model->map_bytes);
  kiln_model_free_classes(model);
  free(model->words), free(model->labels);
  free(model->dim_code), free(model->dim_code_length), free(model->equal), free(model->equal_length), free(model->io_dims);
  free(model);
}

static kiln_status kiln_tables_ok(const kiln_plan_tables *const *plans, int32_t count) {
  if (count < 1) return kiln_fail(KILN_ERROR_FILE, "this library's plan has no tables: it is not a model's library");
  for (int32_t k = 0; k < count; ++k) {
    const kiln_plan_tables *t = plans[k];
    if (T.version != KILN_PLAN_TABLES_VERSION || T.slots < 1)
      return kiln_fail(KILN_ERROR_FILE, "the library's plan tables are of version %d, this API's %d", (int)T.version, KILN_PLAN_TABLES_VERSION);
    kiln_status status = kiln_check_cpu(t);
    if (status != KILN_OK) return status;
  }
  return KILN_OK;
}

/* the model over the weights file's bytes at p (size bytes): checked, its descriptions read, each
   plan's weights' addresses in its table; map: the file's mapping, unmapped on failure and by
   kiln_model_free (NULL: the caller's memory) */
static kiln_status kiln_model_over(const unsigned char *p, size_t size, void *map, kiln_model **model) {
  size_t data_at = 0;
  kiln_model *m = NULL;
  const kiln_plan_tables *const *plans = NULL;
  const int32_t count = kiln_plans(&plans);
  kiln_status status = kiln_check_header(p, size, &data_at);
  if (status == KILN_OK && !(m = kiln_model_new(plans, count))) status = kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  if (m) m->map = map, m->map_bytes = size; /* (unmapped by kiln_model_free from here) */
  if (status == KILN_OK) status = kiln_read_io(m, p, data_at);
  const int64_t arrays = (int64_t)(kiln_read64(p + 8) >> 32);
  const char **starts = status == KILN_OK ? (const char **)calloc((size_t)arrays + 1, sizeof(char *)) : NULL;
  if (status == KILN_OK && !starts) status = kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  size_t at = data_at;
  for (int64_t i = 0; status == KILN_OK && i < arrays; ++i) {
    const uint64_t bytes = kiln_read64(p + KILN_HEAD + 8 * (size_t)i);
    if (bytes > size || at + bytes > size) status = kiln_fail(KILN_ERROR_FILE, "array %lld runs past the weights file's end: truncated or damaged", (long long)i);
    starts[i] = (const char *)p + at;
    at = (at + bytes + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN;
  }
  for (int32_t k = 0; status == KILN_OK && k < m->class_count; ++k) {
    kiln_class *c = &m->classes[k];
    for (int i = 0; i < c->t->constant_count; ++i) {
      const int64_t a = c->arrays[i];
      c->weights[i] = starts[a];
      c->table[c->t->constant_slots[i]] = (void *)starts[a];
    }
  }
  free(starts);
  if (status != KILN_OK) {
    if (m) kiln_model_free(m);
    else if (map) munmap(map, size);
    return status;
  }
  static int started = 0;
  if (!__atomic_exchange_n(&started, 1, __ATOMIC_ACQ_REL)) {
    kiln_choose_paths(plans[0]);
    kiln_pool_start();
  }
  *model = m;
  return kiln_ok();
}

kiln_status kiln_model_load(const char *weights_path, kiln_model **model) {
  if (!model) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_load: model is NULL");
  *model = NULL;
  if (!weights_path) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_load: weights_path is NULL");
  const kiln_plan_tables *const *plans = NULL;
  kiln_status status = kiln_tables_ok(plans, kiln_plans(&plans));
  if (status != KILN_OK) return status;
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
  const kiln_plan_tables *const *plans = NULL;
  kiln_status status = kiln_tables_ok(plans, kiln_plans(&plans));
  if (status != KILN_OK) return status;
  return kiln_model_over((const unsigned char *)data, bytes, NULL, model);
}

/* (kiln's Python runtime) the model over weights it holds: `addresses`, one per slot of the
   plan's table (`count` of them), the weights' set, the rest NULL; they must outlive the model.
   No tensor descriptions: kiln_infer refuses it; runs go through kiln_context_run. */
kiln_status kiln_model_bind(void *const *addresses, int64_t count, kiln_model **model) {
  if (!model || !addresses) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_bind: model or addresses is NULL");
  *model = NULL;
  const kiln_plan_tables *const *one = NULL;
  if (kiln_plans(&one) != 1) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_bind: a library of one plan only");
  kiln_status status = kiln_tables_ok(one, 1);
  if (status != KILN_OK) return status;
  const kiln_plan_tables *t = one[0];
  if (count != T.slots) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_bind: %lld addresses, the plan has %lld slots", (long long)count, (long long)T.slots);
  kiln_model *m = kiln_model_new(one, 1);
  if (!m) return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  kiln_class *c = &m->classes[0];
  for (int i = 0; i < T.constant_count; ++i) {
    const int64_t slot = T.constant_slots[i];
    if (!addresses[slot] || (uintptr_t)addresses[slot] % KILN_ALIGN) {
      kiln_model_free(m);
      return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_bind: weight %d (slot %lld) is NULL or not 64-byte aligned", i, (long long)slot);
    }
    c->table[slot] = addresses[slot];
    c->weights[i] = (const char *)addresses[slot];
  }
  *model = m;
  return kiln_ok();
}

int kiln_model_input_count(const kiln_model *model) { return model ? model->inputs : 0; }
int kiln_model_output_count(const kiln_model *model) { return model ? model->outputs : 0; }

/* the tensors a model describes: its largest class's */
static const kiln_io *kiln_described(const kiln_model *m) { return m->classes[m->class_count - 1].io; }

static kiln_status kiln_describe(const kiln_io *io, kiln_tensor_info *info) {
  info->name = io->name;
  info->dtype.code = io->code, info->dtype.bits = io->bits, info->dtype.lanes = 1;
  info->ndim = io->ndim;
  info->shape = io->shown, info->min_shape = io->minimum, info->max_shape = io->maximum;
  return kiln_ok();
}

kiln_status kiln_model_input(const kiln_model *model, int index, kiln_tensor_info *info) {
  if (!model || !info) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_input: model or info is NULL");
  if (index < 0 || index >= model->inputs) return kiln_fail(KILN_ERROR_ARGUMENT, "input %d: the model has %d", index, (int)model->inputs);
  return kiln_describe(&kiln_described(model)[index], info);
}

kiln_status kiln_model_output(const kiln_model *model, int index, kiln_tensor_info *info) {
  if (!model || !info) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_output: model or info is NULL");
  if (index < 0 || index >= model->outputs) return kiln_fail(KILN_ERROR_ARGUMENT, "output %d: the model has %d", index, (int)model->outputs);
  return kiln_describe(&kiln_described(model)[model->inputs + index], info);
}

static size_t kiln_round(int64_t bytes) { return ((size_t)bytes + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN; }

/* every class runs in the largest class's arena */
size_t kiln_model_workspace_size(const kiln_model *model) {
  size_t most = 0;
  for (int32_t k = 0; model && k < model->class_count; ++k) {
    const size_t bytes = kiln_round(model->classes[k].t->arena_bytes);
    most = bytes > most ? bytes : most;
  }
  return most;
}

/* a run-time length: the arena's bytes at length n (GrowingLayout.at), and each buffer's offset
   into `offsets` (if given): each buffer where the last of those below it at the capacity ends,
   its bytes c0 + c1 n + c2 n^2 rounded to 64 */
static int64_t kiln_layout(const kiln_plan_tables *t, int64_t n, int64_t *offsets, int64_t *ends) {
  int64_t total = 0;
  for (int i = 0; i < T.growing_count; ++i) {
    int64_t offset = 0;
    for (int k = T.below_at[i]; k < T.below_at[i + 1]; ++k)
      if (ends[T.below[k]] > offset) offset = ends[T.below[k]];
    const int64_t *z = T.growing_sizes[i];
    int64_t bytes = z[0] + z[1] * n + z[2] * n * n;
    bytes = bytes < 1 ? 1 : bytes;
    if (offsets) offsets[i] = offset;
    ends[i] = offset + (int64_t)kiln_round(bytes);
    total = ends[i] > total ? ends[i] : total;
  }
  return total;
}

/* a run-time length: the length a run at n computes at */
static int64_t kiln_bound(const kiln_plan_tables *t, int64_t n) { return n < T.floor ? T.floor : n > T.capacity ? T.capacity : n; }

size_t kiln_model_workspace_size_at(const kiln_model *model, int64_t length) {
  if (!model) return 0;
  const kiln_plan_tables *t = model->classes[0].t;
  if (!T.has_length) return kiln_model_workspace_size(model);
  int64_t *ends = (int64_t *)calloc((size_t)T.growing_count + 1, sizeof(int64_t));
  if (!ends) return kiln_model_workspace_size(model); /* (an upper bound) */
  const int64_t n = kiln_bound(t, length < model->length_min ? model->length_min : length);
  const size_t bytes = (size_t)kiln_layout(t, n, NULL, ends);
  free(ends);
  return bytes;
}

/* an io's elements at length n along its axis */
static int64_t kiln_elements(const kiln_io *io, int64_t n) {
  return io->axis >= 0 ? io->elements / io->shape[io->axis] * n : io->elements;
}

/* the length pads are made at: a run-time length's floor (runs below it pad), a padded model's
   largest class (every run pads to its class); 0: no pads */
static int64_t kiln_pad_length(const kiln_model *m) {
  const kiln_plan_tables *t = m->classes[0].t;
  if (T.has_length) return m->length_min < T.floor ? T.floor : 0;
  return m->classes[m->class_count - 1].length;
}

/* the context's own buffers: those of the constants whose values follow a run-time length, and
   those a run pads its tensors into (kiln_pad_length) */
static kiln_status kiln_context_buffers(kiln_context *c, const kiln_model *m) {
  const kiln_plan_tables *t = m->classes[0].t;
  for (int k = 0; k < T.length_constant_count; ++k) {
    const int64_t n = T.length_constant_at[k + 1] - T.length_constant_at[k];
    const size_t bytes = (size_t)(n > 0 ? n : 1) * (size_t)(T.length_constant_bits[k] / 8);
    if (posix_memalign(&c->constants[k], KILN_ALIGN, bytes) != 0) return KILN_ERROR_MEMORY;
  }
  if (m->dim_count) { /* run-time dims: every tensor laid out in a buffer of its capacity, the vector */
    c->vector = (int64_t *)calloc((size_t)m->dim_count, sizeof(int64_t));
    if (!c->vector) return KILN_ERROR_MEMORY;
    for (int i = 0; i < m->inputs + m->outputs; ++i) {
      const kiln_io *io = &kiln_described(m)[i];
      if (!(c->pad[i] = (char *)calloc((size_t)io->elements + 1, io->bits / 8))) return KILN_ERROR_MEMORY;
    }
    return KILN_OK;
  }
  const int64_t length = kiln_pad_length(m);
  if (!length || !kiln_described(m)) return KILN_OK;
  for (int i = 0; i < m->inputs + m->outputs; ++i) {
    const kiln_io *io = &kiln_described(m)[i];
    if (io->axis < 0) continue;
    c->pad[i] = (char *)calloc((size_t)kiln_elements(io, length), io->bits / 8);
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

/* a run-time length: the arena laid out for length n in the context's slots and the constants
   that follow the length written for it (once per length change), or 0 when the workspace is too
   small for it */
static int kiln_lay_out(kiln_context *c, int64_t n) {
  const kiln_plan_tables *t = c->model->classes[0].t;
  if (c->laid == n) return 1;
  int64_t *ends = c->offsets + T.growing_count;
  if ((size_t)kiln_layout(t, n, c->offsets, ends) > c->arena_bytes) return 0;
  void **table = c->tables[0];
  for (int i = 0; i < T.growing_count; ++i) table[T.growing_slots[i]] = c->arena + c->offsets[i];
  for (int k = 0; k < T.length_constant_count; ++k) {
    for (int j = T.length_constant_at[k], e = 0; j < T.length_constant_at[k + 1]; ++j, ++e) {
      const int64_t *z = T.length_constant_terms[j];
      const int64_t v = z[0] + z[1] * n + z[2] * n * n;
      switch (T.length_constant_bits[k]) {
        case 8: ((int8_t *)c->constants[k])[e] = (int8_t)v; break;
        case 16: ((int16_t *)c->constants[k])[e] = (int16_t)v; break;
        case 32: ((int32_t *)c->constants[k])[e] = (int32_t)v; break;
        default: ((int64_t *)c->constants[k])[e] = v; break;
      }
    }
    table[T.length_constant_slots[k]] = c->constants[k];
  }
  c->laid = n;
  return 1;
}

void kiln_context_free(kiln_context *context) {
  if (!context) return;
  const kiln_model *m = context->model;
  if (context->owns_arena) free(context->arena);
  if (context->pad && m)
    for (int i = 0; i < m->inputs + m->outputs; ++i) free(context->pad[i]);
  if (context->constants && m)
    for (int k = 0; k < m->classes[0].t->length_constant_count; ++k) free(context->constants[k]);
  if (context->tables && m)
    for (int32_t k = 0; k < m->class_count; ++k) free(context->tables[k]);
  free(context->tables), free(context->offsets), free(context->pad), free(context->constants), free(context->vector);
  free(context);
}

/* a context over the workspace `arena` (`bytes`; zeroed here when `zero`: its pages are faulted in
   now, not in the first run); owned: kiln_context_free frees it */
static kiln_status kiln_context_over(const kiln_model *model, char *arena, size_t bytes, int owned, int zero, kiln_context **context) {
  const kiln_plan_tables *t = model->classes[0].t;
  kiln_context *c = (kiln_context *)calloc(1, sizeof *c);
  int ok = c != NULL;
  if (ok) {
    c->model = model;
    c->tables = (void ***)calloc((size_t)model->class_count, sizeof(void **));
    c->offsets = (int64_t *)calloc(2 * (size_t)T.growing_count + 1, sizeof(int64_t));
    c->pad = (char **)calloc((size_t)(model->inputs + model->outputs) + 1, sizeof(char *));
    c->constants = (void **)calloc((size_t)T.length_constant_count + 1, sizeof(void *));
    ok = c->tables && c->offsets && c->pad && c->constants && kiln_context_buffers(c, model) == KILN_OK;
  }
  for (int32_t k = 0; ok && k < model->class_count; ++k) {
    const kiln_class *cl = &model->classes[k];
    ok = (c->tables[k] = (void **)calloc((size_t)cl->t->slots, sizeof(void *))) != NULL;
    if (!ok) break;
    memcpy(c->tables[k], cl->table, (size_t)cl->t->slots * sizeof(void *));
    for (int i = 0; i < cl->t->arena_count; ++i) c->tables[k][cl->t->arena[i][0]] = arena + cl->t->arena[i][1];
    c->tables[k][0] = &c->status;
  }
  if (!ok) {
    if (owned) free(arena);
    kiln_context_free(c);
    return kiln_fail(KILN_ERROR_MEMORY, "out of memory");
  }
  if (bytes && zero) memset(arena, 0, bytes);
  c->arena = arena, c->owns_arena = owned, c->arena_bytes = bytes, c->laid = -1;
  *context = c;
  return kiln_ok();
}

kiln_status kiln_context_create(const kiln_model *model, kiln_context **context) {
  if (!context) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create: context is NULL");
  *context = NULL;
  if (!model) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_create: model is NULL");
  const size_t bytes = kiln_model_workspace_size(model);
  char *arena = NULL;
  if (bytes && posix_memalign((void **)&arena, KILN_ALIGN, bytes) != 0)
    return kiln_fail(KILN_ERROR_MEMORY, "out of memory for a workspace of %zu bytes", bytes);
  return kiln_context_over(model, arena, bytes, 1, 1, context);
}

static kiln_status kiln_context_in(const char *who, const kiln_model *model, void *workspace, size_t bytes, int zero, kiln_context **context) {
  if (!context) return kiln_fail(KILN_ERROR_ARGUMENT, "%s: context is NULL", who);
  *context = NULL;
  if (!model) return kiln_fail(KILN_ERROR_ARGUMENT, "%s: model is NULL", who);
  const size_t whole = kiln_model_workspace_size(model);
  if (whole && !workspace) return kiln_fail(KILN_ERROR_ARGUMENT, "%s: workspace is NULL", who);
  if (whole && (uintptr_t)workspace % KILN_ALIGN) return kiln_fail(KILN_ERROR_ARGUMENT, "%s: the workspace at %p is not 64-byte aligned", who, workspace);
  const size_t least = kiln_model_workspace_size_at(model, model->length_min); /* (no run-time length: the whole workspace) */
  if (bytes < least)
    return kiln_fail(KILN_ERROR_ARGUMENT, "%s: a workspace of %zu bytes, the model needs %zu (kiln_model_workspace_size)", who, bytes, least);
  return kiln_context_over(model, (char *)workspace, bytes > whole ? whole : bytes, 0, zero, context);
}

kiln_status kiln_context_create_in(const kiln_model *model, void *workspace, size_t bytes, kiln_context **context) {
  return kiln_context_in("kiln_context_create_in", model, workspace, bytes, 1, context);
}

/* (kiln's Python runtime) a context on its own arena, not zeroed (it faults pages in as runs
   reach them); its table, whose input and output slots the runtime writes before each run, and a
   run-time length's current offsets (in the growing order) */
kiln_status kiln_context_bind(const kiln_model *model, void *workspace, size_t bytes, kiln_context **context) {
  return kiln_context_in("kiln_context_bind", model, workspace, bytes, 0, context);
}

void **kiln_context_table(kiln_context *context) { return context ? context->tables[0] : NULL; }

const int64_t *kiln_context_offsets(const kiln_context *context) { return context ? context->offsets : NULL; }

/* (kiln's Python runtime) the context's runs on `threads` participants (a model's own `threads`:
   another model sharing this library keeps its own); 0: the library's; below 0: every CPU */
kiln_status kiln_context_set_threads(kiln_context *context, int threads) {
  if (!context) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_set_threads: context is NULL");
  context->threads = threads == 0 ? 0 : kiln_pool_reserve_threads(threads);
  return kiln_ok();
}

/* one run of class k's plan over its table (its inputs and outputs already in it): at `length`
   where the plan has a run-time length or is a padded class; `host` called between segments */
static kiln_status kiln_class_run(kiln_context *c, int32_t k, int64_t length, kiln_host_fn host) {
  const kiln_class *cl = &c->model->classes[k];
  const kiln_plan_tables *t = cl->t;
  void **table = c->tables[k];
  if (T.has_length) {
    if (length < 0 || length > T.capacity) return kiln_fail(KILN_ERROR_ARGUMENT, "a run at length %lld, the plan's capacity is %lld", (long long)length, (long long)T.capacity);
    const int64_t e = kiln_bound(t, length);
    if (!kiln_lay_out(c, e)) {
      int64_t *ends = c->offsets + T.growing_count;
      return kiln_fail(KILN_ERROR_ARGUMENT, "a run at length %lld needs a workspace of %lld bytes, this context's holds %zu (kiln_model_workspace_size_at)",
                       (long long)length, (long long)kiln_layout(t, e, NULL, ends), c->arena_bytes);
    }
    c->valid = length;
    table[T.valid_slot] = &c->valid;
  } else if (cl->length > 0) {
    c->valid = length;
    table[cl->valid_slot] = &c->valid;
  }
  c->status = 0;
  const int bound = kiln_pool_call_threads(c->threads);
  const int code = T.run(table, host);
  kiln_pool_call_threads(bound);
  if (code == 1) {
    const int32_t at = c->status;
    const kiln_model *m = c->model;
    if (at >= 0 && at < m->label_count) return kiln_fail(KILN_ERROR_RUN, "node %s: an index input is out of range for the dimension it indexes", m->labels[at]);
    return kiln_fail(KILN_ERROR_RUN, "kernel %d: an index input is out of range for the dimension it indexes", (int)at);
  }
  if (code == -1) return kiln_fail(KILN_ERROR_RUN, "a host step failed");
  return code != 0 ? kiln_fail(KILN_ERROR_RUN, "the plan's entry returned %d", code) : kiln_ok();
}

/* (kiln's Python runtime) one run of the plan over the context's table (its inputs and outputs
   already in it): at `length` where the plan has a run-time length; `host` called between
   segments (the Python runtime's host steps; NULL: none) */
kiln_status kiln_context_run(kiln_context *c, int64_t length, kiln_host_fn host) {
  if (!c) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_context_run: context is NULL");
  return kiln_class_run(c, 0, length, host);
}

static const char *kiln_arena_at(const kiln_context *c, const kiln_class *cl, const kiln_io *io);

/* run-time dims: each dim's dims vector entry of the tensor `io` describes (-1: fixed) */
static const int64_t *kiln_io_dims(const kiln_model *m, const kiln_io *io) { return m->io_dims[io - kiln_described(m)]; }

/* run-time dims: one postfix program over the vector's earlier entries (CONST v, ENTRY j, ADD, SUB,
   MUL, FLOORDIV, MOD, MIN, MAX); 0 when it is malformed, reads an entry not yet known, divides by
   less than 1 or overflows */
static int kiln_dims_eval(const int64_t *code, int64_t length, const int64_t *v, int32_t n, int64_t *out) {
  int64_t stack[32];
  int sp = 0;
  for (int64_t i = 0; i < length;) {
    const int64_t op = code[i++];
    if (op == 1 || op == 2) {
      if (i >= length || sp >= 32) return 0;
      const int64_t x = code[i++];
      if (op == 2 && (x < 0 || x >= n || v[x] < 0)) return 0;
      stack[sp++] = op == 1 ? x : v[x];
      continue;
    }
    if (sp < 2) return 0;
    const int64_t b = stack[--sp], a = stack[sp - 1];
    int64_t r = 0;
    switch (op) {
      case 3: if (__builtin_add_overflow(a, b, &r)) return 0; break;
      case 4: if (__builtin_sub_overflow(a, b, &r)) return 0; break;
      case 5: if (__builtin_mul_overflow(a, b, &r)) return 0; break;
      case 6: if (b < 1) return 0; r = a / b - (a % b != 0 && a < 0); break;
      case 7: if (b < 1) return 0; r = a % b; r += r < 0 ? b : 0; break;
      case 8: r = a < b ? a : b; break;
      case 9: r = a > b ? a : b; break;
      default: return 0;
    }
    stack[sp - 1] = r;
  }
  if (sp != 1) return 0;
  *out = stack[0];
  return 1;
}

/* run-time dims: this run's vector from the inputs' dims and the programs, checked: every entry
   within 1..its capacity, the entries every specialized binding had equal equal here too (else
   only specializing the graph, in Python, can tell whether the model has shapes there) */
static kiln_status kiln_dims_vector(const kiln_model *m, const DLTensor *inputs, int64_t *v) {
  const kiln_io *io = kiln_described(m);
  for (int32_t e = 0; e < m->dim_count; ++e) v[e] = -1;
  for (int i = 0; i < m->inputs; ++i)
    for (int d = 0; d < io[i].ndim; ++d) {
      const int64_t e = m->io_dims[i][d], size = inputs[i].shape[d];
      if (e < 0) continue;
      if (v[e] >= 0 && v[e] != size)
        return kiln_fail(KILN_ERROR_TENSOR, "input %d (%s): dim %d is %lld, another input's same dim is %lld", i, io[i].name, d, (long long)size, (long long)v[e]);
      v[e] = size;
    }
  for (int32_t e = 0; e < m->dim_count; ++e) {
    if (m->dim_code[e] && !kiln_dims_eval(m->dim_code[e], m->dim_code_length[e], v, m->dim_count, &v[e]))
      return kiln_fail(KILN_ERROR_TENSOR, "the model's size %d cannot be computed at these inputs' dims", (int)e);
    if (m->dim_capacity[e] >= 1 && (v[e] < 1 || v[e] > m->dim_capacity[e]))
      return kiln_fail(KILN_ERROR_TENSOR, "the model's size %d is %lld at these inputs' dims, outside 1..%lld: the model has no shapes there", (int)e, (long long)v[e], (long long)m->dim_capacity[e]);
  }
  for (int32_t g = 0; g < m->equal_count; ++g)
    for (int64_t k = 1; k < m->equal_length[g]; ++k)
      if (v[m->equal[g][k]] != v[m->equal[g][0]])
        return kiln_fail(KILN_ERROR_TENSOR, "two of the model's sizes differ at these inputs' dims (%lld and %lld), equal wherever it was compiled: only Python can tell whether it has shapes there",
                         (long long)v[m->equal[g][0]], (long long)v[m->equal[g][k]]);
  return KILN_OK;
}

/* run-time dims: one run, every tensor laid out densely at its sizes in the first part of a
   buffer of its capacity (the rest zero), the vector the plan's last input */
static kiln_status kiln_infer_dims(kiln_context *c, const DLTensor *inputs, DLTensor *outputs) {
  const kiln_model *m = c->model;
  const kiln_class *cl = &m->classes[0];
  const kiln_io *io = cl->io;
  kiln_status status = kiln_dims_vector(m, inputs, c->vector);
  if (status != KILN_OK) return status;
  size_t bytes[KILN_MAX_IO];
  for (int i = 0; i < m->inputs + m->outputs; ++i) {
    const DLTensor *t = i < m->inputs ? &inputs[i] : &outputs[i - m->inputs];
    int64_t n = 1;
    for (int d = 0; d < io[i].ndim; ++d) {
      const int64_t e = m->io_dims[i][d], want = e >= 0 ? c->vector[e] : io[i].shape[d];
      if (t->shape[d] != want)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, the model's at these inputs' dims is %lld", i < m->inputs ? "input" : "output",
                         i < m->inputs ? i : i - m->inputs, io[i].name, d, (long long)t->shape[d], (long long)want);
      n *= want;
    }
    bytes[i] = (size_t)n * (io[i].bits / 8);
  }
  void **table = c->tables[0];
  for (int i = 0; i < m->inputs; ++i) {
    const size_t whole = (size_t)io[i].elements * (io[i].bits / 8);
    memcpy(c->pad[i], (const char *)inputs[i].data + inputs[i].byte_offset, bytes[i]);
    memset(c->pad[i] + bytes[i], 0, whole - bytes[i]);
    table[io[i].slot] = c->pad[i];
  }
  table[cl->valid_slot] = c->vector;
  for (int i = m->inputs; i < m->inputs + m->outputs; ++i)
    if (io[i].source == 0) table[io[i].slot] = c->pad[i];
  status = kiln_class_run(c, 0, 0, NULL);
  if (status != KILN_OK) return status;
  for (int i = m->inputs; i < m->inputs + m->outputs; ++i) {
    const char *from = io[i].source == 0 ? c->pad[i] : io[i].source == 1 ? kiln_arena_at(c, cl, &io[i])
                     : io[i].source == 2 ? cl->weights[io[i].where] : c->pad[io[i].where];
    memmove((char *)outputs[i - m->inputs].data + outputs[i - m->inputs].byte_offset, from, bytes[i]);
  }
  return kiln_ok();
}

/* a tensor against the model's description; *samples: its size of the sample-parallel dim (a
   batched tensor's, else left as it was); *length: its length */
static kiln_status kiln_check_tensor(const kiln_model *m, const char *role, int index, const kiln_io *io, const DLTensor *t, int64_t *samples, int64_t *length) {
  if (!t->data) return kiln_fail(KILN_ERROR_ARGUMENT, "%s %d (%s): data is NULL", role, index, io->name);
  if (t->device.device_type != kDLCPU) return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): not a CPU tensor (device type %d)", role, index, io->name, (int)t->device.device_type);
  if (t->dtype.code != io->code || t->dtype.bits != io->bits || t->dtype.lanes != 1)
    return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dtype (code %d, %d bits, %d lanes), the model's is (code %d, %d bits)", role, index, io->name, t->dtype.code, t->dtype.bits, t->dtype.lanes, io->code, io->bits);
  if (t->ndim != io->ndim || (t->ndim && !t->shape)) return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): %d dims, the model's has %d", role, index, io->name, (int)t->ndim, (int)io->ndim);
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    const int64_t size = t->shape[d];
    if (d == 0 && io->batched) {
      if (size < m->batch_min || size > m->batch_max)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim 0 is %lld, outside the model's range %lld..%lld", role, index, io->name, (long long)size, (long long)m->batch_min, (long long)m->batch_max);
      if (*samples >= 0 && size != *samples)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim 0 is %lld, another tensor's is %lld", role, index, io->name, (long long)size, (long long)*samples);
      *samples = size;
    } else if (d == io->axis) {
      if (size < m->length_min || size > m->length_max)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, outside the model's range %lld..%lld", role, index, io->name, d, (long long)size, (long long)m->length_min, (long long)m->length_max);
      if (*length >= 0 && size != *length)
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, another tensor's length is %lld", role, index, io->name, d, (long long)size, (long long)*length);
      *length = size;
    } else if (m->dim_count && kiln_io_dims(m, io)[d] >= 0) {
      if (size < io->minimum[d] || size > io->maximum[d])
        return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, outside the model's range %lld..%lld", role, index, io->name, d, (long long)size, (long long)io->minimum[d], (long long)io->maximum[d]);
    } else if (size != io->shape[d]) {
      return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): dim %d is %lld, the model's is %lld", role, index, io->name, d, (long long)size, (long long)io->shape[d]);
    }
    if (t->strides && size > 1 && t->strides[d] != expected) return kiln_fail(KILN_ERROR_TENSOR, "%s %d (%s): not C-contiguous (dim %d's stride is %lld)", role, index, io->name, d, (long long)t->strides[d]);
    expected *= size;
  }
  return KILN_OK;
}

/* the arena buffer an output was left in, for this run */
static const char *kiln_arena_at(const kiln_context *c, const kiln_class *cl, const kiln_io *io) {
  return c->arena + (cl->t->has_length ? c->offsets[io->where] : io->where);
}

/* the start of sample s of a tensor at length n (a batched tensor's rows of one sample) */
static size_t kiln_sample_at(const kiln_io *io, int64_t s, int64_t n) {
  return io->batched ? (size_t)s * (size_t)kiln_elements(io, n) * (io->bits / 8) : 0;
}

/* the class a run at length n takes, and the length it computes at (*e) */
static int32_t kiln_class_for(const kiln_model *m, int64_t n, int64_t *e) {
  const kiln_plan_tables *t = m->classes[0].t;
  if (T.has_length) return *e = kiln_bound(t, n), 0;
  for (int32_t k = 0; k < m->class_count; ++k)
    if (m->classes[k].length >= n) return *e = m->classes[k].length, k;
  return *e = n, 0; /* (no length: one class) */
}

/* the plan of one sample, once per sample (batched tensors: that sample's rows), each run at
   length n where the model has a length (at E: a run-time length's max(n, floor), a padded
   class's length; tensors shorter than E padded with zeros into the context's buffers, outputs
   cut back) */
static kiln_status kiln_infer_runs(kiln_context *c, const DLTensor *inputs, DLTensor *outputs, int64_t samples, int64_t n) {
  const kiln_model *m = c->model;
  int64_t e = n;
  const int32_t k = kiln_class_for(m, n, &e);
  const kiln_class *cl = &m->classes[k];
  void **table = c->tables[k];
  const char *given[KILN_MAX_IO];
  for (int64_t s = 0; s < samples; ++s) {
    for (int i = 0; i < m->inputs; ++i) {
      const kiln_io *io = &cl->io[i];
      given[i] = (const char *)inputs[i].data + inputs[i].byte_offset + kiln_sample_at(io, s, n);
      if (io->axis >= 0 && e != n) { /* shorter than the plan runs: padded with zeros */
        kiln_resize(io, c->pad[i], e, given[i], n);
        given[i] = c->pad[i];
      }
      table[io->slot] = (void *)given[i];
    }
    for (int i = 0; i < m->outputs; ++i) {
      const kiln_io *io = &cl->io[m->inputs + i];
      char *to = (char *)outputs[i].data + outputs[i].byte_offset + kiln_sample_at(io, s, n);
      if (io->source == 0) table[io->slot] = io->axis >= 0 && e != n ? c->pad[m->inputs + i] : to;
    }
    const kiln_status ran = kiln_class_run(c, k, n, NULL);
    if (ran != KILN_OK) return ran;
    for (int i = 0; i < m->outputs; ++i) {
      const kiln_io *io = &cl->io[m->inputs + i];
      char *to = (char *)outputs[i].data + outputs[i].byte_offset + kiln_sample_at(io, s, n);
      const char *from = io->source == 0 ? (io->axis >= 0 && e != n ? c->pad[m->inputs + i] : NULL)
                       : io->source == 1 ? kiln_arena_at(c, cl, io)
                       : io->source == 2 ? cl->weights[io->where]
                       : given[io->where];
      if (!from) continue;
      if (io->axis >= 0)
        kiln_resize(io, to, n, from, e);
      else
        memmove(to, from, (size_t)io->elements * (io->bits / 8));
    }
  }
  return kiln_ok();
}

kiln_status kiln_model_output_shape(const kiln_model *m, const DLTensor *inputs, int input_count, int index, int64_t *shape) {
  if (!m || !shape || (m->inputs && !inputs)) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_output_shape: model, inputs or shape is NULL");
  const kiln_io *io = kiln_described(m);
  if (!io) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_output_shape: the model was bound without tensor descriptions");
  if (input_count != m->inputs || index < 0 || index >= m->outputs)
    return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_model_output_shape: %d inputs and output %d, the model takes %d and has %d", input_count, index, (int)m->inputs, (int)m->outputs);
  int64_t samples = -1, length = -1, vector[4096];
  for (int i = 0; i < m->inputs; ++i) {
    if (!inputs[i].data) return kiln_fail(KILN_ERROR_ARGUMENT, "input %d (%s): data is NULL", i, io[i].name);
    kiln_status status = kiln_check_tensor(m, "input", i, &io[i], &inputs[i], &samples, &length);
    if (status != KILN_OK) return status;
  }
  if (m->dim_count) {
    kiln_status status = kiln_dims_vector(m, inputs, vector);
    if (status != KILN_OK) return status;
  }
  const kiln_io *out = &io[m->inputs + index];
  for (int d = 0; d < out->ndim; ++d) {
    const int64_t e = m->dim_count ? m->io_dims[m->inputs + index][d] : -1;
    shape[d] = e >= 0 ? vector[e] : d == 0 && out->batched ? (samples < 0 ? 1 : samples) : d == out->axis ? (length < 0 ? m->length_min : length) : out->shape[d];
  }
  return kiln_ok();
}

kiln_status kiln_infer(kiln_context *context, const DLTensor *inputs, int input_count, DLTensor *outputs, int output_count) {
  if (!context) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: context is NULL");
  const kiln_model *m = context->model;
  if (!kiln_described(m)) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: the model was bound without tensor descriptions (kiln's Python runtime): load a weights file");
  if (input_count != m->inputs || output_count != m->outputs)
    return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: %d inputs and %d outputs given, the model takes %d and %d", input_count, output_count, (int)m->inputs, (int)m->outputs);
  if ((m->inputs && !inputs) || (m->outputs && !outputs)) return kiln_fail(KILN_ERROR_ARGUMENT, "kiln_infer: inputs or outputs is NULL");
  int64_t samples = -1, length = -1;
  const kiln_io *io = kiln_described(m);
  for (int i = 0; i < m->inputs; ++i) {
    kiln_status status = kiln_check_tensor(m, "input", i, &io[i], &inputs[i], &samples, &length);
    if (status != KILN_OK) return status;
  }
  for (int i = 0; i < m->outputs; ++i) {
    kiln_status status = kiln_check_tensor(m, "output", i, &io[m->inputs + i], &outputs[i], &samples, &length);
    if (status != KILN_OK) return status;
  }
  if (m->dim_count) return kiln_infer_dims(context, inputs, outputs);
  return kiln_infer_runs(context, inputs, outputs, samples < 0 ? 1 : samples, length < 0 ? (m->classes[0].t->has_length ? m->length_min : 0) : length);
}

#undef T
