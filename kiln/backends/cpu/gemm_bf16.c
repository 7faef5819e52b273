/* kiln's bf16 matrix-multiply format (included after gemm_lowp.c, the driver, in plans compiled
   with precision bf16, for the avx512 targets, whose float B panels are 32 columns wide).

   C[b] = A[b] . B[b] (+ epilogue) with both operands rounded to bfloat16 (round to nearest even),
   products exact and sums in float32, C float32. Operands:
   - A as bf16 rows [Mp][Kp] (Mp, Kp multiples of 32, zero padded): constant A (convolution
     weights) packed so when the plan is built (g->a_bf16); any other A converted here, one M block
     per task, from the float32 matrix the descriptor describes (a, a_bs, a_rs, a_cs);
   - B as bf16 k-pair panels of 32 columns, [Np/32][Kp/2][32][2] (element (k, j) of a panel at
     (k / 2) * 64 + j * 2 + k % 2): constant B (a MatMul's weights) packed when the plan is built
     (g->b_bf16); any other B (im2col, activations) packed as float32 by the descriptor's packer
     then converted, one 32-column panel at a time.
   Three micro-kernels compute a 32 x 32 block of C over a k chunk, chosen at run time (kiln_set_bf16, from what this CPU has and the OS grants):
   2: AMX-BF16 tiles (2 x 2 accumulator tiles of 16 x 16, two A and two B tiles per 32 k),
   1: AVX-512-BF16 dot products (8 rows x 32 columns of zmm accumulators at a time),
   0: portable C, the same arithmetic without bf16 instructions (an artifact moved to a CPU
      without them runs, slowly, and the runtime says so).
   The instruction-set functions carry their own target attributes, so the rest of the library
   keeps the target's ISA. */

#if KILN_NR != 32
#error "the bf16 path packs B in 32-column panels (avx512 targets)"
#endif

static int kiln_bf16_mode = 0;

/* which micro-kernel runs (0, 1, 2 as above); returns the mode now in force (a mode the build
   lacks falls back to 0) */
