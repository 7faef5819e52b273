"""Architectures kiln's zoo does not have, exported with symbolic sizes by both ONNX exporters,
compiled once with declared ranges and run at many sizes against onnxruntime (issue 49's table).

    python benchmarks/dynamic_architectures.py [--models albert,t5-encoder] [--exporters dynamo,torchscript]
        [--json out.jsonl]

Per (architecture, exporter), each in a process of its own with no plan cache:
``kiln.compile(path, dims=ranges)`` (token models: batch 1..8, seq 1..64; images: batch 1..4,
height and width 32..64), then runs at the ranges' ends, primes and sizes inside (token models
with padding masks that differ per sample), each compared with onnxruntime on the same file. The
row: the route per dim (sample-parallel, padded, run-time extents, or why not), plans compiled
after ``kiln.compile`` returned, the slowest first call at a new size, the worst relative L2, and
any error by binding. No failure is dropped: a size that fails is a row's error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from own_process import append_row, measured_alone

TEXT_RANGES = {"batch": (1, 8), "seq": (1, 64)}
TEXT_SIZES = [(1, 16), (1, 1), (8, 64), (3, 7), (5, 13), (2, 64), (8, 1), (4, 31)]
IMAGE_RANGES = {"batch": (1, 4), "height": (32, 64), "width": (32, 64)}
IMAGE_SIZES = [(1, 32, 32), (4, 64, 64), (3, 37, 37), (2, 48, 64), (1, 61, 53)]
DEFAULT_MODELS = (
    "roberta,albert,electra,xlm-roberta,roformer,ernie,mpnet,clip-text,t5-encoder,deberta-v2,"
    "opt,bloom,gpt-neo,qwen2,deit,convnextv2"
)


def measure(name: str, exporter: str) -> dict[str, Any]:
    """One (architecture, exporter) in this process."""
    import numpy as np
    import onnxruntime

    import kiln
    from kiln.driver.variants import plans_compiled
    from kiln.passes.batching import sample_parallel
    from kiln.zoo import architectures

    row: dict[str, Any] = {"model": name, "exporter": exporter}
    started = time.perf_counter()
    path = str(architectures.export(name, exporter=exporter, dynamic=True))
    row["export_s"] = time.perf_counter() - started
    arch = architectures.get(name)
    text = arch.inputs == "tokens"
    ranges = TEXT_RANGES if text else IMAGE_RANGES
    sizes = TEXT_SIZES if text else IMAGE_SIZES
    from kiln.frontend.onnx import import_onnx

    row["sample_parallel"] = {k: str(v)[:160] for k, v in sample_parallel(import_onnx(path)).items()}
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    started = time.perf_counter()
    from kiln.driver import extents

    found = extents.sizes_found()
    try:
        model = kiln.compile(path, dims={k: f"{a}..{b}" for k, (a, b) in ranges.items()})
    except Exception as err:
        row["error"] = f"compile: {type(err).__module__}.{type(err).__name__}: {err}"[:500]
        return row
    row["compile_s"] = time.perf_counter() - started
    # run-time dims route: kernel integers read from the lowering's size expressions / fitted
    row["sizes_read_fitted"] = [extents.sizes_found()[k] - found[k] for k in ("read", "fitted")]
    before = plans_compiled()
    worst, slowest, runs, errors = 0.0, 0.0, [], []
    for size in sizes:
        if text:
            feeds = architectures.inputs(name, batch=size[0], seq=size[1])
        else:
            feeds = architectures.inputs(name, batch=size[0], image=size[1])
            feeds = {
                "pixel_values": np.ascontiguousarray(np.resize(feeds["pixel_values"], (size[0], 3, size[1], size[2])))
            }
        try:
            want = session.run(None, feeds)[0]
        except Exception as err:
            runs.append({"size": size, "onnxruntime": f"fails: {str(err)[:120]}"})
            continue
        compiled = plans_compiled()
        started = time.perf_counter()
        try:
            got = next(iter(model.run(feeds).values()))
        except Exception as err:
            errors.append(f"{size}: {type(err).__module__}.{type(err).__name__}: {str(err)[:200]}")
            continue
        seconds = time.perf_counter() - started
        error = (
            float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
            if got.shape == want.shape
            else float("inf")
        )
        worst = max(worst, error)
        slowest = max(slowest, seconds)
        runs.append({"size": size, "seconds": seconds, "compiled": plans_compiled() - compiled, "rel_l2": error})
    row.update(
        {
            "runs": runs,
            "errors": errors,
            "compiles_after_compile": plans_compiled() - before,
            "slowest_first_call_s": slowest,
            "worst_rel_l2": worst,
            "native": bool(getattr(model, "is_native", False)),
            "run_time_refused": dict(getattr(model, "run_time_refused", {}) or {}),
            "routes_taken": dict(getattr(model, "routes_taken", {}) or {}),
        }
    )
    from kiln.driver.routes import dim_routes

    row["route_per_dim"] = {symbol: route for symbol, (route, _) in dim_routes(model).items()}
    from kiln.cli_check_ranges import check_ranges, exit_code

    # what `kiln check PATH --dim ... --strict` says of the same ranges
    report = check_ranges(path, {k: f"{a}..{b}" for k, (a, b) in ranges.items()}, {}, "cpu")
    verdicts = sorted({b["verdict"] for b in report["bindings"]}) or [report.get("compile_error", "?")]
    row["kiln_check"] = {"strict_exit": exit_code(report, strict=True), "verdicts": verdicts}
    return row


def _check_text(row: dict[str, Any]) -> str:
    found = row.get("kiln_check")
    if not found:
        return "-"
    return f"exit {found['strict_exit']} ({', '.join(found['verdicts'])})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--exporters", default="dynamo,torchscript")
    parser.add_argument("--json", help="append one JSON line per row here")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, exporter = args.one.split(":")
        print(json.dumps(measure(name, exporter), default=str), flush=True)
        return 0
    print(
        f"{'model':<12} {'exporter':<11} {'route per dim':<44} {'compiles':>8} {'first call s':>12} {'worst rel L2':>12}  "
        f"{'sizes read/fitted':>17}  {'kiln check --strict':<28} errors"
    )
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            row = measured_alone(__file__, f"{name}:{exporter}", args.timeout, {"model": name, "exporter": exporter})
            routes = ", ".join(f"{k}: {v}" for k, v in row.get("route_per_dim", {}).items()) or "-"
            print(
                f"{name:<12} {exporter:<11} {routes:<44} {row.get('compiles_after_compile', '-'):>8} "
                f"{row.get('slowest_first_call_s', float('nan')):>12.2f} {row.get('worst_rel_l2', float('nan')):>12.1e}  "
                f"{'/'.join(map(str, row.get('sizes_read_fitted', ['-']))):>17}  {_check_text(row):<28} {row.get('error') or '; '.join(row.get('errors', []))[:300]}",
                flush=True,
            )
            append_row(args.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
