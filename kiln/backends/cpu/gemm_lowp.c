/* The driver of kiln's reduced-precision matrix products (included after gemm.c and amx.c; the
   number formats are gemm_bf16.c's and gemm_int8.c's, each a kiln_lowp_ops).

   C[b] = A[b] . B[b] (+ epilogue), C float32, operands in a narrow format:
   - A as rows [Mp][Kp] (Mp a multiple of 32, Kp of the format's k unit, zero padded): packed when
     the plan was built for a constant A (g->a_low: convolution weights), else converted here from
     the float32 matrix the descriptor describes (once, shared, when several N blocks need it);
   - B as panels of 32 columns, each [Kp / group][32][group] (group = the k values one 32-bit lane
     takes: 2 bf16, 4 int8): packed when the plan was built for a constant B (g->b_low: a MatMul's
     weights), else packed here from B's rows or im2col rows (once, shared, when several M blocks
     need it).
   Work is split as the float engine's: (batch, M block, N block) tasks over kiln's pool. A task
   walks its N block one 32-column panel at a time; the panel's C blocks stay in L2 while each
   k chunk of the panel (in L1) meets every 32-row slab of A. Blocks of 32 x 32 (a last slab: its
   rows rounded up to 8, the register kernels' unit; to 16 or 32 on AMX tiles) are the formats'
   micro-kernels' (AMX tiles, AVX-512 / AVX2 dot products, portable C); edge blocks accumulate in
   a scratch. After the last chunk a block is
   finished (int8: int32 sums to float32 with the scales) and the epilogue runs on it. */

typedef struct {
  int esize;      /* bytes per element of A rows and B panels */
  int64_t kunit;  /* Kp is a multiple of this (and every k chunk) */
  /* A rows m0..m0+mlen (zero rows up to `rows`) at dst, row stride kp */
  void (*rows)(const kiln_gemm *g, int64_t bt, int64_t m0, int64_t mlen, int64_t rows, int64_t kp, void *dst);
  /* B columns x0..x0+xc, whole K, as panels at dst (fbuf: K x 32 floats of scratch) */
  void (*pack_b)(const kiln_gemm *g, int64_t bt, int64_t x0, int64_t xc, int64_t kp, void *dst, float *fbuf);
  /* C block (16 or 32 rows x 32) (+)= A slab . B chunk over kc; c row stride ldc elements */
  void (*block)(const kiln_gemm *g, const void *a, int64_t lda, const void *b, int64_t kc, void *c, int64_t ldc, int64_t rows, int accumulate);
  /* a finished block's sums (at c, stride ldc) as float32 at out (stride ldo), rows x cols whose
     first element is C[bt][i0][j0]; NULL: the sums already are the float32 results */
  void (*finish)(const kiln_gemm *g, int64_t bt, const void *c, int64_t ldc, int64_t rows, int64_t cols, int64_t i0, int64_t j0, float *out, int64_t ldo);
  int (*uses_amx)(void);
  /* the direct convolution: padded row ph of image bt's channels-last copy (Wp pixels x cp
     channels) at dst; and a 32 x 32 block over every tap at once, the sums kept in registers or
     tiles (returns 0 where the path in force has no such kernel: then `block` tap by tap) */
  void (*nhwc_row)(const kiln_gemm *g, int64_t bt, int64_t ph, int64_t cp, int64_t wp, void *dst);
  int (*block_taps)(const kiln_gemm *g, const void *a, int64_t lda, const int64_t *offsets, int64_t taps, const void *b, int64_t kc, void *c, int64_t ldc);
  int int32_sums; /* the blocks hold int32 sums that the finish scales (int8), else float results */
  int64_t kstep;  /* the k values one 32-bit lane of the register kernels takes (int8 4, bf16 2) */
  /* n finished floats stored in the format the product's readers take, at element `at` of the
     narrow copy of C (int8: quantized into r_out; bf16: rounded into h_out) */
  void (*narrow)(const kiln_gemm *g, const float *src, int64_t at, int64_t n);
} kiln_lowp_ops;

/* the product keeps a narrow copy of its output for its readers (kiln_gemm.r_out, h_out) */
static int kiln_narrow_out(const kiln_gemm *g) { return g->r_out != NULL || g->h_out != NULL; }

/* the activations its producer stored narrow already (int8 bytes, bf16 halves), or NULL */
static const char *kiln_given(const kiln_gemm *g) { return g->q_given ? (const char *)g->q_given : (const char *)g->h_given; }

