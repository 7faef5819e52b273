/* The weight-only int4 path of the matrix-multiply engine (precision "int4-weights"): C = A . B
   with A float32 activations and B constant 4-bit weights in groups of q_group consecutive k of a
   column, each group with a float16 scale (q_half: its bits) and a float32 offset: B[k][j] =
   code * scale + offset (symmetric: offset = -8 * scale, not stored, q_min NULL; asymmetric:
   q_min). Packed when the plan was built
   (engine.py's pack_cols_int4) in panels of KILN_NR columns: [panel][Kp / 8][NR] 32-bit words,
   word (c, j) holding the codes of k = 8c .. 8c + 7 of column j, k-step t in bits 4t .. 4t + 3;
   scales and offsets [panel][Kp / group][NR]. Kp is K rounded up to the group (codes of 0).

   A decode step reads every weight once: bytes decide its speed, and 4-bit codes read an eighth
   of float32's (plus a scale per group), so the arithmetic per weight must stay under the memory's
   pace. Few rows (a decode step's, kiln_w4_rows_n): the activations are quantized at run time per
   group of k (int8, one scale per group: what llama.cpp's Q8_0 dot products, ONNX Runtime's
   MatMulNBits at accuracy level 4 and OpenVINO's dynamic quantization do), and each word vector's
   codes meet them in 32-bit integer dot products, four k-steps an instruction (AVX512-VNNI
   VPDPBUSD; VPMADDUBSW + VPMADDWD on AVX-512BW and AVX2; plain vector code elsewhere, the same
   exact sums); per group the sums are scaled to float once. Many rows (a prompt's): a KC-deep block
   of a panel is dequantized once into float32 and multiplied by gemm.c's micro-kernel with the
   activations in float32.

   Work is split over the pool by column panels, as gemm_w8.c splits it. */

#define KILN_W4_CHUNK 8                /* k-steps per 32-bit word */
#define KILN_W4_ROWS 4                 /* rows of A multiplied in registers at a time (few rows) */
#define KILN_W4_WIDEN_ROWS (2 * KILN_MR) /* from this many rows, a block is dequantized once */

typedef struct {
  const kiln_gemm *g;
  int64_t panels, per_task, padded, groups;
  /* few rows: A quantized per group, [batch][M][padded] int8 in the order kiln_w4_rows_n reads
     (each eight k-steps as 0 2 4 6 1 3 5 7), with each group's scale and the scaled sum of its
     quantized values [batch][M][groups] */
  const int8_t *x;
  const float *scales, *sums;
} kiln_w4_plan;

/* acc + the dot products of four bytes: in each 32-bit lane, unsigned codes (0..15) times the
   same four signed activations x4 (one int32). Every path sums exactly in int32 (15 x 127 x 4
   fits in a 16-bit pair sum too), so every ISA gives the same sums. */
#if defined(__AVX512VNNI__) && KILN_VB == 64
#include <immintrin.h>
static inline __attribute__((always_inline)) kiln_vi kiln_w4_dot(kiln_vi acc, kiln_vi codes, int32_t x4) {
  return (kiln_vi)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)codes, _mm512_set1_epi32(x4));
}
#elif defined(__AVX512BW__) && KILN_VB == 64
#include <immintrin.h>
static inline __attribute__((always_inline)) kiln_vi kiln_w4_dot(kiln_vi acc, kiln_vi codes, int32_t x4) {
  const __m512i pairs = _mm512_maddubs_epi16((__m512i)codes, _mm512_set1_epi32(x4));
  return acc + (kiln_vi)_mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
}
#elif defined(__AVX2__) && KILN_VB == 32
#include <immintrin.h>
static inline __attribute__((always_inline)) kiln_vi kiln_w4_dot(kiln_vi acc, kiln_vi codes, int32_t x4) {
  const __m256i pairs = _mm256_maddubs_epi16((__m256i)codes, _mm256_set1_epi32(x4));
  return acc + (kiln_vi)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
#else
static inline __attribute__((always_inline)) kiln_vi kiln_w4_dot(kiln_vi acc, kiln_vi codes, int32_t x4) {
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) acc += ((codes >> (8 * b)) & 255) * (int32_t)(int8_t)(x4 >> (8 * b));
  return acc;
}
#endif

/* KILN_L float16 scales (their bits) as a float vector: one conversion instruction where the
   target has one (AVX-512, F16C), bit by bit elsewhere */
