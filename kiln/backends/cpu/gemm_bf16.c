/* kiln's bf16 matrix-multiply path (included after gemm.c in plans compiled with precision bf16,
   for the avx512 targets, whose packed B panels are 32 columns wide: KILN_NR == 32).

   C[b] = A[b] . B[b] (+ epilogue) with both operands rounded to bfloat16 (round to nearest even),
   products exact and sums in float32, C float32. Operands:
   - A as bf16 rows [Mp][Kp] (Mp, Kp multiples of 32, zero padded): constant A (convolution
     weights) packed so when the plan is built (g->a_bf16); any other A converted here, one M block
     per task, from the float32 matrix the descriptor describes (a, a_bs, a_rs, a_cs);
   - B as bf16 k-pair panels of 32 columns, [Np/32][Kp/2][32][2] (element (k, j) of a panel at
     (k / 2) * 64 + j * 2 + k % 2): constant B (a MatMul's weights) packed when the plan is built
     (g->b_bf16); any other B (im2col, activations) packed as float32 by the descriptor's packer
     then converted, one 32-column panel at a time.
   Three micro-kernels compute a 32 x 32 block of C over the whole (padded) reduction, chosen at
   run time (kiln_set_bf16, from what this CPU has and the OS grants):
   2: AMX-BF16 tiles (2 x 2 accumulator tiles of 16 x 16, two A and two B tiles per 32 k),
   1: AVX-512-BF16 dot products (8 rows x 32 columns of zmm accumulators at a time),
   0: portable C, the same arithmetic without bf16 instructions (an artifact moved to a CPU
      without them runs, slowly, and the runtime says so).
   The instruction-set functions carry their own target attributes, so the rest of the library
   keeps the target's ISA. */

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_BF16_X86 1
#endif

#if KILN_NR != 32
#error "the bf16 path packs B in 32-column panels (avx512 targets)"
#endif

static int kiln_bf16_mode = 0;

/* which micro-kernel runs (0, 1, 2 as above); returns the mode now in force (a mode the build
   lacks falls back to 0) */
int kiln_set_bf16(int mode) {
#ifdef KILN_BF16_X86
  kiln_bf16_mode = mode >= 0 && mode <= 2 ? mode : 0;
#else
  kiln_bf16_mode = 0;
#endif
  return kiln_bf16_mode;
}

static inline uint16_t kiln_bf16_round(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN stays a (quiet) NaN */
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static inline float kiln_bf16_value(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

#ifdef KILN_BF16_X86
/* n floats to bf16, 16 at a time with VCVTNEPS2BF16 (round to nearest even, as kiln_bf16_round) */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void kiln_bf16_convert_avx512(const float *src, uint16_t *dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)h);
  }
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, (__m256i)h);
  }
}

/* two float rows of 32 (k even, k odd) into one k-pair row of a B panel: [32][2] bf16 */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void kiln_bf16_pair_row_avx512(const float *even, const float *odd, uint16_t *dst) {
  static const uint16_t lanes[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_loadu_si512((const void *)lanes);
  for (int half = 0; half < 2; ++half) {
    /* lanes 0-15: even row's 16 columns, 16-31: the odd row's; interleaved into (even, odd) pairs */
    __m512i both = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(odd + 16 * half), _mm512_loadu_ps(even + 16 * half));
    _mm512_storeu_si512((void *)(dst + 32 * half), _mm512_permutexvar_epi16(order, both));
  }
}
#endif

