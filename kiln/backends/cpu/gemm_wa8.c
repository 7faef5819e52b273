/* The weight-only products' prompt rows in int8 (included after gemm_int8.c, gemm_w4.c and
   gemm_w8.c, in plans compiled with an "-a8" weight format: int8-weights-a8, int4-weights-a8 and
   the int4 variants).

   A prompt's many rows are compute-bound, and an int8 dot product (VPDPBUSD, AMX-INT8) does twice
   the multiplies of a bf16 one an instruction. Each row of A is quantized when the product runs,
   symmetric, to int8 in [-127, 127] with its own scale (the row's largest magnitude / 127: the
   activations' dynamic range is a run-time fact, no calibration); the weights, widened a 32-column
   panel at a time to unsigned bytes: int8 codes as they are (their column scales kept), int4 codes
   re-quantized per column to int8 over the column's range (its groups' scales and offsets give it
   exactly). The sums are exact int32 (gemm_int8.c's kernels, B the unsigned operand: w + 128), and
   a finished block is C = (sum - 128 x the row's code sum) x row scale x column scale, then the
   fused finish (bias, activation) or the epilogue. A decode step's few rows: int8 weights' quantized
   the same way (kiln_wa8_few, below: a row's result is its prompt result, bit for bit); int4's take
   the plain format's path (already int8 per group there), bit for bit. Runs where this CPU has a VNNI or AMX-INT8 kernel (else returns 0: the float
   path); the generated code's kiln_gemm_w8_run / kiln_gemm_w4_run call it through g->q_wide. */

#if 32 % KILN_NR != 0
#error "the int8 prompt path widens whole weight panels into 32-column ones"
#endif

typedef struct {
  kiln_gemm g; /* first: the driver's descriptor (its ops get &this->g) */
  const kiln_gemm *source;
  int bits;
  const float *col_scale;    /* [N (rounded up to 32)] the widened weights' column scales */
  const float *col_inv;      /* [N (rounded up to 32)] 1 / col_scale (0 where it is 0) */
  const float *row_scale;    /* [batch][M] the activations' row scales (NaN: a row with inf or NaN) */
  const int32_t *row_offset; /* [batch][M] -128 x the row's codes' sum (undoes B's + 128) */
} kiln_wa8;

/* the largest |weight| of each int4 column over its groups (codes 0 and 15 at scale s, offset o
   reach o and 15 s + o: the group's minimum and maximum, which asymmetric quantization maps there;
   symmetric: -8 s, the group's largest magnitude): x / 127 is its int8 scale */
static void kiln_wa8_int4_scales(const kiln_gemm *s, float *out) {
  const int64_t groups = (s->K + s->q_group - 1) / s->q_group, panels = (s->N + KILN_NR - 1) / KILN_NR;
  const kiln_vi magnitude = (kiln_vi){0} + 0x7fffffff;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t half = 0; half < KILN_NR; half += KILN_L) {
      kiln_vf top = {0};
      for (int64_t q = 0; q < groups; ++q) {
        const int64_t at = (p * groups + q) * KILN_NR + half;
        const kiln_vf scale = kiln_half_load(s->q_half + at);
        const kiln_vf offset = s->q_min ? *(const kiln_vfu *)(s->q_min + at) : -8.0f * scale;
        const kiln_vf lo = (kiln_vf)((kiln_vi)offset & magnitude), hi = (kiln_vf)((kiln_vi)(15.0f * scale + offset) & magnitude);
        top = kiln_select(lo > top, lo, top);
        top = kiln_select(hi > top, hi, top);
      }
      *(kiln_vfu *)(out + p * KILN_NR + half) = top / 127.0f;
    }
}

/* a vector rounded to the nearest integer (ties to even) as int32; no NaN or value past int32
   reaches here (the callers clamp, or a column's scale bounds |code x scale' + offset'| by 127) */
