/* kiln's int8 matrix-multiply format (included after gemm_lowp.c, the driver, in plans compiled
   with precision int8).

   One operand is the weights, quantized per output channel, symmetric, to int8 in [-127, 127]
   when the plan was built; the other is the float32 activations, quantized per tensor here, as
   they are packed, to unsigned q = clamp(round(x * q_inv) + q_zero, 0, q_max) (q_max 255, or 127
   where the plan may run on AVX2's VPMADDUBSW, whose pairs of u8 x s8 products saturate 16 bits
   beyond 7-bit activations: two 127 x 127 products still fit). Sums are exact int32; a finished
   block becomes float32 as C = (sum + q_offset[ch]) * q_scale[ch], the offset undoing the
   activations' zero point (-q_zero x the channel's weight sum) and the scale the product of the
   activation and channel scales. No quantize or dequantize pass over memory: activations are
   quantized in the packing, results dequantized in the block's finish, before the epilogue.

   A MatMul (x . W) has A = activations (u8 rows), B = weights (s8 panels), channel = column;
   a convolution has A = weights (s8 rows), B = im2col or the 1x1 input (u8 panels), channel =
   row. Layouts: A rows [Mp][Kp]; B panels of 32 columns [Kp/4][32][4] (4 consecutive k of a
   column in one 32-bit lane: the VNNI and AMX-INT8 operand layout); Kp a multiple of 64.

   Micro-kernels, chosen at run time (kiln_set_int8): 4 AMX-INT8 tiles (TDPBUSD / TDPBSUD),
   3 AVX512-VNNI (VPDPBUSD on zmm), 2 AVX-VNNI (VPDPBUSD on ymm), 1 AVX2 (VPMADDUBSW then VPMADDWD;
   only for 7-bit activations), 0 portable C. Every path computes the same exact integer sums. */

static int kiln_int8_mode = 0;

/* which micro-kernel runs (0..4 as above); returns the mode in force */
int kiln_set_int8(int mode) {
#ifdef KILN_X86
  kiln_int8_mode = mode >= 0 && mode <= 4 ? mode : 0;
#else
  kiln_int8_mode = 0;
#endif
  return kiln_int8_mode;
}

/* n floats quantized to this product's unsigned activations (NaN -> 0) */
static void kiln_int8_quantize(const kiln_gemm *g, const float *restrict src, uint8_t *restrict dst, int64_t n) {
  kiln_quantize_u8(g->q_inv, g->q_zero, g->q_max, src, dst, n);
}

/* A rows m0..m0+mlen quantized (activations: a MatMul's x), zero rows up to `rows`, k padded with 0 */
static void kiln_int8_rows(const kiln_gemm *g, int64_t bt, int64_t m0, int64_t mlen, int64_t rows, int64_t kp, void *to) {
  uint8_t *dst = (uint8_t *)to;
  const int64_t K = g->K;
  float line[K] __attribute__((aligned(64)));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t *out = dst + r * kp;
    if (r >= mlen) {
      memset(out, 0, (size_t)kp);
      continue;
    }
    const int64_t first = bt * g->a_bs + (m0 + r) * g->a_rs;
    if (g->q_given) { /* quantized by the producer: the bytes as they are */
      if (g->a_cs == 1)
        memcpy(out, g->q_given + KILN_SPAN(first, K, g->q_given_size, "A (int8 rows, given)"), (size_t)K);
      else
        for (int64_t k = 0; k < K; ++k) out[k] = g->q_given[KILN_AT(first + k * g->a_cs, g->q_given_size, "A (int8 rows, given)")];
      memset(out + K, 0, (size_t)(kp - K));
      continue;
    }
    const float *src;
    if (g->a_cs == 1) {
      src = g->a + KILN_SPAN(first, K, g->a_size, "A (int8 rows)");
    } else {
      for (int64_t k = 0; k < K; ++k) line[k] = g->a[KILN_AT(first + k * g->a_cs, g->a_size, "A (int8 rows)")];
      src = line;
    }
    kiln_int8_quantize(g, src, out, K);
    memset(out + K, 0, (size_t)(kp - K)); /* the weights' padding is 0: any value would do */
  }
}

