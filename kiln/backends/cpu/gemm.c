/* kiln's matrix-multiply engine: compiled into the engine object every model library links
   (c_unit.engine_source), or, in debug builds, included in the generated unit. Its descriptor,
   kiln_gemm, is gemm_api.h's.

   C[b] = A[b] . B[b] (+ epilogue) for b in [0, batch), A: M x K, B: K x N, C: M x N row-major with
   leading dimension ldc. The register-blocked micro-kernel computes a KILN_MR x KILN_NR tile with
   KILN_MR * 2 vector accumulators (GCC vector extensions, so the same source gives AVX2, AVX-512 or
   NEON code; KILN_VB, the vector bytes, and KILN_MR come from the target, and so do the default cache
   blocks KILN_KC and KILN_A_BLOCK: CpuTarget.blocking, from the machine's L1d and L2).

   Operands arrive "packed": A in panels of KILN_MR rows stored k-major ([K][MR] per panel), B in
   panels of KILN_NR columns ([K][NR] per panel), zero padded at the edges. Constant operands (the
   weights) are packed once, ahead of time; the others are packed here per cache block by a packer
   (strided matrix, or im2col for convolutions). Loops follow the BLIS blocking: a KC-deep slice,
   an MC x KC block of A kept in L2, a KC x NR micro-panel of B kept in L1.

   Work is split across OpenMP threads as (batch, M block, N block) tasks. The epilogue (bias,
   activation, residual, ...) is generated per kernel and applied to each micro-tile right after its
   last K slice, while the tile is in L1. */

#include <stdlib.h>
#include <string.h>

#define KILN_L (KILN_VB / 4)
#define KILN_NR (2 * KILN_L)

/* KILN_DEBUG: every element the engine reads or writes through an operand is checked against the
   operand's size (kiln_checked, from the debug prelude); otherwise the checks compile away */
#ifdef KILN_DEBUG
#define KILN_AT(index, size, what) kiln_checked((index), (size), (what), __LINE__)
#define KILN_SPAN(first, count, size, what) \
  (kiln_checked((first), (size), (what), __LINE__), kiln_checked((first) + (count) - 1, (size), (what), __LINE__), (first))
#else
#define KILN_AT(index, size, what) (index)
#define KILN_SPAN(first, count, size, what) (first)
#endif

typedef float kiln_vf __attribute__((vector_size(KILN_VB)));
typedef float kiln_vfu __attribute__((vector_size(KILN_VB), aligned(4))); /* unaligned access */


/* -- a fused epilogue in registers ------------------------------------------------------------ */

typedef int32_t kiln_vi __attribute__((vector_size(KILN_VB)));

typedef struct {
  const float *row, *col; /* at the tile's first row / column, or NULL */
  int relu;
  float lo, hi;
} kiln_finish;

static inline __attribute__((always_inline)) kiln_vf kiln_select(kiln_vi mask, kiln_vf yes, kiln_vf no) {
  return (kiln_vf)(((kiln_vi)yes & mask) | ((kiln_vi)no & ~mask));
}

/* one accumulator vector of row r, columns [j, j + KILN_L) of the tile, finished */
static inline __attribute__((always_inline)) kiln_vf kiln_finish_v(const kiln_finish *f, kiln_vf v, int r, int j) {
  if (f->row) v += f->row[r];
  if (f->col) v += *(const kiln_vfu *)(f->col + j);
  const kiln_vf zero = {0}, lo = (kiln_vf){0} + f->lo, hi = (kiln_vf){0} + f->hi;
  if (f->relu) v = kiln_select(v < zero, zero, v);
  v = kiln_select(v <= lo, lo, v);
  return kiln_select(v >= hi, hi, v);
}

/* the same on a tile in memory (edge tiles) */
static void kiln_finish_tile(const kiln_finish *f, float *c, int64_t ldc, int64_t mr, int64_t nr) {
  for (int64_t r = 0; r < mr; ++r)
    for (int64_t j = 0; j < nr; ++j) {
      float v = c[r * ldc + j];
      if (f->row) v += f->row[r];
      if (f->col) v += f->col[j];
      if (f->relu) v = v < 0.0f ? 0.0f : v;
      v = v <= f->lo ? f->lo : v;
      c[r * ldc + j] = v >= f->hi ? f->hi : v;
    }
}

