/* kiln's Winograd convolution drivers (included in generated code that uses them; needs gemm.c).
   The tile transforms below are generated from the matrices in kiln/lower/winograd.py and work on
   8 tiles at once (lane l is the image's tile t0 + l, see below), so the transforms vectorize and
   V / M are read and written contiguously (their layout is [point][channel][tile]). */

#ifdef __AVX2__
#include <immintrin.h>
#endif

typedef float kiln_v8 __attribute__((vector_size(32)));
typedef float kiln_v8u __attribute__((vector_size(32), aligned(4)));

/* TRANSFORMS */

/* Lanes run over 8 consecutive tiles of an image, row-major across tile rows (t = th * TW + tw), so
   small images fill every lane too (a 14 x 14 output has 16 tiles of 4 x 4: two full vectors).
   Each image plane is first copied into a zero-padded thread-local plane (one memcpy per row, no
   per-element bounds tests), from which a lane's patch element (i, j) is a gather at its tile's
   origin + i * pitch + j: the same index vector for all a x a points. V and M rows are stored and
   loaded whole at [point][channel][image tile]. */
static inline kiln_v8 kiln_wino_gather(const float *base, const int32_t *index) {
#ifdef __AVX2__
  return (kiln_v8)_mm256_i32gather_ps(base, _mm256_loadu_si256((const __m256i *)index), 4);
#else
  kiln_v8 lane;
  for (int l = 0; l < 8; ++l) lane[l] = base[index[l]];
  return lane;
#endif
}

/* the padded plane's offset of each lane's tile origin (tile t0 + l; lanes past the last tile
   read the origin) */
static inline void kiln_wino_origins(int32_t *index, int64_t t0, int lanes, int64_t TW, int m, int64_t pitch) {
  for (int l = 0; l < 8; ++l) {
    const int64_t t = l < lanes ? t0 + l : t0;
    index[l] = (int32_t)((t / TW) * m * pitch + (t % TW) * m);
  }
}

/* every (image, channel, tile) patch -> V[point][c][tile]; zero padding outside the image */
typedef struct {
  int m;
  const float *x;
  float *v;
  int64_t N, C, H, W, PT, PL, TH, TW;
} kiln_wino_in_job;

static void kiln_winograd_in_planes(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_wino_in_job *job = (const kiln_wino_in_job *)ctx;
  const int m = job->m, a = m + 2;
  const float *x = job->x;
  float *v = job->v;
  const int64_t N = job->N, C = job->C, H = job->H, W = job->W, PT = job->PT, PL = job->PL, TW = job->TW;
  const int64_t T = N * job->TH * TW, tiles = job->TH * TW;
  /* the padded plane: image (ih, iw) at row ih + PT, column iw + PL; every patch lies inside */
  const int64_t rows = job->TH * m + 2, pitch = TW * m + 2;
  static _Thread_local float *padded_buf;
  static _Thread_local int64_t padded_have;
  float *padded = kiln_scratch(&padded_buf, &padded_have, rows * pitch);
  for (int64_t plane_index = lo; plane_index < hi; ++plane_index) {
    const int64_t n = plane_index / C, c = plane_index % C;
    const float *plane = x + (n * C + c) * H * W;
    memset(padded, 0, (size_t)(rows * pitch) * sizeof(float));
    const int64_t copy_rows = H < rows - PT ? H : rows - PT, copy_cols = W < pitch - PL ? W : pitch - PL;
    for (int64_t ih = 0; ih < copy_rows; ++ih) {
      KILN_SPAN((n * C + c) * H * W + ih * W, copy_cols, N * C * H * W, "winograd input");
      memcpy(padded + (ih + PT) * pitch + PL, plane + ih * W, (size_t)copy_cols * sizeof(float));
    }
    for (int64_t t0 = 0; t0 < tiles; t0 += 8) {
      const int lanes = tiles - t0 < 8 ? (int)(tiles - t0) : 8;
      int32_t index[8];
      kiln_wino_origins(index, t0, lanes, TW, m, pitch);
      kiln_v8 d[36], out[36];
      for (int i = 0; i < a; ++i)
        for (int j = 0; j < a; ++j) d[i * a + j] = kiln_wino_gather(padded + i * pitch + j, index);
      if (m == 4) kiln_wino4_in(d, out); else kiln_wino2_in(d, out);
      float *dst = v + c * T + n * tiles + t0;
      KILN_SPAN(c * T + n * tiles + t0, (int64_t)(a * a - 1) * C * T + lanes, (int64_t)a * a * C * T, "winograd V");
      for (int p = 0; p < a * a; ++p) {
        if (lanes == 8) *(kiln_v8u *)(dst + p * C * T) = out[p];
        else for (int l = 0; l < lanes; ++l) dst[p * C * T + l] = out[p][l];
      }
    }
  }
}

