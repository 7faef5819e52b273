/* The weight-only int8 path of the matrix-multiply engine (precision "int8-weights"): C = A . B
   with A float32 activations, read in place (row-major, k contiguous), and B constant int8
   weights with one float32 scale per column (symmetric: B[k][j] = q[k][j] * scale[j]), packed when
   the plan was built in panels of KILN_NR columns ([panel][K][NR] bytes, zero padded: engine.py's
   pack_cols_int8). A decode step multiplies one row by every weight matrix of the model once:
   the bytes of B decide its speed, and int8 reads a quarter of float32's. Each B vector is
   widened to float32 in registers (sign-extend, convert: kiln_widen8, AVX-512 and AVX2
   instructions, element by element elsewhere) and multiplied as the float micro-kernel multiplies;
   the sums are scaled per column once, then finished (bias, activation, bounds) in registers
   like gemm.c's tiles, or by the generated epilogue.

   Work is split over the pool by column panels (each task a run of panels, every row of A):
   B streams from memory once, whatever M is, and a task's rows reuse its panel from L1/L2. */

/* KILN_L int8 weights widened to a float vector: one sign-extending load and one conversion
   (GCC's own vector conversion of int8 lanes goes element by element, 16x slower) */
#if defined(__AVX512F__) && KILN_VB == 64
#include <immintrin.h>
static inline __attribute__((always_inline)) kiln_vf kiln_widen8(const int8_t *p) {
  return (kiln_vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#elif defined(__AVX2__) && KILN_VB == 32
#include <immintrin.h>
static inline __attribute__((always_inline)) kiln_vf kiln_widen8(const int8_t *p) {
  return (kiln_vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#else
static inline __attribute__((always_inline)) kiln_vf kiln_widen8(const int8_t *p) {
  kiln_vf v;
  for (int i = 0; i < KILN_L; ++i) v[i] = (float)p[i];
  return v;
}
#endif

typedef struct {
  const kiln_gemm *g;
  int64_t panels, per_task;
} kiln_w8_plan;

/* from this many rows of A a panel is widened once per block (kiln_w8_panel_rows) rather than in
   registers per MR rows: at two tiles of rows the widening already costs more than the copy */
#define KILN_W8_WIDEN_ROWS (2 * KILN_MR)

/* `rows` (a constant at each call: the switch below) rows of A times one int8 panel, scaled by
   the panel's column scales, stored (finished when `f` is given) into c */
static inline __attribute__((always_inline)) void kiln_w8_rows_n(const int rows, int64_t k, const float *restrict a, int64_t lda, const int8_t *restrict b, const float *restrict scale, float *restrict c, int64_t ldc, const kiln_finish *f) {
  kiln_vf acc0[KILN_MR], acc1[KILN_MR];
#pragma GCC unroll 16
  for (int r = 0; r < rows; ++r) acc0[r] = acc1[r] = (kiln_vf){0};
  for (int64_t p = 0; p < k; ++p) {
    const kiln_vf b0 = kiln_widen8(b), b1 = kiln_widen8(b + KILN_L);
#pragma GCC unroll 16
    for (int r = 0; r < rows; ++r) {
      const float x = a[r * lda + p];
      acc0[r] += x * b0;
      acc1[r] += x * b1;
    }
    b += KILN_NR;
  }
  const kiln_vf s0 = *(const kiln_vfu *)scale, s1 = *(const kiln_vfu *)(scale + KILN_L);
#pragma GCC unroll 16
  for (int r = 0; r < rows; ++r) {
    acc0[r] *= s0;
    acc1[r] *= s1;
  }
  kiln_store_tile(rows, acc0, acc1, c, ldc, f);
}

/* mr <= MR rows of one panel, nr <= NR of its columns valid: a narrower tile goes through a
   scratch tile (the panel's padded columns are computed there, never stored) */
static void kiln_w8_tile(int64_t mr, int64_t nr, int64_t k, const float *a, int64_t lda, const int8_t *b, const float *scale, float *c, int64_t ldc, const kiln_finish *f) {
  float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));
  float cols[KILN_NR] __attribute__((aligned(64)));
  const int whole = nr == KILN_NR;
  float *out = whole ? c : tile;
  const int64_t ldo = whole ? ldc : KILN_NR;
  if (!whole) { /* the scales past the matrix's last column are never read: zeros in their place */
    memset(cols, 0, sizeof cols);
    memcpy(cols, scale, (size_t)nr * sizeof(float));
    scale = cols;
  }
  const kiln_finish *inner = whole ? f : NULL;
  switch (mr) {
#define KILN_W8_CASE(n) \
  case n: kiln_w8_rows_n(n, k, a, lda, b, scale, out, ldo, inner); break;
    KILN_W8_CASE(1)
#if KILN_MR >= 2
    KILN_W8_CASE(2)
#endif
#if KILN_MR >= 3
    KILN_W8_CASE(3)
#endif
#if KILN_MR >= 4
    KILN_W8_CASE(4)
#endif
#if KILN_MR >= 5
    KILN_W8_CASE(5)
#endif
#if KILN_MR >= 6
    KILN_W8_CASE(6)
#endif
#if KILN_MR >= 7
    KILN_W8_CASE(7)
#endif
#if KILN_MR >= 8
    KILN_W8_CASE(8)
#endif
#if KILN_MR > 8
#error "kiln_w8_tile: add the cases of this KILN_MR"
#endif
#undef KILN_W8_CASE
    default: break;
  }
  if (!whole) {
    for (int64_t r = 0; r < mr; ++r) memcpy(c + r * ldc, tile + r * KILN_NR, (size_t)nr * sizeof(float));
    if (f) kiln_finish_tile(f, c, ldc, mr, nr);
  }
}

/* many rows (a prompt's): the panel widened and scaled once per KC-deep block into float32 (what
   the float micro-kernel streams), then every row of A multiplied by it as gemm.c multiplies an A
   read in place; the widening is paid once per block, not once per MR rows */
static void kiln_w8_panel_rows(const kiln_gemm *g, int64_t bt, const int8_t *b, const float *scale, int64_t n0, int64_t nr) {
  static _Thread_local float *block;
  static _Thread_local int64_t have;
  const int64_t K = g->K, kblock = KILN_KC;
  float *panel = kiln_scratch(&block, &have, kblock * KILN_NR);
  float cols[KILN_NR] __attribute__((aligned(64))) = {0};
  memcpy(cols, scale, (size_t)nr * sizeof(float)); /* (columns past the matrix: scale 0) */
  const kiln_vf s0 = *(const kiln_vf *)cols, s1 = *(const kiln_vf *)(cols + KILN_L);
  for (int64_t k0 = 0; k0 < K; k0 += kblock) {
    const int64_t kc = K - k0 < kblock ? K - k0 : kblock;
    for (int64_t p = 0; p < kc; ++p) {
      const int8_t *from = b + (k0 + p) * KILN_NR;
      *(kiln_vf *)(panel + p * KILN_NR) = kiln_widen8(from) * s0;
      *(kiln_vf *)(panel + p * KILN_NR + KILN_L) = kiln_widen8(from + KILN_L) * s1;
    }
    kiln_block_rows(g, bt, panel, k0, kc, n0, nr);
  }
}

static void kiln_w8_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  (void)worker;
  const kiln_w8_plan *p = (const kiln_w8_plan *)ctx;
  const kiln_gemm *g = p->g;
  const int64_t M = g->M, N = g->N, K = g->K;
  const int8_t *weights = (const int8_t *)g->b_low;
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / ((p->panels + p->per_task - 1) / p->per_task);
    const int64_t first = (task % ((p->panels + p->per_task - 1) / p->per_task)) * p->per_task;
    const int64_t last = first + p->per_task < p->panels ? first + p->per_task : p->panels;
    for (int64_t panel = first; panel < last; ++panel) {
      const int64_t n0 = panel * KILN_NR, nr = N - n0 < KILN_NR ? N - n0 : KILN_NR;
      const int64_t at = bt * g->b_pbs + panel * K * KILN_NR;
      const int8_t *b = weights + KILN_SPAN(at, K * KILN_NR, g->b_packed_size, "B (int8 panels)");
      if (M >= KILN_W8_WIDEN_ROWS) {
        kiln_w8_panel_rows(g, bt, b, g->q_scale + n0, n0, nr);
        continue;
      }
      for (int64_t m0 = 0; m0 < M; m0 += KILN_MR) {
        const int64_t mr = M - m0 < KILN_MR ? M - m0 : KILN_MR;
        const int64_t from = bt * g->a_bs + m0 * g->a_rs;
        (void)KILN_SPAN(from, (mr - 1) * g->a_rs + K, g->a_size, "A (in place)");
        const int64_t to = bt * g->c_bs + m0 * g->ldc + n0;
        (void)KILN_SPAN(to, (mr - 1) * g->ldc + nr, g->c_size, "C");
        kiln_finish fin;
        kiln_w8_tile(mr, nr, K, g->a + from, g->a_rs, b, g->q_scale + n0, g->c + to, g->ldc, kiln_finish_at(g, m0, n0, &fin));
        if (g->epilogue) g->epilogue(g, bt, m0, m0 + mr, n0, n0 + nr);
      }
    }
  }
}

KILN_ENGINE void kiln_gemm_w8_run(const kiln_gemm *g) {
  if (g->M <= 0 || g->N <= 0) return;
  /* a prompt's rows in bf16 or int8 ("-bf16", "-a8"); with "-a8" a decode step's few rows in int8 too
     (bits -8: gemm_wa8.c's kiln_wa8_few) */
  if (g->q_wide && g->q_wide(g, g->M >= KILN_W8_WIDEN_ROWS ? 8 : -8)) return;
  kiln_w8_plan plan = {g, (g->N + KILN_NR - 1) / KILN_NR, 1};
  kiln_panel_tasks(g, plan.panels, &plan.per_task, kiln_w8_tasks, &plan);
}