int kiln_set_bf16(int mode) {
#ifdef KILN_X86
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

#ifdef KILN_X86
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
#ifdef KILN_X86
  if (kiln_bf16_mode > 0) {
    kiln_bf16_convert_avx512(src, dst, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = kiln_bf16_round(src[i]);
}

/* rows m0..m0+mlen of A as bf16 rows [rows][kp] (zero padded to rows, a multiple of 32, and kp) */
static void kiln_bf16_rows(const kiln_gemm *g, int64_t bt, int64_t m0, int64_t mlen, int64_t rows, int64_t kp, void *to) {
  const int64_t K = g->K;
  uint16_t *dst = (uint16_t *)to;
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t *out = dst + r * kp;
    if (r >= mlen) {
      memset(out, 0, (size_t)kp * sizeof(uint16_t));
      continue;
    }
    const int64_t first = bt * g->a_bs + (m0 + r) * g->a_rs;
    if (g->h_given) { /* rounded by the producer: the halves as they are */
      if (g->a_cs == 1)
        memcpy(out, g->h_given + KILN_SPAN(first, K, g->q_given_size, "A (bf16 rows, given)"), (size_t)K * sizeof(uint16_t));
      else
        for (int64_t k = 0; k < K; ++k) out[k] = g->h_given[KILN_AT(first + k * g->a_cs, g->q_given_size, "A (bf16 rows, given)")];
    } else if (g->a_cs == 1) {
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
#ifdef KILN_X86
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
static void kiln_bf16_pack_b(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t kp, void *to, float *fbuf) {
  uint16_t *dst = (uint16_t *)to;
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
#ifdef KILN_X86
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

#ifdef KILN_X86
#define KILN_AMX_DOT_BF16(c, x, y) _tile_dpbf16ps(c, x, y)
KILN_AMX_BLOCK(kiln_bf16_amx, "amx-tile,amx-bf16", uint16_t, KILN_AMX_DOT_BF16)

/* 8 rows x 32 columns on zmm: the sum over taps t of A rows at a + offsets[t] times B panel rows
   t * kc .. (t + 1) * kc, the sums held in registers across the taps; a plain block is one tap */
__attribute__((target("avx512f,avx512bf16"))) static void kiln_bf16_dot8(const uint16_t *a, int64_t lda, const int64_t *offsets, int64_t taps, const uint16_t *b, int64_t kc, float *c, int64_t ldc, int accumulate) {
  __m512 acc0[8], acc1[8];
  for (int r = 0; r < 8; ++r) {
    acc0[r] = accumulate ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    acc1[r] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < taps; ++t) {
    const uint16_t *at = a + offsets[t], *bt = b + t * kc * 32;
    for (int64_t p = 0; p < kc / 2; ++p) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(bt + p * 64));
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bt + p * 64 + 32));
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        uint32_t word;
        memcpy(&word, at + r * lda + 2 * p, sizeof word);
        const __m512bh pair = (__m512bh)_mm512_set1_epi32((int)word);
        acc0[r] = _mm512_dpbf16_ps(acc0[r], pair, b0);
        acc1[r] = _mm512_dpbf16_ps(acc1[r], pair, b1);
      }
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
static void kiln_bf16_block(const kiln_gemm *g, const void *av, int64_t lda, const void *bv, int64_t kc, void *cv, int64_t ldc, int64_t rows, int accumulate) {
  const uint16_t *a = (const uint16_t *)av, *b = (const uint16_t *)bv;
  float *c = (float *)cv;
#ifdef KILN_X86
  if (kiln_bf16_mode == 2) {
    kiln_bf16_amx(a, lda, kiln_amx_one_tap, 1, b, kc, c, ldc, rows, accumulate, 0);
    return;
  }
  if (kiln_bf16_mode == 1) {
    for (int64_t r = 0; r < rows; r += 8) kiln_bf16_dot8(a + r * lda, lda, kiln_amx_one_tap, 1, b, kc, c + r * ldc, ldc, accumulate);
    return;
  }
#endif
  kiln_bf16_portable(a, lda, b, kc, c, ldc, rows, accumulate);
}

static int kiln_bf16_amx_on(void) { return kiln_bf16_mode == 2; }

/* the direct convolution's channels-last copy: padded row ph of image bt in bf16 (padding 0) */
static void kiln_bf16_nhwc_row(const kiln_gemm *g, int64_t bt, int64_t ph, int64_t cp, int64_t wp, void *to) {
  const int64_t *q = g->conv;
  const int64_t C = q[0], H = q[1], W = q[2], PT = q[5], PL = q[6], h = ph - PT;
  const int64_t width = W < wp - PL ? W : wp - PL; /* the input pixels any tap reads */
  uint16_t *dst = (uint16_t *)to;
  if (h < 0 || h >= H || width <= 0) {
    memset(dst, 0, (size_t)(wp * cp) * sizeof(uint16_t));
    return;
  }
  /* the padding around the row's pixels, and the pixels' padded channels */
  memset(dst, 0, (size_t)(PL * cp) * sizeof(uint16_t));
  memset(dst + (PL + width) * cp, 0, (size_t)((wp - PL - width) * cp) * sizeof(uint16_t));
  if (cp != C)
    for (int64_t w = 0; w < width; ++w) memset(dst + (PL + w) * cp + C, 0, (size_t)(cp - C) * sizeof(uint16_t));
  if (q[11] && g->h_given) { /* channels last, rounded by the producer: the halves in place */
    const uint16_t *src = g->h_given + KILN_SPAN(bt * g->b_bs + h * W * C, width * C, g->q_given_size, "B (direct input, given, channels last)");
    if (cp == C)
      memcpy(dst + PL * cp, src, (size_t)(width * C) * sizeof(uint16_t));
    else
      for (int64_t w = 0; w < width; ++w) memcpy(dst + (PL + w) * cp, src + w * C, (size_t)C * sizeof(uint16_t));
    return;
  }
  if (q[11]) { /* channels last: the row is width pixels of C channels */
    const float *src = g->b + KILN_SPAN(bt * g->b_bs + h * W * C, width * C, g->b_size, "B (direct input, channels last)");
    if (cp == C)
      kiln_bf16_convert(src, dst + PL * cp, width * C);
    else
      for (int64_t w = 0; w < width; ++w) kiln_bf16_convert(src + w * C, dst + (PL + w) * cp, C);
    return;
  }
  const float *image = g->b + bt * g->b_bs;
  KILN_SPAN(bt * g->b_bs + h * W, (C - 1) * H * W + W, g->b_size, "B (direct input)");
  uint16_t line[W];
  for (int64_t c = 0; c < C; ++c) {
    kiln_bf16_convert(image + c * H * W + h * W, line, W);
    uint16_t *column = dst + PL * cp + c;
    for (int64_t w = 0; w < width; ++w) column[w * cp] = line[w];
  }
}

/* every tap of a direct convolution's 32 x 32 block at once where the path has such a kernel (AMX
   tiles, AVX512_BF16 registers): 1; else 0 (the driver goes tap by tap through kiln_bf16_block) */
static int kiln_bf16_taps(const kiln_gemm *g, const void *a, int64_t lda, const int64_t *offsets, int64_t taps, const void *b, int64_t kc, void *c, int64_t ldc) {
  (void)g;
#ifdef KILN_X86
  const uint16_t *a16 = (const uint16_t *)a, *b16 = (const uint16_t *)b;
  if (kiln_bf16_mode == 2) {
    kiln_bf16_amx(a16, lda, offsets, taps, b16, kc, c, ldc, 32, 0, 0);
    return 1;
  }
  if (kiln_bf16_mode == 1) {
    for (int64_t r = 0; r < 32; r += 8) kiln_bf16_dot8(a16 + r * lda, lda, offsets, taps, b16, kc, (float *)c + r * ldc, ldc, 0);
    return 1;
  }
#else
  (void)a, (void)lda, (void)offsets, (void)taps, (void)b, (void)kc, (void)c, (void)ldc;
#endif
  return 0;
}

/* finished floats rounded for the bf16 products reading them (kiln_gemm.h_out) */
static void kiln_bf16_narrow(const kiln_gemm *g, const float *src, int64_t at, int64_t n) { kiln_bf16_convert(src, g->h_out + at, n); }

static const kiln_lowp_ops kiln_bf16_ops = {2, 32, kiln_bf16_rows, kiln_bf16_pack_b, kiln_bf16_block, NULL,
                                            kiln_bf16_amx_on, kiln_bf16_nhwc_row, kiln_bf16_taps, 0, 2, kiln_bf16_narrow};

KILN_ENGINE void kiln_gemm_bf16_run(const kiln_gemm *g) {
  if (g->direct) {
    kiln_lowp_direct(g, &kiln_bf16_ops);
    return;
  }
  kiln_lowp_run(g, &kiln_bf16_ops);
}