static void kiln_bf16_convert(const float *src, uint16_t *dst, int64_t n) {
#ifdef KILN_BF16_X86
  if (kiln_bf16_mode > 0) {
    kiln_bf16_convert_avx512(src, dst, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = kiln_bf16_round(src[i]);
}

/* rows m0..m0+mlen of A as bf16 rows [rows][kp] (zero padded to rows, a multiple of 32, and kp) */
static void kiln_bf16_rows(const kiln_gemm *g, int64_t bt, int64_t m0, int64_t mlen, int64_t rows, int64_t kp, uint16_t *dst) {
  const int64_t K = g->K;
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t *out = dst + r * kp;
    if (r >= mlen) {
      memset(out, 0, (size_t)kp * sizeof(uint16_t));
      continue;
    }
    const int64_t first = bt * g->a_bs + (m0 + r) * g->a_rs;
    if (g->a_cs == 1) {
      kiln_bf16_convert(g->a + KILN_SPAN(first, K, g->a_size, "A (bf16 rows)"), out, K);
    } else {
      for (int64_t k = 0; k < K; ++k) out[k] = kiln_bf16_round(g->a[KILN_AT(first + k * g->a_cs, g->a_size, "A (bf16 rows)")]);
    }
    memset(out + K, 0, (size_t)(kp - K) * sizeof(uint16_t));
  }
}

/* a float panel [K][32] (the descriptor's packer's output) as a bf16 k-pair panel [kp/2][32][2] */
static void kiln_bf16_pairs(const float *panel, int64_t K, int64_t kp, uint16_t *dst) {
  static const float zeros[32];
  for (int64_t p = 0; p < kp / 2; ++p) {
    const float *even = 2 * p < K ? panel + 2 * p * 32 : zeros;
    const float *odd = 2 * p + 1 < K ? panel + (2 * p + 1) * 32 : zeros;
#ifdef KILN_BF16_X86
    if (kiln_bf16_mode > 0) {
      kiln_bf16_pair_row_avx512(even, odd, dst + p * 64);
      continue;
    }
#endif
    for (int j = 0; j < 32; ++j) {
      dst[p * 64 + 2 * j] = kiln_bf16_round(even[j]);
      dst[p * 64 + 2 * j + 1] = kiln_bf16_round(odd[j]);
    }
  }
}

/* columns x0..x0+xc of B, whole K, as bf16 k-pair panels [ceil(xc/32)][kp/2][32][2], in one pass
   where B's rows can be read (or built, im2col) two at a time: a row-major B (a 1x1 convolution's
   input, activations) and the im2col matrix; any other B through the float packer (fbuf: K x 32) */
static void kiln_bf16_pack_b(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t kp, uint16_t *dst, float *fbuf) {
  const int64_t K = g->K, panels = (xc + 31) / 32, padded = panels * 32;
  const int row_major = g->pack_b == kiln_pack_b_strided && g->b_cs == 1, im2col = g->pack_b == kiln_pack_im2col;
  if (!row_major && !im2col) {
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t cols = xc - p * 32 < 32 ? xc - p * 32 : 32;
      g->pack_b(g, bt, x0 + p * 32, cols, 0, K, fbuf);
      kiln_bf16_pairs(fbuf, K, kp, dst + p * kp * 32);
    }
    return;
  }
  float rows[2][padded] __attribute__((aligned(64)));
  static const float zeros[32];
  for (int64_t pair = 0; pair < kp / 2; ++pair) {
    const float *src[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t k = 2 * pair + h;
      if (k >= K) {
        src[h] = NULL; /* padding: zeros */
      } else if (row_major && xc == padded) {
        const int64_t start = bt * g->b_bs + k * g->b_rs + x0;
        src[h] = g->b + KILN_SPAN(start, xc, g->b_size, "B (bf16 rows)");
      } else {
        if (row_major) {
          const int64_t start = bt * g->b_bs + k * g->b_rs + x0;
          memcpy(rows[h], g->b + KILN_SPAN(start, xc, g->b_size, "B (bf16 rows)"), (size_t)xc * sizeof(float));
        } else {
          kiln_im2col_row(g, bt, x0, xc, k, rows[h]);
        }
        for (int64_t j = xc; j < padded; ++j) rows[h][j] = 0.0f;
        src[h] = rows[h];
      }
    }
    for (int64_t p = 0; p < panels; ++p) {
      const float *even = src[0] ? src[0] + p * 32 : zeros, *odd = src[1] ? src[1] + p * 32 : zeros;
      uint16_t *out = dst + p * kp * 32 + pair * 64;
#ifdef KILN_BF16_X86
      if (kiln_bf16_mode > 0) {
        kiln_bf16_pair_row_avx512(even, odd, out);
        continue;
      }
#endif
      for (int j = 0; j < 32; ++j) {
        out[2 * j] = kiln_bf16_round(even[j]);
        out[2 * j + 1] = kiln_bf16_round(odd[j]);
      }
    }
  }
}

