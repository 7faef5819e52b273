"""kiln's C library (``kiln compile --emit c``) against kiln from Python and onnxruntime: what a call
costs without Python in the loop, and whether the C library computes what ``kiln.load(...).run``
does, bit for bit.

For each model: compile (batch and lengths bound to the zoo's example), save and ``kiln.load`` the
artifact, emit the C library, build ``kiln/bench/kiln_time.c`` against it; time kiln_infer from C,
``run`` from Python and onnxruntime's ``InferenceSession.run`` on the same inputs, THREADS threads
each, alternating; compare the C outputs with Python's.

    python benchmarks/c_library.py                       # one-conv, resnet50, bert-base, gpt2
    python benchmarks/c_library.py --models one-conv --threads 1 --calls 2000

Not a test: prints a table and JSON lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def one_conv(folder: Path) -> tuple[str, dict[str, np.ndarray]]:
    """A 3x3 convolution of 8 channels on a 1x3x32x32 image: a call's fixed cost dominates."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "one_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32, 32])],
        [weight],
    )
    path = folder / "one_conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path), {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}


def model_files(name: str, folder: Path) -> tuple[str, dict[str, np.ndarray]]:
    if name == "one-conv":
        return one_conv(folder)
    from kiln import zoo

    return str(zoo.onnx_path(name)), zoo.example_inputs(name)


def timed(call, calls: int) -> list[float]:  # type: ignore[no-untyped-def]
    for _ in range(10):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def measure(name: str, calls: int, threads: int, rounds: int, work: Path) -> dict:
    import onnxruntime as ort

    import kiln
    from kiln.bench.backends.kiln_c_backend import build_timer, time_from_c
    from kiln.driver.emit_c import emit_c
    from kiln.passes.batching import symbols

    path, feeds = model_files(name, work)
    compiled = kiln.compile(path)
    dims = {s: int(np.asarray(feeds[v.name]).shape[i]) for v in compiled.signature.inputs for i, s in enumerate(v.type.shape or ()) if isinstance(s, str)}  # fmt: skip
    compiled.prepare(feeds)
    artifact = work / f"{name}.kiln"
    compiled.save(str(artifact))
    loaded = kiln.load(str(artifact), threads=threads)
    folder = work / f"{name}-c"
    emit_c(compiled, folder, {k: v for k, v in dims.items() if k in symbols(compiled.signature)})
    binary = build_timer(folder)  # kiln/bench/kiln_time.c, as the kiln-c bench row builds it
    inputs = []
    for v in loaded.input_names:
        file = work / f"{name}-{v}.bin"
        np.ascontiguousarray(feeds[v]).tofile(file)
        inputs.append(str(file))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
    c_times, py_times, ort_times = [], [], []
    for _ in range(rounds):
        env = {"KILN_TIME_OUT": str(work / f"{name}-out")}
        c_times.append(time_from_c(binary, folder, calls, threads, [Path(i) for i in inputs], env)[0])
        py_times.append(statistics.median(timed(lambda: loaded.run(feeds), calls)))
        ort_times.append(statistics.median(timed(lambda: session.run(None, ort_feeds), calls)))
    want = loaded.run(feeds)
    identical = all(
        np.array_equal(
            np.fromfile(work / f"{name}-out{i}.bin", np.asarray(want[o]).dtype), np.asarray(want[o]).reshape(-1)
        )
        for i, o in enumerate(loaded.output_names)
    )
    return {
        "model": name,
        "threads": threads,
        "kiln_c_us": statistics.median(c_times),
        "kiln_python_us": statistics.median(py_times),
        "onnxruntime_python_us": statistics.median(ort_times),
        "bit_identical": identical,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="one-conv,resnet50,bert-base,gpt2")
    parser.add_argument("--threads", type=int, default=1, help="threads per engine (0: every CPU)")
    parser.add_argument("--calls", type=int, default=0, help="calls per round (default: 2000 for one-conv, else 20)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-c-bench-") as scratch:
        for name in args.models.split(","):
            calls = args.calls or (2000 if name == "one-conv" else 20)
            row = measure(name, calls, args.threads, args.rounds, Path(scratch))
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(
        f"\n{'model':<10} {'threads':>7} {'kiln-c us':>10} {'kiln-python us':>15} {'ORT-python us':>14} {'C / ORT':>8}  identical"
    )
    for r in rows:
        print(f"{r['model']:<10} {r['threads']:>7} {r['kiln_c_us']:>10.1f} {r['kiln_python_us']:>15.1f} "
              f"{r['onnxruntime_python_us']:>14.1f} {r['kiln_c_us'] / r['onnxruntime_python_us']:>8.2f}  {r['bit_identical']}")  # fmt: skip
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