#ifdef KILN_X86
/* 16 floats at a time on zmm (a row of 7..56 pixels is too short for what GCC makes of the loop
   below: a vector of 64 bytes, so it ran scalar); the tail masked */
__attribute__((target("avx512f"))) static void kiln_quantize_u8_avx512(float q_inv, int32_t q_zero, int32_t q_max, const float *src, uint8_t *dst, int64_t n) {
  const __m512 inv = _mm512_set1_ps(q_inv), zero = _mm512_set1_ps((float)q_zero);
  const __m512 low = _mm512_setzero_ps(), top = _mm512_set1_ps((float)q_max);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
    __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, zero), low), top); /* (max(NaN, 0) is 0: the second operand) */
    _mm512_mask_cvtusepi32_storeu_epi8(dst + i, m, _mm512_cvttps_epi32(v));
  }
}
#endif

/* n floats quantized to unsigned int8 activations, q = clamp(rint(x * q_inv) + q_zero, 0, q_max),
   NaN -> 0: what an int8 product does to its float activations (gemm_int8.c) and what a product
   whose output they are stores for it (kiln_gemm.r_out), the same function so both agree bit for bit */
static void kiln_quantize_u8(float q_inv, int32_t q_zero, int32_t q_max, const float *restrict src, uint8_t *restrict dst, int64_t n) {
#ifdef KILN_X86
  static int wide = -1;
  if (wide < 0) wide = __builtin_cpu_supports("avx512f");
  if (wide) {
    kiln_quantize_u8_avx512(q_inv, q_zero, q_max, src, dst, n);
    return;
  }
#endif
  const float inv = q_inv, zero = (float)q_zero, top = (float)q_max;
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) { /* (restrict, ivdep: a byte store may alias anything for GCC) */
    float v = __builtin_nearbyintf(src[i] * inv) + zero;
    v = v > 0.0f ? v : 0.0f;
    v = v < top ? v : top;
    dst[i] = (uint8_t)(int32_t)v;
  }
}

/* rows [i0, i0 + rows) x columns [j0, j0 + cols) of batch element bt's finished C stored
   narrow for the products that read it (g->r_out or h_out: same indexing) */
static void kiln_requantize(const kiln_gemm *g, const kiln_lowp_ops *ops, int64_t bt, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = KILN_SPAN(bt * g->c_bs + (i0 + r) * g->ldc + j0, cols, g->c_size, "C (stored narrow)");
    ops->narrow(g, g->c + at, at, cols);
  }
}

/* a finished tile (rows x cols floats at `tile`, row stride ld) through the product's TileFinish
   (g->f_: bias, Relu, bounds: its whole epilogue) and stored only as its readers' narrow form at
   rows i0.., columns j0.. of batch element bt's r_out or h_out (g->r_only: nothing reads the floats) */
static void kiln_store_quantized(const kiln_gemm *g, const kiln_lowp_ops *ops, float *tile, int64_t ld, int64_t bt, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  const kiln_finish fin = {g->f_row ? g->f_row + i0 : NULL, g->f_col ? g->f_col + j0 : NULL, g->f_relu, g->f_lo, g->f_hi};
  kiln_finish_tile(&fin, tile, ld, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = KILN_SPAN(bt * g->c_bs + (i0 + r) * g->ldc + j0, cols, g->c_size, "C (narrow only)");
    ops->narrow(g, tile + r * ld, at, cols);
  }
}

#define KILN_LOWP_CHUNK 8 /* B panels per shared-packing call (im2col rows are built 8 panels wide) */
#define KILN_LOWP_KC_BYTES 8192 /* bytes of k per chunk (4096 bf16, 8192 int8): one chunk for most products; a single pass over K with the C tiles held measured faster than chunks of 512 bytes that revisit C (BERT, ResNet-50) */

typedef struct {
  const kiln_gemm *g;
  const kiln_lowp_ops *ops;
  int64_t kp, mc, nc, tiles_m, tiles_n;
  const char *a_rows; /* A converted whole, once (shared by the tasks), or NULL */
  int64_t a_rows_bs;  /* bytes */
  const char *b_panels; /* B packed whole, once (shared by the tasks), or NULL */
  int64_t b_panels_bs;  /* bytes */
  const char *a_given;  /* A's rows read in place (int8 or bf16 activations stored narrow by their
                           producer, rows of K = kp elements): whole slabs of 32 rows from here, a last short
                           slab converted (the kernels read 16 or 32 rows) */
} kiln_lowp_plan;

