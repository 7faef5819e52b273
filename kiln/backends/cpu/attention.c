/* kiln's attention driver (included in generated code that uses it; needs gemm.c).

   softmax(chain(Q K^T)) V for each of BH (batch x head) slices, the slices spread over the cores.
   A slice's LQ x LK scores live in one per-thread block of `scratch` (threads x LQ x LK floats, in
   the arena): Q K^T and P V are matrix products on the engine (run single-threaded inside this
   parallel loop), the scale/mask chain is the generated epilogue applied to the scores block, and
   each row's softmax is max, kiln_expf (vectorized), a double-precision sum and one scaling. The
   [BH, LQ, LK] score tensor is never written whole. A decode step's few query rows skip the engine
   (direct loops, kiln_attention_direct), and slices that share K and V (a grouped head's query
   heads: K's and V's inner slice stride 0) are taken a few together, their rows' scores in a
   per-thread block of `rows` (KILN_ATTENTION_FEW x LK), each key and value read once for all.

   Operands are strided views (kiln_view), so splitting and merging heads costs no copies: slice
   bh = outer * n1 + inner starts at outer * s0 + inner * s1, its element (r, c) at r * rs + c * cs
   (the output's cs is 1). `size` is the whole buffer's, for the KILN_DEBUG checks. */

typedef struct {
  int64_t size, n1, s0, s1, rs, cs;
} kiln_view;

static inline int64_t kiln_view_at(const kiln_view *w, int64_t bh) { return (bh / w->n1) * w->s0 + (bh % w->n1) * w->s1; }

typedef struct {
  int64_t LQ, LK, D, DV;
  const float *q, *kt, *v;
  float *out, *scratch, *rows; /* rows: per-thread KILN_ATTENTION_FEW x LK blocks for slices taken together (or null) */
  kiln_view qv, kv, vv, ov;
  const kiln_gemm *ctx;
  int safe;
  void (*product)(const kiln_gemm *); /* the engine's float path, or its bf16 path (gemm_bf16.c) */
} kiln_attention_job;

/* the sum of a vector's lanes, halves folded (a tree of log2(lanes) adds in registers, not a
   chain of lanes - 1 scalar adds through memory) */
#if defined(__AVX512F__) && KILN_VB == 64
#include <immintrin.h>
static inline float kiln_lanes_sum(kiln_vf v) { return _mm512_reduce_add_ps((__m512)v); }
/* four vectors' lane sums into out[0..3] at once: their 128-bit quarters added across the four
   (two rounds of shuffles), then each quarter's lanes (15 instructions, not four reductions' 32) */
#define KILN_HAVE_SUM4 1
static inline void kiln_lanes_sum4(kiln_vf a, kiln_vf b, kiln_vf c, kiln_vf d, float *out) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4((__m512)a, (__m512)b, 0x44), _mm512_shuffle_f32x4((__m512)a, (__m512)b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4((__m512)c, (__m512)d, 0x44), _mm512_shuffle_f32x4((__m512)c, (__m512)d, 0xEE));
  /* ab's quarters: a0+a2, a1+a3, b0+b2, b1+b3 (cd's likewise) -> a, b, c, d quarters */
  __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4E)); /* within each quarter: lanes 0+2, 1+3 */
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1)); /* then 0+1: every lane its quarter's sum */
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), x)));
}
#elif defined(__AVX__) && KILN_VB == 32
#include <immintrin.h>
static inline float kiln_lanes_sum(kiln_vf v) {
  __m128 half = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
}
#else
static inline float kiln_lanes_sum(kiln_vf v) {
  float lanes[KILN_L];
  memcpy(lanes, &v, sizeof v);
  for (int width = KILN_L / 2; width > 0; width /= 2)
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  return lanes[0];
}
#endif

/* a few query rows (a decode step's): the two products as direct loops over the operands where
   they sit (K's rows and V's rows contiguous along the head dimension), no packing: Q K^T one
   dot product per key (here), P V one scaled row of V added per key (kiln_attention_values).
   Returns 0 (the engine's products instead) where the layout or the product's path (bf16) asks
   for the engine.

   Each step's work is a few short dot products, so a chain of dependent adds (one accumulator a
   key, or one a vector of output columns) would bound it by the adds' latency, not by the loads:
   KILN_ATTENTION_KEYS keys at a time (each with an accumulator per row, the keys' vectors loaded
   once for all rows), and P V KILN_ATTENTION_BLOCK vectors of columns at a time. */
