"""Memory of a deployed model: kiln's compile, and ``kiln.load`` + first runs, against an
onnxruntime session on the same model, each phase in its own fresh process.

    python benchmarks/memory.py [-m resnet50,bert-base] [--runs 3] [--json]

For each zoo model (batch 1, its default sequence length) it prints, in MB above the process's
baseline (its RSS after importing the engine, before touching the model):
- ``compile``: kiln's peak while compiling from the ONNX file and saving the artifact (a cold
  compile: its own empty KILN_CACHE_DIR);
- ``load+run``: kiln's peak over ``kiln.load(artifact)`` and ``--runs`` runs (an empty cache too:
  a machine that never compiled the model);
- ``ort``: onnxruntime's peak over creating its session (all graph optimizations) and the runs;
- ``weights``: the model's weights (the ONNX file's initializers);
- ``first``/``warm``: kiln's first run after load and a warm run, in ms (what a first call pays).

Peaks are VmHWM (reset to the current RSS where Linux allows), so a phase's figure is its own.
Prints the CPU and its ISA; one thread per engine is not forced (each uses its defaults)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PHASE = r"""
import json, sys, time
import numpy as np
from kiln.bench.metrics import peak_rss_bytes, reset_peak, rss_bytes, release_freed_memory
phase, model, onnx_path, artifact, runs, feeds_path = sys.argv[1:7]
feeds = dict(np.load(feeds_path))
if phase == "ort":
    import onnxruntime as ort
else:
    import kiln
release_freed_memory()
reset_peak()
base = rss_bytes()
out = {}
if phase == "compile":
    compiled = kiln.compile(onnx_path, dims={"batch": 1})
    compiled.save(artifact)
elif phase == "load":
    loaded = kiln.load(artifact)
    times = []
    for _ in range(int(runs)):
        start = time.perf_counter()
        loaded.run(feeds)
        times.append(time.perf_counter() - start)
    out["first_ms"], out["warm_ms"] = times[0] * 1e3, min(times[1:] or times) * 1e3
else:
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    for _ in range(int(runs)):
        session.run(None, feeds)
out["peak_mb"] = (peak_rss_bytes() - base) / 1e6
print(json.dumps(out))
"""


def _phase(phase: str, name: str, onnx_path: Path, artifact: Path, runs: int, feeds: Path) -> dict:
    # each phase with caches of its own, empty: a cold compile, and a load as on a machine that
    # never compiled the model (no plan cache to map the packed weights from)
    with tempfile.TemporaryDirectory(prefix="kiln-memory-cache-") as cache:
        result = subprocess.run(
            [sys.executable, "-c", PHASE, phase, name, str(onnx_path), str(artifact), str(runs), str(feeds)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "KILN_CACHE_DIR": cache},
        )
    if result.returncode != 0:
        raise SystemExit(f"{phase} of {name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(name: str, runs: int, folder: Path) -> dict:
    import numpy as np
    import onnx

    from kiln import zoo

    onnx_path = zoo.onnx_path(name)
    weights = sum(
        onnx.numpy_helper.to_array(t).nbytes
        for t in onnx.load(str(onnx_path), load_external_data=True).graph.initializer
    )
    feeds = folder / f"{name}-feeds.npz"
    np.savez(feeds, **{k: np.asarray(v) for k, v in zoo.example_inputs(name).items()})
    artifact = folder / f"{name}.kiln"
    row = {"model": name, "weights_mb": weights / 1e6}
    row["compile_mb"] = _phase("compile", name, onnx_path, artifact, runs, feeds)["peak_mb"]
    loaded = _phase("load", name, onnx_path, artifact, runs, feeds)
    row.update(load_run_mb=loaded["peak_mb"], first_ms=loaded["first_ms"], warm_ms=loaded["warm_ms"])
    try:
        row["ort_mb"] = _phase("ort", name, onnx_path, artifact, runs, feeds)["peak_mb"]
    except SystemExit as err:  # onnxruntime is an optional peer
        row["ort_mb"], row["ort_error"] = None, str(err)[:200]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--models", default="resnet50,bert-base")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from kiln.bench.machine import fingerprint

    hardware = fingerprint()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-memory-") as scratch:
        for name in args.models.split(","):
            rows.append(measure(name.strip(), args.runs, Path(scratch)))
    if args.json:
        print(json.dumps({"hardware": hardware, "rows": rows}, indent=1))
        return
    isa = " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in hardware["flags"])
    print(f"{hardware['cpu']} ({isa}), {os.cpu_count()} cores; MB above the process's baseline")
    print(
        f"{'model':12} {'weights':>8} {'compile':>8} {'load+run':>9} {'ort':>8} {'ratio':>6} {'first ms':>9} {'warm ms':>8}"
    )
    for r in rows:
        ratio = r["load_run_mb"] / r["ort_mb"] if r.get("ort_mb") else float("nan")
        ort = f"{r['ort_mb']:.0f}" if r.get("ort_mb") is not None else "n/a"
        print(
            f"{r['model']:12} {r['weights_mb']:8.0f} {r['compile_mb']:8.0f} {r['load_run_mb']:9.0f} {ort:>8} "
            f"{ratio:6.2f} {r['first_ms']:9.1f} {r['warm_ms']:8.1f}"
        )


if __name__ == "__main__":
    main()
