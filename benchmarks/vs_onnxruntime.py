"""kiln (cpu target) vs onnxruntime on the zoo models: same threads, batch 1, warm-up then N runs.

    python benchmarks/vs_onnxruntime.py                      # the four seed models
    python benchmarks/vs_onnxruntime.py --models resnet50 --runs 50 --threads 2

Both run in this process, one after the other per model, so they see the same machine state;
ratios (kiln / onnxruntime) are what to read on a shared, noisy machine. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def measure(run, feeds, warmup: int, runs: int) -> list[float]:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        run(feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,vgg19,bert-base,gpt2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import onnxruntime

    import kiln
    from kiln import zoo
    from kiln.zoo.check import relative_l2

    header = f"{'model':10} {'kiln compile s':>14} {'kiln p50 ms':>11} {'kiln p90':>9} {'ORT p50 ms':>10} {'ORT p90':>8} {'kiln/ORT':>8} {'rel L2':>8}"
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
        ours = measure(model.run, feeds, args.warmup, args.runs)
        theirs = measure(lambda f: session.run(None, f), feeds, args.warmup, args.runs)
        p50, p50_ort = statistics.median(ours), statistics.median(theirs)
        p90, p90_ort = float(np.percentile(ours, 90)), float(np.percentile(theirs, 90))
        print(
            f"{name:10} {compile_s:14.1f} {p50:11.1f} {p90:9.1f} {p50_ort:10.1f} {p90_ort:8.1f} {p50 / p50_ort:8.2f} {error:8.1e}"
        )


if __name__ == "__main__":
    main()
