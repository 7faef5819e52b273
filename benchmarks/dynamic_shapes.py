"""One compile for every size vs a compile per size (issue 29's table): for each zoo model with a
sample-parallel batch dim, compiled with ``--dim batch=1..64`` (size classes 1 and 8) and compiled
for exactly one batch size:

* compile seconds (the median of three, each in a fresh process and a fresh cache holding only the
  engine object, so both pay their kernels and neither the other's), and the artifact's size;
* steady-state latency at batch 1, 8 and 32 (median of ``--runs``), the range compile over the
  compile for exactly that size;
* the first call at a size neither has seen (batch 5) over a warm call at that size.

With ``--seq 1..384`` (token models, exported with a symbolic sequence length) the same for the
length instead, at batch 1: a compile with ``--dim seq=1..384`` (padded to its compiled lengths,
``kiln.passes.padding``) against a compile for exactly one length; ``--lengths`` are measured
(a length that is no class runs padded to the next one: its ratio is padding's cost), and the
first call at an unseen length is at 100, after one call at the first of ``--lengths`` (the
process's first call is reported apart: it packs the weights every length shares), and the arena
each length lays out (its formulas evaluated there) beside the exact compile's.

    python benchmarks/dynamic_shapes.py --models resnet50,mobilenet_v2 --runs 5
    python benchmarks/dynamic_shapes.py --models bert-base,gpt2 --seq 1..384 --lengths 16,100,128,384

Prints a table and, with ``--json``, one JSON line per model. Records the CPU and ISA."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMPILES = 3  # compiles timed of each kind (the median is reported)
FIRST_CALLS = 3  # first calls measured, each on a freshly loaded model (the median is reported)

COMPILE = """
import sys, time, kiln
from kiln.driver.options import CompileOptions
path, dims, out = sys.argv[1], eval(sys.argv[2]), sys.argv[3]
start = time.perf_counter()
model = kiln.compile(path, dims=dims, options=CompileOptions.from_env(plan_cache=False))
seconds = time.perf_counter() - start
model.save(out)
print(seconds)
"""


def compile_seconds(path: str, dims: dict, engine_cache: Path, out: Path) -> float:
    """The median of COMPILES compiles, each in a fresh process and cache (one compile on this
    VM varies by up to 1.5x with what the host does meanwhile)."""
    return statistics.median(compile_in_fresh_cache(path, dims, engine_cache, out) for _ in range(COMPILES))


def compile_in_fresh_cache(path: str, dims: dict, engine_cache: Path, out: Path) -> float:
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "cache"
        shutil.copytree(engine_cache, cache)
        env = {**os.environ, "KILN_CACHE_DIR": str(cache)}
        done = subprocess.run(
            [sys.executable, "-c", COMPILE, path, repr(dims), str(out)], env=env, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        return float(done.stdout.split()[-1])


def warm_engine_cache(path: str) -> Path:
    """A cache folder holding the engine object (and nothing of ``path``'s kernels)."""
    folder = Path(tempfile.mkdtemp(prefix="kiln-engine-"))
    cache = folder / "cache"
    env = {**os.environ, "KILN_CACHE_DIR": str(cache)}
    tiny = (
        "import numpy as np, kiln; from onnx import helper, TensorProto as T;"
        "g = helper.make_graph([helper.make_node('MatMul', ['x', 'x'], ['y'])], 'g',"
        "[helper.make_tensor_value_info('x', T.FLOAT, [64, 64])], [helper.make_tensor_value_info('y', T.FLOAT, [64, 64])]);"
        "kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)], ir_version=10))"
    )
    subprocess.run([sys.executable, "-c", tiny], env=env, check=True)
    for sub in cache.iterdir():  # keep the engine objects only
        if sub.name != "lib":
            shutil.rmtree(sub, ignore_errors=True)
    for item in (cache / "lib").iterdir():
        if item.suffix != ".o":
            shutil.rmtree(item, ignore_errors=True) if item.is_dir() else item.unlink()
    return cache


def compile_summary(row: dict) -> str:
    """The compile line of a model's row: the range compile against the single-size one, both
    seconds and artifact sizes."""
    seconds, size = (
        row["compile_range_s"] / row["compile_single_s"],
        row["artifact_range_mb"] / row["artifact_single_mb"],
    )
    return (
        f"  compile: range {row['compile_range_s']:.1f} s, one size {row['compile_single_s']:.1f} s ({seconds:.2f}x); "
        f"artifact {row['artifact_range_mb']:.1f} MB vs {row['artifact_single_mb']:.1f} MB ({size:.2f}x)"
    )


def median_ms(model, feeds, runs: int) -> float:  # type: ignore[no-untyped-def]
    model.run(feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model.run(feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def paired_ms(first, second, feeds, runs: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Medians of the two models' runs, alternating (a noisy neighbour slows both alike)."""
    first.run(feeds)
    second.run(feeds)
    times: tuple[list, list] = ([], [])
    for _ in range(runs):
        for model, kept in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            model.run(feeds)
            kept.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seq", default="", help="LOW..HIGH: measure the sequence length instead of the batch")
    parser.add_argument("--lengths", default="16,100,128,384")
    args = parser.parse_args()

    import kiln
    from kiln import zoo
    from kiln.backends import parse
    from kiln.bench.machine import fingerprint

    machine = fingerprint()
    machine["isa"] = parse("cpu").summary
    print(f"# {machine['cpu']} ({machine['family_model']}) | {machine['isa']} | {machine['usable_cpus']} CPUs")
    batches = [int(b) for b in args.batches.split(",")]
    work = Path(tempfile.mkdtemp(prefix="kiln-dynamic-"))
    if args.seq:
        lengths(args, work)
        return
    for name in args.models.split(","):
        path = str(zoo.onnx_path(name))
        engine = warm_engine_cache(path)
        row: dict = {"model": name}
        row["compile_range_s"] = compile_seconds(path, {"batch": (1, 64)}, engine, work / "range.kiln")
        row["compile_single_s"] = compile_seconds(path, {"batch": 1}, engine, work / "single.kiln")
        row["artifact_range_mb"] = (work / "range.kiln").stat().st_size / 1e6
        row["artifact_single_mb"] = (work / "single.kiln").stat().st_size / 1e6
        shutil.rmtree(engine.parent, ignore_errors=True)
        os.sync()  # the artifacts just written reach the disk now, not while calls are timed
        # the first call at a size nobody compiled (each of FIRST_CALLS times on a freshly loaded
        # model: the median, since one call is at the mercy of whatever the machine did just
        # then), then warm calls at it
        feeds = zoo.example_inputs(name, batch=5)
        firsts = []
        for _ in range(FIRST_CALLS):
            ranged = kiln.load(work / "range.kiln")
            start = time.perf_counter()
            ranged.run(feeds)
            firsts.append((time.perf_counter() - start) * 1e3)
        row["first_call_b5_ms"] = statistics.median(firsts)
        row["warm_b5_ms"] = median_ms(ranged, feeds, args.runs)
        for batch in batches:
            feeds = zoo.example_inputs(name, batch=batch)
            exact = kiln.compile(path, dims={"batch": batch})
            row[f"range_b{batch}_ms"] = median_ms(ranged, feeds, args.runs)
            row[f"exact_b{batch}_ms"] = median_ms(exact, feeds, args.runs)
            del exact
        if args.json:
            print(json.dumps({**row, "isa": machine.get("isa")}))
        print(f"\n{name}")
        print(compile_summary(row))
        print(
            f"  first call at batch 5: {row['first_call_b5_ms']:.1f} ms, warm {row['warm_b5_ms']:.1f} ms "
            f"({row['first_call_b5_ms'] / row['warm_b5_ms']:.2f}x)"
        )
        for batch in batches:
            r, e = row[f"range_b{batch}_ms"], row[f"exact_b{batch}_ms"]
            print(f"  batch {batch}: range {r:.1f} ms, exact compile {e:.1f} ms ({r / e:.2f}x)")
    shutil.rmtree(work, ignore_errors=True)


def lengths(args: argparse.Namespace, work: Path) -> None:
    import kiln
    from kiln import zoo

    low, high = (int(v) for v in args.seq.split(".."))
    measured = [int(v) for v in args.lengths.split(",")]
    for name in args.models.split(","):
        path = str(zoo.onnx_path(name, dynamic_seq=True))
        engine = warm_engine_cache(path)
        row: dict = {"model": name, "range": [low, high]}
        row["compile_range_s"] = compile_seconds(
            path, {"seq": (low, high), "batch": (1, 1)}, engine, work / "range.kiln"
        )
        row["compile_single_s"] = compile_seconds(path, {"seq": 128, "batch": 1}, engine, work / "single.kiln")
        row["artifact_range_mb"] = (work / "range.kiln").stat().st_size / 1e6
        row["artifact_single_mb"] = (work / "single.kiln").stat().st_size / 1e6
        shutil.rmtree(engine.parent, ignore_errors=True)
        os.sync()  # the artifacts just written reach the disk now, not while calls are timed
        # a model's first call pays once for what every size shares (the weights packed for the
        # engine, the thread pool): measured apart, then the first call at an unseen length; each
        # FIRST_CALLS times on a freshly loaded model, the medians
        after_load, first = [], []
        for _ in range(FIRST_CALLS):
            ranged = kiln.load(work / "range.kiln")
            feeds = zoo.example_inputs(name, batch=1, seq=measured[0])
            start = time.perf_counter()
            ranged.run(feeds)
            after_load.append((time.perf_counter() - start) * 1e3)
            feeds = zoo.example_inputs(name, batch=1, seq=100)
            start = time.perf_counter()
            ranged.run(feeds)
            first.append((time.perf_counter() - start) * 1e3)
        row["classes"] = list(ranged.padder().classes)
        row[f"first_call_after_load_s{measured[0]}_ms"] = statistics.median(after_load)
        row["first_call_s100_ms"] = statistics.median(first)
        row["warm_s100_ms"] = median_ms(ranged, feeds, args.runs)
        for length in measured:
            feeds = zoo.example_inputs(name, batch=1, seq=length)
            exact = kiln.compile(path, dims={"batch": 1, "seq": length})
            row[f"range_s{length}_ms"], row[f"exact_s{length}_ms"] = paired_ms(ranged, exact, feeds, args.runs)
            # the arena a run at this length lays out (formulas of the length) vs the exact compile's
            growing = ranged.padded_model.executables()[0].plan.memory.growing
            row[f"arena_range_s{length}_mb"] = (growing.at(length)[1] if growing else float("nan")) / 1e6
            row[f"arena_exact_s{length}_mb"] = max(e.plan.memory.arena_bytes for e in exact.executables()) / 1e6
            del exact
        if args.json:
            print(json.dumps(row))
        print(f"\n{name} (seq={low}..{high}, compiled lengths {row['classes']})")
        print(
            f"  compile: range {row['compile_range_s']:.1f} s, one length {row['compile_single_s']:.1f} s "
            f"({row['compile_range_s'] / row['compile_single_s']:.2f}x); artifact {row['artifact_range_mb']:.1f} MB "
            f"vs {row['artifact_single_mb']:.1f} MB ({row['artifact_range_mb'] / row['artifact_single_mb']:.2f}x)"
        )
        print(
            f"  first call after load (length {measured[0]}): {row[f'first_call_after_load_s{measured[0]}_ms']:.1f} ms; "
            f"then the first call at length 100: {row['first_call_s100_ms']:.1f} ms, warm {row['warm_s100_ms']:.1f} ms "
            f"({row['first_call_s100_ms'] / row['warm_s100_ms']:.2f}x)"
        )
        for length in measured:
            r, e = row[f"range_s{length}_ms"], row[f"exact_s{length}_ms"]
            print(
                f"  length {length}: range {r:.1f} ms, exact compile {e:.1f} ms ({r / e:.2f}x); arena "
                f"{row[f'arena_range_s{length}_mb']:.1f} MB vs {row[f'arena_exact_s{length}_mb']:.1f} MB"
            )


if __name__ == "__main__":
    main()
