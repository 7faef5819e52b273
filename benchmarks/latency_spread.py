"""Steady latency: p50/p90/p99 and the run-to-run spread of kiln and its peers, side by side.

    python benchmarks/latency_spread.py                      # resnet50, mobilenet_v2, bert-base, gpt2
    python benchmarks/latency_spread.py -m bert-base --runs 200 --repeats 3 --json

Each (engine, model, repeat) is its own fresh process, as a user's would be: it builds the engine
(kiln: ``kiln.compile`` from the ONNX file into an empty plan cache of its own, so the compile is
cold, as on a machine that never saw the model; onnxruntime: its session; OpenVINO: its compiled
model), warms up with 5 runs, then times ``--runs`` single-stream runs at batch 1 with ``--threads``
threads. For each it reports the median, p90 and p99 in ms, p90/p50, the CPUs the process used
while timing (process CPU time / wall time: a pool whose threads sleep or wait shows below the
thread count), and across the repeats the spread of the medians ((max - min) / min). The targets
(issue 48): p90 <= 1.10 x p50 and the repeats' medians within 5%. Peers that are not installed are
reported so. Not a test: run it on an otherwise quiet machine; the CPU and its ISA are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("kiln", "onnxruntime", "openvino")

JOB = r"""
import json, sys, time
import numpy as np
engine, model, runs, threads, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
from kiln import zoo
feeds = {k: np.asarray(v) for k, v in zoo.example_inputs(model, batch=1).items()}
start = time.perf_counter()
if engine == "kiln":
    import kiln
    compiled = kiln.compile(path, dims={"batch": 1}, threads=threads)
    run = lambda: compiled.run(feeds)
elif engine == "onnxruntime":
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, feeds)
else:
    import openvino as ov
    core = ov.Core()
    network = core.read_model(path)
    network.reshape({i.get_any_name(): list(feeds[i.get_any_name()].shape) for i in network.inputs})
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    request = core.compile_model(network, "CPU", config).create_infer_request()
    run = lambda: request.infer(feeds)
build_s = time.perf_counter() - start
for _ in range(5):
    run()
times = []
cpu0, wall0 = time.process_time(), time.perf_counter()
for _ in range(runs):
    begin = time.perf_counter()
    run()
    times.append(time.perf_counter() - begin)
cpus = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
print(json.dumps({"build_s": build_s, "times_ms": [t * 1e3 for t in times], "cpus": cpus}))
"""


def job(engine: str, model: str, runs: int, threads: int) -> dict:
    """One engine on one model in a fresh process, with an empty kiln cache of its own (the zoo's
    exported file comes from the usual cache: exporting it is not what is measured)."""
    from kiln import zoo

    path = str(zoo.onnx_path(model))
    with tempfile.TemporaryDirectory(prefix="kiln-spread-cache-") as cache:
        result = subprocess.run(
            [sys.executable, "-c", JOB, engine, model, str(runs), str(threads), path],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "KILN_CACHE_DIR": cache},
        )
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["(no message)"]
        if "ModuleNotFoundError" in tail[0]:
            return {"error": "not installed"}
        return {"error": tail[0][:200]}
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    times = sorted(measured.pop("times_ms"))

    def quantile(q: float) -> float:
        return times[min(len(times) - 1, int(q * len(times)))]

    return {
        **measured,
        "p50_ms": statistics.median(times),
        "p90_ms": quantile(0.90),
        "p99_ms": quantile(0.99),
        "max_ms": times[-1],
    }


def summarize(model: str, engine: str, repeats: list[dict]) -> dict:
    good = [r for r in repeats if "error" not in r]
    if not good:
        return {"model": model, "engine": engine, "error": repeats[0]["error"]}
    medians = [r["p50_ms"] for r in good]
    return {
        "model": model,
        "engine": engine,
        "repeats": good,
        "p50_ms": statistics.median(medians),
        "worst_p90_over_p50": max(r["p90_ms"] / r["p50_ms"] for r in good),
        "worst_p99_over_p50": max(r["p99_ms"] / r["p50_ms"] for r in good),
        "median_spread": (max(medians) - min(medians)) / min(medians),
        "cpus": min(r["cpus"] for r in good),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--models", default="resnet50,mobilenet_v2,bert-base,gpt2")
    parser.add_argument("-e", "--engines", default=",".join(ENGINES))
    parser.add_argument("--runs", type=int, default=100, help="timed runs per process (default 100)")
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per engine and model (default 2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or args.runs < 10 or args.repeats < 1:
        parser.error(f"engines are {', '.join(ENGINES)}; --runs >= 10; --repeats >= 1")
    from kiln.bench.machine import fingerprint

    hardware = fingerprint()
    rows = []
    for model in (m.strip() for m in args.models.split(",") if m.strip()):
        for engine in engines:
            # repeats alternate with nothing else running: each its own process, one after another
            rows.append(
                summarize(model, engine, [job(engine, model, args.runs, args.threads) for _ in range(args.repeats)])
            )
            if not args.json:
                _print_row(rows[-1])
    if args.json:
        print(json.dumps({"hardware": hardware, "threads": args.threads, "runs": args.runs, "rows": rows}, indent=1))
    else:
        isa = " ".join(hardware["flags"]) or "no AVX2"
        print(
            f"# {hardware['cpu']} ({hardware['family_model']}; {isa}), {args.threads} threads, batch 1, {args.runs} runs"
        )
    return 0


def _print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['model']:13} {row['engine']:12} {row['error']}", flush=True)
        return
    medians = " ".join(f"{r['p50_ms']:.2f}" for r in row["repeats"])
    print(
        f"{row['model']:13} {row['engine']:12} p50 {row['p50_ms']:8.2f} ms  p90/p50 {row['worst_p90_over_p50']:.2f}"
        f"  p99/p50 {row['worst_p99_over_p50']:.2f}  medians [{medians}] spread {100 * row['median_spread']:.1f}%"
        f"  cpus {row['cpus']:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