#define KILN_ATTENTION_FEW 4
#if KILN_VB == 64
#define KILN_ATTENTION_KEYS 4 /* rows x keys accumulators and the keys' vectors: 16 + 4 of 32 registers */
#else
#define KILN_ATTENTION_KEYS 2 /* 8 + 2 of 16 */
#endif
#define KILN_ATTENTION_BLOCK 4

/* the scores of `rows` (a constant at each call) rows q[i] against every key, D whole vectors */
static inline __attribute__((always_inline)) void kiln_attention_scores_n(const int rows, int64_t LK, int64_t D, const float *const *q, const float *kt, int64_t kcs, float *s) {
  int64_t j = 0;
  for (; j + KILN_ATTENTION_KEYS <= LK; j += KILN_ATTENTION_KEYS) {
    kiln_vf acc[KILN_ATTENTION_FEW][KILN_ATTENTION_KEYS] = {{{0}}};
    for (int64_t d = 0; d < D; d += KILN_L) {
      kiln_vf key[KILN_ATTENTION_KEYS];
      for (int c = 0; c < KILN_ATTENTION_KEYS; ++c) key[c] = *(const kiln_vfu *)(kt + (j + c) * kcs + KILN_AT(d, D, "K row"));
      for (int i = 0; i < rows; ++i) {
        const kiln_vf x = *(const kiln_vfu *)(q[i] + d);
        for (int c = 0; c < KILN_ATTENTION_KEYS; ++c) acc[i][c] += x * key[c];
      }
    }
    for (int i = 0; i < rows; ++i) {
#if defined(KILN_HAVE_SUM4) && KILN_ATTENTION_KEYS == 4
      kiln_lanes_sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], s + i * LK + KILN_AT(j + 3, LK, "scores") - 3);
#else
      for (int c = 0; c < KILN_ATTENTION_KEYS; ++c) s[i * LK + j + c] = kiln_lanes_sum(acc[i][c]);
#endif
    }
  }
  for (; j < LK; ++j) { /* the last keys, one at a time */
    const float *key = kt + j * kcs;
    for (int i = 0; i < rows; ++i) {
      kiln_vf acc = {0};
      for (int64_t d = 0; d < D; d += KILN_L) acc += *(const kiln_vfu *)(q[i] + d) * *(const kiln_vfu *)(key + KILN_AT(d, D, "K row"));
      s[i * LK + j] = kiln_lanes_sum(acc);
    }
  }
}

/* whether the few-row loops serve this job (else the engine's products) */
static int kiln_attention_few(const kiln_attention_job *job, int64_t rows) {
#ifdef KILN_HAVE_WIDE
  const int float_rows = job->product == kiln_gemm_run || job->product == kiln_gemm_wide_run; /* (few rows: float32) */
#else
  const int float_rows = job->product == kiln_gemm_run;
#endif
  return rows <= KILN_ATTENTION_FEW && float_rows && job->qv.cs == 1 && job->kv.rs == 1 && job->vv.cs == 1;
}

/* the scores of `rows` query rows q[i] (row i's block at s + i * LK) */
static void kiln_attention_direct(const kiln_attention_job *job, int64_t rows, const float *const *q, const float *kt, float *s) {
  const int64_t LK = job->LK, D = job->D, kcs = job->kv.cs;
  if (D % KILN_L == 0) { /* whole vectors: each key read once for every query row */
    switch (rows) {
      case 1: kiln_attention_scores_n(1, LK, D, q, kt, kcs, s); return;
      case 2: kiln_attention_scores_n(2, LK, D, q, kt, kcs, s); return;
      case 3: kiln_attention_scores_n(3, LK, D, q, kt, kcs, s); return;
      default: kiln_attention_scores_n(4, LK, D, q, kt, kcs, s); return;
    }
  }
  for (int64_t j = 0; j < LK; ++j) {
    const float *key = kt + j * kcs;
    for (int64_t i = 0; i < rows; ++i) {
      const float *row = q[i];
      float total = 0.0f;
#pragma omp simd reduction(+ : total)
      for (int64_t d = 0; d < D; ++d) total += row[d] * key[KILN_AT(d, D, "K row")];
      s[i * LK + j] = total;
    }
  }
}