/* four u8 rows (k = 4q..4q+3) into a panel's k-quad row: column j's 4 bytes in one 32-bit lane */
static inline void kiln_int8_quad_row(const uint8_t *r0, const uint8_t *r1, const uint8_t *r2, const uint8_t *r3, uint8_t *out) {
  uint32_t words[32];
  for (int j = 0; j < 32; ++j)
    words[j] = (uint32_t)r0[j] | ((uint32_t)r1[j] << 8) | ((uint32_t)r2[j] << 16) | ((uint32_t)r3[j] << 24);
  memcpy(out, words, sizeof words);
}

/* columns x0..x0+xc of B (a convolution's im2col or 1x1 input, already quantized whole into
   g->q_source), whole K, into panels [Kp/4][32][4]; k beyond K and columns beyond xc hold the
   zero point (the weights there are 0) */
static void kiln_int8_pack_b(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t kp, void *to, float *fbuf) {
  uint8_t *dst = (uint8_t *)to;
  const int64_t K = g->K, panels = (xc + 31) / 32, padded = panels * 32;
  const int im2col = g->pack_b == kiln_pack_im2col;
  const uint8_t zero = (uint8_t)g->q_zero, *source = g->q_source + bt * g->b_bs;
  uint8_t rows[4][padded] __attribute__((aligned(64)));
  for (int64_t quad = 0; quad < kp / 4; ++quad) {
    const uint8_t *src[4];
    for (int h = 0; h < 4; ++h) {
      const int64_t k = 4 * quad + h;
      if (k >= K) {
        memset(rows[h], zero, (size_t)padded);
        src[h] = rows[h];
      } else if (im2col) {
        kiln_im2col_row_u8(g, source, bt, x0, xc, k, rows[h], zero);
        memset(rows[h] + xc, zero, (size_t)(padded - xc));
        src[h] = rows[h];
      } else { /* row-major (b_cs == 1): read in place when whole panels are there */
        const uint8_t *row = g->q_source + KILN_SPAN(bt * g->b_bs + k * g->b_rs + x0, xc, g->b_size, "B (int8 rows)");
        if (xc == padded) {
          src[h] = row;
        } else {
          memcpy(rows[h], row, (size_t)xc);
          memset(rows[h] + xc, zero, (size_t)(padded - xc));
          src[h] = rows[h];
        }
      }
    }
    for (int64_t p = 0; p < panels; ++p)
      kiln_int8_quad_row(src[0] + p * 32, src[1] + p * 32, src[2] + p * 32, src[3] + p * 32, dst + p * kp * 32 + quad * 128);
  }
  (void)fbuf;
}

/* -- micro-kernels: int32 C (rows x 32, stride ldc) (+)= A slab . B chunk over kc (a multiple of
   64). `au`: A holds the unsigned operand (a MatMul's activations), else B does. ------------- */

#ifdef KILN_X86
#define KILN_AMX_DOT_INT8(c, x, y) \
  do {                              \
    if (au)                         \
      _tile_dpbusd(c, x, y);        \
    else                            \
      _tile_dpbsud(c, x, y);        \
  } while (0)
KILN_AMX_BLOCK(kiln_int8_amx, "amx-tile,amx-int8", uint8_t, KILN_AMX_DOT_INT8)

/* 8 rows x 32 columns on zmm: the sum over taps t of A rows at a + offsets[t] times B panel rows
   t * kc .. (t + 1) * kc, the sums held in registers across the taps (a direct convolution's block
   pays one load and store of C, not one per tap); a plain block is one tap at offset 0 */
__attribute__((target("avx512f,avx512vnni"))) static void kiln_int8_vnni512(const uint8_t *a, int64_t lda, const int64_t *offsets, int64_t taps, const uint8_t *b, int64_t kc, int32_t *c, int64_t ldc, int accumulate, int au) {
  __m512i acc0[8], acc1[8];
  for (int r = 0; r < 8; ++r) {
    acc0[r] = accumulate ? _mm512_loadu_si512((const void *)(c + r * ldc)) : _mm512_setzero_si512();
    acc1[r] = accumulate ? _mm512_loadu_si512((const void *)(c + r * ldc + 16)) : _mm512_setzero_si512();
  }
  for (int64_t t = 0; t < taps; ++t) {
    const uint8_t *at = a + offsets[t], *bt = b + t * kc * 32;
    for (int64_t q = 0; q < kc / 4; ++q) {
      const __m512i b0 = _mm512_loadu_si512((const void *)(bt + q * 128));
      const __m512i b1 = _mm512_loadu_si512((const void *)(bt + q * 128 + 64));
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        int32_t word;
        memcpy(&word, at + r * lda + 4 * q, sizeof word);
        const __m512i quad = _mm512_set1_epi32(word);
        if (au) {
          acc0[r] = _mm512_dpbusd_epi32(acc0[r], quad, b0);
          acc1[r] = _mm512_dpbusd_epi32(acc1[r], quad, b1);
        } else {
          acc0[r] = _mm512_dpbusd_epi32(acc0[r], b0, quad);
          acc1[r] = _mm512_dpbusd_epi32(acc1[r], b1, quad);
        }
      }
    }
  }
  for (int r = 0; r < 8; ++r) {
    _mm512_storeu_si512((void *)(c + r * ldc), acc0[r]);
    _mm512_storeu_si512((void *)(c + r * ldc + 16), acc1[r]);
  }
}

