"""PyTorch users' comparison, one run on one machine: eager PyTorch, torch.compile with inductor,
torch.compile with kiln (``backend="kiln"``) and kiln on the ONNX export of the same module.

    python benchmarks/torch_compile.py [--models resnet50,bert-base] [--duration 3] [--json out.json]

Each (model, mode) runs in a process of its own. Per model: first-call time of each torch.compile (capture + compile + first run) and of
``kiln.compile`` on the ONNX file (import + compile + first run), then the median latency over
``--duration`` seconds. First calls are measured twice, with caches this script owns: cold (inductor's
and kiln's cache folders new and empty: nothing compiled before) and warm (a second process on the
same folders: inductor's FX graph cache, kiln's plan cache and built libraries). Ratios: the kiln
backend against kiln via ONNX (the issue's target: within 5%), against inductor (faster), and the
first-call times (kiln's <= inductor's, cold and warm). Nothing else should run on the machine
meanwhile (2 threads each, as kiln bench).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np


def latency(function: Any, duration: float) -> float:
    """Median seconds per call over ``duration`` seconds (at least 10 calls), after 2 warm-ups."""
    for _ in range(2):
        function()
    times: list[float] = []
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline or len(times) < 10:
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, mode: str, duration: float, threads: int) -> dict[str, float]:
    """One (model, mode) in this process: first-call seconds and median latency in ms."""
    import torch

    import kiln
    import kiln.torch_backend
    from kiln import zoo
    from kiln.driver import plan_cache

    torch.set_num_threads(threads)
    feeds = zoo.example_inputs(name)
    if mode == "kiln_onnx":
        path = str(zoo.onnx_path(name))
        start = time.perf_counter()
        model = kiln.compile(path, threads=threads)
        model.run(feeds)
        first = time.perf_counter() - start
        plan_cache.wait()  # the plan cache stores in the background: not while latency is measured
        return {"first_s": first, "ms": 1e3 * latency(lambda: model.run(feeds), duration)}
    module = zoo.get(name).build(zoo.options_for(name)).eval()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad():
        if mode == "eager":
            return {"first_s": 0.0, "ms": 1e3 * latency(lambda: module(*args), duration)}
        backend = {"inductor": "inductor", "kiln_backend": "kiln"}[mode]
        options = {"threads": threads} if backend == "kiln" else None
        compiled = torch.compile(module, backend=backend, options=options)
        start = time.perf_counter()
        compiled(*args)
        first = time.perf_counter() - start
        plan_cache.wait()
        return {"first_s": first, "ms": 1e3 * latency(lambda: compiled(*args), duration)}


MODES = ("eager", "inductor", "kiln_backend", "kiln_onnx")


def isolated(name: str, mode: str, duration: float, threads: int, caches: str | None = None) -> dict[str, float]:
    """``measure`` in a process of its own (torch's and kiln's thread pools never share a process);
    ``caches``: a folder holding this run's inductor and kiln caches (the zoo's ONNX files are
    shared with the user's cache: exporting them is not what is measured)."""
    import os
    import subprocess
    import sys

    from kiln.integrity import cache_root

    env = dict(os.environ)
    if caches is not None:
        kiln_cache = os.path.join(caches, "kiln")
        os.makedirs(kiln_cache, exist_ok=True)
        if not os.path.exists(os.path.join(kiln_cache, "zoo")):
            os.symlink(cache_root() / "zoo", os.path.join(kiln_cache, "zoo"))
        env.update(KILN_CACHE_DIR=kiln_cache, TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"))
    command = [sys.executable, __file__, "--one", name, mode, "--duration", str(duration), "--threads", str(threads)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{name} {mode} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,vgg19,mobilenet_v2,bert-base,gpt2")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        print(json.dumps(measure(*options.one, options.duration, options.threads)))
        return
    from kiln.backends.cpu import features

    flags = sorted(f for f in features.cpu_flags() if f in ("avx2", "avx512f", "amx_tile", "avx_vnni"))
    print(f"{platform.processor() or platform.machine()}, ISA flags {', '.join(flags)}, {options.threads} threads")
    header = (
        "model | eager ms | inductor ms | kiln backend ms | kiln ONNX ms | backend/ONNX | backend/inductor | "
        "first call s, cold: inductor / kiln backend / kiln ONNX | warm: inductor / kiln backend / kiln ONNX"
    )
    print(header)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-caches-") as scratch:
        for name in options.models.split(","):
            row: dict[str, Any] = {"model": name}
            for mode in MODES:
                caches = os.path.join(scratch, f"{name}-{mode}")
                if mode != "eager":  # cold: this run's empty cache folders; then warm on the same
                    row[f"{mode}_cold_s"] = isolated(name, mode, 0.2, options.threads, caches)["first_s"]
                found = isolated(name, mode, options.duration, options.threads, caches)
                row[f"{mode}_ms"], row[f"{mode}_first_s"] = found["ms"], found["first_s"]
                shutil.rmtree(caches, ignore_errors=True)  # a VGG plan is 0.5 GB
            row["backend_vs_onnx"] = row["kiln_backend_ms"] / row["kiln_onnx_ms"]
            row["backend_vs_inductor"] = row["kiln_backend_ms"] / row["inductor_ms"]
            row["first_call_vs_inductor"] = row["kiln_backend_first_s"] / row["inductor_first_s"]
            row["cold_first_call_vs_inductor"] = row["kiln_backend_cold_s"] / row["inductor_cold_s"]
            rows.append(row)
            print(
                f"{name} | {row['eager_ms']:.1f} | {row['inductor_ms']:.1f} | {row['kiln_backend_ms']:.1f} | "
                f"{row['kiln_onnx_ms']:.1f} | {row['backend_vs_onnx']:.2f} | {row['backend_vs_inductor']:.2f} | "
                f"{row['inductor_cold_s']:.1f} / {row['kiln_backend_cold_s']:.1f} / {row['kiln_onnx_cold_s']:.1f} | "
                f"{row['inductor_first_s']:.1f} / {row['kiln_backend_first_s']:.1f} / {row['kiln_onnx_first_s']:.1f}",
                flush=True,
            )
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"flags": flags, "threads": options.threads, "rows": rows}, handle, indent=1)
    print("geomean backend/ONNX", float(np.exp(np.mean([np.log(r["backend_vs_onnx"]) for r in rows]))))


if __name__ == "__main__":
    main()