static inline __attribute__((always_inline)) kiln_vi kiln_wa8_round(kiln_vf v) {
#if defined(__AVX512F__) && KILN_VB == 64
  return (kiln_vi)_mm512_cvtps_epi32((__m512)v); /* (MXCSR's rounding: nearest even) */
#elif defined(__AVX__) && KILN_VB == 32
  return (kiln_vi)_mm256_cvtps_epi32((__m256)v);
#else
  for (int i = 0; i < KILN_L; ++i) v[i] = __builtin_nearbyintf(v[i]);
  return __builtin_convertvector(v, kiln_vi);
#endif
}

/* n floats x[i * step] times inv, rounded, clamped to [-127, 127] (NaN: 0), as bytes; returns
   their sum */
static inline int32_t kiln_wa8_bytes(const float *x, int64_t step, float inv, int64_t n, int8_t *out) {
  typedef int8_t kiln_vb8 __attribute__((vector_size(KILN_L)));
  const kiln_vf top = (kiln_vf){0} + 127.0f, low = (kiln_vf){0} - 127.0f, zero = {0};
  kiln_vi sum = {0};
  for (int64_t i = 0; i < n; i += KILN_L) {
    const int64_t left = n - i < KILN_L ? n - i : KILN_L; /* (a last vector's missing lanes: 0) */
    kiln_vf v;
    if (step == 1 && left == KILN_L)
      v = *(const kiln_vfu *)(x + i) * inv;
    else
      for (int l = 0; l < KILN_L; ++l) v[l] = l < left ? x[(i + l) * step] * inv : 0.0f;
    v = kiln_select(v == v, v, zero);
    v = kiln_select(v > top, top, v);
    v = kiln_select(v < low, low, v);
    const kiln_vi q = kiln_wa8_round(v);
    sum += q;
    const kiln_vb8 bytes = __builtin_convertvector(q, kiln_vb8);
    memcpy(out + i, &bytes, (size_t)left);
  }
  int32_t total = 0;
  for (int l = 0; l < KILN_L; ++l) total += sum[l];
  return total;
}

/* four k-steps' int32 values (each in [-127, 127]) of KILN_L columns as their k-quads: column j's
   bytes + 128 in one 32-bit lane, k in byte order (the int8 kernels' B layout) */
static inline __attribute__((always_inline)) void kiln_wa8_store_quads(kiln_vi x0, kiln_vi x1, kiln_vi x2, kiln_vi x3, uint8_t *out) {
  const kiln_vi bytes = (kiln_vi){0} + 255;
  const kiln_vi quad = (x0 & bytes) | ((x1 & bytes) << 8) | ((x2 & bytes) << 16) | ((x3 & bytes) << 24);
  const kiln_vi flipped = quad ^ ((kiln_vi){0} + (int32_t)0x80808080u);
  memcpy(out, &flipped, sizeof flipped);
}

/* int8 code k of KILN_L columns (rows of NR bytes at b; k past K: 0) as int32 */
static inline __attribute__((always_inline)) kiln_vi kiln_wa8_int8_step(const int8_t *b, int64_t k, int64_t K) {
  if (k >= K) return (kiln_vi){0};
#if defined(__AVX512F__) && KILN_VB == 64
  return (kiln_vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + k * KILN_NR)));
#elif defined(__AVX2__) && KILN_VB == 32
  return (kiln_vi)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + k * KILN_NR)));
#else
  typedef int8_t kiln_vb8 __attribute__((vector_size(KILN_L)));
  kiln_vb8 v;
  memcpy(&v, b + k * KILN_NR, sizeof v);
  return __builtin_convertvector(v, kiln_vi);
#endif
}

/* int4 code k of KILN_L columns (words at `words`) re-quantized: rint(code x scale' + offset'),
   within [-127, 127] by the column's scale (k past K: 0) */
static inline __attribute__((always_inline)) kiln_vi kiln_wa8_int4_step(const int32_t *words, kiln_vf scale, kiln_vf offset, int64_t k, int64_t K) {
  if (k >= K) return (kiln_vi){0};
  kiln_vi code;
  memcpy(&code, words + (k / KILN_W4_CHUNK) * KILN_NR, sizeof code);
  code = (code >> (4 * (int)(k % KILN_W4_CHUNK))) & 15;
  return kiln_wa8_round(__builtin_convertvector(code, kiln_vf) * scale + offset);
}

