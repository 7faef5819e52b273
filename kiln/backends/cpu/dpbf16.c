/* kiln's AVX-512-BF16 micro-kernel (the bf16 path where AMX is absent or refused; needs
   -mavx512bf16, which -march=native gives on such a CPU).

   C (8 x 32 float32, row stride ldc floats) += A . B over kc (even) steps of k, with both operands
   packed in k pairs: A as a[kc/2][8] 32-bit words (word (p, r) = bf16 A[r][2p] in the low half,
   A[r][2p+1] in the high half), B as b[kc/2][32][2] bf16 (element (k, j) at b[(k/2)*64 + j*2 + k%2]).
   One VDPBF16PS per 16 columns and k pair: each lane adds a[2p] * b[2p] + a[2p+1] * b[2p+1] to its
   float32 accumulator (products exact in float32). */

#include <immintrin.h>
#include <stdint.h>

#define KILN_BF16_MR 8

void kiln_dpbf16_tile(int64_t kc, const uint32_t *a, const uint16_t *b, float *c, int64_t ldc) {
  __m512 acc0[KILN_BF16_MR], acc1[KILN_BF16_MR];
  for (int r = 0; r < KILN_BF16_MR; ++r) {
    acc0[r] = _mm512_loadu_ps(c + r * ldc);
    acc1[r] = _mm512_loadu_ps(c + r * ldc + 16);
  }
  for (int64_t p = 0; p < kc / 2; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(b + p * 64));
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(b + p * 64 + 32));
    for (int r = 0; r < KILN_BF16_MR; ++r) {
      const __m512bh pair = (__m512bh)_mm512_set1_epi32((int)a[p * KILN_BF16_MR + r]);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], pair, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], pair, b1);
    }
  }
  for (int r = 0; r < KILN_BF16_MR; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc0[r]);
    _mm512_storeu_ps(c + r * ldc + 16, acc1[r]);
  }
}