/* P V for `rows` (a constant at each call) rows: KILN_ATTENTION_BLOCK vectors of output columns at
   a time (then one), the rows' sums held in registers over every key, each key's vectors of V
   read once for all of them */
static inline __attribute__((always_inline)) void kiln_attention_values_n(const int rows, int64_t LK, int64_t DV, const float *s, const float *v, int64_t vrs, float *const *out) {
  int64_t e = 0;
  for (; e + KILN_ATTENTION_BLOCK * KILN_L <= DV; e += KILN_ATTENTION_BLOCK * KILN_L) {
    kiln_vf acc[KILN_ATTENTION_FEW][KILN_ATTENTION_BLOCK] = {{{0}}};
    for (int64_t j = 0; j < LK; ++j) {
      kiln_vf value[KILN_ATTENTION_BLOCK];
      for (int c = 0; c < KILN_ATTENTION_BLOCK; ++c) value[c] = *(const kiln_vfu *)(v + j * vrs + KILN_AT(e + c * KILN_L, DV, "V row"));
      for (int i = 0; i < rows; ++i) {
        const float p = s[i * LK + j];
        for (int c = 0; c < KILN_ATTENTION_BLOCK; ++c) acc[i][c] += p * value[c];
      }
    }
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < KILN_ATTENTION_BLOCK; ++c) *(kiln_vfu *)(out[i] + e + c * KILN_L) = acc[i][c];
  }
  for (; e < DV; e += KILN_L) {
    kiln_vf acc[KILN_ATTENTION_FEW] = {{0}};
    for (int64_t j = 0; j < LK; ++j) {
      const kiln_vf value = *(const kiln_vfu *)(v + j * vrs + KILN_AT(e, DV, "V row"));
      for (int i = 0; i < rows; ++i) acc[i] += s[i * LK + j] * value;
    }
    for (int i = 0; i < rows; ++i) *(kiln_vfu *)(out[i] + e) = acc[i];
  }
}

/* P V for the few rows (row i's probabilities at s + i * LK, its output at out[i]): each row of V
   read once and added, scaled, to every output row */
static void kiln_attention_values(const kiln_attention_job *job, int64_t rows, const float *s, const float *v, float *const *out) {
  const int64_t LK = job->LK, DV = job->DV, vrs = job->vv.rs;
  if (DV % KILN_L == 0) { /* (the slice's V span is checked by the caller) */
    switch (rows) {
      case 1: kiln_attention_values_n(1, LK, DV, s, v, vrs, out); return;
      case 2: kiln_attention_values_n(2, LK, DV, s, v, vrs, out); return;
      case 3: kiln_attention_values_n(3, LK, DV, s, v, vrs, out); return;
      default: kiln_attention_values_n(4, LK, DV, s, v, vrs, out); return;
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
    for (int64_t e = 0; e < DV; ++e) out[i][e] = 0.0f;
  }
  for (int64_t j = 0; j < LK; ++j) {
    const float *value = v + j * vrs;
    for (int64_t i = 0; i < rows; ++i) {
      const float p = s[i * LK + j];
      float *o = out[i];
#pragma omp simd
      for (int64_t e = 0; e < DV; ++e) o[e] += p * value[KILN_AT(e, DV, "V row")];
    }
  }
}

/* each row's softmax in place (a block of `rows` rows of LK scores) */
static void kiln_attention_softmax(const kiln_attention_job *job, int64_t rows, float *s) {
  const int64_t LK = job->LK;
  for (int64_t i = 0; i < rows; ++i) {
    float *row = s + i * LK;
    /* a NaN score need not win the max: row - high is NaN at it, so the sum and the whole row
       are NaN either way; all -inf gives NaN as the reference does */
    float high = -INFINITY;
#pragma omp simd reduction(max : high)
    for (int64_t j = 0; j < LK; ++j) high = high > row[KILN_AT(j, LK, "scores")] ? high : row[j];
#pragma omp simd
    for (int64_t j = 0; j < LK; ++j) row[j] = kiln_expf(row[j] - high);
    double total = 0.0;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < LK; ++j) total += (double)row[j];
    const float inverse = (float)(1.0 / total);
    if (job->safe && total != total) { /* a fully masked row (all scores -inf): zeros, not NaN */
      for (int64_t j = 0; j < LK; ++j) row[j] = 0.0f;
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < LK; ++j) row[j] *= inverse;
  }
}