/* a tile's `rows` accumulator rows stored, finished first when `f` is given */
static inline __attribute__((always_inline)) void kiln_store_tile(const int rows, kiln_vf *acc0, kiln_vf *acc1, float *restrict c, int64_t ldc, const kiln_finish *f) {
  if (f) {
#pragma GCC unroll 16
    for (int r = 0; r < rows; ++r) {
      acc0[r] = kiln_finish_v(f, acc0[r], r, 0);
      acc1[r] = kiln_finish_v(f, acc1[r], r, KILN_L);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < rows; ++r) {
    *(kiln_vfu *)(c + r * ldc) = acc0[r];
    *(kiln_vfu *)(c + r * ldc + KILN_L) = acc1[r];
  }
}

/* -- the micro-kernel --------------------------------------------------------------------------- */

static inline void kiln_ukernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c, int64_t ldc, int accumulate, const kiln_finish *f) {
  kiln_vf acc0[KILN_MR], acc1[KILN_MR];
#pragma GCC unroll 16
  for (int r = 0; r < KILN_MR; ++r) {
    if (accumulate) {
      acc0[r] = *(const kiln_vfu *)(c + r * ldc);
      acc1[r] = *(const kiln_vfu *)(c + r * ldc + KILN_L);
    } else {
      acc0[r] = (kiln_vf){0};
      acc1[r] = (kiln_vf){0};
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    kiln_vf b0 = *(const kiln_vf *)b, b1 = *(const kiln_vf *)(b + KILN_L);
#pragma GCC unroll 16
    for (int r = 0; r < KILN_MR; ++r) {
      acc0[r] += a[r] * b0; /* scalar * vector: a broadcast */
      acc1[r] += a[r] * b1;
    }
    a += KILN_MR;
    b += KILN_NR;
  }
  kiln_store_tile(KILN_MR, acc0, acc1, c, ldc, f);
}

/* the micro-kernel over an A read in place: `rows` (up to MR) rows a + r * lda, each contiguous
   along k (the activations of x . W, row-major): no packing pass, and no second parallel phase to
   wait for. Fewer than MR rows (a batch-1 linear layer, a decode step) multiply only their own
   accumulators. `rows` is a constant at every call (kiln_ukernel_rows_few's switch, the MR-row
   tile), so the loops over it unroll into registers. */
static inline __attribute__((always_inline)) void kiln_rows_n(const int rows, int64_t kc, const float *restrict a, int64_t lda, const float *restrict b, float *restrict c, int64_t ldc, int accumulate, const kiln_finish *f) {
  kiln_vf acc0[KILN_MR], acc1[KILN_MR];
#pragma GCC unroll 16
  for (int r = 0; r < rows; ++r) {
    acc0[r] = accumulate ? *(const kiln_vfu *)(c + r * ldc) : (kiln_vf){0};
    acc1[r] = accumulate ? *(const kiln_vfu *)(c + r * ldc + KILN_L) : (kiln_vf){0};
  }
  for (int64_t k = 0; k < kc; ++k) {
    const kiln_vf b0 = *(const kiln_vf *)b, b1 = *(const kiln_vf *)(b + KILN_L);
#pragma GCC unroll 16
    for (int r = 0; r < rows; ++r) {
      const float x = a[r * lda + k];
      acc0[r] += x * b0;
      acc1[r] += x * b1;
    }
    b += KILN_NR;
  }
  kiln_store_tile(rows, acc0, acc1, c, ldc, f);
}

/* an edge tile (mr <= MR rows, nr <= NR columns) of an A read in place; a narrower one through a
   scratch tile */
static void kiln_ukernel_rows_few(int64_t kc, const float *a, int64_t lda, const float *b, float *c, int64_t ldc, int accumulate, int64_t mr, int64_t nr) {
  float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));
  float *out = c;
  int64_t ldo = ldc;
  if (nr < KILN_NR) {
    out = tile;
    ldo = KILN_NR;
    if (accumulate)
      for (int64_t r = 0; r < mr; ++r) memcpy(tile + r * KILN_NR, c + r * ldc, (size_t)nr * sizeof(float));
  }
  switch (mr) {
#define KILN_ROWS_CASE(n) \
  case n: kiln_rows_n(n, kc, a, lda, b, out, ldo, accumulate, NULL); break;
    KILN_ROWS_CASE(1)
#if KILN_MR >= 2
    KILN_ROWS_CASE(2)
#endif
#if KILN_MR >= 3
    KILN_ROWS_CASE(3)
#endif
#if KILN_MR >= 4
    KILN_ROWS_CASE(4)
#endif
#if KILN_MR >= 5
    KILN_ROWS_CASE(5)
#endif
#if KILN_MR >= 6
    KILN_ROWS_CASE(6)
#endif
#if KILN_MR >= 7
    KILN_ROWS_CASE(7)
#endif
#if KILN_MR >= 8
    KILN_ROWS_CASE(8)
#endif
#if KILN_MR > 8
#error "kiln_ukernel_rows_few: add the cases of this KILN_MR"
#endif
#undef KILN_ROWS_CASE
    default: break;
  }
  if (nr < KILN_NR)
    for (int64_t r = 0; r < mr; ++r) memcpy(c + r * ldc, tile + r * KILN_NR, (size_t)nr * sizeof(float));
}