/* 4 rows x 16 columns on ymm: AVX-VNNI (vnni) or AVX2's VPMADDUBSW + VPMADDWD (7-bit activations) */
#define KILN_INT8_YMM(name, attributes, DOT)                                                                        \
  __attribute__((target(attributes))) static void name(const uint8_t *a, int64_t lda, const uint8_t *b, int64_t kc, \
                                                       int32_t *c, int64_t ldc, int accumulate, int au) {          \
    __m256i acc0[4], acc1[4];                                                                                       \
    const __m256i ones = _mm256_set1_epi16(1);                                                                      \
    (void)ones;                                                                                                     \
    for (int r = 0; r < 4; ++r) {                                                                                   \
      acc0[r] = accumulate ? _mm256_loadu_si256((const __m256i *)(c + r * ldc)) : _mm256_setzero_si256();          \
      acc1[r] = accumulate ? _mm256_loadu_si256((const __m256i *)(c + r * ldc + 8)) : _mm256_setzero_si256();      \
    }                                                                                                               \
    for (int64_t q = 0; q < kc / 4; ++q) {                                                                          \
      const __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + q * 128));                                        \
      const __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + q * 128 + 32));                                   \
      for (int r = 0; r < 4; ++r) {                                                                                 \
        int32_t word;                                                                                               \
        memcpy(&word, a + r * lda + 4 * q, sizeof word);                                                            \
        const __m256i quad = _mm256_set1_epi32(word);                                                               \
        if (au) {                                                                                                   \
          acc0[r] = DOT(acc0[r], quad, b0);                                                                         \
          acc1[r] = DOT(acc1[r], quad, b1);                                                                         \
        } else {                                                                                                    \
          acc0[r] = DOT(acc0[r], b0, quad);                                                                         \
          acc1[r] = DOT(acc1[r], b1, quad);                                                                         \
        }                                                                                                           \
      }                                                                                                             \
    }                                                                                                               \
    for (int r = 0; r < 4; ++r) {                                                                                   \
      _mm256_storeu_si256((__m256i *)(c + r * ldc), acc0[r]);                                                       \
      _mm256_storeu_si256((__m256i *)(c + r * ldc + 8), acc1[r]);                                                   \
    }                                                                                                               \
  }
#define KILN_DOT_VNNI(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define KILN_DOT_AVX2(acc, u, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), ones))
KILN_INT8_YMM(kiln_int8_avxvnni, "avx2,avxvnni", KILN_DOT_VNNI)
KILN_INT8_YMM(kiln_int8_avx2, "avx2", KILN_DOT_AVX2)
#endif

static void kiln_int8_portable(const uint8_t *a, int64_t lda, const uint8_t *b, int64_t kc, int32_t *c, int64_t ldc, int64_t rows, int accumulate, int au) {
  for (int64_t r = 0; r < rows; ++r) {
    int32_t acc[32] = {0};
    if (accumulate) memcpy(acc, c + r * ldc, sizeof acc);
    for (int64_t q = 0; q < kc / 4; ++q) {
      const uint8_t *quad = a + r * lda + 4 * q, *column = b + q * 128;
      for (int j = 0; j < 32; ++j)
        for (int h = 0; h < 4; ++h) {
          const int32_t x = au ? (int32_t)quad[h] : (int32_t)(int8_t)quad[h];
          const int32_t y = au ? (int32_t)(int8_t)column[4 * j + h] : (int32_t)column[4 * j + h];
          acc[j] += x * y;
        }
    }
    memcpy(c + r * ldc, acc, sizeof acc);
  }
}