static void kiln_lowp_convert(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_lowp_plan *p = (const kiln_lowp_plan *)ctx;
  const int64_t slabs = (p->g->M + 31) / 32;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t bt = i / slabs, m0 = (i % slabs) * 32;
    const int64_t rows = p->g->M - m0 < 32 ? p->g->M - m0 : 32;
    p->ops->rows(p->g, bt, m0, rows, 32, p->kp, (char *)p->a_rows + bt * p->a_rows_bs + m0 * p->kp * p->ops->esize);
  }
}

static void kiln_lowp_pack(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_lowp_plan *p = (const kiln_lowp_plan *)ctx;
  const kiln_gemm *g = p->g;
  static _Thread_local float *f_buf;
  static _Thread_local int64_t f_have;
  float *fbuf = kiln_scratch(&f_buf, &f_have, g->K * 32);
  if (!fbuf) return;
  const int64_t panels = (g->N + 31) / 32, chunks = (panels + KILN_LOWP_CHUNK - 1) / KILN_LOWP_CHUNK;
  const int64_t panel_bytes = p->kp * 32 * p->ops->esize;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t bt = i / chunks, col = (i % chunks) * KILN_LOWP_CHUNK * 32;
    const int64_t cols = g->N - col < KILN_LOWP_CHUNK * 32 ? g->N - col : KILN_LOWP_CHUNK * 32;
    p->ops->pack_b(g, bt, col, cols, p->kp, (char *)p->b_panels + bt * p->b_panels_bs + (col / 32) * panel_bytes, fbuf);
  }
}

static void kiln_lowp_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_lowp_plan *p = (const kiln_lowp_plan *)ctx;
  const kiln_gemm *g = p->g;
  const kiln_lowp_ops *ops = p->ops;
  const int64_t M = g->M, N = g->N, K = g->K, kp = p->kp, mc = p->mc, nc = p->nc, es = ops->esize;
  static _Thread_local float *f_buf, *a_buf, *b_buf, *e_buf;
  static _Thread_local int64_t f_have, a_have, b_have, e_have;
  const int64_t kchunk = KILN_LOWP_KC_BYTES / es < kp ? KILN_LOWP_KC_BYTES / es : kp;
  const int64_t slabs = (mc + 31) / 32, panel_bytes = kp * 32 * es;
  char *abuf = NULL, *bbuf = NULL;
  float *fbuf = NULL;
  /* edge blocks (fewer than 32 rows or columns) accumulate in a scratch of whole blocks (one per
     slab of the panel being computed), finished into C after the last chunk */
  float *edges = kiln_scratch(&e_buf, &e_have, slabs * 32 * 32);
  if (!g->a_low && !p->a_rows) abuf = (char *)kiln_scratch(&a_buf, &a_have, (slabs * 32 * kp * es + 3) / 4); /* (a_given: its short slab) */
  if (!g->b_low && !p->b_panels) {
    fbuf = kiln_scratch(&f_buf, &f_have, K * 32);
    bbuf = (char *)kiln_scratch(&b_buf, &b_have, (panel_bytes + 3) / 4);
  }
  if (!edges || (!g->a_low && !p->a_rows && !abuf) || (!g->b_low && !p->b_panels && !(fbuf && bbuf))) return; /* out of memory */
  const int amx = ops->uses_amx();
#ifdef KILN_X86
  if (amx) kiln_amx_configure();