/* an edge tile (mr < MR or nr < NR): computed whole in a scratch tile, the valid part copied */
static void kiln_ukernel_edge(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int accumulate, int64_t mr, int64_t nr) {
  float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));
  if (accumulate)
    for (int64_t r = 0; r < mr; ++r) memcpy(tile + r * KILN_NR, c + r * ldc, (size_t)nr * sizeof(float));
  kiln_ukernel(kc, a, b, tile, KILN_NR, accumulate, NULL);
  for (int64_t r = 0; r < mr; ++r) memcpy(c + r * ldc, tile + r * KILN_NR, (size_t)nr * sizeof(float));
}

/* an edge tile at most one vector wide (nr <= L: a 49-pixel plane's last 1 column, say): half the
   multiplies of a full-width edge tile, over the same packed panels */
static void kiln_ukernel_half(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int accumulate, int64_t mr, int64_t nr) {
  float tile[KILN_MR * KILN_L] __attribute__((aligned(64)));
  kiln_vf acc[KILN_MR];
  if (accumulate)
    for (int64_t r = 0; r < mr; ++r) memcpy(tile + r * KILN_L, c + r * ldc, (size_t)nr * sizeof(float));
#pragma GCC unroll 16
  for (int r = 0; r < KILN_MR; ++r) acc[r] = accumulate ? *(const kiln_vf *)(tile + r * KILN_L) : (kiln_vf){0};
  for (int64_t k = 0; k < kc; ++k) {
    const kiln_vf b0 = *(const kiln_vf *)b;
#pragma GCC unroll 16
    for (int r = 0; r < KILN_MR; ++r) acc[r] += a[r] * b0;
    a += KILN_MR;
    b += KILN_NR;
  }
#pragma GCC unroll 16
  for (int r = 0; r < KILN_MR; ++r) *(kiln_vf *)(tile + r * KILN_L) = acc[r];
  for (int64_t r = 0; r < mr; ++r) memcpy(c + r * ldc, tile + r * KILN_L, (size_t)nr * sizeof(float));
}

/* -- packers ------------------------------------------------------------------------------------ */

/* rows x0..x0+xc of A (k0..k0+kc) into MR-row panels, zero padded */
KILN_ENGINE void kiln_pack_a_strided(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst) {
  const int64_t base = bt * g->a_bs;
  for (int64_t p = 0; p < xc; p += KILN_MR) {
    int64_t rows = xc - p < KILN_MR ? xc - p : KILN_MR;
    for (int64_t k = 0; k < kc; ++k) {
      int64_t r = 0;
      for (; r < rows; ++r) dst[k * KILN_MR + r] = g->a[KILN_AT(base + (x0 + p + r) * g->a_rs + (k0 + k) * g->a_cs, g->a_size, "A")];
      for (; r < KILN_MR; ++r) dst[k * KILN_MR + r] = 0.0f;
    }
    dst += kc * KILN_MR;
  }
}

/* columns x0..x0+xc of B (k0..k0+kc) into NR-column panels, zero padded; row by row, so the
   source is read in order */