static void kiln_int8_block(const kiln_gemm *g, const void *av, int64_t lda, const void *bv, int64_t kc, void *cv, int64_t ldc, int64_t rows, int accumulate) {
  const uint8_t *a = (const uint8_t *)av, *b = (const uint8_t *)bv;
  int32_t *c = (int32_t *)cv;
  const int au = !g->q_rows || g->direct; /* a MatMul, or a direct convolution: A holds the activations */
  int mode = kiln_int8_mode;
  if (mode == 1 && g->q_max > 127) mode = 0; /* VPMADDUBSW would saturate 8-bit activations */
#ifdef KILN_X86
  if (mode == 4) {
    kiln_int8_amx(a, lda, kiln_amx_one_tap, 1, b, kc, c, ldc, rows, accumulate, au);
    return;
  }
  if (mode == 3) {
    for (int64_t r = 0; r < rows; r += 8) kiln_int8_vnni512(a + r * lda, lda, kiln_amx_one_tap, 1, b, kc, c + r * ldc, ldc, accumulate, au);
    return;
  }
  if (mode == 2 || mode == 1) {
    for (int64_t r = 0; r < rows; r += 4)
      for (int half = 0; half < 2; ++half) {
        if (mode == 2)
          kiln_int8_avxvnni(a + r * lda, lda, b + 64 * half, kc, c + r * ldc + 16 * half, ldc, accumulate, au);
        else
          kiln_int8_avx2(a + r * lda, lda, b + 64 * half, kc, c + r * ldc + 16 * half, ldc, accumulate, au);
      }
    return;
  }
#endif
  kiln_int8_portable(a, lda, b, kc, c, ldc, rows, accumulate, au);
}