#endif
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / (p->tiles_m * p->tiles_n), rest = task % (p->tiles_m * p->tiles_n);
    const int64_t m0 = (rest / p->tiles_n) * mc, n0 = (rest % p->tiles_n) * nc;
    const int64_t mlen = M - m0 < mc ? M - m0 : mc, nlen = N - n0 < nc ? N - n0 : nc;
    const char *ablock = NULL;
    if (p->a_given) {
      ablock = p->a_given + es * KILN_SPAN(bt * g->a_bs + m0 * kp, mlen * kp, g->q_given_size, "A (rows, given)");
      if (mlen % 32) ops->rows(g, bt, m0 + mlen - mlen % 32, mlen % 32, 32, kp, abuf); /* the short slab */
    } else if (g->a_low) {
      ablock = (const char *)g->a_low + es * KILN_SPAN(bt * g->a_pbs + m0 * kp, kiln_round_up(mlen, 32) * kp, g->a_packed_size, "A (packed rows)");
    } else if (p->a_rows) {
      ablock = p->a_rows + bt * p->a_rows_bs + m0 * kp * es;
    } else {
      ops->rows(g, bt, m0, mlen, kiln_round_up(mlen, 32), kp, abuf);
      ablock = abuf;
    }
    float *c = g->c + bt * g->c_bs;
    for (int64_t jr = 0; jr < nlen; jr += 32) {
      const int64_t cols = nlen - jr < 32 ? nlen - jr : 32;
      const char *bpanel;
      if (g->b_low) {
        bpanel = (const char *)g->b_low + es * KILN_SPAN(bt * g->b_pbs + ((n0 + jr) / 32) * kp * 32, kp * 32, g->b_packed_size, "B (packed panels)");
      } else if (p->b_panels) {
        bpanel = p->b_panels + bt * p->b_panels_bs + ((n0 + jr) / 32) * panel_bytes;
      } else {
        ops->pack_b(g, bt, n0 + jr, cols, kp, bbuf, fbuf);
        bpanel = bbuf;
      }
      for (int64_t k0 = 0; k0 < kp; k0 += kchunk) {
        int64_t kc = kp - k0 < kchunk ? kp - k0 : kchunk;
        const int first = k0 == 0, last = k0 + kc >= kp;
        /* past K, A and B hold zeros: the register kernels stop at K's next lane step (a K of 16
           padded to 64 multiplies 16), AMX tiles take their whole 64-byte rows */
        if (!amx && K - k0 < kc) kc = kiln_round_up(K - k0, ops->kstep);
        const char *bchunk = bpanel + k0 * 32 * es;
        for (int64_t ir = 0; ir < mlen; ir += 32) {
          const int64_t rows = mlen - ir < 32 ? mlen - ir : 32;
          const char *aslab = (p->a_given && rows < 32 ? abuf : ablock + ir * kp * es) + k0 * es;
          float *tile = c + (m0 + ir) * g->ldc + n0 + jr;
          if (g->r_only) { /* the sums in the slab's scratch block, the floats in another, C untouched */
            float *block = edges + (ir / 32) * 32 * 32;
            ops->block(g, aslab, kp, bchunk, kc, block, 32, amx ? (rows <= 16 ? 16 : 32) : kiln_round_up(rows, 8), !first);
            if (last) {
              float finished[32 * 32] __attribute__((aligned(64)));
              if (ops->finish)
                ops->finish(g, bt, block, 32, rows, cols, m0 + ir, n0 + jr, finished, 32);
              else
                for (int64_t r = 0; r < rows; ++r) memcpy(finished + r * 32, block + r * 32, (size_t)cols * sizeof(float));
              kiln_store_quantized(g, ops, finished, 32, bt, m0 + ir, rows, n0 + jr, cols);
            }
            continue;
          }
          if (rows == 32 && cols == 32 && first && last && ops->finish) {
            /* one chunk: the sums stay in a scratch block in L1, finished straight into C */
            KILN_SPAN(bt * g->c_bs + (m0 + ir) * g->ldc + n0 + jr, 31 * g->ldc + 32, g->c_size, "C");
            float *block = edges + (ir / 32) * 32 * 32;
            ops->block(g, aslab, kp, bchunk, kc, block, 32, 32, 0);
            ops->finish(g, bt, block, 32, 32, 32, m0 + ir, n0 + jr, tile, g->ldc);
          } else if (rows == 32 && cols == 32) {
            KILN_SPAN(bt * g->c_bs + (m0 + ir) * g->ldc + n0 + jr, 31 * g->ldc + 32, g->c_size, "C");
            ops->block(g, aslab, kp, bchunk, kc, tile, g->ldc, 32, !first);
            if (last && ops->finish) ops->finish(g, bt, tile, g->ldc, 32, 32, m0 + ir, n0 + jr, tile, g->ldc);
          } else {
            float *block = edges + (ir / 32) * 32 * 32;
            ops->block(g, aslab, kp, bchunk, kc, block, 32, amx ? (rows <= 16 ? 16 : 32) : kiln_round_up(rows, 8), !first);
            if (last) {
              KILN_SPAN(bt * g->c_bs + (m0 + ir) * g->ldc + n0 + jr, (rows - 1) * g->ldc + cols, g->c_size, "C");
              if (ops->finish)
                ops->finish(g, bt, block, 32, rows, cols, m0 + ir, n0 + jr, tile, g->ldc);
              else
                for (int64_t r = 0; r < rows; ++r) memcpy(tile + r * g->ldc, block + r * 32, (size_t)cols * sizeof(float));
            }
          }
          if (last && g->f_on) { /* a fused finish (the weight-only paths' prompt rows, gemm_wbf16.c) */
            kiln_finish fin;
            kiln_finish_tile(kiln_finish_at(g, m0 + ir, n0 + jr, &fin), tile, g->ldc, rows, cols);
          }
          if (last && g->epilogue) g->epilogue(g, bt, m0 + ir, m0 + ir + rows, n0 + jr, n0 + jr + cols);
          if (last && kiln_narrow_out(g)) kiln_requantize(g, ops, bt, m0 + ir, rows, n0 + jr, cols);
        }
      }
    }
  }