/* `count` slices from bh that share K and V (their inner slice dim repeats K's and V's) on the
   few-row loops together: their rows' scores in one block, each key and value read once for all */
static void kiln_attention_together(const kiln_attention_job *job, int64_t bh, int64_t count, float *s) {
  const int64_t LQ = job->LQ, LK = job->LK, D = job->D, DV = job->DV;
  const kiln_view qv = job->qv, kv = job->kv, vv = job->vv, ov = job->ov;
  const float *q[KILN_ATTENTION_FEW];
  float *out[KILN_ATTENTION_FEW];
  const int64_t ko = kiln_view_at(&kv, bh), vo = kiln_view_at(&vv, bh);
  (void)KILN_SPAN(ko, (LK - 1) * kv.cs + (D - 1) * kv.rs + 1, kv.size, "K");
  (void)KILN_SPAN(vo, (LK - 1) * vv.rs + (DV - 1) * vv.cs + 1, vv.size, "V");
  for (int64_t g = 0; g < count; ++g) {
    const int64_t qo = kiln_view_at(&qv, bh + g), oo = kiln_view_at(&ov, bh + g);
    (void)KILN_SPAN(qo, (LQ - 1) * qv.rs + D, qv.size, "Q");
    (void)KILN_SPAN(oo, (LQ - 1) * ov.rs + DV, ov.size, "attention output");
    for (int64_t i = 0; i < LQ; ++i) {
      q[g * LQ + i] = job->q + qo + i * qv.rs;
      out[g * LQ + i] = job->out + oo + i * ov.rs;
    }
  }
  const int64_t rows = count * LQ;
  kiln_attention_direct(job, rows, q, job->kt + ko, s);
  if (job->ctx && job->ctx->epilogue) /* the chain reads each slice's scores block through g->c */
    for (int64_t g = 0; g < count; ++g) {
      kiln_gemm e = *job->ctx;
      e.c = s + g * LQ * LK;
      job->ctx->epilogue(&e, bh + g, 0, LQ, 0, LK);
    }
  kiln_attention_softmax(job, rows, s);
  kiln_attention_values(job, rows, s, job->v + vo, out);
}