/* -- micro-kernels: C (32 x 32, row stride ldc) (+)= A (32 rows, stride lda) . B pairs, over kc ---- */

#ifdef KILN_BF16_X86
typedef struct {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) kiln_tile_config;

/* tmm0-3: the 2 x 2 C tiles (16 x 16 float32), tmm4-5: two A tiles (16 x 32 bf16), tmm6-7: two B
   tiles (16 k pairs x 16 columns) */
__attribute__((target("amx-tile"))) static void kiln_amx_configure(void) {
  kiln_tile_config config;
  memset(&config, 0, sizeof config);
  config.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) static void kiln_amx_release(void) { _tile_release(); }

__attribute__((target("amx-tile,amx-bf16"))) static void kiln_bf16_amx(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t kc, float *c, int64_t ldc, int64_t rows, int accumulate) {
  if (accumulate) {
    _tile_loadd(0, c, ldc * 4);
    _tile_loadd(1, c + 16, ldc * 4);
  } else {
    _tile_zero(0);
    _tile_zero(1);
  }
  if (rows > 16) {
    if (accumulate) {
      _tile_loadd(2, c + 16 * ldc, ldc * 4);
      _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
    } else {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t k0 = 0; k0 < kc; k0 += 32) {
      _tile_loadd(6, b + k0 * 32, 128);
      _tile_loadd(7, b + k0 * 32 + 32, 128);
      _tile_loadd(4, a + k0, lda * 2);
      _tile_loadd(5, a + 16 * lda + k0, lda * 2);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
  } else {
    for (int64_t k0 = 0; k0 < kc; k0 += 32) {
      _tile_loadd(6, b + k0 * 32, 128);
      _tile_loadd(7, b + k0 * 32 + 32, 128);
      _tile_loadd(4, a + k0, lda * 2);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
    }
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
}

__attribute__((target("avx512f,avx512bf16"))) static void kiln_bf16_dot8(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t kc, float *c, int64_t ldc, int accumulate) {
  __m512 acc0[8], acc1[8];
  for (int r = 0; r < 8; ++r) {
    acc0[r] = accumulate ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    acc1[r] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kc / 2; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(b + p * 64));
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(b + p * 64 + 32));
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      uint32_t word;
      memcpy(&word, a + r * lda + 2 * p, sizeof word);
      const __m512bh pair = (__m512bh)_mm512_set1_epi32((int)word);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], pair, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], pair, b1);
    }
  }
  for (int r = 0; r < 8; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc0[r]);
    _mm512_storeu_ps(c + r * ldc + 16, acc1[r]);
  }
}
#endif

static void kiln_bf16_portable(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t kc, float *c, int64_t ldc, int64_t rows, int accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    float acc[32] = {0};
    if (accumulate) memcpy(acc, c + r * ldc, sizeof acc);
    for (int64_t p = 0; p < kc / 2; ++p) {
      const float a0 = kiln_bf16_value(a[r * lda + 2 * p]), a1 = kiln_bf16_value(a[r * lda + 2 * p + 1]);
      const uint16_t *pair = b + p * 64;
      for (int j = 0; j < 32; ++j) acc[j] += a0 * kiln_bf16_value(pair[2 * j]) + a1 * kiln_bf16_value(pair[2 * j + 1]);
    }
    memcpy(c + r * ldc, acc, sizeof acc);
  }
}