/* the source panel holding columns c .. c + L (L = KILN_L, one vector) as quads at out, row
   stride 128 bytes (one k-quad of a 32-column panel), kp / 4 quads */
static void kiln_wa8_pack_lanes(const kiln_wa8 *w, int64_t bt, int64_t c, int64_t kp, uint8_t *out) {
  const kiln_gemm *s = w->source;
  const int64_t K = s->K, panel = c / KILN_NR, lane = c % KILN_NR;
  if (w->bits == 8) {
    const int64_t at = KILN_SPAN(bt * s->b_pbs + panel * K * KILN_NR, K * KILN_NR, s->b_packed_size, "B (int8 panels)");
    const int8_t *b = (const int8_t *)s->b_low + at + lane;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) /* (the last quad's k past K: in the loop below) */
      kiln_wa8_store_quads(kiln_wa8_int8_step(b, k, kp), kiln_wa8_int8_step(b, k + 1, kp), kiln_wa8_int8_step(b, k + 2, kp),
                           kiln_wa8_int8_step(b, k + 3, kp), out + k * 32);
    for (; k < kp; k += 4)
      kiln_wa8_store_quads(kiln_wa8_int8_step(b, k, K), kiln_wa8_int8_step(b, k + 1, K), kiln_wa8_int8_step(b, k + 2, K),
                           kiln_wa8_int8_step(b, k + 3, K), out + k * 32);
    return;
  }
  const int64_t group = s->q_group, groups = (K + group - 1) / group;
  const int64_t words = groups * group / KILN_W4_CHUNK * KILN_NR, params = groups * KILN_NR;
  const int64_t at = KILN_SPAN(bt * s->b_pbs + panel * words, words, s->b_packed_size, "B (int4 words)");
  const int32_t *codes = (const int32_t *)s->b_low + at + lane;
  const uint16_t *scales = s->q_half + panel * params + lane;
  const float *offsets = s->q_min ? s->q_min + panel * params + lane : NULL;
  const kiln_vf inv = *(const kiln_vfu *)(w->col_inv + c);
  for (int64_t k0 = 0; k0 < kp; k0 += group) { /* (groups are multiples of 4 k-steps) */
    const int64_t q = (k0 < K ? k0 : K - 1) / group, end = k0 + group < kp ? k0 + group : kp;
    const kiln_vf scale = kiln_half_load(scales + q * KILN_NR);
    const kiln_vf offset = offsets ? *(const kiln_vfu *)(offsets + q * KILN_NR) : -8.0f * scale;
    const kiln_vf sc = scale * inv, off = offset * inv;
    const int64_t whole = end < K ? end : K - K % 4; /* quads wholly inside K, then the rest */
    int64_t k = k0;
    for (; k < whole; k += 4)
      kiln_wa8_store_quads(kiln_wa8_int4_step(codes, sc, off, k, kp), kiln_wa8_int4_step(codes, sc, off, k + 1, kp),
                           kiln_wa8_int4_step(codes, sc, off, k + 2, kp), kiln_wa8_int4_step(codes, sc, off, k + 3, kp),
                           out + k * 32);
    for (; k < end; k += 4)
      kiln_wa8_store_quads(kiln_wa8_int4_step(codes, sc, off, k, K), kiln_wa8_int4_step(codes, sc, off, k + 1, K),
                           kiln_wa8_int4_step(codes, sc, off, k + 2, K), kiln_wa8_int4_step(codes, sc, off, k + 3, K),
                           out + k * 32);
  }
}

/* columns x0..x0+xc of B as the int8 kernels' unsigned panels [kp/4][32][4] (gemm_lowp.c's pack_b;
   columns past N: the weight 0) */
static void kiln_wa8_pack_b(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t kp, void *to, float *fbuf) {
  const kiln_wa8 *w = (const kiln_wa8 *)g;
  uint8_t *dst = (uint8_t *)to;
  (void)fbuf;
  for (int64_t c0 = x0; c0 < x0 + xc; c0 += 32, dst += kp * 32)
    for (int64_t v = 0; v < 32; v += KILN_L) {
      if (c0 + v < g->N) {
        kiln_wa8_pack_lanes(w, bt, c0 + v, kp, dst + 4 * v);
        continue;
      }
      for (int64_t k = 0; k < kp; k += 4) memset(dst + k * 32 + 4 * v, 0x80, (size_t)(4 * KILN_L));
    }
}