KILN_ENGINE void kiln_pack_b_strided(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst) {
  const int64_t full = xc / KILN_NR, panel = kc * KILN_NR;
  for (int64_t k = 0; k < kc; ++k) {
    const int64_t start = bt * g->b_bs + (k0 + k) * g->b_rs + x0 * g->b_cs;
    KILN_SPAN(start, (xc - 1) * g->b_cs + 1, g->b_size, "B"); /* the row's first and last element */
    const float *row = g->b + start;
    float *out = dst + k * KILN_NR;
    if (g->b_cs == 1) {
      for (int64_t p = 0; p < full; ++p) {
        *(kiln_vf *)(out + p * panel) = *(const kiln_vfu *)(row + p * KILN_NR);
        *(kiln_vf *)(out + p * panel + KILN_L) = *(const kiln_vfu *)(row + p * KILN_NR + KILN_L);
      }
    } else {
      for (int64_t p = 0; p < full; ++p)
        for (int64_t j = 0; j < KILN_NR; ++j) out[p * panel + j] = row[(p * KILN_NR + j) * g->b_cs];
    }
    if (full * KILN_NR < xc) {
      float *tail = out + full * panel;
      int64_t j = 0;
      for (; j < xc - full * KILN_NR; ++j) tail[j] = row[(full * KILN_NR + j) * g->b_cs];
      for (; j < KILN_NR; ++j) tail[j] = 0.0f;
    }
  }
}

/* rows x0..x0+xc of a column-contiguous B (b_rs == 1: attention's K^T read from K's rows) into NR-column
   panels: each column is one contiguous run of the source */
static void kiln_pack_b_columns(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst) {
  for (int64_t p = 0; p < xc; p += KILN_NR) {
    const int64_t cols = xc - p < KILN_NR ? xc - p : KILN_NR;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t start = bt * g->b_bs + (x0 + p + j) * g->b_cs + k0;
      const float *column = g->b + KILN_SPAN(start, kc, g->b_size, "B (columns)");
      for (int64_t k = 0; k < kc; ++k) dst[k * KILN_NR + j] = column[k];
    }
    for (int64_t j = cols; j < KILN_NR; ++j)
      for (int64_t k = 0; k < kc; ++k) dst[k * KILN_NR + j] = 0.0f;
    dst += kc * KILN_NR;
  }
}

/* one row k (= (ic, kh, kw)) of the im2col matrix, columns x0..x0+xc, into out (runs along output
   rows: the in-image span copied without per-element bounds tests); `source` is image bt's start
   and `pad` what lies outside the image. One body for float images (kiln_im2col_row) and for the
   int8 path's quantized ones (kiln_im2col_row_u8, padding the zero point). */
#define KILN_IM2COL_ROW(name, T)                                                                                      \
  static void name(const kiln_gemm *g, const T *source, int64_t bt, int64_t x0, int64_t xc, int64_t kk, T *out, T pad) { \
    const int64_t *q = g->conv;                                                                                       \
    const int64_t H = q[1], W = q[2], KH = q[3], KW = q[4], SH = q[5], SW = q[6], DH = q[7], DW = q[8], PT = q[9],   \
                  PL = q[10], OW = q[12];                                                                             \
    const int64_t ic = kk / (KH * KW), kh = (kk / KW) % KH, kw = kk % KW;                                             \
    const T *plane = source + ic * H * W;                                                                             \
    int64_t oh = x0 / OW, ow = x0 % OW, j = 0;                                                                        \
    while (j < xc) {                                                                                                  \
      const int64_t run = OW - ow < xc - j ? OW - ow : xc - j;                                                        \
      const int64_t ih = oh * SH - PT + kh * DH;                                                                      \
      T *o = out + j;                                                                                                 \
      if (ih < 0 || ih >= H) {                                                                                        \
        for (int64_t t = 0; t < run; ++t) o[t] = pad;                                                                 \
      } else {                                                                                                        \
        /* output columns whose input column (ow+t)*SW - PL + kw*DW lies in [0, W) */                                 \
        const int64_t shift = kw * DW - PL;                                                                           \
        int64_t lo = 0, hi = run;                                                                                     \
        while (lo < run && (ow + lo) * SW + shift < 0) ++lo;                                                          \
        while (hi > lo && (ow + hi - 1) * SW + shift >= W) --hi;                                                      \
        const T *src = plane + ih * W + ow * SW + shift;                                                              \
        if (hi > lo)                                                                                                  \
          KILN_SPAN(bt * g->b_bs + ic * H * W + ih * W + (ow + lo) * SW + shift, (hi - lo - 1) * SW + 1, g->b_size,   \
                    "B (im2col input)");                                                                              \
        for (int64_t t = 0; t < lo; ++t) o[t] = pad;                                                                  \
        if (SW == 1)                                                                                                  \
          memcpy(o + lo, src + lo, (size_t)(hi - lo) * sizeof(T));                                                    \
        else if (SW == 2) /* (a constant stride: vectorized as even-element extraction) */                            \
          for (int64_t t = lo; t < hi; ++t) o[t] = src[2 * t];                                                        \
        else                                                                                                          \
          for (int64_t t = lo; t < hi; ++t) o[t] = src[t * SW];                                                       \
        for (int64_t t = hi; t < run; ++t) o[t] = pad;                                                                \
      }                                                                                                               \
      j += run;                                                                                                       \
      ow = 0;                                                                                                         \
      ++oh;                                                                                                           \
    }                                                                                                                 \
  }