#ifdef KILN_X86
  if (amx) kiln_amx_release();
#endif
}

/* `shared`: bytes up to which an operand several tasks would convert or pack again is converted
   or packed once, shared (KILN_SHARED_LIMIT; more where packing is dear: gemm_wbf16.c's widening) */
static void kiln_lowp_run_shared(const kiln_gemm *g, const kiln_lowp_ops *ops, int64_t shared) {
  const int64_t M = g->M, N = g->N, K = g->K, kp = kiln_round_up(K, ops->kunit), es = ops->esize;
  int threads = kiln_pool_threads();
  if (kiln_in_pool()) threads = 1;
  /* an M block of A rows fills about 256 KB of L2 (one chunk of it, 32 rows, is in L1) */
  int64_t cap = 262144 / (kp * es < KILN_LOWP_KC_BYTES ? kp * es : KILN_LOWP_KC_BYTES);
  cap = cap < 32 ? 32 : (cap > 512 ? 512 : cap);
  int64_t mc = kiln_round_up(M < cap ? M : cap, 32);
  int64_t nc = kiln_round_up(N < 512 ? N : 512, 32);
  int64_t tiles_m = (M + mc - 1) / mc;
  while (threads > 1 && g->batch * tiles_m * ((N + nc - 1) / nc) < 4 * threads && nc > 32) nc = kiln_round_up(nc / 2, 32);
  while (threads > 1 && g->batch * tiles_m * ((N + nc - 1) / nc) < 2 * threads && mc > 32) {
    mc = kiln_round_up(mc / 2, 32);
    tiles_m = (M + mc - 1) / mc;
  }
  mc = kiln_round_up((M + tiles_m - 1) / tiles_m, 32);
  int64_t tiles_n = (N + nc - 1) / nc;
  nc = kiln_round_up((N + tiles_n - 1) / tiles_n, 32);
  tiles_n = (N + nc - 1) / nc;
  const int64_t tasks = g->batch * tiles_m * tiles_n;
  kiln_lowp_plan plan = {g, ops, kp, mc, nc, tiles_m, tiles_n, NULL, 0, NULL, 0, NULL};
  if (!g->a_low && kiln_given(g) && g->a_cs == 1 && g->a_rs == K && kp == K && (g->batch == 1 || g->a_bs == M * K))
    plan.a_given = kiln_given(g);
  const int workers = M * N * K * g->batch >= 65536 && tasks > 1 ? 0 : 1;
  /* an A several tasks would convert again (one per N block) is converted once, shared; so is a
     B several tasks would pack again (one per M block) */
  static _Thread_local float *shared_a, *shared_b;
  static _Thread_local int64_t have_a, have_b;
  const int64_t slabs = (M + 31) / 32, size_a = g->batch * slabs * 32 * kp * es;
  if (!g->a_low && !plan.a_given && tiles_n > 1 && size_a <= shared) {
    char *rows = (char *)kiln_scratch(&shared_a, &have_a, (size_a + 3) / 4);
    if (rows) {
      plan.a_rows = rows;
      plan.a_rows_bs = slabs * 32 * kp * es;
      kiln_parallel_for(0, g->batch * slabs, 1, workers, kiln_lowp_convert, &plan);
    }
  }
  const int64_t panels = (N + 31) / 32, size_b = g->batch * panels * kp * 32 * es;
  if (!g->b_low && tiles_m > 1 && size_b <= shared) {
    char *packed = (char *)kiln_scratch(&shared_b, &have_b, (size_b + 3) / 4);
    if (packed) {
      plan.b_panels = packed;
      plan.b_panels_bs = panels * kp * 32 * es;
      kiln_parallel_for(0, g->batch * ((panels + KILN_LOWP_CHUNK - 1) / KILN_LOWP_CHUNK), 1, workers, kiln_lowp_pack, &plan);
    }
  }
  kiln_parallel_for(0, tasks, 1, workers, kiln_lowp_tasks, &plan);
}