/* C block (rows: 16 or 32 of A's rows) (+)= A . B chunk, written at c (row stride ldc) */
static void kiln_bf16_block(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t kc, float *c, int64_t ldc, int64_t rows, int accumulate) {
#ifdef KILN_BF16_X86
  if (kiln_bf16_mode == 2) {
    kiln_bf16_amx(a, lda, b, kc, c, ldc, rows, accumulate);
    return;
  }
  if (kiln_bf16_mode == 1) {
    for (int64_t r = 0; r < rows; r += 8) kiln_bf16_dot8(a + r * lda, lda, b, kc, c + r * ldc, ldc, accumulate);
    return;
  }
#endif
  kiln_bf16_portable(a, lda, b, kc, c, ldc, rows, accumulate);
}

/* -- the driver --------------------------------------------------------------------------------- */

#define KILN_BF16_CHUNK 8 /* B panels per shared-packing call (the im2col rows are built 8 panels wide) */
#define KILN_BF16_KC 256 /* k per chunk: a 32-row A chunk and a 32-column B chunk, 16 KB each, in L1 */

typedef struct {
  const kiln_gemm *g;
  int64_t kp, mc, nc, tiles_m, tiles_n;
  const uint16_t *a_rows; /* A converted whole, once (shared by the tasks), or NULL */
  int64_t a_rows_bs;
  const uint16_t *b_pairs; /* B packed and converted whole, once (shared by the tasks), or NULL */
  int64_t b_pairs_bs;
} kiln_bf16_plan;

/* the shared packing of B: 32-column panels [lo, hi) of every batch element */
static void kiln_gemm_bf16_pack(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_bf16_plan *p = (const kiln_bf16_plan *)ctx;
  const kiln_gemm *g = p->g;
  static _Thread_local float *f_buf;
  static _Thread_local int64_t f_have;
  float *fbuf = kiln_scratch(&f_buf, &f_have, g->K * 32);
  if (!fbuf) return;
  const int64_t panels = (g->N + 31) / 32, chunks = (panels + KILN_BF16_CHUNK - 1) / KILN_BF16_CHUNK;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t bt = i / chunks, col = (i % chunks) * KILN_BF16_CHUNK * 32;
    const int64_t cols = g->N - col < KILN_BF16_CHUNK * 32 ? g->N - col : KILN_BF16_CHUNK * 32;
    kiln_bf16_pack_b(g, bt, col, cols, p->kp, (uint16_t *)p->b_pairs + bt * p->b_pairs_bs + (col / 32) * p->kp * 32, fbuf);
  }
}

/* the shared conversion of A: rows [lo, hi) of 32 of every batch element */
static void kiln_gemm_bf16_convert(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_bf16_plan *p = (const kiln_bf16_plan *)ctx;
  const int64_t slabs = (p->g->M + 31) / 32;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t bt = i / slabs, m0 = (i % slabs) * 32;
    const int64_t rows = p->g->M - m0 < 32 ? p->g->M - m0 : 32;
    kiln_bf16_rows(p->g, bt, m0, rows, 32, p->kp, (uint16_t *)p->a_rows + bt * p->a_rows_bs + m0 * p->kp);
  }
}

static void kiln_gemm_bf16_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_bf16_plan *p = (const kiln_bf16_plan *)ctx;
  const kiln_gemm *g = p->g;
  const int64_t M = g->M, N = g->N, K = g->K, kp = p->kp, mc = p->mc, nc = p->nc;
  static _Thread_local float *f_buf, *a_buf, *b_buf, *e_buf; /* a_buf, b_buf hold bf16 (two per float) */
  static _Thread_local int64_t f_have, a_have, b_have, e_have;
  const int64_t kchunk = g->kc > 0 ? kiln_round_up(g->kc, 32) : KILN_BF16_KC;
  const int64_t slabs = (mc + 31) / 32;
  uint16_t *abuf = NULL, *bbuf = NULL;
  float *fbuf = NULL;
  /* edge blocks (fewer than 32 rows or columns) accumulate in a scratch of whole blocks, copied
     out after the last chunk: one slot per slab of the panel being computed */
  float *edges = kiln_scratch(&e_buf, &e_have, slabs * 32 * 32);
  if (!g->a_bf16 && !p->a_rows) abuf = (uint16_t *)kiln_scratch(&a_buf, &a_have, (slabs * 32 * kp + 1) / 2);
  if (!g->b_bf16 && !p->b_pairs) {
    fbuf = kiln_scratch(&f_buf, &f_have, K * 32);
    bbuf = (uint16_t *)kiln_scratch(&b_buf, &b_have, kp * 16);
  }
  if (!edges || (!g->a_bf16 && !p->a_rows && !abuf) || (!g->b_bf16 && !p->b_pairs && !(fbuf && bbuf))) return; /* out of memory */