KILN_IM2COL_ROW(kiln_im2col_row_any, float)
KILN_IM2COL_ROW(kiln_im2col_row_u8, uint8_t)

static inline void kiln_im2col_row(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t kk, float *out) {
  kiln_im2col_row_any(g, g->b + bt * g->b_bs, bt, x0, xc, kk, out, 0.0f);
}

/* im2col: B[k][p] = x[ic][oh*SH - PT + kh*DH][ow*SW - PL + kw*DW] (0 outside the image), with
   k = (ic, kh, kw) and p = (oh, ow); columns x0..x0+xc into NR-column panels. Built one k row at
   a time into a contiguous scratch row, then scattered into the panels. */
KILN_ENGINE void kiln_pack_im2col(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst) {
  const int64_t full = xc / KILN_NR, panel = kc * KILN_NR, padded = (full + (full * KILN_NR < xc)) * KILN_NR;
  float row[padded] __attribute__((aligned(64)));
  for (int64_t k = 0; k < kc; ++k) {
    kiln_im2col_row(g, bt, x0, xc, k0 + k, row);
    for (int64_t j = xc; j < padded; ++j) row[j] = 0.0f;
    float *o = dst + k * KILN_NR;
    for (int64_t p = 0; p < padded / KILN_NR; ++p) {
      *(kiln_vf *)(o + p * panel) = *(const kiln_vfu *)(row + p * KILN_NR);
      *(kiln_vf *)(o + p * panel + KILN_L) = *(const kiln_vfu *)(row + p * KILN_NR + KILN_L);
    }
  }
}

/* -- the driver --------------------------------------------------------------------------------- */

static float *kiln_scratch(float **slot, int64_t *have, int64_t need) {
  if (*have < need) {
    free(*slot);
    *slot = (float *)aligned_alloc(64, (size_t)((need * sizeof(float) + 63) / 64 * 64));
    *have = *slot ? need : 0;
  }
  return *slot;
}

static int64_t kiln_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* How many column tiles to cut `panels` NR-wide panels into, given `fixed` tasks per column tile
   (batch x row tiles) and `threads` participants, from `at_least` up: the fewest (the largest
   tiles) whose busiest thread does within 5% of an even share, else the best balance up to eight
   tasks per thread. Nine equal tasks on two threads leave one thread idle a ninth of the time;
   ten slightly smaller ones do not. */
static int64_t kiln_balanced_tiles(int64_t panels, int64_t fixed, int64_t at_least, int threads) {
  int64_t best = at_least;
  double best_share = 0.0;
  for (int64_t t = at_least; t <= panels && fixed * t <= 8 * (int64_t)threads; ++t) {
    const int64_t per = (panels + t - 1) / t, tiles = (panels + per - 1) / per;
    const int64_t busiest = (fixed * tiles + threads - 1) / threads * per; /* panels, at most */
    const double share = (double)(fixed * panels) / (double)threads / (double)busiest;
    if (share >= 0.95) return t;
    if (share > best_share) {
      best_share = share;
      best = t;
    }
  }
  return best;
}

#define KILN_SHARED_LIMIT (16 << 20) /* bytes: operands packed whole, once, up to this size */

/* what the parallel phases of one product share (kiln_parallel_for's context) */
typedef struct {
  const kiln_gemm *g;
  int64_t M, N, K, kblock, mc, nc, tiles_m, tiles_n, panels_a, panels_b, a_pbs, b_pbs;
  int direct_a; /* A read in place (row-major, k contiguous): never packed */
  float *all_a, *all_b;
  const float *a_packed, *b_packed;
} kiln_gemm_plan;

