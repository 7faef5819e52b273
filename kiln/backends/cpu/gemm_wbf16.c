/* The weight-only products' prompt rows in bfloat16 (included after gemm_bf16.c, gemm_w4.c and
   gemm_w8.c, in plans compiled with an "-bf16" weight format: int8-weights-bf16, int4-weights-bf16
   and the int4 variants).

   A decode step's few rows are memory-bound: gemm_w8.c and gemm_w4.c read the narrow weights once
   and that decides their time. A prompt's many rows are compute-bound: there the weights are
   widened, a 32-column panel at a time, to float32 by the scales (and offsets) they were quantized
   with, then rounded to bfloat16 k-pair panels, and the product runs on gemm_bf16.c's kernels
   (AVX512-BF16 dot products or AMX tiles) through gemm_lowp.c's driver, activations rounded to
   bfloat16, sums in float32, the fused finish (bias, activation) on each finished tile. The driver
   packs B through the descriptor's float packer (pack_b): a copy of the descriptor whose packer is
   the widening below, the original descriptor beside it for the codes. */

#if KILN_NR != 32
#error "the bf16 path packs B in 32-column panels (avx512 targets)"
#endif

typedef struct {
  kiln_gemm g; /* first: the driver's descriptor (its pack_b gets &this->g) */
  const kiln_gemm *source;
  int bits;
} kiln_wbf16;

/* columns x0 .. x0 + xc (xc <= 32, one panel) of the narrow B, every k, widened to float32 at
   dst [K][32] (columns past xc: 0) */
static void kiln_wbf16_widen(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t k0, int64_t kc, float *dst) {
  const kiln_wbf16 *w = (const kiln_wbf16 *)g;
  const kiln_gemm *s = w->source;
  const int64_t K = s->K, panel = x0 / KILN_NR;
  (void)k0;
  (void)kc;
  if (w->bits == 8) {
    const int64_t at = KILN_SPAN(bt * s->b_pbs + panel * K * KILN_NR, K * KILN_NR, s->b_packed_size, "B (int8 panels)");
    const int8_t *b = (const int8_t *)s->b_low + at;
    float cols[KILN_NR] __attribute__((aligned(64))) = {0};
    memcpy(cols, s->q_scale + x0, (size_t)xc * sizeof(float));
    const kiln_vf s0 = *(const kiln_vf *)cols, s1 = *(const kiln_vf *)(cols + KILN_L);
    for (int64_t k = 0; k < K; ++k) {
      *(kiln_vf *)(dst + k * KILN_NR) = kiln_widen8(b + k * KILN_NR) * s0;
      *(kiln_vf *)(dst + k * KILN_NR + KILN_L) = kiln_widen8(b + k * KILN_NR + KILN_L) * s1;
    }
    return;
  }
  const int64_t group = s->q_group, groups = (K + group - 1) / group, padded = groups * group;
  const int64_t words = padded / KILN_W4_CHUNK * KILN_NR, params = groups * KILN_NR;
  const int64_t at = KILN_SPAN(bt * s->b_pbs + panel * words, words, s->b_packed_size, "B (int4 words)");
  const int32_t *codes = (const int32_t *)s->b_low + at;
  const uint16_t *scale = s->q_half + panel * params;
  const float *offset = s->q_min ? s->q_min + panel * params : NULL;
  for (int64_t k = 0; k < K; ++k) kiln_w4_widen_step(codes, scale, offset, group, k, dst + k * KILN_NR);
}

/* an activations' product (attention's) in a plan with "-bf16": many rows on the bf16 path, a
   decode step's few in float32 (as the weight-only products' rows) */
#define KILN_HAVE_WIDE 1
KILN_ENGINE void kiln_gemm_wide_run(const kiln_gemm *g) {
  if (g->M >= 2 * KILN_MR && kiln_bf16_mode != 0)
    kiln_gemm_bf16_run(g);
  else
    kiln_gemm_run(g);
}

/* a weight-only product of many rows through the bf16 kernels (g->q_wide); 0 where this CPU runs
   the bf16 path only as portable code (then the float path of gemm_w8.c / gemm_w4.c is faster) */
KILN_ENGINE int kiln_gemm_wbf16_run(const kiln_gemm *g, int bits) {
  if (kiln_bf16_mode == 0 || bits < 0) return 0; /* (a decode step's few rows: the plain path) */
  kiln_wbf16 w = {*g, g, bits};
  w.g.b_low = NULL;
  w.g.b = NULL;
  w.g.pack_b = kiln_wbf16_widen;
  w.g.q_wide = NULL;
  w.g.q_scale = NULL;
  /* (B widened once and shared by the M blocks up to 64 MB: a 2048 x 8192 layer's bf16 panels are
     32 MB, above the usual limit, and each M block widening them again cost a fifth of the time) */
  kiln_lowp_run_shared(&w.g, &kiln_bf16_ops, (int64_t)64 << 20);
  return 1;
}
