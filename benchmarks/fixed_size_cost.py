"""What serving every size from one compile costs at a fixed size (issue 49: "speed at fixed sizes
unchanged"): an architecture's export with symbolic sizes compiled once for its ranges, against
the same file compiled for exactly that size, timed at the same sizes in the same process.

    python benchmarks/fixed_size_cost.py [--models bart,convnextv2] [--exporters dynamo]
        [--runs 100] [--json out.jsonl]

Per (architecture, exporter), in a process of its own with no plan cache: ``kiln.compile(path,
dims=ranges)`` (token models: batch 1..8, seq 1..64; images: batch 1..4, height and width
32..64) and, per size, ``kiln.compile(path, dims=that size)``; both warmed up, then timed in
alternating blocks of 10 calls (``--runs`` each), so drift on a busy machine touches both. The row:
per size, the median and p90 of each, their ratio (ranges / exact), and the route the ranges took
per dim. Timings are the machine's: record its CPU beside them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from own_process import append_row, measured_alone

TEXT_RANGES = {"batch": "1..8", "seq": "1..64"}
TEXT_SIZES = [(1, 16), (4, 31), (8, 64)]
IMAGE_RANGES = {"batch": "1..4", "height": "32..64", "width": "32..64"}
IMAGE_SIZES = [(1, 32, 32), (3, 37, 37), (4, 64, 64)]
DEFAULT_MODELS = "roberta,bart,gptj,falcon,convnextv2"
BLOCK = 10


def feeds_for(name: str, size: tuple[int, ...]) -> dict[str, Any]:
    import numpy as np

    from kiln.zoo import architectures

    if architectures.get(name).inputs == "tokens":
        return architectures.inputs(name, batch=size[0], seq=size[1])
    pixels = np.random.default_rng(0).standard_normal((size[0], 3, size[1], size[2])).astype(np.float32)
    return {"pixel_values": pixels}


def timed(models: list[Any], feeds: dict[str, Any], runs: int) -> list[list[float]]:
    """Per model, ``runs`` call times (s), taken in alternating blocks after a warm-up."""
    for model in models:
        for _ in range(3):
            model.run(feeds)
    times: list[list[float]] = [[] for _ in models]
    while len(times[0]) < runs:
        for model, own in zip(models, times):
            for _ in range(BLOCK):
                started = time.perf_counter()
                model.run(feeds)
                own.append(time.perf_counter() - started)
    return times


def measure(one: str, runs: int) -> dict[str, Any]:
    import numpy as np

    import kiln
    from kiln.zoo import architectures

    name, exporter, runs_given = one.split(":")
    runs = int(runs_given or runs)
    path = str(architectures.export(name, exporter=exporter, dynamic=True))
    text = architectures.get(name).inputs == "tokens"
    ranges, sizes = (TEXT_RANGES, TEXT_SIZES) if text else (IMAGE_RANGES, IMAGE_SIZES)
    names = list(ranges)
    ranged = kiln.compile(path, dims=ranges)
    row: dict[str, Any] = {"model": name, "exporter": exporter, "sizes": []}
    row["refused"] = dict(getattr(ranged, "run_time_refused", {}) or {})
    for size in sizes:
        exact = kiln.compile(path, dims=dict(zip(names, size)))
        feeds = feeds_for(name, size)
        got, want = (next(iter(m.run(feeds).values())) for m in (ranged, exact))
        a, b = timed([ranged, exact], feeds, runs)
        medians = [float(np.median(t)) * 1e3 for t in (a, b)]
        p90s = [float(np.percentile(t, 90)) * 1e3 for t in (a, b)]
        row["sizes"].append(
            {
                "size": size,
                "ranges_ms": medians[0],
                "exact_ms": medians[1],
                "ranges_p90_ms": p90s[0],
                "exact_p90_ms": p90s[1],
                "ratio": medians[0] / medians[1],
                "max_abs_diff": float(np.max(np.abs(got - want))),
            }
        )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--exporters", default="dynamo,torchscript")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--json", help="append one JSON line per row here")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        import json

        print(json.dumps(measure(args.one, args.runs), default=str), flush=True)
        return 0
    print(f"{'model':<12} {'exporter':<11} {'size':<14} {'ranges ms (p90)':>16} {'exact ms (p90)':>16} {'ratio':>6}")
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            one = f"{name}:{exporter}:{args.runs}"
            row = measured_alone(__file__, one, args.timeout, {"model": name, "exporter": exporter})
            if "error" in row:
                print(f"{name:<12} {exporter:<11} error: {str(row['error'])[:200]}", flush=True)
            for entry in row.get("sizes", []):
                size = "x".join(str(s) for s in entry["size"])
                print(
                    f"{name:<12} {exporter:<11} {size:<14} "
                    f"{entry['ranges_ms']:>7.2f} ({entry['ranges_p90_ms']:>6.2f}) "
                    f"{entry['exact_ms']:>7.2f} ({entry['exact_p90_ms']:>6.2f}) {entry['ratio']:>6.2f}",
                    flush=True,
                )
            append_row(args.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