KILN_ENGINE void kiln_winograd_in(int m, const float *x, float *v, int64_t N, int64_t C, int64_t H, int64_t W, int64_t PT,
                             int64_t PL, int64_t TH, int64_t TW) {
  kiln_wino_in_job planes = {m, x, v, N, C, H, W, PT, PL, TH, TW};
  kiln_parallel_for(0, N * C, 0, 0, kiln_winograd_in_planes, &planes);
}

/* M[point][o][tile] (tile_major: M[point][tile][o], a product of few tiles computed with the
   tiles as its rows, so the engine's panels run across output channels, not across 4 or 16
   tiles padded to a panel) -> the output (+ bias), then the fused epilogue once per finished
   plane. The tiles' m x m results are scattered into a thread-local plane of whole tiles (no
   edge tests), whose visible OH x OW part is then copied out row by row with the bias. */
typedef struct {
  int m, tile_major;
  const float *mm;
  float *y;
  const float *bias;
  int64_t N, O, OH, OW, TH, TW;
  const kiln_gemm *g;
} kiln_wino_out_job;

/* plane o of image n: the visible OH x OW part of a plane of whole tiles (row pitch TW * m), plus
   the bias */
static void kiln_wino_copy_out(const kiln_wino_out_job *job, const float *whole, int64_t n, int64_t o) {
  const int64_t O = job->O, OH = job->OH, OW = job->OW, pitch = job->TW * job->m;
  const float b = job->bias ? job->bias[o] : 0.0f;
  float *dst = job->y + (n * O + o) * OH * OW;
  KILN_SPAN((n * O + o) * OH * OW, OH * OW, job->N * O * OH * OW, "winograd output");
  for (int64_t oh = 0; oh < OH; ++oh) {
    const float *row = whole + oh * pitch;
#pragma omp simd
    for (int64_t ow = 0; ow < OW; ++ow) dst[oh * OW + ow] = row[ow] + b;
  }
}

/* M's `points` transform points of `lanes` consecutive values (tiles of a channel, or channels of
   a tile) at src, step apart: one vector each, lanes past `lanes` zero */
static inline void kiln_wino_points(const float *src, int64_t step, int points, int lanes, kiln_v8 *p) {
  for (int q = 0; q < points; ++q) {
    if (lanes == 8) p[q] = *(const kiln_v8u *)(src + q * step);
    else { kiln_v8 lane = {0}; for (int l = 0; l < lanes; ++l) lane[l] = src[q * step + l]; p[q] = lane; }
  }
}