static inline float kiln_half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 31u, mantissa = h & 1023u;
  uint32_t bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  if (exponent == 31) bits = sign | 0x7f800000u | (mantissa << 13);
  if (exponent == 0) { /* zero, or subnormal: mantissa x 2^-24 */
    const float value = (float)mantissa * 0x1p-24f;
    memcpy(&bits, &value, sizeof bits);
    bits |= sign;
  }
  float out;
  memcpy(&out, &bits, sizeof out);
  return out;
}

#if (defined(__AVX512F__) && KILN_VB == 64) || (defined(__F16C__) && KILN_VB == 32)
#include <immintrin.h>
#endif
static inline __attribute__((always_inline)) kiln_vf kiln_half_load(const uint16_t *p) {
#if defined(__AVX512F__) && KILN_VB == 64
  return (kiln_vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__F16C__) && KILN_VB == 32
  return (kiln_vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
  kiln_vf v;
  for (int i = 0; i < KILN_L; ++i) v[i] = kiln_half_to_float(p[i]);
  return v;
#endif
}

/* one k-step of a panel (a word vector pair at w): its codes split into the even k-steps' (w &
   0x0f0f0f0f: bytes 0 2 4 6) and the odd ones' ((w >> 4) & 0x0f0f0f0f), met by a row's activations
   stored in that order (xe, xo: four bytes each) into its int32 sums */
static inline __attribute__((always_inline)) void kiln_w4_step(const int32_t *w, int32_t xe, int32_t xo, kiln_vi *sum0, kiln_vi *sum1) {
  const kiln_vi nibbles = (kiln_vi){0} + 0x0f0f0f0f;
  const kiln_vi w0 = *(const kiln_vi *)w, w1 = *(const kiln_vi *)(w + KILN_L);
  *sum0 = kiln_w4_dot(kiln_w4_dot(*sum0, w0 & nibbles, xe), (w0 >> 4) & nibbles, xo);
  *sum1 = kiln_w4_dot(kiln_w4_dot(*sum1, w1 & nibbles, xe), (w1 >> 4) & nibbles, xo);
}

/* a group's int32 sums of a row into its float accumulators: sum x * w = scale_x * scale_w * sum
   xq * code + offset_w * scale_x * sum xq (the group's scales at `scale`, offsets at `offset` or
   -8 x scale; sx the row's group scale, total its quantized sum times sx) */
static inline __attribute__((always_inline)) void kiln_w4_group(const uint16_t *scale, const float *offset, float sx, float total, kiln_vi sum0, kiln_vi sum1, kiln_vf *acc0, kiln_vf *acc1) {
  const kiln_vf s0 = kiln_half_load(scale), s1 = kiln_half_load(scale + KILN_L);
  const kiln_vf o0 = offset ? *(const kiln_vf *)offset : -8.0f * s0;
  const kiln_vf o1 = offset ? *(const kiln_vf *)(offset + KILN_L) : -8.0f * s1;
  *acc0 += __builtin_convertvector(sum0, kiln_vf) * (s0 * sx) + total * o0;
  *acc1 += __builtin_convertvector(sum1, kiln_vf) * (s1 * sx) + total * o1;
}

/* `rows` (a constant at each call) quantized rows of A (x, ldx bytes apart; their group scales
   and sums, lds apart) times one int4 panel, stored (finished when `f` is given) into c: each step
   kiln_w4_step, each group's sums into float by kiln_w4_group. */
static inline __attribute__((always_inline)) void kiln_w4_rows_n(const int rows, const kiln_w4_plan *p, const int8_t *restrict x, int64_t ldx, const float *restrict xs, const float *restrict sums, int64_t lds, const int32_t *restrict w, const uint16_t *restrict scale, const float *restrict offset, float *restrict c, int64_t ldc, const kiln_finish *f) {
  kiln_vf acc0[KILN_W4_ROWS], acc1[KILN_W4_ROWS];
  const int64_t steps = p->g->q_group / KILN_W4_CHUNK;
#pragma GCC unroll 4
  for (int r = 0; r < rows; ++r) acc0[r] = acc1[r] = (kiln_vf){0};
  for (int64_t group = 0; group < p->groups; ++group) {
    kiln_vi sum0[KILN_W4_ROWS], sum1[KILN_W4_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) sum0[r] = sum1[r] = (kiln_vi){0};
    for (int64_t step = 0; step < steps; ++step) {
#pragma GCC unroll 4
      for (int r = 0; r < rows; ++r) {
        int32_t xe, xo;
        memcpy(&xe, x + r * ldx, 4);
        memcpy(&xo, x + r * ldx + 4, 4);
        kiln_w4_step(w, xe, xo, &sum0[r], &sum1[r]);
      }
      w += KILN_NR;
      x += KILN_W4_CHUNK;
    }
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r)
      kiln_w4_group(scale, offset, xs[r * lds + group], sums[r * lds + group], sum0[r], sum1[r], &acc0[r], &acc1[r]);
    scale += KILN_NR;
    if (offset) offset += KILN_NR;
  }
  kiln_store_tile(rows, acc0, acc1, c, ldc, f);
}