/* a finished block's int32 sums to float32 (rows i0.. of batch element bt, columns j0..) */
static void kiln_wa8_finish(const kiln_gemm *g, int64_t bt, const void *cv, int64_t ldc, int64_t rows, int64_t cols, int64_t i0, int64_t j0, float *out, int64_t ldo) {
  const kiln_wa8 *w = (const kiln_wa8 *)g;
  const int32_t *c = (const int32_t *)cv;
  const float *col = w->col_scale + j0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = bt * g->M + i0 + r;
    const int32_t offset = w->row_offset[row];
    const float scale = w->row_scale[row];
#pragma GCC ivdep
    for (int64_t j = 0; j < cols; ++j) out[r * ldo + j] = (float)(c[r * ldc + j] + offset) * scale * col[j];
  }
}

static const kiln_lowp_ops kiln_wa8_ops = {1, 64, kiln_int8_rows, kiln_wa8_pack_b, kiln_int8_block, kiln_wa8_finish,
                                           kiln_int8_amx_on, NULL, NULL, 1, 4, NULL};

typedef struct {
  const kiln_gemm *g;
  int8_t *codes;
  float *scale;
  int32_t *offset;
} kiln_wa8_rows_plan;

/* rows [lo, hi) of A (batch-major) quantized: codes [row][K], the row's scale and offset */
static void kiln_wa8_quantize(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_wa8_rows_plan *p = (const kiln_wa8_rows_plan *)ctx;
  const kiln_gemm *g = p->g;
  const int64_t K = g->K;
  (void)worker;
  for (int64_t row = lo; row < hi; ++row) {
    const int64_t first = (row / g->M) * g->a_bs + (row % g->M) * g->a_rs;
    const float *a = g->a + KILN_SPAN(first, (K - 1) * g->a_cs + 1, g->a_size, "A (rows to quantize)");
    float top = 0.0f, poison = 0.0f; /* poison: NaN where the row holds an inf or a NaN */
    int64_t k0 = 0;
    if (g->a_cs == 1) {
      kiln_vf vtop = {0}, vpoison = {0};
      const kiln_vi magnitude = (kiln_vi){0} + 0x7fffffff;
      for (; k0 + KILN_L <= K; k0 += KILN_L) {
        const kiln_vf x = *(const kiln_vfu *)(a + k0), m = (kiln_vf)((kiln_vi)x & magnitude);
        vtop = kiln_select(m > vtop, m, vtop);
        vpoison += x * 0.0f;
      }
      for (int l = 0; l < KILN_L; ++l) {
        top = vtop[l] > top ? vtop[l] : top;
        poison += vpoison[l];
      }
    }
    for (int64_t k = k0; k < K; ++k) {
      const float x = a[k * g->a_cs], m = __builtin_fabsf(x);
      top = m > top ? m : top;
      poison += x * 0.0f;
    }
    const float inv = top > 0.0f && poison == 0.0f ? 127.0f / top : 0.0f;
    const int32_t sum = kiln_wa8_bytes(a, g->a_cs, inv, K, p->codes + row * K);
    p->scale[row] = poison == 0.0f ? top / 127.0f : __builtin_nanf("");
    p->offset[row] = -128 * sum;
  }
}

/* a weight-only product of many rows through the int8 kernels (g->q_wide); 0 where this CPU has
   no VNNI or AMX-INT8 kernel (AVX2's VPMADDUBSW would saturate these bytes) or K is so deep that
   a row's int32 sum could overflow */
static int kiln_wa8_few(const kiln_gemm *g);

