"""kiln (cpu target) vs onnxruntime on the zoo models: same threads, batch 1, warm-up then N runs.

    python benchmarks/vs_onnxruntime.py                      # the four seed models
    python benchmarks/vs_onnxruntime.py --models resnet50 --runs 60 --rounds 12 --threads 2

Both run in this process, interleaved in rounds: each round times a few calls of one engine then
of the other (which goes first alternates; each engine's first call of a round is an untimed
warm-up, and a short pause between engines lets the other's spinning worker threads go idle), so
both see the same machine state even when the shared machine's speed drifts by tens of percent
within a minute. "kiln/ORT" is the median over rounds of the per-round ratio of medians, with the
range of those ratios; p50/p90 are over all timed calls. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def timed(run, feeds, count: int) -> list[float]:  # type: ignore[no-untyped-def]
    run(feeds)  # warm-up: caches and thread pools after the other engine ran
    times = []
    for _ in range(count):
        start = time.perf_counter()
        run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def interleaved(ours, theirs, feeds, warmup: int, runs: int, rounds: int):  # type: ignore[no-untyped-def]
    """(kiln times, ORT times, per-round ratios of medians)."""
    for _ in range(warmup):
        ours(feeds)
        theirs(feeds)
    per_round = max(1, runs // rounds)
    engines = {"kiln": ours, "ort": theirs}
    mine, others, ratios = [], [], []
    for index in range(rounds):
        times = {}
        for name in ("kiln", "ort") if index % 2 == 0 else ("ort", "kiln"):
            time.sleep(0.05)  # the other engine's spinning threads go idle first
            times[name] = timed(engines[name], feeds, per_round)
        mine.extend(times["kiln"])
        others.extend(times["ort"])
        ratios.append(statistics.median(times["kiln"]) / statistics.median(times["ort"]))
    return mine, others, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,vgg19,bert-base,gpt2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30, help="timed calls per engine (split over the rounds)")
    parser.add_argument("--rounds", type=int, default=6, help="interleaving rounds (default 6)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import onnxruntime

    import kiln
    from kiln import zoo
    from kiln.zoo.check import relative_l2

    header = (
        f"{'model':10} {'kiln compile s':>14} {'kiln p50 ms':>11} {'kiln p90':>9} {'ORT p50 ms':>10} {'ORT p90':>8}"
        f" {'kiln/ORT':>8} {'(range)':>11} {'rel L2':>8}"
    )
    print(header)
    for name in args.models.split(","):
        path = str(zoo.onnx_path(name, progress=print))
        feeds = zoo.example_inputs(name)
        start = time.perf_counter()
        model = kiln.compile(path, target="cpu", dims={"batch": 1})
        compile_s = time.perf_counter() - start
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        error = relative_l2(next(iter(model.run(feeds).values())), session.run(None, feeds)[0])
        ours, theirs, ratios = interleaved(
            model.run, lambda f: session.run(None, f), feeds, args.warmup, args.runs, args.rounds
        )
        p50, p50_ort = statistics.median(ours), statistics.median(theirs)
        p90, p90_ort = float(np.percentile(ours, 90)), float(np.percentile(theirs, 90))
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        print(
            f"{name:10} {compile_s:14.1f} {p50:11.1f} {p90:9.1f} {p50_ort:10.1f} {p90_ort:8.1f}"
            f" {statistics.median(ratios):8.2f} {spread:>11} {error:8.1e}"
        )


if __name__ == "__main__":
    main()