/* mr <= KILN_W4_ROWS rows of one panel, nr <= NR of its columns valid: a narrower tile goes
   through a scratch tile (the padded columns, scale and offset 0, are computed there, never stored) */
static void kiln_w4_tile(const kiln_w4_plan *p, int64_t mr, int64_t nr, int64_t row, const int32_t *w, const uint16_t *scale, const float *offset, float *c, const kiln_finish *f) {
  float tile[KILN_W4_ROWS * KILN_NR] __attribute__((aligned(64)));
  const int whole = nr == KILN_NR;
  float *out = whole ? c : tile;
  const int64_t ldo = whole ? p->g->ldc : KILN_NR, ldx = p->padded, lds = p->groups;
  const int8_t *x = p->x + row * ldx;
  const float *xs = p->scales + row * lds, *sums = p->sums + row * lds;
  const kiln_finish *inner = whole ? f : NULL;
  switch (mr) {
    case 1: kiln_w4_rows_n(1, p, x, ldx, xs, sums, lds, w, scale, offset, out, ldo, inner); break;
    case 2: kiln_w4_rows_n(2, p, x, ldx, xs, sums, lds, w, scale, offset, out, ldo, inner); break;
    case 3: kiln_w4_rows_n(3, p, x, ldx, xs, sums, lds, w, scale, offset, out, ldo, inner); break;
    default: kiln_w4_rows_n(4, p, x, ldx, xs, sums, lds, w, scale, offset, out, ldo, inner); break;
  }
  if (!whole) {
    for (int64_t r = 0; r < mr; ++r) memcpy(c + r * p->g->ldc, tile + r * KILN_NR, (size_t)nr * sizeof(float));
    if (f) kiln_finish_tile(f, c, p->g->ldc, mr, nr);
  }
}

/* one row of A (quantized; M 1) times KILN_W4_SET whole panels read side by side, a step of each in
   turn: several streams from memory at once (as gemm_rows.c's kiln_stream_set; one panel's codes
   read alone run ~10% under the memory's pace), each panel's sums kiln_w4_rows_n's, in its order */
#define KILN_W4_SET (KILN_VB == 64 ? 4 : 2)
static void kiln_w4_row_set(const kiln_w4_plan *p, int64_t bt, int64_t first) {
  const kiln_gemm *g = p->g;
  const int64_t words = p->padded / KILN_W4_CHUNK * KILN_NR, params = p->groups * KILN_NR;
  const int64_t steps = g->q_group / KILN_W4_CHUNK;
  const int32_t *w[KILN_W4_SET];
  const uint16_t *scale[KILN_W4_SET];
  const float *offset[KILN_W4_SET];
  kiln_vf acc0[KILN_W4_SET], acc1[KILN_W4_SET];
#pragma GCC unroll 4
  for (int s = 0; s < KILN_W4_SET; ++s) {
    const int64_t at = KILN_SPAN(bt * g->b_pbs + (first + s) * words, words, g->b_packed_size, "B (int4 words)");
    w[s] = (const int32_t *)g->b_low + at;
    scale[s] = g->q_half + (first + s) * params;
    offset[s] = g->q_min ? g->q_min + (first + s) * params : NULL;
    acc0[s] = acc1[s] = (kiln_vf){0};
  }
  const int8_t *x = p->x + bt * p->padded;
  const float *xs = p->scales + bt * p->groups, *sums = p->sums + bt * p->groups;
  for (int64_t group = 0; group < p->groups; ++group) {
    kiln_vi sum0[KILN_W4_SET], sum1[KILN_W4_SET];
#pragma GCC unroll 4
    for (int s = 0; s < KILN_W4_SET; ++s) sum0[s] = sum1[s] = (kiln_vi){0};
    for (int64_t step = 0; step < steps; ++step) {
      int32_t xe, xo;
      memcpy(&xe, x, 4);
      memcpy(&xo, x + 4, 4);
#pragma GCC unroll 4
      for (int s = 0; s < KILN_W4_SET; ++s) {
        kiln_w4_step(w[s], xe, xo, &sum0[s], &sum1[s]);
        w[s] += KILN_NR;
      }
      x += KILN_W4_CHUNK;
    }
#pragma GCC unroll 4
    for (int s = 0; s < KILN_W4_SET; ++s) {
      kiln_w4_group(scale[s], offset[s], xs[group], sums[group], sum0[s], sum1[s], &acc0[s], &acc1[s]);
      scale[s] += KILN_NR;
      if (offset[s]) offset[s] += KILN_NR;
    }
  }
  kiln_set_store(g, bt, first, KILN_W4_SET, acc0, acc1);
}