enum { KILN_PACK_CHUNK = 8 }; /* panels per packing call */

/* packers write panels of the block they are given with a panel stride of kc * width: with kc = K,
   a run of whole panels lands exactly where the shared layout wants it */
static void kiln_gemm_pack_a(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_gemm_plan *p = (const kiln_gemm_plan *)ctx;
  const int64_t chunks = (p->panels_a + KILN_PACK_CHUNK - 1) / KILN_PACK_CHUNK;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t bt = i / chunks, row = (i % chunks) * KILN_PACK_CHUNK * KILN_MR;
    const int64_t rows = p->M - row < KILN_PACK_CHUNK * KILN_MR ? p->M - row : KILN_PACK_CHUNK * KILN_MR;
    p->g->pack_a(p->g, bt, row, rows, 0, p->K, p->all_a + bt * p->a_pbs + (row / KILN_MR) * p->K * KILN_MR);
  }
}

static void kiln_gemm_pack_b(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_gemm_plan *p = (const kiln_gemm_plan *)ctx;
  const int64_t chunks = (p->panels_b + KILN_PACK_CHUNK - 1) / KILN_PACK_CHUNK;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t bt = i / chunks, col = (i % chunks) * KILN_PACK_CHUNK * KILN_NR;
    const int64_t cols = p->N - col < KILN_PACK_CHUNK * KILN_NR ? p->N - col : KILN_PACK_CHUNK * KILN_NR;
    p->g->pack_b(p->g, bt, col, cols, 0, p->K, p->all_b + bt * p->b_pbs + (col / KILN_NR) * p->K * KILN_NR);
  }
}

