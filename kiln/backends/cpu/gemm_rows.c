/* The matrix-multiply engine's row paths over whole panels (after gemm.c, in the same unit): the
   weight-only paths' prompt rows over a panel block widened to float (gemm_w8.c, gemm_w4.c), and a
   decode step's few rows times constant packed float32 B streamed one whole panel at a time. */

/* the finish (bias, activation, bounds) of the tile at row m0, column n0, in `fin`; NULL: none */
static inline const kiln_finish *kiln_finish_at(const kiln_gemm *g, int64_t m0, int64_t n0, kiln_finish *fin) {
  if (!g->f_on) return NULL;
  *fin = (kiln_finish){g->f_row ? g->f_row + m0 : NULL, g->f_col ? g->f_col + n0 : NULL, g->f_relu, g->f_lo, g->f_hi};
  return fin;
}

/* the panel paths' split over the pool (this one, gemm_w8.c, gemm_w4.c): about 4 tasks a thread,
   each a run of whole panels (even shares without a task per panel), over every batch element;
   the plan's `*per_task` is set before `body` runs (inside a driver's parallel loop: alone) */
static void kiln_panel_tasks(const kiln_gemm *g, int64_t panels, int64_t *per_task, kiln_body body, void *plan) {
  const int threads = kiln_in_pool() ? 1 : kiln_pool_threads();
  const int64_t wanted = 4 * (int64_t)(threads > 0 ? threads : 1);
  *per_task = panels > wanted ? (panels + wanted - 1) / wanted : 1;
  const int64_t tasks = g->batch * ((panels + *per_task - 1) / *per_task);
  const int64_t work = g->M * g->N * g->K * g->batch;
  kiln_parallel_for(0, tasks, 1, work >= 65536 && tasks > 1 ? 0 : 1, body, plan);
}

/* every row of A (read in place) times one float panel block [kc][NR] of columns n0 .. n0 + nr,
   accumulated over the blocks before it (k0 > 0), finished (bias, activation, bounds, the generated
   epilogue) at the last: the weight-only paths' prompt rows (gemm_w8.c, gemm_w4.c), whose panels
   are widened to float one block at a time */
static void kiln_block_rows(const kiln_gemm *g, int64_t bt, const float *panel, int64_t k0, int64_t kc, int64_t n0, int64_t nr) {
  const int last = k0 + kc >= g->K;
  for (int64_t m0 = 0; m0 < g->M; m0 += KILN_MR) {
    const int64_t mr = g->M - m0 < KILN_MR ? g->M - m0 : KILN_MR;
    const int64_t from = bt * g->a_bs + m0 * g->a_rs + k0;
    (void)KILN_SPAN(from, (mr - 1) * g->a_rs + kc, g->a_size, "A (in place)");
    const int64_t to = bt * g->c_bs + m0 * g->ldc + n0;
    (void)KILN_SPAN(to, (mr - 1) * g->ldc + nr, g->c_size, "C");
    float *tile = g->c + to;
    kiln_finish fin;
    const kiln_finish *finish = last ? kiln_finish_at(g, m0, n0, &fin) : NULL;
    if (mr == KILN_MR && nr == KILN_NR) {
      kiln_rows_n(KILN_MR, kc, g->a + from, g->a_rs, panel, tile, g->ldc, k0 > 0, finish);
    } else {
      kiln_ukernel_rows_few(kc, g->a + from, g->a_rs, panel, tile, g->ldc, k0 > 0, mr, nr);
      if (finish) kiln_finish_tile(finish, tile, g->ldc, mr, nr);
    }
    if (last && g->epilogue) g->epilogue(g, bt, m0, m0 + mr, n0, n0 + nr);
  }
}

/* a few rows of A read in place times constant packed B (a decode step's products): each task a run
   of whole panels, each panel streamed once over all of K (contiguous: no cache blocks to jump
   between, nothing packed), as the weight-only paths stream theirs */