/* k-step k of a panel's codes widened to float32 at dst (its NR columns): code x scale + offset (a
   symmetric group's offset -8 x scale); a last panel's columns past N hold code, scale and offset
   0, so 0 (this path's prompt rows and gemm_wbf16.c's) */
static inline __attribute__((always_inline)) void kiln_w4_widen_step(const int32_t *codes, const uint16_t *scale, const float *offset, int64_t group, int64_t k, float *dst) {
  const int64_t at = (k / group) * KILN_NR;
  const int32_t *word = codes + (k / KILN_W4_CHUNK) * KILN_NR;
  const kiln_vf s0 = kiln_half_load(scale + at), s1 = kiln_half_load(scale + at + KILN_L);
  const kiln_vf o0 = offset ? *(const kiln_vf *)(offset + at) : -8.0f * s0;
  const kiln_vf o1 = offset ? *(const kiln_vf *)(offset + at + KILN_L) : -8.0f * s1;
  const int shift = 4 * (int)(k % KILN_W4_CHUNK);
  const kiln_vi w0 = *(const kiln_vi *)word, w1 = *(const kiln_vi *)(word + KILN_L);
  *(kiln_vf *)dst = __builtin_convertvector((w0 >> shift) & 15, kiln_vf) * s0 + o0;
  *(kiln_vf *)(dst + KILN_L) = __builtin_convertvector((w1 >> shift) & 15, kiln_vf) * s1 + o1;
}

/* many rows (a prompt's): each KC-deep block of the panel dequantized once into float32 (what the
   float micro-kernel streams), then every row of A multiplied by it, read in place */
static void kiln_w4_panel_rows(const kiln_w4_plan *p, int64_t bt, const int32_t *w, const uint16_t *scale, const float *offset, int64_t n0, int64_t nr) {
  static _Thread_local float *block;
  static _Thread_local int64_t have;
  const kiln_gemm *g = p->g;
  const int64_t K = g->K, group = g->q_group;
  const int64_t kblock = KILN_KC >= KILN_W4_CHUNK ? KILN_KC / KILN_W4_CHUNK * KILN_W4_CHUNK : KILN_W4_CHUNK;
  float *panel = kiln_scratch(&block, &have, kblock * KILN_NR);
  for (int64_t k0 = 0; k0 < K; k0 += kblock) {
    const int64_t kc = K - k0 < kblock ? K - k0 : kblock;
    for (int64_t q = 0; q < kc; ++q) kiln_w4_widen_step(w, scale, offset, group, k0 + q, panel + q * KILN_NR);
    kiln_block_rows(g, bt, panel, k0, kc, n0, nr);
  }
}