#ifdef KILN_BF16_X86
  if (kiln_bf16_mode == 2) kiln_amx_configure();
#endif
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / (p->tiles_m * p->tiles_n), rest = task % (p->tiles_m * p->tiles_n);
    const int64_t m0 = (rest / p->tiles_n) * mc, n0 = (rest % p->tiles_n) * nc;
    const int64_t mlen = M - m0 < mc ? M - m0 : mc, nlen = N - n0 < nc ? N - n0 : nc;
    const uint16_t *ablock;
    if (g->a_bf16) {
      ablock = g->a_bf16 + KILN_SPAN(bt * g->a_pbs + m0 * kp, kiln_round_up(mlen, 32) * kp, g->a_packed_size, "A (bf16 packed)");
    } else if (p->a_rows) {
      ablock = p->a_rows + bt * p->a_rows_bs + m0 * kp;
    } else {
      kiln_bf16_rows(g, bt, m0, mlen, kiln_round_up(mlen, 32), kp, abuf);
      ablock = abuf;
    }
    float *c = g->c + bt * g->c_bs;
    for (int64_t jr = 0; jr < nlen; jr += 32) {
      const int64_t cols = nlen - jr < 32 ? nlen - jr : 32;
      const uint16_t *bpanel;
      if (g->b_bf16) {
        bpanel = g->b_bf16 + KILN_SPAN(bt * g->b_pbs + ((n0 + jr) / 32) * kp * 32, kp * 32, g->b_packed_size, "B (bf16 packed)");
      } else if (p->b_pairs) {
        bpanel = p->b_pairs + bt * p->b_pairs_bs + ((n0 + jr) / 32) * kp * 32;
      } else {
        kiln_bf16_pack_b(g, bt, n0 + jr, cols, kp, bbuf, fbuf);
        bpanel = bbuf;
      }
      /* the panel's column of C blocks stays in L2 while each k chunk of B (in L1) meets every slab */
      for (int64_t k0 = 0; k0 < kp; k0 += kchunk) {
        const int64_t kc = kp - k0 < kchunk ? kp - k0 : kchunk;
        const int first = k0 == 0, last = k0 + kc >= kp;
        const uint16_t *bchunk = bpanel + k0 * 32;
        for (int64_t ir = 0; ir < mlen; ir += 32) {
          const int64_t rows = mlen - ir < 32 ? mlen - ir : 32;
          const uint16_t *aslab = ablock + ir * kp + k0;
          if (rows == 32 && cols == 32) {
            float *tile = c + (m0 + ir) * g->ldc + n0 + jr;
            KILN_SPAN(bt * g->c_bs + (m0 + ir) * g->ldc + n0 + jr, 31 * g->ldc + 32, g->c_size, "C");
            kiln_bf16_block(aslab, kp, bchunk, kc, tile, g->ldc, 32, !first);
          } else {
            float *block = edges + (ir / 32) * 32 * 32;
            kiln_bf16_block(aslab, kp, bchunk, kc, block, 32, rows <= 16 ? 16 : 32, !first);
            if (last) {
              float *tile = c + (m0 + ir) * g->ldc + n0 + jr;
              KILN_SPAN(bt * g->c_bs + (m0 + ir) * g->ldc + n0 + jr, (rows - 1) * g->ldc + cols, g->c_size, "C");
              for (int64_t r = 0; r < rows; ++r) memcpy(tile + r * g->ldc, block + r * 32, (size_t)cols * sizeof(float));
            }
          }
          if (last && g->epilogue) g->epilogue(g, bt, m0 + ir, m0 + ir + rows, n0 + jr, n0 + jr + cols);
        }
      }
    }
  }