KILN_ENGINE int kiln_gemm_wa8_run(const kiln_gemm *g, int bits) {
  if (bits < 0) return bits == -8 && kiln_wa8_few(g); /* a decode step's few rows (int8 weights only) */
  if (kiln_int8_mode < 2 || g->K > 65536 || (bits == 4 && g->q_group % 4)) return 0;
  static _Thread_local float *s_cols, *s_rows, *s_codes;
  static _Thread_local int64_t have_cols, have_rows, have_codes;
  const int64_t rows = g->batch * g->M, cols = kiln_round_up(g->N, 32);
  float *col_scale = kiln_scratch(&s_cols, &have_cols, 2 * cols), *col_inv = col_scale + cols;
  float *row_data = kiln_scratch(&s_rows, &have_rows, 2 * rows);
  int8_t *codes = (int8_t *)kiln_scratch(&s_codes, &have_codes, (rows * g->K + 3) / 4);
  if (!col_scale || !row_data || !codes) return 0; /* out of memory: the float path */
  memset(col_scale, 0, (size_t)cols * sizeof(float));
  if (bits == 8)
    memcpy(col_scale, g->q_scale, (size_t)g->N * sizeof(float));
  else
    kiln_wa8_int4_scales(g, col_scale);
  for (int64_t j = 0; j < cols; ++j) col_inv[j] = col_scale[j] > 0.0f ? 1.0f / col_scale[j] : 0.0f;
  kiln_wa8_rows_plan rp = {g, codes, row_data, (int32_t *)(row_data + rows)};
  kiln_parallel_for(0, rows, 8, kiln_in_pool() ? 1 : 0, kiln_wa8_quantize, &rp);
  kiln_wa8 w = {*g, g, bits, col_scale, col_inv, rp.scale, rp.offset};
  w.g.b_low = NULL;
  w.g.b = NULL;
  w.g.q_wide = NULL;
  w.g.q_scale = NULL;
  w.g.q_offset = NULL;
  w.g.q_rows = 1; /* (gemm_int8.c's kernels: A the signed operand, B the unsigned) */
  w.g.q_given = (const uint8_t *)codes;
  w.g.q_given_size = rows * g->K;
  w.g.a_bs = g->M * g->K;
  w.g.a_rs = g->K;
  w.g.a_cs = 1;
  /* (B's panels built once and shared by the M blocks up to 64 MB, as gemm_wbf16.c's) */
  kiln_lowp_run_shared(&w.g, &kiln_wa8_ops, (int64_t)64 << 20);
  return 1;
}

/* -- a decode step's few rows (int8-weights-a8) ---------------------------------------------------

   Each row quantized as a prompt's row is (kiln_wa8_quantize: its own scale, codes in [-127, 127]);
   the int8 panels read where they lie ([K][32] bytes, no repacking: a decode step reads every
   weight once), four k-steps of the 32 columns (128 bytes) turned into k-quads in registers by one
   two-source byte shuffle per 16 columns (VPERMT2B where the CPU has AVX512-VBMI; GCC's sequence of
   shuffles elsewhere) and met by VPDPBUSD, up to 4 rows at a time. The sums are the prompt path's
   exact int32 ones, finished by the same expression: a row's result is the one it would get in a
   prompt, bit for bit. AVX512-VNNI builds (KILN_VB 64, int8 mode 3 or 4) only; elsewhere the float
   path (gemm_w8.c). */
#if KILN_VB == 64 && KILN_NR == 32 && defined(KILN_X86)
#define KILN_WA8_FEW 4 /* rows met by each quad at a time */
typedef uint8_t kiln_wa8_bytes64 __attribute__((vector_size(64)));

typedef void (*kiln_wa8_sums)(int64_t K, const int8_t *x, int rows, const int8_t *b, int32_t *sums);

typedef struct {
  const kiln_gemm *g;
  int64_t panels, per_task;
  const int8_t *codes; /* [batch * M][K] the rows' codes */
  const float *scale;  /* [batch * M] */
  const int32_t *offset;
  kiln_wa8_sums sums; /* this CPU's kernel (with VBMI's byte shuffle or without) */
} kiln_wa8_few_plan;

/* the int32 sums of R rows (a constant: the accumulators stay in registers; codes x, K apart) times
   one panel b, stored at sums[r][32]. Byte 4j + t of quad h is k-step t's column 16h + j: rows k,
   k + 1 are the first source's 64 bytes, k + 2, k + 3 the second's. */