typedef struct { const kiln_gemm *g; int64_t panels, per_task; } kiln_stream_plan;

/* one row of A times KILN_STREAMS whole panels read side by side, a k-step of each in turn: four
   streams from memory at once rather than one (the memory serves several a little faster: 2-4% a
   67 MB matrix on Zen 4, a plain streaming read 10-15%) */
#define KILN_STREAMS 4

/* one row's results over `count` whole panels from `first` (a set's kernel's accumulators, two
   vectors a panel): each finished and stored, then the generated epilogue */
static void kiln_set_store(const kiln_gemm *g, int64_t bt, int64_t first, int count, kiln_vf *acc0, kiln_vf *acc1) {
  for (int s = 0; s < count; ++s) {
    const int64_t n0 = (first + s) * KILN_NR;
    float *c = g->c + KILN_SPAN(bt * g->c_bs + n0, KILN_NR, g->c_size, "C");
    kiln_finish fin;
    kiln_store_tile(1, &acc0[s], &acc1[s], c, g->ldc, kiln_finish_at(g, 0, n0, &fin));
    if (g->epilogue) g->epilogue(g, bt, 0, 1, n0, n0 + KILN_NR);
  }
}
static void kiln_stream_set(const kiln_gemm *g, int64_t bt, int64_t first) {
  const int64_t K = g->K, size = K * KILN_NR;
  const int64_t at = KILN_SPAN(bt * g->b_pbs + first * size, KILN_STREAMS * size, g->b_packed_size, "B (packed)");
  const int64_t from = KILN_SPAN(bt * g->a_bs, K, g->a_size, "A (in place)");
  const float *restrict b = g->b_packed + at, *restrict a = g->a + from;
  kiln_vf acc0[KILN_STREAMS], acc1[KILN_STREAMS];
#pragma GCC unroll 8
  for (int s = 0; s < KILN_STREAMS; ++s) acc0[s] = acc1[s] = (kiln_vf){0};
  for (int64_t k = 0; k < K; ++k) {
    const float x = a[k];
#pragma GCC unroll 8
    for (int s = 0; s < KILN_STREAMS; ++s) {
      acc0[s] += x * *(const kiln_vf *)(b + s * size + k * KILN_NR);
      acc1[s] += x * *(const kiln_vf *)(b + s * size + k * KILN_NR + KILN_L);
    }
  }
  kiln_set_store(g, bt, first, KILN_STREAMS, acc0, acc1);
}

static void kiln_stream_tasks(void *ctx, int64_t lo, int64_t hi, int worker) {
  (void)worker;
  const kiln_stream_plan *p = (const kiln_stream_plan *)ctx;
  const kiln_gemm *g = p->g;
  const int64_t runs = (p->panels + p->per_task - 1) / p->per_task;
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t bt = task / runs, first = (task % runs) * p->per_task;
    const int64_t last = first + p->per_task < p->panels ? first + p->per_task : p->panels;
    int64_t panel = first;
    for (; KILN_STREAMS > 1 && panel + KILN_STREAMS <= last && (panel + KILN_STREAMS) * KILN_NR <= g->N; panel += KILN_STREAMS)
      kiln_stream_set(g, bt, panel);
    for (; panel < last; ++panel) {
      const int64_t n0 = panel * KILN_NR, nr = g->N - n0 < KILN_NR ? g->N - n0 : KILN_NR;
      const int64_t at = KILN_SPAN(bt * g->b_pbs + panel * g->K * KILN_NR, g->K * KILN_NR, g->b_packed_size, "B (packed)");
      kiln_block_rows(g, bt, g->b_packed + at, 0, g->K, n0, nr);
    }
  }
}

static void kiln_stream_run(const kiln_gemm *g) {
  kiln_stream_plan plan = {g, (g->N + KILN_NR - 1) / KILN_NR, 1};
  kiln_panel_tasks(g, plan.panels, &plan.per_task, kiln_stream_tasks, &plan);
}