/* int32 sums to float32: (sum + offset[ch]) * scale[ch] */
static void kiln_int8_finish(const kiln_gemm *g, int64_t bt, const void *cv, int64_t ldc, int64_t rows, int64_t cols, int64_t i0, int64_t j0, float *out, int64_t ldo) {
  (void)bt; /* (the channels' scales: the same for every batch element) */
  const int32_t *c = (const int32_t *)cv;
  if (rows == 32 && cols == 32 && ldc == 32) { /* a whole block from the scratch: constant trip counts */
    for (int r = 0; r < 32; ++r) {
      const float *scale = g->q_rows ? NULL : g->q_scale + j0;
      const int32_t *offset = g->q_rows ? NULL : g->q_offset + j0;
      const float row_scale = g->q_rows ? g->q_scale[i0 + r] : 0.0f;
      const int32_t row_offset = g->q_rows ? g->q_offset[i0 + r] : 0;
      if (g->q_rows) {
        for (int j = 0; j < 32; ++j) out[r * ldo + j] = (float)(c[r * 32 + j] + row_offset) * row_scale;
      } else {
        for (int j = 0; j < 32; ++j) out[r * ldo + j] = (float)(c[r * 32 + j] + offset[j]) * scale[j];
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (g->q_rows) {
      const float scale = g->q_scale[i0 + r];
      const int32_t offset = g->q_offset[i0 + r];
#pragma GCC ivdep
      for (int64_t j = 0; j < cols; ++j) out[r * ldo + j] = (float)(c[r * ldc + j] + offset) * scale;
    } else {
      const float *scale = g->q_scale + j0;
      const int32_t *offset = g->q_offset + j0;
#pragma GCC ivdep
      for (int64_t j = 0; j < cols; ++j) out[r * ldo + j] = (float)(c[r * ldc + j] + offset[j]) * scale[j];
    }
  }
}

static int kiln_int8_amx_on(void) { return kiln_int8_mode == 4; }

#ifdef KILN_X86
/* a 16 x 16 block of bytes transposed (rows of src become columns of dst): four rounds of
   interleaves (bytes, 16-bit, 32-bit, 64-bit units) */
__attribute__((target("sse2"))) static void kiln_transpose16_u8(const uint8_t *src, int64_t sstride, uint8_t *dst, int64_t dstride) {
  __m128i r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm_loadu_si128((const __m128i *)(src + i * sstride));
  for (int k = 0; k < 8; ++k) { /* t[k]: pixels 0-7, t[k + 8]: 8-15, channel pairs (2k, 2k+1) */
    t[k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
    t[k + 8] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
  }
  for (int half = 0; half < 2; ++half) /* u[8h + 2q]: pixels 8h..8h+3, channels 4q..4q+3; u[8h+2q+1]: pixels +4 */
    for (int q = 0; q < 4; ++q) {
      u[8 * half + 2 * q] = _mm_unpacklo_epi16(t[8 * half + 2 * q], t[8 * half + 2 * q + 1]);
      u[8 * half + 2 * q + 1] = _mm_unpackhi_epi16(t[8 * half + 2 * q], t[8 * half + 2 * q + 1]);
    }
  for (int group = 0; group < 4; ++group) { /* pixels 4 * group .. + 3 */
    const int base = 8 * (group / 2) + group % 2;
    const __m128i a = u[base], b = u[base + 2], c = u[base + 4], d = u[base + 6];
    const __m128i x0 = _mm_unpacklo_epi32(a, b), x1 = _mm_unpackhi_epi32(a, b);
    const __m128i y0 = _mm_unpacklo_epi32(c, d), y1 = _mm_unpackhi_epi32(c, d);
    uint8_t *o = dst + 4 * group * dstride;
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi64(x0, y0));
    _mm_storeu_si128((__m128i *)(o + dstride), _mm_unpackhi_epi64(x0, y0));
    _mm_storeu_si128((__m128i *)(o + 2 * dstride), _mm_unpacklo_epi64(x1, y1));
    _mm_storeu_si128((__m128i *)(o + 3 * dstride), _mm_unpackhi_epi64(x1, y1));
  }
}
#endif

/* the direct convolution's channels-last copy: padded row ph of image bt (wp pixels), each pixel's
   channels quantized (padding, spatial or channel: the zero point, i.e. x = 0). An NCHW input: channel
   lines quantized first, then transposed 16 x 16 bytes at a time; an NHWC one: its pixels copied
   (quantized by their producer) or quantized in place */
static void kiln_int8_nhwc_row(const kiln_gemm *g, int64_t bt, int64_t ph, int64_t cp, int64_t wp, void *to) {
  const int64_t *q = g->conv;
  const int64_t C = q[0], H = q[1], W = q[2], PT = q[5], PL = q[6], h = ph - PT;
  const int64_t width = W < wp - PL ? W : wp - PL; /* the input pixels any tap reads */
  uint8_t *dst = (uint8_t *)to;
  if (h < 0 || h >= H || width <= 0) {
    memset(dst, (int)g->q_zero, (size_t)(wp * cp));
    return;
  }
  uint8_t *first = dst + PL * cp;
  /* the padding around the row's pixels (the pixels' padded channels: below) */
  memset(dst, (int)g->q_zero, (size_t)(PL * cp));
  memset(first + width * cp, (int)g->q_zero, (size_t)((wp - PL - width) * cp));
  if (cp != C)
    for (int64_t w = 0; w < width; ++w) memset(first + w * cp + C, (int)g->q_zero, (size_t)(cp - C));
  if (q[11]) { /* channels last: the row is width pixels of C channels */
    const int64_t at = bt * g->b_bs + h * W * C;
    if (g->q_given) {
      const uint8_t *src = g->q_given + KILN_SPAN(at, width * C, g->q_given_size, "B (direct input, given, channels last)");
      if (cp == C)
        memcpy(first, src, (size_t)(width * C));
      else
        for (int64_t w = 0; w < width; ++w) memcpy(first + w * cp, src + w * C, (size_t)C);
    } else {
      const float *src = g->b + KILN_SPAN(at, width * C, g->b_size, "B (direct input, channels last)");
      if (cp == C)
        kiln_int8_quantize(g, src, first, width * C);
      else
        for (int64_t w = 0; w < width; ++w) kiln_int8_quantize(g, src + w * C, first + w * cp, C);
    }
    return;
  }
  const float *image = g->b + bt * g->b_bs;
  KILN_SPAN(bt * g->b_bs + h * W, (C - 1) * H * W + W, g->b_size, "B (direct input)");
  static _Thread_local float *l_buf;
  static _Thread_local int64_t l_have;
  const uint8_t *lines; /* channel c's pixels of row h at lines + c * stride */
  int64_t stride = W;
  if (g->q_given) { /* quantized by the producer: its NCHW bytes in place */
    lines = g->q_given + KILN_SPAN(bt * g->b_bs + h * W, (C - 1) * H * W + W, g->q_given_size, "B (direct input, given)");
    stride = H * W;
  } else {
    uint8_t *quantized = (uint8_t *)kiln_scratch(&l_buf, &l_have, (C * W + 3) / 4);
    if (!quantized) return;
    for (int64_t c = 0; c < C; ++c) kiln_int8_quantize(g, image + c * H * W + h * W, quantized + c * W, W);
    lines = quantized;
  }
  int64_t c0 = 0, w0 = 0;
#ifdef KILN_X86
  for (c0 = 0; c0 + 16 <= C; c0 += 16)
    for (w0 = 0; w0 + 16 <= width; w0 += 16) kiln_transpose16_u8(lines + c0 * stride + w0, stride, first + w0 * cp + c0, cp);
  w0 = width - width % 16;
#endif
  for (int64_t c = 0; c < C; ++c) /* what the blocks left: the last channels, the last pixels */
    for (int64_t w = c < c0 ? w0 : 0; w < width; ++w) first[w * cp + c] = lines[c * stride + w];
}

/* every tap of a direct convolution's 32 x 32 block at once (A: the activations, unsigned), where
   the path has such a kernel (AMX tiles, AVX-512 VNNI registers): 1; else 0 (the driver goes tap
   by tap through kiln_int8_block) */
static int kiln_int8_taps(const kiln_gemm *g, const void *a, int64_t lda, const int64_t *offsets, int64_t taps, const void *b, int64_t kc, void *c, int64_t ldc) {
  (void)g;
#ifdef KILN_X86
  const uint8_t *au8 = (const uint8_t *)a, *bu8 = (const uint8_t *)b;
  if (kiln_int8_mode == 4) {
    kiln_int8_amx(au8, lda, offsets, taps, bu8, kc, c, ldc, 32, 0, 1);
    return 1;
  }
  if (kiln_int8_mode == 3) {
    for (int64_t r = 0; r < 32; r += 8) kiln_int8_vnni512(au8 + r * lda, lda, offsets, taps, bu8, kc, (int32_t *)c + r * ldc, ldc, 0, 1);
    return 1;
  }
#else
  (void)a, (void)lda, (void)offsets, (void)taps, (void)b, (void)kc, (void)c, (void)ldc;
#endif
  return 0;
}

/* finished floats quantized for the int8 products reading them (kiln_gemm.r_out) */
static void kiln_int8_narrow(const kiln_gemm *g, const float *src, int64_t at, int64_t n) {
  kiln_quantize_u8(g->r_inv, g->r_zero, g->r_max, src, g->r_out + at, n);
}

static const kiln_lowp_ops kiln_int8_ops = {1, 64, kiln_int8_rows, kiln_int8_pack_b, kiln_int8_block, kiln_int8_finish,
                                            kiln_int8_amx_on, kiln_int8_nhwc_row, kiln_int8_taps, 1, 4, kiln_int8_narrow};

/* the quantize-once prologue: B's float activations [lo, hi) of a chunked range */
enum { KILN_INT8_QCHUNK = 16384 };
static void kiln_int8_quantize_chunks(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_gemm *g = (const kiln_gemm *)ctx;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t first = i * KILN_INT8_QCHUNK, n = g->b_size - first < KILN_INT8_QCHUNK ? g->b_size - first : KILN_INT8_QCHUNK;
    kiln_int8_quantize(g, g->b + first, (uint8_t *)g->q_source + first, n);
  }
}

KILN_ENGINE void kiln_gemm_int8_run(const kiln_gemm *g) {
  if (g->direct) {
    kiln_lowp_direct(g, &kiln_int8_ops);
    return;
  }
  if (g->b_low) {
    kiln_lowp_run(g, &kiln_int8_ops);
    return;
  }
  /* B is activations (a convolution's input): quantized once, whole (each element would
     otherwise be quantized once per kernel tap), then packed from bytes; or quantized already,
     by the product that computed them */
  if (g->q_given) {
    kiln_gemm local = *g;
    local.q_source = g->q_given;
    KILN_SPAN(0, g->b_size, g->q_given_size, "B (given)");
    kiln_lowp_run(&local, &kiln_int8_ops);
    return;
  }
  static _Thread_local float *q_buf;
  static _Thread_local int64_t q_have;
  kiln_gemm local = *g;
  local.q_source = (const uint8_t *)kiln_scratch(&q_buf, &q_have, (g->b_size + 3) / 4);
  if (!local.q_source) return; /* out of memory */
  const int64_t chunks = (g->b_size + KILN_INT8_QCHUNK - 1) / KILN_INT8_QCHUNK;
  kiln_parallel_for(0, chunks, 1, kiln_in_pool() || chunks < 2 ? 1 : 0, kiln_int8_quantize_chunks, &local);
  kiln_lowp_run(&local, &kiln_int8_ops);
}