#define KILN_WA8_FEW_BODY(R)                                                                           \
  {                                                                                                    \
    __m512i acc0[R], acc1[R];                                                                          \
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_si512();                            \
    for (int64_t k = 0; k < K; k += 4) {                                                               \
      kiln_wa8_bytes64 v0, v1;                                                                         \
      int32_t x4[R];                                                                                   \
      if (k + 4 <= K) {                                                                                \
        memcpy(&v0, b + k * 32, 64);                                                                   \
        memcpy(&v1, b + k * 32 + 64, 64);                                                              \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) memcpy(&x4[r], x + r * K + k, 4);                                  \
      } else { /* the last k-steps: zeros past K (a weight of 128 after the flip, times a code of 0) */ \
        uint8_t last[128] = {0};                                                                       \
        memcpy(last, b + k * 32, (size_t)(K - k) * 32);                                                \
        memcpy(&v0, last, 64);                                                                         \
        memcpy(&v1, last + 64, 64);                                                                    \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                                                  \
          x4[r] = 0;                                                                                   \
          memcpy(&x4[r], x + r * K + k, (size_t)(K - k));                                              \
        }                                                                                              \
      }                                                                                                \
      const __m512i q0 = (__m512i)(__builtin_shuffle(v0, v1, pick0) ^ flip);                           \
      const __m512i q1 = (__m512i)(__builtin_shuffle(v0, v1, pick1) ^ flip);                           \
      _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                                                    \
        acc0[r] = _mm512_dpbusd_epi32(acc0[r], q0, _mm512_set1_epi32(x4[r]));                          \
        acc1[r] = _mm512_dpbusd_epi32(acc1[r], q1, _mm512_set1_epi32(x4[r]));                          \
      }                                                                                                \
    }                                                                                                  \
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                                                      \
      _mm512_storeu_si512(sums + r * 32, acc0[r]);                                                     \
      _mm512_storeu_si512(sums + r * 32 + 16, acc1[r]);                                                \
    }                                                                                                  \
  }
#define KILN_WA8_FEW_SUMS(name, attributes)                                                                   \
  __attribute__((target(attributes))) static void name(int64_t K, const int8_t *x, int rows, const int8_t *b, \
                                                       int32_t *sums) {                                       \
    static const kiln_wa8_bytes64 pick0 = KILN_WA8_PICK(0), pick1 = KILN_WA8_PICK(16);                        \
    const kiln_wa8_bytes64 flip = (kiln_wa8_bytes64){0} + 0x80;                                               \
    switch (rows) {                                                                                           \
      case 1: KILN_WA8_FEW_BODY(1) break;                                                                     \
      case 2: KILN_WA8_FEW_BODY(2) break;                                                                     \
      case 3: KILN_WA8_FEW_BODY(3) break;                                                                     \
      default: KILN_WA8_FEW_BODY(4) break;                                                                    \
    }                                                                                                         \
  }
/* the shuffle's indices: byte i takes column c + i / 4 of k-row i % 4 (each row 32 bytes) */
#define KILN_WA8_Q(c, i) (32 * ((i) % 4) + (i) / 4 + (c))
#define KILN_WA8_Q8(c, i) KILN_WA8_Q(c, i), KILN_WA8_Q(c, i + 1), KILN_WA8_Q(c, i + 2), KILN_WA8_Q(c, i + 3), \
    KILN_WA8_Q(c, i + 4), KILN_WA8_Q(c, i + 5), KILN_WA8_Q(c, i + 6), KILN_WA8_Q(c, i + 7)
#define KILN_WA8_PICK(c) {KILN_WA8_Q8(c, 0), KILN_WA8_Q8(c, 8), KILN_WA8_Q8(c, 16), KILN_WA8_Q8(c, 24), \
    KILN_WA8_Q8(c, 32), KILN_WA8_Q8(c, 40), KILN_WA8_Q8(c, 48), KILN_WA8_Q8(c, 56)}