static void kiln_lowp_run(const kiln_gemm *g, const kiln_lowp_ops *ops) { kiln_lowp_run_shared(g, ops, KILN_SHARED_LIMIT); }


/* -- the direct convolution: no im2col ------------------------------------------------------

   The input, converted once into a padded channels-last copy P (channels padded to the k unit cp),
   makes every output pixel's taps plain rows of P. Stride 1: P[Hq][Wq][cp] (Wq = OW + KW - 1), and
   output (oh, ow) at tap (kh, kw) reads P[oh + kh][ow + kw][:]. Stride s (s_h, s_w): P is split into
   s_h x s_w phase images P_ab[Hq][Wq][cp] holding the padded input's pixels (q * s_h + a, r * s_w + b),
   so output (oh, ow) at tap (kh, kw) reads P_{kh % s_h, kw % s_w}[oh + kh / s_h][ow + kw / s_w]: a
   stride-1 read again (Wq = OW + (KW - 1) / s_w). Over "virtual" pixels v = oh * Wq + ow (the columns
   past OW computed and dropped), tap t's A rows start at P + v * cp + offset[t] with one stride, cp:
   the product is A (virtual pixels x (tap, channel)) . B (the weights as B panels, packed by the
   lowering in that k order), one 32 x 32 block of (pixels, output channels) at a time, written
   transposed into an NCHW output, or as it is into an NHWC one (geometry flag: the input and the
   output channels last), then the epilogue on each run of real pixels. */

#ifdef KILN_X86
/* a 16 x 16 float block transposed (src rows, stride ss, become dst rows, stride ds) */
__attribute__((target("avx512f"))) static void kiln_transpose16_f32(const float *src, int64_t ss, float *dst, int64_t ds) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ss);
  for (int i = 0; i < 8; ++i) { /* 32-bit pairs */
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) { /* 64-bit pairs */
    r[4 * i] = (__m512)_mm512_unpacklo_pd((__m512d)t[4 * i], (__m512d)t[4 * i + 2]);
    r[4 * i + 1] = (__m512)_mm512_unpackhi_pd((__m512d)t[4 * i], (__m512d)t[4 * i + 2]);
    r[4 * i + 2] = (__m512)_mm512_unpacklo_pd((__m512d)t[4 * i + 1], (__m512d)t[4 * i + 3]);
    r[4 * i + 3] = (__m512)_mm512_unpackhi_pd((__m512d)t[4 * i + 1], (__m512d)t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i) /* 128-bit lanes */
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) { /* 256-bit halves */
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ds, r[i]);
}
#endif

/* an int8 block's sums scaled to float32 in place, row by row (a row: 32 output channels) */
static void kiln_direct_scale(const kiln_gemm *g, const kiln_lowp_ops *ops, float *block, int64_t oc0, int64_t cols) {
  if (!ops->int32_sums) return;
  int32_t *sums = (int32_t *)block;
  float scale[32], offset[32];
  for (int j = 0; j < 32; ++j) {
    scale[j] = j < cols ? g->q_scale[oc0 + j] : 0.0f;
    offset[j] = j < cols ? (float)g->q_offset[oc0 + j] : 0.0f;
  }
  for (int r = 0; r < 32; ++r)
    for (int j = 0; j < 32; ++j) block[r * 32 + j] = ((float)sums[r * 32 + j] + offset[j]) * scale[j];
}

/* a finished (scaled) 32 x 32 block of (pixels, output channels) as (output channels, pixels) */
static void kiln_direct_transpose(const float *block, float *out) {
#ifdef KILN_X86
  if (__builtin_cpu_supports("avx512f")) {
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) kiln_transpose16_f32(block + 16 * i * 32 + 16 * j, 32, out + 16 * j * 32 + 16 * i, 32);
    return;
  }
#endif
  for (int r = 0; r < 32; ++r)
    for (int j = 0; j < 32; ++j) out[j * 32 + r] = block[r * 32 + j];
}

typedef struct {
  const kiln_gemm *g;
  const kiln_lowp_ops *ops;
  int64_t C, H, W, KH, KW, PT, PL, OH, OW, SH, SW, OC, cp, wq, hq, kp, virtual_px, phase_bytes, image_bytes, mc, nc, tiles_m, tiles_n;
  int nhwc; /* the input and the output channels last */
  char *P;
  int64_t offsets[64]; /* per tap, in elements of P */
} kiln_direct_plan;

