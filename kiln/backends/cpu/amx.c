/* kiln's AMX-BF16 tile product (the seed of the bf16 engine path; needs -mamx-tile -mamx-bf16,
   which -march=native gives on a CPU with AMX, and the process's AMX permission: features.py).

   C (16 x 16 float32, row stride ldc floats) += A (16 x K bfloat16, row stride lda elements) times
   B (K x 16 bfloat16) held in the tile unit's pair layout b2[K/2][16][2] (element (k, j) at
   b2[(k / 2) * 32 + j * 2 + k % 2]); K a multiple of 32. One TDPBF16PS per 32 k: 16 x 16 x 32
   multiply-adds, products exact in float32, accumulated in float32. */

#include <immintrin.h>
#include <stdint.h>

typedef struct {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) kiln_tile_config;

void kiln_amx_bf16_tile(const uint16_t *a, int64_t lda, const uint16_t *b2, float *c, int64_t ldc, int64_t k) {
  kiln_tile_config config = {0};
  config.palette_id = 1;
  for (int t = 0; t < 3; ++t) { /* tmm0: C (16 x 16 float32), tmm1: A (16 x 32 bf16), tmm2: B pairs */
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  _tile_loadd(0, c, ldc * 4);
  for (int64_t k0 = 0; k0 < k; k0 += 32) {
    _tile_loadd(1, a + k0, lda * 2);
    _tile_loadd(2, b2 + (k0 / 2) * 32, 64);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, c, ldc * 4);
  _tile_release();
}