/* tasks [lo, hi): each an (image, M block, N block) of the product */
static void kiln_gemm_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_gemm_plan *p = (const kiln_gemm_plan *)ctx;
  const kiln_gemm *g = p->g;
  const int64_t M = p->M, N = p->N, K = p->K, kblock = p->kblock, mc = p->mc, nc = p->nc;
  const int64_t tiles_m = p->tiles_m, tiles_n = p->tiles_n, a_pbs = p->a_pbs, b_pbs = p->b_pbs;
  const float *a_packed = p->a_packed, *b_packed = p->b_packed;
  const float *all_a = p->all_a, *all_b = p->all_b;
  (void)all_a;
  (void)all_b;
  static _Thread_local float *a_buf, *b_buf;
  static _Thread_local int64_t a_have, b_have;
  const int direct_a = p->direct_a; /* A read in place: no A panels */
  float *abuf = a_packed || direct_a ? NULL : kiln_scratch(&a_buf, &a_have, mc * kblock);
  float *bbuf = b_packed ? NULL : kiln_scratch(&b_buf, &b_have, nc * kblock);
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / (tiles_m * tiles_n), rest = task % (tiles_m * tiles_n);
    const int64_t m0 = (rest / tiles_n) * mc, n0 = (rest % tiles_n) * nc;
    const int64_t mlen = M - m0 < mc ? M - m0 : mc, nlen = N - n0 < nc ? N - n0 : nc;
    float *c = g->c + bt * g->c_bs;
    for (int64_t k0 = 0; k0 < K; k0 += kblock) {
      const int64_t kc = K - k0 < kblock ? K - k0 : kblock;
      const float *ablock, *bblock;
      int64_t a_stride, b_stride; /* between panels */
      if (a_packed) {
        ablock = a_packed + bt * a_pbs + (m0 / KILN_MR) * K * KILN_MR + k0 * KILN_MR;
        a_stride = K * KILN_MR;
      } else if (direct_a) {
        ablock = NULL; /* panels packed one by one below, only at the edges */
        a_stride = 0;
      } else {
        g->pack_a(g, bt, m0, mlen, k0, kc, abuf);
        ablock = abuf;
        a_stride = kc * KILN_MR;
      }
      if (b_packed) {
        bblock = b_packed + bt * b_pbs + (n0 / KILN_NR) * K * KILN_NR + k0 * KILN_NR;
        b_stride = K * KILN_NR;
      } else {
        g->pack_b(g, bt, n0, nlen, k0, kc, bbuf);
        bblock = bbuf;
        b_stride = kc * KILN_NR;
      }
      const int last = k0 + kc >= K;
#ifdef KILN_DEBUG
      if (a_packed) /* the panels this block reads, whole */
        KILN_SPAN(bt * a_pbs + (m0 / KILN_MR) * K * KILN_MR, ((mlen + KILN_MR - 1) / KILN_MR - 1) * K * KILN_MR + K * KILN_MR, all_a ? g->batch * a_pbs : g->a_packed_size, "A (packed)");
      if (b_packed)
        KILN_SPAN(bt * b_pbs + (n0 / KILN_NR) * K * KILN_NR, ((nlen + KILN_NR - 1) / KILN_NR - 1) * K * KILN_NR + K * KILN_NR, all_b ? g->batch * b_pbs : g->b_packed_size, "B (packed)");
      KILN_SPAN(bt * g->c_bs + m0 * g->ldc + n0, (mlen - 1) * g->ldc + nlen, g->c_size, "C");
#endif
      for (int64_t jr = 0; jr < nlen; jr += KILN_NR) {
        const int64_t nr = nlen - jr < KILN_NR ? nlen - jr : KILN_NR;
        const float *bpanel = bblock + (jr / KILN_NR) * b_stride;
        for (int64_t ir = 0; ir < mlen; ir += KILN_MR) {
          const int64_t mr = mlen - ir < KILN_MR ? mlen - ir : KILN_MR;
          float *tile = c + (m0 + ir) * g->ldc + n0 + jr;
          /* the fused epilogue in registers on whole tiles, on the tile in memory at the edges */
          kiln_finish fin, *finish = NULL;
          if (last && g->f_on) {
            fin = (kiln_finish){g->f_row ? g->f_row + m0 + ir : NULL, g->f_col ? g->f_col + n0 + jr : NULL, g->f_relu, g->f_lo, g->f_hi};
            finish = &fin;
          }
          const int whole = mr == KILN_MR && nr == KILN_NR;
          if (direct_a) { /* A read in place: whole tiles, and edge tiles (M below MR: batch-1 products) */
            const int64_t first = bt * g->a_bs + (m0 + ir) * g->a_rs + k0;
            KILN_SPAN(first, (mr - 1) * g->a_rs + kc, g->a_size, "A (in place)");
            if (whole)
              kiln_rows_n(KILN_MR, kc, g->a + first, g->a_rs, bpanel, tile, g->ldc, k0 > 0, finish);
            else
              kiln_ukernel_rows_few(kc, g->a + first, g->a_rs, bpanel, tile, g->ldc, k0 > 0, mr, nr);
          } else {
            const float *apanel = ablock + (ir / KILN_MR) * a_stride;
            if (whole)
              kiln_ukernel(kc, apanel, bpanel, tile, g->ldc, k0 > 0, finish);
            else if (nr <= KILN_L)
              kiln_ukernel_half(kc, apanel, bpanel, tile, g->ldc, k0 > 0, mr, nr);
            else
              kiln_ukernel_edge(kc, apanel, bpanel, tile, g->ldc, k0 > 0, mr, nr);
          }
          if (finish && !whole) kiln_finish_tile(finish, tile, g->ldc, mr, nr);
          if (last && g->epilogue) g->epilogue(g, bt, m0 + ir, m0 + ir + mr, n0 + jr, n0 + jr + nr);
        }
      }
    }
  }
}

/* at most KILN_STREAM_ROWS rows of A read in place times constant packed B: each panel streamed once
   over all of K (gemm_rows.c); more rows reuse B from cache blocks, the driver below */
#define KILN_STREAM_ROWS 1
static void kiln_stream_run(const kiln_gemm *g);