KILN_WA8_FEW_SUMS(kiln_wa8_few_vbmi, "avx512f,avx512bw,avx512vnni,avx512vbmi")
KILN_WA8_FEW_SUMS(kiln_wa8_few_bw, "avx512f,avx512bw,avx512vnni")
#undef KILN_WA8_FEW_SUMS
#undef KILN_WA8_FEW_BODY
#undef KILN_WA8_PICK
#undef KILN_WA8_Q8
#undef KILN_WA8_Q

static void kiln_wa8_few_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  (void)worker;
  const kiln_wa8_few_plan *p = (const kiln_wa8_few_plan *)ctx;
  const kiln_gemm *g = p->g;
  const int64_t M = g->M, N = g->N, K = g->K, runs = (p->panels + p->per_task - 1) / p->per_task;
  int32_t sums[KILN_WA8_FEW * 32] __attribute__((aligned(64)));
  float tile[KILN_WA8_FEW * 32] __attribute__((aligned(64)));
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / runs, first = (task % runs) * p->per_task;
    const int64_t last = first + p->per_task < p->panels ? first + p->per_task : p->panels;
    for (int64_t panel = first; panel < last; ++panel) {
      const int64_t n0 = panel * 32, nr = N - n0 < 32 ? N - n0 : 32;
      const int8_t *b = (const int8_t *)g->b_low + KILN_SPAN(bt * g->b_pbs + panel * K * 32, K * 32, g->b_packed_size, "B (int8 panels)");
      for (int64_t m0 = 0; m0 < M; m0 += KILN_WA8_FEW) {
        const int rows = (int)(M - m0 < KILN_WA8_FEW ? M - m0 : KILN_WA8_FEW);
        const int64_t row = bt * M + m0;
        p->sums(K, p->codes + row * K, rows, b, sums);
        const int64_t to = bt * g->c_bs + m0 * g->ldc + n0;
        (void)KILN_SPAN(to, (rows - 1) * g->ldc + nr, g->c_size, "C");
        for (int r = 0; r < rows; ++r) /* (the prompt path's finish: kiln_wa8_finish) */
          for (int64_t j = 0; j < nr; ++j)
            tile[r * 32 + j] = (float)(sums[r * 32 + j] + p->offset[row + r]) * p->scale[row + r] * g->q_scale[n0 + j];
        for (int r = 0; r < rows; ++r) memcpy(g->c + to + r * g->ldc, tile + r * 32, (size_t)nr * sizeof(float));
        kiln_finish fin;
        const kiln_finish *f = kiln_finish_at(g, m0, n0, &fin);
        if (f) kiln_finish_tile(f, g->c + to, g->ldc, rows, nr);
        if (g->epilogue) g->epilogue(g, bt, m0, m0 + rows, n0, n0 + nr);
      }
    }
  }
}

/* a decode step's few rows of an int8-weights-a8 product in int8; 0 where this build or CPU has no
   kernel for them (the float path then) */
static int kiln_wa8_few(const kiln_gemm *g) {
  if (kiln_int8_mode < 3 || g->K > 65536 || g->a_cs != 1) return 0;
  static _Thread_local float *s_rows, *s_codes;
  static _Thread_local int64_t have_rows, have_codes;
  const int64_t rows = g->batch * g->M;
  float *row_data = kiln_scratch(&s_rows, &have_rows, 2 * rows);
  int8_t *codes = (int8_t *)kiln_scratch(&s_codes, &have_codes, (rows * g->K + 3) / 4);
  if (!row_data || !codes) return 0;
  kiln_wa8_rows_plan rp = {g, codes, row_data, (int32_t *)(row_data + rows)};
  kiln_wa8_quantize(&rp, 0, rows, 0);
  kiln_wa8_few_plan plan = {g, (g->N + 31) / 32, 1, codes, rp.scale, rp.offset,
                            __builtin_cpu_supports("avx512vbmi") ? kiln_wa8_few_vbmi : kiln_wa8_few_bw};
  kiln_panel_tasks(g, plan.panels, &plan.per_task, kiln_wa8_few_tasks, &plan);
  return 1;
}
#else
static int kiln_wa8_few(const kiln_gemm *g) {
  (void)g;
  return 0;
}
#endif