static void kiln_winograd_out_planes(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_wino_out_job *job = (const kiln_wino_out_job *)ctx;
  const int m = job->m, a = m + 2;
  const float *mm = job->mm;
  const kiln_gemm *g = job->g;
  const int64_t N = job->N, O = job->O, OH = job->OH, OW = job->OW, TH = job->TH, TW = job->TW;
  const int64_t T = N * TH * TW, tiles = TH * TW, pitch = TW * m;
  static _Thread_local float *whole_buf;
  static _Thread_local int64_t whole_have;
  float *whole = kiln_scratch(&whole_buf, &whole_have, TH * m * pitch);
  for (int64_t plane_index = lo; plane_index < hi; ++plane_index) {
    const int64_t n = plane_index / O, o = plane_index % O;
    for (int64_t t0 = 0; t0 < tiles; t0 += 8) {
      const int lanes = tiles - t0 < 8 ? (int)(tiles - t0) : 8;
      kiln_v8 p[36], out[16];
      const float *src = mm + o * T + n * tiles + t0;
      KILN_SPAN(o * T + n * tiles + t0, (int64_t)(a * a - 1) * O * T + lanes, (int64_t)a * a * O * T, "winograd M");
      kiln_wino_points(src, O * T, a * a, lanes, p);
      if (m == 4) kiln_wino4_out(p, out); else kiln_wino2_out(p, out);
      for (int l = 0; l < lanes; ++l) {
        const int64_t t = t0 + l;
        float *tile = whole + (t / TW) * m * pitch + (t % TW) * m;
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < m; ++j) tile[i * pitch + j] = out[i * m + j][l];
      }
    }
    kiln_wino_copy_out(job, whole, n, o);
    if (g && g->epilogue) g->epilogue(g, n, o, o + 1, 0, OH * OW); /* the plane is final (and in cache) */
  }
}

/* the same from a tile-major M[point][tile][o]: lanes run over 8 output channels of one tile (a
   contiguous load per point), and each of the 8 planes is assembled whole before it is copied out
   with the bias and its epilogue runs */
static void kiln_winograd_out_channels(void *ctx, int64_t lo, int64_t hi, int worker) {
  const kiln_wino_out_job *job = (const kiln_wino_out_job *)ctx;
  const int m = job->m, a = m + 2;
  const float *mm = job->mm;
  const kiln_gemm *g = job->g;
  const int64_t N = job->N, O = job->O, OH = job->OH, OW = job->OW, TH = job->TH, TW = job->TW;
  const int64_t T = N * TH * TW, tiles = TH * TW, pitch = TW * m, plane = TH * m * pitch, blocks = (O + 7) / 8;
  static _Thread_local float *whole_buf;
  static _Thread_local int64_t whole_have;
  float *whole = kiln_scratch(&whole_buf, &whole_have, 8 * plane);
  if (!whole) return; /* out of memory */
  for (int64_t index = lo; index < hi; ++index) {
    const int64_t n = index / blocks, o0 = (index % blocks) * 8;
    const int lanes = O - o0 < 8 ? (int)(O - o0) : 8;
    for (int64_t t = 0; t < tiles; ++t) {
      kiln_v8 p[36], out[16];
      const float *src = mm + (n * tiles + t) * O + o0;
      KILN_SPAN((n * tiles + t) * O + o0, (int64_t)(a * a - 1) * O * T + lanes, (int64_t)a * a * O * T, "winograd M");
      kiln_wino_points(src, O * T, a * a, lanes, p);
      if (m == 4) kiln_wino4_out(p, out); else kiln_wino2_out(p, out);
      float *tile = whole + (t / TW) * m * pitch + (t % TW) * m;
      for (int l = 0; l < lanes; ++l)
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < m; ++j) tile[l * plane + i * pitch + j] = out[i * m + j][l];
    }
    for (int l = 0; l < lanes; ++l) kiln_wino_copy_out(job, whole + l * plane, n, o0 + l);
    if (g && g->epilogue) g->epilogue(g, n, o0, o0 + lanes, 0, OH * OW); /* the planes are final (and in cache) */
  }
}

KILN_ENGINE void kiln_winograd_out(int m, const float *mm, float *y, const float *bias, int64_t N, int64_t O, int64_t OH,
                              int64_t OW, int64_t TH, int64_t TW, int tile_major, const kiln_gemm *g) {
  kiln_wino_out_job planes = {m, tile_major, mm, y, bias, N, O, OH, OW, TH, TW, g};
  if (tile_major) {
    kiln_parallel_for(0, N * ((O + 7) / 8), 0, 0, kiln_winograd_out_channels, &planes);
    return;
  }
  kiln_parallel_for(0, N * O, 0, 0, kiln_winograd_out_planes, &planes);
}