KILN_ENGINE void kiln_gemm_run(const kiln_gemm *g) {
  const int64_t M = g->M, N = g->N, K = g->K;
  int threads = kiln_pool_threads();
  if (kiln_in_pool()) threads = 1; /* inside a driver's parallel loop this product runs alone */
  if (M > 0 && N > 0 && K > 0 && M <= KILN_STREAM_ROWS && g->b_packed && !g->a_packed && g->pack_a == kiln_pack_a_strided && g->a_cs == 1) {
    kiln_stream_run(g);
    return;
  }
  const int64_t kblock = g->kc > 0 ? g->kc : KILN_KC;
  /* an MC x KC block of A fills about half of L2 (KILN_A_BLOCK floats, from the machine's caches):
     short reductions take more rows */
  int64_t depth = K < kblock ? K : kblock, mc_cap = KILN_A_BLOCK / (depth > 0 ? depth : 1);
  mc_cap = mc_cap < 96 ? 96 : (mc_cap > 1024 ? 1024 : mc_cap);
  int64_t mc = kiln_round_up(M < mc_cap ? M : mc_cap, KILN_MR);
  int64_t nc = kiln_round_up(N < 1024 ? N : 1024, KILN_NR);
  if (g->mc > 0) mc = kiln_round_up(M < g->mc ? M : g->mc, KILN_MR);
  if (g->nc > 0) nc = kiln_round_up(N < g->nc ? N : g->nc, KILN_NR);
  int64_t tiles_m = (M + mc - 1) / mc;
  /* enough tasks to keep every thread busy: split N finer, then M (unless tuned) */
  while (threads > 1 && !g->nc && g->batch * tiles_m * ((N + nc - 1) / nc) < 4 * threads && nc > KILN_NR) nc = kiln_round_up(nc / 2, KILN_NR);
  while (threads > 1 && !g->mc && g->batch * tiles_m * ((N + nc - 1) / nc) < 2 * threads && mc > KILN_MR) {
    mc = kiln_round_up(mc / 2, KILN_MR);
    tiles_m = (M + mc - 1) / mc;
  }
  /* equal blocks, so no task is a short remainder (a 256-row matrix as 128 + 128, not 192 + 64) */
  if (!g->mc) mc = kiln_round_up((M + tiles_m - 1) / tiles_m, KILN_MR);
  int64_t tiles_n = (N + nc - 1) / nc;
  if (!g->nc && threads > 1) { /* as many column tiles as keep every thread equally busy */
    const int64_t panels = (N + KILN_NR - 1) / KILN_NR;
    tiles_n = kiln_balanced_tiles(panels, g->batch * tiles_m, tiles_n, threads);
  }
  if (!g->nc) nc = kiln_round_up((N + tiles_n - 1) / tiles_n, KILN_NR);
  tiles_n = (N + nc - 1) / nc;
  const int64_t tasks = g->batch * tiles_m * tiles_n;
  const int64_t work = M * N * K * g->batch;
  /* An operand that several tasks would pack again (A once per N tile, B once per M tile) is
     packed whole first, shared by all tasks, into the caller's scratch (each request runs on its
     own thread, so concurrent requests never share it). */
  const int64_t panels_a = (M + KILN_MR - 1) / KILN_MR, panels_b = (N + KILN_NR - 1) / KILN_NR;
  const int64_t size_a = g->batch * panels_a * KILN_MR * K, size_b = g->batch * panels_b * KILN_NR * K;
  static _Thread_local float *shared_a, *shared_b;
  static _Thread_local int64_t have_a, have_b;
  float *all_a = NULL, *all_b = NULL;
  const int direct_a = !g->a_packed && g->pack_a == kiln_pack_a_strided && g->a_cs == 1; /* read in place */
  if (!g->a_packed && !direct_a && tiles_n > 1 && size_a * 4 <= KILN_SHARED_LIMIT) all_a = kiln_scratch(&shared_a, &have_a, size_a);
  if (!g->b_packed && tiles_m > 1 && size_b * 4 <= KILN_SHARED_LIMIT) all_b = kiln_scratch(&shared_b, &have_b, size_b);
  const float *a_packed = all_a ? all_a : g->a_packed, *b_packed = all_b ? all_b : g->b_packed;
  const int64_t a_pbs = all_a ? panels_a * KILN_MR * K : g->a_pbs, b_pbs = all_b ? panels_b * KILN_NR * K : g->b_pbs;
  kiln_gemm_plan plan = {g, M, N, K, kblock, mc, nc, tiles_m, tiles_n, panels_a, panels_b, a_pbs, b_pbs,
                         direct_a, all_a, all_b, a_packed, b_packed};
  const int workers = work >= 65536 && tasks > 1 ? 0 : 1; /* small products: one thread */
  if (all_a) kiln_parallel_for(0, g->batch * ((panels_a + KILN_PACK_CHUNK - 1) / KILN_PACK_CHUNK), 0, workers, kiln_gemm_pack_a, &plan);
  if (all_b) kiln_parallel_for(0, g->batch * ((panels_b + KILN_PACK_CHUNK - 1) / KILN_PACK_CHUNK), 0, workers, kiln_gemm_pack_b, &plan);
  kiln_parallel_for(0, tasks, 1, workers, kiln_gemm_tasks, &plan);
}
