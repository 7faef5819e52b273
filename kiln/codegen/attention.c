/* kiln's attention driver (included in generated code that uses it; needs gemm.c).

   softmax(chain(Q K^T)) V for each of BH (batch x head) slices, the slices spread over the cores.
   A slice's LQ x LK scores live in one per-thread block of `scratch` (threads x LQ x LK floats, in
   the arena): Q K^T and P V are matrix products on the engine (run single-threaded inside this
   parallel loop), the scale/mask chain is the generated epilogue applied to the scores block, and
   each row's softmax is max, kiln_expf (vectorized), a double-precision sum and one scaling. The
   [BH, LQ, LK] score tensor is never written whole. */

static void kiln_attention(int64_t BH, int64_t LQ, int64_t LK, int64_t D, int64_t DV, const float *q, const float *kt,
                           const float *v, float *out, float *scratch, int64_t threads, const kiln_gemm *ctx) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t bh = 0; bh < BH; ++bh) {
    float *s = scratch + (int64_t)omp_get_thread_num() * LQ * LK;
    kiln_gemm g = {0};
    g.batch = 1; g.M = LQ; g.N = LK; g.K = D;
    g.a = q + bh * LQ * D; g.a_rs = D; g.a_cs = 1; g.pack_a = kiln_pack_a_strided; g.a_size = LQ * D;
    g.b = kt + bh * D * LK; g.b_rs = LK; g.b_cs = 1; g.pack_b = kiln_pack_b_strided; g.b_size = D * LK;
    g.c = s; g.ldc = LK; g.c_size = LQ * LK;
    kiln_gemm_run(&g);
    if (ctx && ctx->epilogue) { /* the chain reads the scores block through g->c (see the helper) */
      kiln_gemm e = *ctx;
      e.c = s;
      ctx->epilogue(&e, bh, 0, LQ, 0, LK);
    }
    for (int64_t i = 0; i < LQ; ++i) {
      float *row = s + i * LK;
      float high = -INFINITY;
      for (int64_t j = 0; j < LK; ++j) high = (high > row[KILN_AT(j, LK, "scores")] || high != high) ? high : row[j];
#pragma omp simd
      for (int64_t j = 0; j < LK; ++j) row[j] = kiln_expf(row[j] - high);
      double total = 0.0;
      for (int64_t j = 0; j < LK; ++j) total += (double)row[j];
      const float inverse = (float)(1.0 / total);
#pragma omp simd
      for (int64_t j = 0; j < LK; ++j) row[j] *= inverse;
    }
    kiln_gemm h = {0};
    h.batch = 1; h.M = LQ; h.N = DV; h.K = LK;
    h.a = s; h.a_rs = LK; h.a_cs = 1; h.pack_a = kiln_pack_a_strided; h.a_size = LQ * LK;
    h.b = v + bh * LK * DV; h.b_rs = DV; h.b_cs = 1; h.pack_b = kiln_pack_b_strided; h.b_size = LK * DV;
    h.c = out + bh * LQ * DV; h.ldc = DV; h.c_size = LQ * DV;
    kiln_gemm_run(&h);
  }
}
