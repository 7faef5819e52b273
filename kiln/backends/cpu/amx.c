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
#endif