static void kiln_w4_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  (void)worker;
  const kiln_w4_plan *p = (const kiln_w4_plan *)ctx;
  const kiln_gemm *g = p->g;
  const int64_t M = g->M, N = g->N, runs = (p->panels + p->per_task - 1) / p->per_task;
  const int64_t words = p->padded / KILN_W4_CHUNK * KILN_NR, params = p->groups * KILN_NR;
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / runs, first = (task % runs) * p->per_task;
    const int64_t last = first + p->per_task < p->panels ? first + p->per_task : p->panels;
    int64_t panel = first;
    for (; p->x && M == 1 && panel + KILN_W4_SET <= last && (panel + KILN_W4_SET) * KILN_NR <= N; panel += KILN_W4_SET)
      kiln_w4_row_set(p, bt, panel);
    for (; panel < last; ++panel) {
      const int64_t n0 = panel * KILN_NR, nr = N - n0 < KILN_NR ? N - n0 : KILN_NR;
      const int64_t at = KILN_SPAN(bt * g->b_pbs + panel * words, words, g->b_packed_size, "B (int4 words)");
      const int32_t *w = (const int32_t *)g->b_low + at;
      const uint16_t *scale = g->q_half + panel * params;
      const float *offset = g->q_min ? g->q_min + panel * params : NULL;
      if (!p->x) {
        kiln_w4_panel_rows(p, bt, w, scale, offset, n0, nr);
        continue;
      }
      for (int64_t m0 = 0; m0 < M; m0 += KILN_W4_ROWS) {
        const int64_t mr = M - m0 < KILN_W4_ROWS ? M - m0 : KILN_W4_ROWS;
        const int64_t to = bt * g->c_bs + m0 * g->ldc + n0;
        (void)KILN_SPAN(to, (mr - 1) * g->ldc + nr, g->c_size, "C");
        kiln_finish fin;
        kiln_w4_tile(p, mr, nr, bt * M + m0, w, scale, offset, g->c + to, kiln_finish_at(g, m0, n0, &fin));
        if (g->epilogue) g->epilogue(g, bt, m0, m0 + mr, n0, n0 + nr);
      }
    }
  }
}

/* few rows: A quantized per group of k (symmetric int8: scale = largest magnitude / 127) into a
   zero-padded copy, each eight k-steps stored as 0 2 4 6 1 3 5 7 (kiln_w4_rows_n's order), with
   each group's scale and the sum of its quantized values times the scale (the weights' offsets
   multiply the activations as quantized: a symmetric group's offset, -8 x scale, then cancels the
   codes' 8 exactly, as an integer Q4_0 x Q8_0 dot product does); 0 when out of memory */
static int kiln_w4_quantize_rows(kiln_w4_plan *p) {
  static _Thread_local float *copy;
  static _Thread_local int64_t have;
  const kiln_gemm *g = p->g;
  const int64_t rows = g->batch * g->M, group = g->q_group;
  float *floats = kiln_scratch(&copy, &have, rows * 2 * p->groups + (rows * p->padded + 3) / 4);
  if (!floats) return 0;
  float *scales = floats, *sums = floats + rows * p->groups;
  int8_t *x = (int8_t *)(floats + rows * 2 * p->groups);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t from = (row / g->M) * g->a_bs + (row % g->M) * g->a_rs;
    (void)KILN_SPAN(from, g->K, g->a_size, "A (in place)");
    const float *a = g->a + from;
    int8_t *to = x + row * p->padded;
    for (int64_t i = 0; i < p->groups; ++i) {
      const int64_t k0 = i * group, count = g->K - k0 < group ? g->K - k0 : group;
      float top = 0.0f;
      for (int64_t k = 0; k < count; ++k) top = fabsf(a[k0 + k]) > top ? fabsf(a[k0 + k]) : top;
      const float scale = top / 127.0f, inverse = top > 0.0f ? 127.0f / top : 0.0f;
      int32_t total = 0;
      for (int64_t k = 0; k < group; ++k) {
        const int32_t v = k < count ? (int32_t)lrintf(a[k0 + k] * inverse) : 0;
        const int64_t t = k % KILN_W4_CHUNK;
        to[k0 + k - t + (t % 2) * 4 + t / 2] = (int8_t)v;
        total += v;
      }
      scales[row * p->groups + i] = scale;
      sums[row * p->groups + i] = scale * (float)total;
    }
  }
  p->x = x;
  p->scales = scales;
  p->sums = sums;
  return 1;
}

KILN_ENGINE void kiln_gemm_w4_run(const kiln_gemm *g) {
  if (g->M <= 0 || g->N <= 0) return;
  if (g->q_wide && g->M >= KILN_W4_WIDEN_ROWS && g->q_wide(g, 4)) return; /* a prompt's rows in bf16 */
  const int64_t padded = (g->K + g->q_group - 1) / g->q_group * g->q_group;
  kiln_w4_plan plan = {g, (g->N + KILN_NR - 1) / KILN_NR, 1, padded, padded / g->q_group, NULL, NULL, NULL};
  /* few rows quantized (else, or out of memory for their copy: the weights dequantized per block) */
  if (g->M < KILN_W4_WIDEN_ROWS) (void)kiln_w4_quantize_rows(&plan);
  kiln_panel_tasks(g, plan.panels, &plan.per_task, kiln_w4_tasks, &plan);
}