#ifdef KILN_BF16_X86
  if (kiln_bf16_mode == 2) kiln_amx_release();
#endif
}

static void kiln_gemm_bf16_run(const kiln_gemm *g) {
  const int64_t M = g->M, N = g->N, K = g->K, kp = kiln_round_up(K, 32);
  int threads = kiln_pool_threads();
  if (kiln_in_pool()) threads = 1;
  /* an M block of bf16 rows fills about 256 KB of L2 (one chunk of it, 32 rows, is in L1) */
  int64_t cap = 262144 / ((kp < KILN_BF16_KC ? kp : KILN_BF16_KC) * 2);
  cap = cap < 32 ? 32 : (cap > 512 ? 512 : cap);
  int64_t mc = kiln_round_up(M < cap ? M : cap, 32);
  int64_t nc = kiln_round_up(N < 512 ? N : 512, 32);
  if (g->mc > 0) mc = kiln_round_up(M < g->mc ? M : g->mc, 32);
  if (g->nc > 0) nc = kiln_round_up(N < g->nc ? N : g->nc, 32);
  int64_t tiles_m = (M + mc - 1) / mc;
  while (threads > 1 && !g->nc && g->batch * tiles_m * ((N + nc - 1) / nc) < 4 * threads && nc > 32) nc = kiln_round_up(nc / 2, 32);
  while (threads > 1 && !g->mc && g->batch * tiles_m * ((N + nc - 1) / nc) < 2 * threads && mc > 32) {
    mc = kiln_round_up(mc / 2, 32);
    tiles_m = (M + mc - 1) / mc;
  }
  if (!g->mc) mc = kiln_round_up((M + tiles_m - 1) / tiles_m, 32);
  int64_t tiles_n = (N + nc - 1) / nc;
  if (!g->nc) nc = kiln_round_up((N + tiles_n - 1) / tiles_n, 32);
  tiles_n = (N + nc - 1) / nc;
  const int64_t tasks = g->batch * tiles_m * tiles_n;
  kiln_bf16_plan plan = {g, kp, mc, nc, tiles_m, tiles_n, NULL, 0, NULL, 0};
  const int workers = M * N * K * g->batch >= 65536 && tasks > 1 ? 0 : 1;
  /* an A that several tasks would convert again (one per N block) is converted once, shared */
  static _Thread_local float *shared;
  static _Thread_local int64_t have;
  const int64_t slabs = (M + 31) / 32, size = g->batch * slabs * 32 * kp;
  if (!g->a_bf16 && tiles_n > 1 && size * 2 <= KILN_SHARED_LIMIT) {
    uint16_t *rows = (uint16_t *)kiln_scratch(&shared, &have, (size + 1) / 2);
    if (rows) {
      plan.a_rows = rows;
      plan.a_rows_bs = slabs * 32 * kp;
      kiln_parallel_for(0, g->batch * slabs, 1, workers, kiln_gemm_bf16_convert, &plan);
    }
  }
  /* a B that several tasks would pack again (one per M block) is packed once, shared */
  static _Thread_local float *shared_b;
  static _Thread_local int64_t have_b;
  const int64_t panels = (N + 31) / 32, size_b = g->batch * panels * kp * 32;
  if (!g->b_bf16 && tiles_m > 1 && size_b * 2 <= KILN_SHARED_LIMIT) {
    uint16_t *pairs = (uint16_t *)kiln_scratch(&shared_b, &have_b, (size_b + 1) / 2);
    if (pairs) {
      plan.b_pairs = pairs;
      plan.b_pairs_bs = panels * kp * 32;
      kiln_parallel_for(0, g->batch * ((panels + KILN_BF16_CHUNK - 1) / KILN_BF16_CHUNK), 1, workers, kiln_gemm_bf16_pack, &plan);
    }
  }
  kiln_parallel_for(0, tasks, 1, workers, kiln_gemm_bf16_tasks, &plan);
}
