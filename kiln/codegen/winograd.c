/* kiln's Winograd convolution drivers (included in generated code that uses them; needs gemm.c).
   The tile transforms below are generated from the matrices in kiln/lower/winograd.py and work on
   8 tiles at once: lane l is tile column tw0 + l, so the transforms vectorize and V / M are read
   and written contiguously (their layout is [point][channel][tile]). */

typedef float kiln_v8 __attribute__((vector_size(32)));
typedef float kiln_v8u __attribute__((vector_size(32), aligned(4)));

/* TRANSFORMS */

/* every (image, channel, tile) patch -> V[point][c][tile]; zero padding outside the image */
static void kiln_winograd_in(int m, const float *x, float *v, int64_t N, int64_t C, int64_t H, int64_t W, int64_t PT,
                             int64_t PL, int64_t TH, int64_t TW) {
  const int a = m + 2;
  const int64_t T = N * TH * TW;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t th = 0; th < TH; ++th) {
        const int64_t ih0 = th * m - PT;
        for (int64_t tw0 = 0; tw0 < TW; tw0 += 8) {
          const int lanes = TW - tw0 < 8 ? (int)(TW - tw0) : 8;
          kiln_v8 d[36], out[36];
          for (int i = 0; i < a; ++i) {
            const int64_t ih = ih0 + i;
            const int row_inside = ih >= 0 && ih < H;
            for (int j = 0; j < a; ++j) {
              kiln_v8 lane = {0};
              for (int l = 0; l < lanes; ++l) {
                const int64_t iw = (tw0 + l) * m - PL + j;
                lane[l] = row_inside && iw >= 0 && iw < W ? x[KILN_AT((n * C + c) * H * W + ih * W + iw, N * C * H * W, "winograd input")] : 0.0f;
              }
              d[i * a + j] = lane;
            }
          }
          if (m == 4) kiln_wino4_in(d, out); else kiln_wino2_in(d, out);
          float *dst = v + c * T + (n * TH + th) * TW + tw0;
          KILN_SPAN(c * T + (n * TH + th) * TW + tw0, (int64_t)(a * a - 1) * C * T + lanes, (int64_t)a * a * C * T, "winograd V");
          for (int p = 0; p < a * a; ++p) {
            if (lanes == 8) *(kiln_v8u *)(dst + p * C * T) = out[p];
            else for (int l = 0; l < lanes; ++l) dst[p * C * T + l] = out[p][l];
          }
        }
      }
    }
}

/* M[point][o][tile] -> the output (+ bias), then the fused epilogue per finished tile row */
static void kiln_winograd_out(int m, const float *mm, float *y, const float *bias, int64_t N, int64_t O, int64_t OH,
                              int64_t OW, int64_t TH, int64_t TW, const kiln_gemm *g) {
  const int a = m + 2;
  const int64_t T = N * TH * TW;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      const float b = bias ? bias[o] : 0.0f;
      for (int64_t th = 0; th < TH; ++th) {
        for (int64_t tw0 = 0; tw0 < TW; tw0 += 8) {
          const int lanes = TW - tw0 < 8 ? (int)(TW - tw0) : 8;
          kiln_v8 p[36], out[16];
          const float *src = mm + o * T + (n * TH + th) * TW + tw0;
          KILN_SPAN(o * T + (n * TH + th) * TW + tw0, (int64_t)(a * a - 1) * O * T + lanes, (int64_t)a * a * O * T, "winograd M");
          for (int q = 0; q < a * a; ++q) {
            if (lanes == 8) p[q] = *(const kiln_v8u *)(src + q * O * T);
            else { kiln_v8 lane = {0}; for (int l = 0; l < lanes; ++l) lane[l] = src[q * O * T + l]; p[q] = lane; }
          }
          if (m == 4) kiln_wino4_out(p, out); else kiln_wino2_out(p, out);
          for (int i = 0; i < m; ++i) {
            const int64_t oh = th * m + i;
            if (oh >= OH) break;
            for (int l = 0; l < lanes; ++l)
              for (int j = 0; j < m; ++j) {
                const int64_t ow = (tw0 + l) * m + j;
                if (ow < OW) y[KILN_AT((n * O + o) * OH * OW + oh * OW + ow, N * O * OH * OW, "winograd output")] = out[i * m + j][l] + b;
              }
          }
        }
        if (g && g->epilogue) {  /* rows th*m .. th*m+m of this output plane are final */
          const int64_t first = th * m, last = (th + 1) * m < OH ? (th + 1) * m : OH;
          g->epilogue(g, n, o, o + 1, first * OW, last * OW);
        }
      }
    }
}
