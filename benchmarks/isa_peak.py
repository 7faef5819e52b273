"""The CPU's instruction peaks: what one and two cores can issue of float32 FMA, bf16 dot products
(VDPBF16PS) and int8 dot products (VPDPBUSD, AVX-512 VNNI; VPDPBUSD on ymm with AVX-VNNI), each
with independent accumulators in registers (16 zmm, 12 ymm) and no memory traffic.

    python benchmarks/isa_peak.py            # every unit this CPU has, 1 and 2 threads
    python benchmarks/isa_peak.py --json

The ceiling every product is measured against ("% of the machine's peak" in issue 48's targets):
kiln's `kiln explain --profile` reports kernels against its own measured 1024^3 product instead,
which is below this by the cost of loads, packing and threads meeting. Not a test. Needs gcc."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static long ROUNDS = 20000000;

/* N accumulators: 16 of the 32 zmm registers; 12 of AVX2's 16 ymm (16 would spill) */
#define LOOP(N, TYPE, INIT, STEP)                                       \
  TYPE acc[N]; for (int i = 0; i < N; ++i) acc[i] = INIT;               \
  for (long k = 0; k < ROUNDS; ++k) {                                   \
    _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) acc[i] = STEP; \
    __asm__ volatile("" : "+v"(x));                                     \
  }                                                                     \
  volatile TYPE sink = acc[0]; for (int i = 1; i < N; ++i) sink = acc[i]; (void)sink;

__attribute__((target("avx512f"))) static void fma512(void) {
  __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0.0f);
  LOOP(16, __m512, _mm512_set1_ps((float)i), _mm512_fmadd_ps(acc[i], x, y))
}
__attribute__((target("avx2,fma"))) static void fma256(void) {
  __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(0.0f);
  LOOP(12, __m256, _mm256_set1_ps((float)i), _mm256_fmadd_ps(acc[i], x, y))
}
__attribute__((target("avx512f,avx512bf16"))) static void bf16_512(void) {
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = x;
  LOOP(16, __m512, _mm512_set1_ps((float)i), _mm512_dpbf16_ps(acc[i], x, y))
}
__attribute__((target("avx512f,avx512vnni"))) static void vnni512(void) {
  __m512i x = _mm512_set1_epi32(0x01010101), y = _mm512_set1_epi32(0x02020202);
  LOOP(16, __m512i, _mm512_set1_epi32(i), _mm512_dpbusd_epi32(acc[i], x, y))
}
__attribute__((target("avx2,avxvnni"))) static void vnni256(void) {
  __m256i x = _mm256_set1_epi32(0x01010101), y = _mm256_set1_epi32(0x02020202);
  LOOP(12, __m256i, _mm256_set1_epi32(i), _mm256_dpbusd_avx_epi32(acc[i], x, y))
}

typedef struct { const char *name; void (*run)(void); double ops; } unit;
static const unit UNITS[] = {
  {"fp32 fma zmm", fma512, 16.0 * 16 * 2},
  {"fp32 fma ymm", fma256, 12.0 * 8 * 2},
  {"bf16 vdpbf16ps zmm", bf16_512, 16.0 * 32 * 2},
  {"int8 vpdpbusd zmm", vnni512, 16.0 * 64 * 2},
  {"int8 vpdpbusd ymm (avx-vnni)", vnni256, 12.0 * 32 * 2},
};
static void *worker(void *arg) { ((const unit *)arg)->run(); return NULL; }

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  const int here[] = {__builtin_cpu_supports("avx512f"), __builtin_cpu_supports("fma"),
                      __builtin_cpu_supports("avx512bf16"), __builtin_cpu_supports("avx512vnni"),
                      __builtin_cpu_supports("avxvnni")}; /* (literals only) */
  for (size_t u = 0; u < sizeof UNITS / sizeof *UNITS; ++u) {
    if (!here[u]) continue;
    pthread_t t[64];
    double start = now();
    for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, worker, (void *)&UNITS[u]);
    for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
    double seconds = now() - start;
    printf("%s\t%d\t%.1f\n", UNITS[u].name, threads, UNITS[u].ops * ROUNDS * threads / seconds / 1e9);
  }
  return 0;
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts (comma-separated)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        source, binary = Path(folder) / "peak.c", Path(folder) / "peak"
        source.write_text(SOURCE)
        built = subprocess.run(
            ["gcc", "-O2", "-pthread", "-o", str(binary), str(source)], capture_output=True, text=True
        )
        if built.returncode:
            print(f"gcc could not build the probe (an old gcc lacks an intrinsic?):\n{built.stderr}", file=sys.stderr)
            return 2
        rows = []
        for threads in (int(t) for t in args.threads.split(",")):
            done = subprocess.run([str(binary), str(threads)], capture_output=True, text=True, check=True)
            for line in done.stdout.splitlines():
                name, count, rate = line.split("\t")
                rows.append({"unit": name, "threads": int(count), "gops": float(rate)})
    from kiln.bench.machine import fingerprint

    machine = fingerprint()
    if args.json:
        print(json.dumps({"cpu": machine.get("cpu"), "flags": machine.get("flags"), "peaks": rows}))
        return 0
    print(f"# {machine.get('cpu')}; flags: {', '.join(machine.get('flags') or [])}")
    print(f"{'unit':32} {'threads':>7} {'GOP/s (GFLOP/s)':>16}")
    for row in rows:
        print(f"{row['unit']:32} {row['threads']:7d} {row['gops']:16.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