/* padded input rows lo..hi (over every image) into their phase images */
static void kiln_direct_rows(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_direct_plan *p = (const kiln_direct_plan *)ctx;
  const int64_t es = p->ops->esize, rows = p->hq * p->SH, pixel = p->cp * es;
  static _Thread_local float *r_buf;
  static _Thread_local int64_t r_have;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t bt = i / rows, ph = i % rows, a = ph % p->SH, q = ph / p->SH;
    char *image = p->P + bt * p->image_bytes;
    if (p->SW == 1) { /* the row lands whole in phase (a, 0) */
      p->ops->nhwc_row(p->g, bt, ph, p->cp, p->wq, image + a * p->phase_bytes + q * p->wq * pixel);
      continue;
    }
    char *line = (char *)kiln_scratch(&r_buf, &r_have, (p->wq * p->SW * pixel + 3) / 4);
    if (!line) return; /* out of memory */
    p->ops->nhwc_row(p->g, bt, ph, p->cp, p->wq * p->SW, line);
    for (int64_t b = 0; b < p->SW; ++b) {
      char *row = image + (a * p->SW + b) * p->phase_bytes + q * p->wq * pixel;
      for (int64_t col = 0; col < p->wq; ++col) memcpy(row + col * pixel, line + (col * p->SW + b) * pixel, (size_t)pixel);
    }
  }
}

/* a block's real pixels v .. last (virtual) stored and finished, run by run of one output row */
static void kiln_direct_store(const kiln_direct_plan *p, int64_t bt, int64_t v, int64_t last, float *block, int64_t oc0, int64_t cols) {
  const kiln_gemm *g = p->g;
  const int64_t pixels = p->OH * p->OW, OC = p->OC;
  float turned[32 * 32] __attribute__((aligned(64)));
  if (!p->nhwc) kiln_direct_transpose(block, turned);
  float *out = g->c + bt * g->c_bs;
  int64_t r = 0;
  while (v + r < last) {
    const int64_t oh = (v + r) / p->wq, ow = (v + r) % p->wq;
    if (ow >= p->OW) { /* a dropped column */
      ++r;
      continue;
    }
    const int64_t run = p->OW - ow < last - (v + r) ? p->OW - ow : last - (v + r);
    const int64_t j0 = oh * p->OW + ow;
    if (p->nhwc && g->r_only) { /* only the readers' narrow form */
      kiln_store_quantized(g, p->ops, block + r * 32, 32, bt, j0, run, oc0, cols);
    } else if (p->nhwc) { /* pixel rows of OC channels: (pixel, channel) is the engine's (row, column) */
      KILN_SPAN(bt * g->c_bs + j0 * OC + oc0, (run - 1) * OC + cols, g->c_size, "C (direct, channels last)");
      for (int64_t k = 0; k < run; ++k) memcpy(out + (j0 + k) * OC + oc0, block + (r + k) * 32, (size_t)cols * sizeof(float));
      if (g->epilogue) g->epilogue(g, bt, j0, j0 + run, oc0, oc0 + cols);
      if (kiln_narrow_out(g)) kiln_requantize(g, p->ops, bt, j0, run, oc0, cols);
    } else {
      KILN_SPAN(bt * g->c_bs + oc0 * pixels + j0, (cols - 1) * pixels + run, g->c_size, "C (direct)");
      for (int64_t j = 0; j < cols; ++j) memcpy(out + (oc0 + j) * pixels + j0, turned + j * 32 + r, (size_t)run * sizeof(float));
      if (g->epilogue) g->epilogue(g, bt, oc0, oc0 + cols, j0, j0 + run);
      if (kiln_narrow_out(g))
        for (int64_t j = 0; j < cols; ++j) kiln_requantize(g, p->ops, bt, oc0 + j, 1, j0, run);
    }
    r += run;
  }
}

static void kiln_direct_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_direct_plan *p = (const kiln_direct_plan *)ctx;
  const kiln_gemm *g = p->g;
  const kiln_lowp_ops *ops = p->ops;
  const int64_t es = ops->esize, taps = p->KH * p->KW, OC = p->OC;
  float block[32 * 32] __attribute__((aligned(64)));
  const int amx = ops->uses_amx();
#ifdef KILN_X86
  if (amx) kiln_amx_configure();
