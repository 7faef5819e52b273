/* The matrix-multiply engine's descriptor (gemm.c) and the entry points generated code calls:
   in the generated translation unit with the engine (debug builds) or apart from it, in the
   engine object every model library links (gemm.c, its reduced-precision paths, the Winograd
   transforms, attention and the thread pool, compiled once per target: c_unit.engine_source).
   KILN_ENGINE: `static` in one translation unit, hidden (not exported) across two. */
#include <stdlib.h>
#include <string.h>

typedef struct kiln_gemm kiln_gemm;
typedef void (*kiln_pack_fn)(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst);
typedef void (*kiln_epilogue_fn)(const kiln_gemm *g, int64_t bt, int64_t i0, int64_t i1, int64_t j0, int64_t j1);

struct kiln_gemm {
  int64_t batch, M, N, K;
  /* A[b][i][k] = a[b * a_bs + i * a_rs + k * a_cs]; a_packed (when set) holds every panel for
     every batch element (batch stride a_pbs) */
  const float *a; int64_t a_bs, a_rs, a_cs;
  const float *a_packed; int64_t a_pbs;
  kiln_pack_fn pack_a;
  /* B[b][k][j] = b[b * b_bs + k * b_rs + j * b_cs], or b_packed, or pack_b (im2col) */
  const float *b; int64_t b_bs, b_rs, b_cs;
  const float *b_packed; int64_t b_pbs;
  kiln_pack_fn pack_b;
  float *c; int64_t c_bs, ldc;
  kiln_epilogue_fn epilogue;
  /* a fused epilogue applied to a finished tile's accumulators in registers (fp32 only; set instead
     of `epilogue`, which computes the same): + f_row[i] (a convolution's bias per output channel),
     + f_col[j] (a linear layer's), then f_relu (x < 0 ? 0 : x) and the bounds f_lo, f_hi (x <= lo ? lo
     : x, then x >= hi ? hi : x; -inf and inf when absent) */
  const float *f_row, *f_col; int f_on, f_relu; float f_lo, f_hi;
  /* the reduced-precision paths (gemm_lowp.c): constant operands packed in the narrow format when
     the plan was built (then a_pbs, b_pbs are their batch strides and a_packed_size,
     b_packed_size their sizes in elements) */
  const void *a_low, *b_low;
  /* int8 (gemm_int8.c): per-channel scales and int32 offsets (channel: the row of C when
     q_rows, else the column), and the float activations' quantization (q = x * q_inv + q_zero,
     clamped to [0, q_max]) */
  const float *q_scale; const int32_t *q_offset; int q_rows;
  /* int4 weights (gemm_w4.c): k-steps per group of B's codes, each group's float16 scale (its
     bits) and float32 offset (NULL: symmetric, -8 x its scale) */
  const uint16_t *q_half; const float *q_min; int64_t q_group;
  /* weight-only int8 (int4) compiled with "-bf16" or "-a8": many rows through the bf16 or int8
     kernels (gemm_wbf16.c's kiln_gemm_wbf16_run, gemm_wa8.c's kiln_gemm_wa8_run, given `bits`;
     -8: a decode step's few rows of int8 weights, which only the int8 kernels take); returns 0 where
     it did not run them */
  int (*q_wide)(const kiln_gemm *g, int bits);
  float q_inv; int32_t q_zero, q_max;
  const uint8_t *q_source; /* B's float activations quantized once, same indexing as b (gemm_int8.c) */
  const uint8_t *q_given;  /* the activations (A of a MatMul, B of a convolution) quantized already by
                              their producer, same indexing and parameters (or NULL: quantized here) */
  uint8_t *r_out;          /* the finished C also stored quantized for the int8 products reading it:
                              r_out[i] = clamp(rint(c[i] * r_inv) + r_zero, 0, r_max) (or NULL) */
  float r_inv; int32_t r_zero, r_max;
  int r_only;               /* nothing reads the float C: each tile finished in a scratch (the f_ fields:
                              bias, Relu, bounds) and stored as r_out (h_out) only (kiln.lower.quantized_only) */
  const uint16_t *h_given; /* bf16 (gemm_bf16.c): the activations rounded to bfloat16 already by their
                              producer, same indexing (or NULL: converted here) */
  uint16_t *h_out;         /* bf16: the finished C also stored as bfloat16 for the bf16 products
                              reading it (round to nearest even, the conversion they would do) */
  int64_t q_given_size;     /* elements of q_given or h_given, for KILN_DEBUG checks (r_out, h_out have c_size) */
  int direct; /* a convolution on the direct path (gemm_lowp.c): b the input, conv = (C H W KH KW PT PL OH OW SH SW NHWC) */
  void **buffers;           /* the segment's buffer table, for the epilogue */
  const int64_t *conv;      /* im2col geometry: C H W KH KW SH SW DH DW PT PL OH OW */
  int64_t mc, nc, kc;       /* cache blocking chosen by the autotuner (0: the defaults below) */
  int64_t a_size, b_size, c_size, a_packed_size, b_packed_size; /* elements, for KILN_DEBUG checks */
};

KILN_ENGINE void kiln_gemm_run(const kiln_gemm *g);
KILN_ENGINE void kiln_pack_a_strided(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst);
KILN_ENGINE void kiln_pack_b_strided(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst);
KILN_ENGINE void kiln_pack_im2col(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst);