/* slices [lo, hi) on participant `worker`, whose scores block is scratch[worker] (and rows[worker]) */
static void kiln_attention_slices(void *job_ptr, int64_t lo, int64_t hi, int worker) {
  const kiln_attention_job *job = (const kiln_attention_job *)job_ptr;
  const int64_t LQ = job->LQ, LK = job->LK, D = job->D, DV = job->DV;
  const float *q = job->q, *kt = job->kt, *v = job->v;
  float *out = job->out, *scratch = job->scratch;
  const kiln_view qv = job->qv, kv = job->kv, vv = job->vv, ov = job->ov;
  const kiln_gemm *ctx = job->ctx;
  /* slices whose K and V are the same (a grouped head's): a few at a time, their rows together */
  const int together = job->rows && kv.n1 > 1 && kv.s1 == 0 && vv.n1 == kv.n1 && vv.s1 == 0 && kiln_attention_few(job, 2 * LQ);
  for (int64_t bh = lo; bh < hi;) {
    if (together) {
      int64_t count = kv.n1 - bh % kv.n1; /* the slices left that share this K and V */
      if (count > hi - bh) count = hi - bh;
      if (count > KILN_ATTENTION_FEW / LQ) count = KILN_ATTENTION_FEW / LQ;
      if (count > 1) {
        kiln_attention_together(job, bh, count, job->rows + (int64_t)worker * KILN_ATTENTION_FEW * LK);
        bh += count;
        continue;
      }
    }
    float *s = scratch + (int64_t)worker * LQ * LK;
    const int64_t qo = kiln_view_at(&qv, bh), ko = kiln_view_at(&kv, bh), vo = kiln_view_at(&vv, bh), oo = kiln_view_at(&ov, bh);
    (void)KILN_SPAN(ko, (LK - 1) * kv.cs + (D - 1) * kv.rs + 1, kv.size, "K");
    (void)KILN_SPAN(vo, (LK - 1) * vv.rs + (DV - 1) * vv.cs + 1, vv.size, "V");
    const int direct = kiln_attention_few(job, LQ);
    const float *rows_q[KILN_ATTENTION_FEW];
    float *rows_out[KILN_ATTENTION_FEW];
    if (direct) {
      for (int64_t i = 0; i < LQ; ++i) {
        rows_q[i] = q + qo + i * qv.rs;
        rows_out[i] = out + oo + i * ov.rs;
      }
      kiln_attention_direct(job, LQ, rows_q, kt + ko, s);
    } else {
      kiln_gemm g = {0};
      g.batch = 1; g.M = LQ; g.N = LK; g.K = D;
      g.a = q + qo; g.a_rs = qv.rs; g.a_cs = qv.cs; g.pack_a = kiln_pack_a_strided; g.a_size = qv.size - qo;
      g.b = kt + ko; g.b_rs = kv.rs; g.b_cs = kv.cs; g.b_size = kv.size - ko;
      g.pack_b = kv.rs == 1 && kv.cs != 1 ? kiln_pack_b_columns : kiln_pack_b_strided;
      g.c = s; g.ldc = LK; g.c_size = LQ * LK;
      job->product(&g);
    }
    if (ctx && ctx->epilogue) { /* the chain reads the scores block through g->c (see the helper) */
      kiln_gemm e = *ctx;
      e.c = s;
      ctx->epilogue(&e, bh, 0, LQ, 0, LK);
    }
    kiln_attention_softmax(job, LQ, s);
    if (direct) {
      (void)KILN_SPAN(oo, (LQ - 1) * ov.rs + DV, ov.size, "attention output");
      kiln_attention_values(job, LQ, s, v + vo, rows_out);
      bh++;
      continue;
    }
    kiln_gemm h = {0};
    h.batch = 1; h.M = LQ; h.N = DV; h.K = LK;
    h.a = s; h.a_rs = LK; h.a_cs = 1; h.pack_a = kiln_pack_a_strided; h.a_size = LQ * LK;
    h.b = v + vo; h.b_rs = vv.rs; h.b_cs = vv.cs; h.b_size = vv.size - vo;
    h.pack_b = vv.rs == 1 && vv.cs != 1 ? kiln_pack_b_columns : kiln_pack_b_strided;
    h.c = out + oo; h.ldc = ov.rs; h.c_size = ov.size - oo;
    job->product(&h);
    bh++;
  }
}

KILN_ENGINE void kiln_attention(int64_t BH, int64_t LQ, int64_t LK, int64_t D, int64_t DV,
                           const float *q, int64_t q_size, int64_t q_n1, int64_t q_s0, int64_t q_s1, int64_t q_rs, int64_t q_cs,
                           const float *kt, int64_t k_size, int64_t k_n1, int64_t k_s0, int64_t k_s1, int64_t k_rs, int64_t k_cs,
                           const float *v, int64_t v_size, int64_t v_n1, int64_t v_s0, int64_t v_s1, int64_t v_rs, int64_t v_cs,
                           float *out, int64_t o_size, int64_t o_n1, int64_t o_s0, int64_t o_s1, int64_t o_rs, int64_t o_cs,
                           float *scratch, float *rows, int64_t threads, int safe, const kiln_gemm *ctx,
                           void (*product)(const kiln_gemm *)) {
  (void)o_cs; /* 1: the fusion pass folds only output layouts with contiguous rows */
  kiln_attention_job job = {LQ, LK, D, DV, q, kt, v, out, scratch, rows,
                            {q_size, q_n1, q_s0, q_s1, q_rs, q_cs}, {k_size, k_n1, k_s0, k_s1, k_rs, k_cs},
                            {v_size, v_n1, v_s0, v_s1, v_rs, v_cs}, {o_size, o_n1, o_s0, o_s1, o_rs, o_cs}, ctx, safe, product};
  /* at most `threads` participants: the scratch holds that many scores blocks. Slices that share
     K and V are taken together only within one chunk, so the chunks are as many slices as go
     together (a chunk of one would read a grouped head's K and V once for each of its slices) */
  int64_t grain = 1;
  if (rows && k_n1 > 1 && k_s1 == 0 && v_n1 == k_n1 && v_s1 == 0 && kiln_attention_few(&job, 2 * LQ)) {
    grain = KILN_ATTENTION_FEW / LQ;
    if (grain > k_n1) grain = k_n1;
  }
  kiln_parallel_for(0, BH, grain, (int)threads, kiln_attention_slices, &job);
}