#endif
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / (p->tiles_m * p->tiles_n), rest = task % (p->tiles_m * p->tiles_n);
    const int64_t v0 = (rest / p->tiles_n) * p->mc, o0 = (rest % p->tiles_n) * p->nc;
    const int64_t vlen = p->virtual_px - v0 < p->mc ? p->virtual_px - v0 : p->mc;
    const int64_t olen = OC - o0 < p->nc ? OC - o0 : p->nc;
    const char *image = p->P + bt * p->image_bytes;
    for (int64_t jr = 0; jr < olen; jr += 32) {
      const int64_t cols = olen - jr < 32 ? olen - jr : 32, oc0 = o0 + jr;
      const char *panel = (const char *)g->a_low + es * KILN_SPAN((oc0 / 32) * p->kp * 32, p->kp * 32, g->a_packed_size, "weights (direct)");
      for (int64_t ir = 0; ir < vlen; ir += 32) {
        const int64_t v = v0 + ir;
        const char *rows = image + v * p->cp * es;
        if (!ops->block_taps(g, rows, p->cp, p->offsets, taps, panel, p->cp, block, 32))
          for (int64_t t = 0; t < taps; ++t)
            ops->block(g, rows + p->offsets[t] * es, p->cp, panel + t * p->cp * 32 * es, p->cp, block, 32, 32, t > 0);
        kiln_direct_scale(g, ops, block, oc0, cols);
        kiln_direct_store(p, bt, v, v + 32 < p->virtual_px ? v + 32 : p->virtual_px, block, oc0, cols);
      }
    }
  }
#ifdef KILN_X86
  if (amx) kiln_amx_release();
#endif
}

static void kiln_lowp_direct(const kiln_gemm *g, const kiln_lowp_ops *ops) {
  const int64_t *q = g->conv;
  kiln_direct_plan plan;
  memset(&plan, 0, sizeof plan);
  plan.g = g;
  plan.ops = ops;
  plan.C = q[0], plan.H = q[1], plan.W = q[2], plan.KH = q[3], plan.KW = q[4], plan.PT = q[5], plan.PL = q[6], plan.OH = q[7], plan.OW = q[8];
  plan.SH = q[9], plan.SW = q[10], plan.nhwc = (int)q[11];
  plan.OC = plan.nhwc ? g->N : g->M;
  plan.cp = kiln_round_up(plan.C, ops->kunit);
  plan.wq = plan.OW + (plan.KW - 1) / plan.SW;
  plan.virtual_px = plan.OH * plan.wq;
  plan.kp = plan.KH * plan.KW * plan.cp;
  /* rows of each phase: every one a tap reads, and enough slack that the last block's dropped
     pixels read inside */
  plan.hq = plan.OH + (plan.KH - 1) / plan.SH + (32 + plan.KW + plan.wq - 1) / plan.wq + 1;
  plan.phase_bytes = plan.hq * plan.wq * plan.cp * ops->esize;
  plan.image_bytes = plan.SH * plan.SW * plan.phase_bytes;
  for (int64_t kh = 0; kh < plan.KH; ++kh)
    for (int64_t kw = 0; kw < plan.KW; ++kw)
      plan.offsets[kh * plan.KW + kw] = ((kh % plan.SH) * plan.SW + kw % plan.SW) * (plan.phase_bytes / ops->esize) +
                                        ((kh / plan.SH) * plan.wq + kw / plan.SW) * plan.cp;
  int threads = kiln_pool_threads();
  if (kiln_in_pool()) threads = 1;
  static _Thread_local float *images;
  static _Thread_local int64_t have;
  plan.P = (char *)kiln_scratch(&images, &have, (g->batch * plan.image_bytes + 3) / 4);
  if (!plan.P) return; /* out of memory */
  const int workers = g->M * g->N * g->K * g->batch >= 65536 ? 0 : 1;
  kiln_parallel_for(0, g->batch * plan.hq * plan.SH, 4, workers, kiln_direct_rows, &plan);
  int64_t mc = kiln_round_up(plan.virtual_px < 256 ? plan.virtual_px : 256, 32);
  int64_t nc = kiln_round_up(plan.OC < 256 ? plan.OC : 256, 32);
  int64_t tiles_m = (plan.virtual_px + mc - 1) / mc, tiles_n = (plan.OC + nc - 1) / nc;
  while (threads > 1 && g->batch * tiles_m * tiles_n < 4 * threads && mc > 32) {
    mc = kiln_round_up(mc / 2, 32);
    tiles_m = (plan.virtual_px + mc - 1) / mc;
  }
  plan.mc = mc, plan.nc = nc, plan.tiles_m = tiles_m, plan.tiles_n = tiles_n;
  kiln_parallel_for(0, g->batch * tiles_m * tiles_n, 1, workers, kiln_direct_tasks, &plan);
}
