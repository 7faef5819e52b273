"""One compile for every image size vs a compile per size: each zoo image classifier exported with
a symbolic height and width, compiled with ``--dim height=LOW..HIGH --dim width=LOW..HIGH`` at
batch 1 (kernels that take the sizes at run time, ``kiln.driver.spatial``) and compiled for
exactly one size:

* compile seconds (the median of three, each in a fresh process and cache holding only the engine
  object), and the artifact's size;
* the first call at a size the model has not run (on a freshly loaded artifact, after one call at
  another size) over a warm call there, and the same first call before (``--disable
  run-time-dims``: each new size compiled on first use);
* steady-state latency at ``--sizes`` (median of ``--runs``, the two models alternating), the
  range compile over the compile for exactly that size.

    python benchmarks/image_sizes.py --models resnet50,mobilenet_v2 --range 64..224 --runs 5

Prints a table and, with ``--json``, one JSON line per model. Records the CPU and ISA."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_shapes import FIRST_CALLS, compile_seconds, compile_summary, paired_ms, warm_engine_cache

UNSEEN = (161, 119)  # the first call's size (height, width): none of --sizes


def image(height: int, width: int, seed: int = 0):  # type: ignore[no-untyped-def]
    import numpy as np

    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((1, 3, height, width)).astype(np.float32)}


def first_call_ms(artifact: Path, warm_up: dict, feeds: dict) -> float:
    """The median over FIRST_CALLS freshly loaded models of the first call at ``feeds``' size,
    after one call at ``warm_up``'s (the process's first call packs what every size shares)."""
    import kiln

    times = []
    for _ in range(FIRST_CALLS):
        model = kiln.load(artifact)
        model.run(warm_up)
        start = time.perf_counter()
        model.run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(name: str, low: int, high: int, sizes: list[tuple[int, int]], runs: int, work: Path) -> dict:
    import kiln
    from kiln import zoo
    from kiln.driver.options import CompileOptions

    path = str(zoo.onnx_path(name, dynamic_image=True))
    # batch 1..1: the one-size compile serves batch 1 alone, so the range compile does too (an
    # undeclared batch would also build its default size class 8: twice the work, compared unfairly)
    ranges = {"batch": (1, 1), "height": (low, high), "width": (low, high)}
    engine = warm_engine_cache(path)
    row: dict = {"model": name, "range": f"{low}..{high}"}
    row["compile_range_s"] = compile_seconds(path, ranges, engine, work / "range.kiln")
    row["compile_single_s"] = compile_seconds(
        path, {"batch": 1, "height": high, "width": high}, engine, work / "one.kiln"
    )
    row["artifact_range_mb"] = (work / "range.kiln").stat().st_size / 1e6
    row["artifact_single_mb"] = (work / "one.kiln").stat().st_size / 1e6
    shutil.rmtree(engine.parent, ignore_errors=True)
    os.sync()
    warm_up, unseen = image(high, high), image(*UNSEEN, seed=1)
    row["first_call_ms"] = first_call_ms(work / "range.kiln", warm_up, unseen)
    ranged = kiln.load(work / "range.kiln")
    ranged.run(unseen)
    row["warm_unseen_ms"] = statistics.median(_timed(ranged, unseen) for _ in range(runs))
    before = kiln.compile(path, dims=ranges, options=CompileOptions.from_env(disabled=frozenset({"run-time-dims"})))
    before.run(warm_up)
    row["first_call_before_ms"] = _timed(before, unseen)
    del before
    for height, width in sizes:
        exact = kiln.compile(path, dims={"batch": 1, "height": height, "width": width})
        r, e = paired_ms(ranged, exact, image(height, width), runs)
        row[f"range_{height}x{width}_ms"], row[f"exact_{height}x{width}_ms"] = r, e
        del exact
    return row


def _timed(model, feeds) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    model.run(feeds)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2")
    parser.add_argument("--range", default="64..224", help="LOW..HIGH of both the height and the width")
    parser.add_argument("--sizes", default="224x224,160x128,96x96", help="HEIGHTxWIDTH,... measured steady")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from kiln.backends import parse
    from kiln.bench.machine import fingerprint

    machine = fingerprint()
    machine["isa"] = parse("cpu").summary
    print(f"# {machine['cpu']} ({machine['family_model']}) | {machine['isa']} | {machine['usable_cpus']} CPUs")
    low, high = (int(v) for v in args.range.split(".."))
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="kiln-images-"))
    for name in args.models.split(","):
        row = measure(name, low, high, sizes, args.runs, work)  # type: ignore[arg-type]
        if args.json:
            print(json.dumps({**row, "isa": machine.get("isa")}))
        print(f"\n{name} (height and width {row['range']}, batch 1)")
        print(compile_summary(row))
        first, warm, before = row["first_call_ms"], row["warm_unseen_ms"], row["first_call_before_ms"]
        print(
            f"  first call at {UNSEEN[0]}x{UNSEEN[1]}: {first:.1f} ms, warm {warm:.1f} ms ({first / warm:.2f}x); "
            f"before (a compile per size): {before:.0f} ms ({before / warm:.0f}x)"
        )
        for height, width in sizes:
            r, e = row[f"range_{height}x{width}_ms"], row[f"exact_{height}x{width}_ms"]
            print(f"  {height}x{width}: range {r:.1f} ms, exact compile {e:.1f} ms ({r / e:.2f}x)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
