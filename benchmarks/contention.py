"""How kiln and onnxruntime hold up when another process shares the cores (issue 14's target).

    python benchmarks/contention.py                         # mobilenet_v2 and resnet50, 2 threads
    python benchmarks/contention.py --models resnet50 --seconds 10

For each model and engine (same threads, batch 1): the median latency on an idle machine, then
with one busy process (a spinning Python loop) pinned to one of the process's CPUs, then idle
again. Prints both medians, the slow-down (loaded / idle) and the ratio of kiln's slow-down to
onnxruntime's (the target: at most 1.2). Not a test: run it on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np


def busy(cpu: int, stop: multiprocessing.Event) -> None:  # type: ignore[valid-type]
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():  # type: ignore[attr-defined]
        for _ in range(100000):
            pass


def median_latency(run, seconds: float) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):
        run()
    times = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds or len(times) < 10:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def engines(model: str, threads: int):  # type: ignore[no-untyped-def]
    import kiln
    from kiln import zoo

    path = str(zoo.onnx_path(model))
    feeds = zoo.example_inputs(model, batch=1)
    compiled = kiln.compile(path, dims={"batch": 1}, threads=threads)
    yield "kiln", lambda: compiled.run(feeds)
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime: not installed")
        return
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    yield "onnxruntime", lambda: session.run(None, feeds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mobilenet_v2,resnet50")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("needs at least 2 CPUs")
        return 2
    rows = []
    for model in args.models.split(","):
        slowdowns = {}
        for name, run in engines(model, args.threads):
            idle = median_latency(run, args.seconds)
            stop = multiprocessing.Event()
            hog = multiprocessing.Process(target=busy, args=(cpus[-1], stop), daemon=True)
            hog.start()
            time.sleep(0.5)
            try:
                loaded = median_latency(run, args.seconds)
            finally:
                stop.set()
                hog.join(5)
            time.sleep(0.5)
            again = median_latency(run, args.seconds)
            slowdowns[name] = loaded / idle
            rows.append((model, name, idle, loaded, again, loaded / idle))
            print(
                f"{model:14} {name:12} idle {idle:8.2f} ms  loaded {loaded:8.2f} ms  idle again {again:8.2f} ms  x{loaded / idle:.2f}",
                flush=True,
            )
        if "onnxruntime" in slowdowns:
            ratio = slowdowns["kiln"] / slowdowns["onnxruntime"]
            print(f"{model:14} kiln slow-down / onnxruntime slow-down = {ratio:.2f} (target <= 1.2)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
