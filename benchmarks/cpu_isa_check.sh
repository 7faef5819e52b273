#!/usr/bin/env bash
# kiln's CPU instruction-set paths on a machine this checkout's CI never has (AVX-512, VNNI, BF16,
# AMX): which ISA the CPU reports, what `kiln targets` picks, the ISA-specific tests (each path's
# exact and tolerance tests; a path the CPU lacks is skipped with its reason), then int8 and bf16
# latency at 2 threads against onnxruntime (the harness's runner: each job its own process).
#
#   OUT=/tmp/isa bash benchmarks/cpu_isa_check.sh          # everything, ~8 minutes on 16 cores
#   STEPS=tests OUT=/tmp/isa bash benchmarks/cpu_isa_check.sh
#
# Written for a lent machine (python3 with numpy, onnx, onnxruntime, torch, pytest-xdist, and
# mlcommons-loadgen for the latency steps: the harness times with it; kiln from
# this checkout through PYTHONPATH). Results: $OUT/isa.txt, $OUT/tests.txt, $OUT/int8.txt, $OUT/bf16.txt.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-isa}
STEPS=${STEPS:-tests,int8,bf16}
PYTHON=${PYTHON:-python3}
MODELS=${MODELS:-resnet50,bert-base}
mkdir -p "$OUT"
export COLUMNS=220 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-isa-cache}
workers=$(($(nproc) / 2))
[ "$workers" -lt 1 ] && workers=1
[ "$workers" -gt 8 ] && workers=8

{
    date -u
    lscpu | grep -E 'Model name|Vendor|CPU\(s\)|Thread|Core|Socket|L1d|L2|L3|MHz'
    echo "isa: $(grep -o 'avx512[a-z_0-9]*\|amx_[a-z0-9]*\|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    (cc --version || gcc --version) 2>&1 | head -1
    $PYTHON -c 'import sys, numpy, onnx, onnxruntime; print(sys.version.split()[0], "numpy", numpy.__version__, "onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__)'
    $PYTHON -m kiln.cli targets 2>&1 | head -40  # COLUMNS wide: the table unwrapped
} 2>&1 | tee "$OUT/isa.txt"

if [[ ,$STEPS, == *,tests,* ]]; then
    timeout 180 $PYTHON -m pytest -q -rs -p no:cacheprovider -n "$workers" \
        tests/codegen/test_gemm.py tests/codegen/test_bf16.py tests/codegen/test_int8.py \
        tests/codegen/test_depthwise.py tests/codegen/test_native.py tests/targets/test_targets.py 2>&1 |
        tee "$OUT/tests.txt" | tail -25
fi
if [[ ,$STEPS, == *,int8,* ]]; then
    timeout ${INT8_S:-170} $PYTHON benchmarks/vs_peers.py --models "$MODELS" --precision int8 --peers onnxruntime-int8,kiln \
        --threads 2 --duration 2 --no-roofline --out "$OUT/bench-int8" --db "$OUT/bench.db" 2>"$OUT/int8.log" |
        tee "$OUT/int8.txt"
fi
if [[ ,$STEPS, == *,bf16,* ]]; then
    timeout ${BF16_S:-130} $PYTHON benchmarks/vs_peers.py --models "$MODELS" --precision bf16 --peers onnxruntime,kiln \
        --threads 2 --duration 2 --no-roofline --out "$OUT/bench-bf16" --db "$OUT/bench.db" 2>"$OUT/bf16.log" |
        tee "$OUT/bf16.txt"
fi
