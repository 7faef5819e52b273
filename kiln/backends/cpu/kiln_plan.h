/* kiln_plan.h: one compiled plan's tables as its own unit defines them (kiln_tables, written by
   kiln.backends.cpu.c_tables) and kiln's C API (capi.c) reads them. They are code, not data from a
   file: the buffer table's size, where each buffer lives, the arena at a run-time length. The
   Python runtime and a C program both run a plan through capi.c over these tables. */
#ifndef KILN_PLAN_H
#define KILN_PLAN_H

#include <stdint.h>

#define KILN_PLAN_TABLES_VERSION 1

typedef struct {
  int32_t version;   /* KILN_PLAN_TABLES_VERSION */
  const char *id;    /* the plan's unit's SHA-256 (hex): what a weights file must name */
  int64_t slots;     /* entries of the buffer table (slot 0: the status word) */
  const int64_t *slot_bytes; /* each slot's buffer bytes (at the capacity of a run-time length) */
  int64_t arena_bytes;       /* the arena (at the capacity) */
  int32_t constant_count;
  const int64_t *constant_slots; /* the weights' slots, in the weights file's order */
  int32_t arena_count;
  const int64_t (*arena)[2]; /* arena buffers: {slot, offset} (at the capacity) */
  int32_t input_count;
  const int64_t *input_slots; /* the plan's inputs in order (a run-time length's valid length last) */
  int32_t output_count;
  const int64_t *output_slots;
  /* a run-time length (has_length): the kernels read the length from valid_slot, at least floor;
     every arena buffer's bytes are c0 + c1 n + c2 n^2, placed where the last of those below it ends */
  int32_t has_length;
  int64_t valid_slot, floor, capacity;
  int32_t growing_count;
  const int64_t *growing_slots;
  const int64_t (*growing_sizes)[3];
  const int32_t *below_at; /* growing_count + 1 starts into below */
  const int32_t *below;
  /* integer constants whose values follow the length: each element c0 + c1 n + c2 n^2 */
  int32_t length_constant_count;
  const int64_t *length_constant_slots;
  const int32_t *length_constant_bits;
  const int32_t *length_constant_at; /* length_constant_count + 1 starts into the terms */
  const int64_t (*length_constant_terms)[3];
  uint32_t cpu_needs; /* bits (capi.c's kiln_cpu_flag) of the instructions the code was built for */
  int32_t int8_vnni;  /* the code's int8 products may take the AVX512-VNNI path */
  int (*run)(void **buffers, int (*host)(int gap)); /* the plan's entry (kiln_run) */
} kiln_plan_tables;

extern const kiln_plan_tables kiln_tables;
/* the library's plans: its one (the unit defines it), or a padded length's classes (a C library of
   them defines it over its renamed units' tables) */
const kiln_plan_tables *const *kiln_library_plans(int32_t *count);

#endif
