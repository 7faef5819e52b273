/* What kiln's AMX paths share (included before gemm_lowp.c when a plan has reduced-precision
   products): one tile configuration for both bf16 and int8 products. tmm0-3 hold a 2 x 2 block
   of C tiles (16 rows x 64 bytes: 16 float32 or int32), tmm4-5 two A tiles (16 rows x 64 bytes:
   32 bf16 or 64 int8 of k), tmm6-7 two B tiles (16 rows of k pairs or quads x 16 columns). The
   configuration is per thread: each task loads it and releases the tiles when done. AMX runs
   only after the OS granted the process its tile data (features.request_amx, arch_prctl). */

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_X86 1

typedef struct {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) kiln_tile_config;

__attribute__((target("amx-tile"))) static void kiln_amx_configure(void) {
  kiln_tile_config config;
  memset(&config, 0, sizeof config);
  config.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) static void kiln_amx_release(void) { _tile_release(); }

/* name(a, lda, offsets, taps, b, kc, c, ldc, rows, accumulate, au): C (rows 16 or 32 x 32, row
   stride ldc; float32 or int32) (+)= the sum over taps t of A rows at a + offsets[t] (stride lda
   elements of T) times B panel rows t * kc .. (t + 1) * kc, over kc (a multiple of one 64-byte
   A tile row) per tap. One body for both formats: T the element (bf16 as uint16_t, int8 as
   uint8_t), DOT(c, a, b) the tile product (it may read `au`: int8's A holds the unsigned operand).
   A plain block is one tap at offset 0; a direct convolution's block is every tap, the sums held
   in the tiles throughout. */
#define KILN_AMX_BLOCK(name, attributes, T, DOT)                                                                        \
  __attribute__((target(attributes))) static void name(const T *a, int64_t lda, const int64_t *offsets, int64_t taps,   \
                                                       const T *b, int64_t kc, void *cv, int64_t ldc, int64_t rows,    \
                                                       int accumulate, int au) {                                       \
    char *c = (char *)cv;                                                                                               \
    const int64_t step = 64 / (int64_t)sizeof(T), sa = lda * (int64_t)sizeof(T), sc = ldc * 4;                        \
    (void)au;                                                                                                           \
    if (accumulate) {                                                                                                   \
      _tile_loadd(0, c, sc);                                                                                            \
      _tile_loadd(1, c + 64, sc);                                                                                       \
    } else {                                                                                                            \
      _tile_zero(0);                                                                                                    \
      _tile_zero(1);                                                                                                    \
    }                                                                                                                   \
    if (rows > 16 && accumulate) {                                                                                      \
      _tile_loadd(2, c + 16 * sc, sc);                                                                                  \
      _tile_loadd(3, c + 16 * sc + 64, sc);                                                                             \
    } else if (rows > 16) {                                                                                             \
      _tile_zero(2);                                                                                                    \
      _tile_zero(3);                                                                                                    \
    }                                                                                                                   \
    for (int64_t t = 0; t < taps; ++t) {                                                                                \
      const T *at = a + offsets[t], *bt = b + t * kc * 32;                                                              \
      for (int64_t k0 = 0; k0 < kc; k0 += step) {                                                                       \
        _tile_loadd(6, bt + k0 * 32, 128);                                                                              \
        _tile_loadd(7, bt + k0 * 32 + step, 128);                                                                       \
        _tile_loadd(4, at + k0, sa);                                                                                    \
        DOT(0, 4, 6);                                                                                                   \
        DOT(1, 4, 7);                                                                                                   \
        if (rows > 16) {                                                                                                \
          _tile_loadd(5, at + 16 * lda + k0, sa);                                                                       \
          DOT(2, 5, 6);                                                                                                 \
          DOT(3, 5, 7);                                                                                                 \
        }                                                                                                               \
      }                                                                                                                 \
    }                                                                                                                   \
    _tile_stored(0, c, sc);                                                                                             \
    _tile_stored(1, c + 64, sc);                                                                                        \
    if (rows > 16) {                                                                                                    \
      _tile_stored(2, c + 16 * sc, sc);                                                                                 \
      _tile_stored(3, c + 16 * sc + 64, sc);                                                                            \
    }                                                                                                                   \
  }

static const int64_t kiln_amx_one_tap[1] = {0};
#endif
