"""kiln's C library (``kiln compile --emit c``) against kiln from Python and onnxruntime: what a call
costs without Python in the loop, and whether the C library computes what ``kiln.load(...).run``
does, bit for bit.

For each model: compile (batch and lengths bound to the zoo's example), save and ``kiln.load`` the
artifact, emit the C library, build ``kiln/bench/kiln_time.c`` against it; time kiln_infer from C,
``run`` from Python, onnxruntime's ``Run`` from C (``benchmarks/ort_time.c``: its C API through the
``libonnxruntime.so`` its wheel ships, inputs and outputs bound once over caller-owned buffers) and
its ``InferenceSession.run`` from Python on the same inputs, THREADS threads each, alternating;
compare the C outputs with Python's.

    python benchmarks/c_library.py                       # tiny-conv, one-conv, resnet50, bert-base, gpt2
    python benchmarks/c_library.py --models one-conv --threads 1 --calls 2000
    python benchmarks/c_library.py --ranged bert-base,gpt2,resnet50   # batch 1..2 and seq 1..128 in one library

``--ranged``: the model compiled once with its batch and sequence as ranges (``declare``), saved and
loaded, and emitted as one C library over both ranges; at sizes across them, the C outputs compared
with ``kiln.load(...).run``'s and both timed (no compile happens at any size: the C library has no
compiler to call).

Not a test: prints a table and JSON lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def one_conv(folder: Path, channels: int, size: int, out_channels: int) -> tuple[str, dict[str, np.ndarray]]:
    """A 3x3 convolution (padding 1) of ``out_channels`` on a 1 x channels x size x size image."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((out_channels, channels, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "one_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, size, size])],
        [weight],
    )
    path = folder / f"one_conv_{channels}_{size}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path), {"x": rng.standard_normal((1, channels, size, size)).astype(np.float32)}


# one 3x3 convolution: tiny-conv's 144 multiply-adds leave only what a call costs; one-conv's 221k
# (8 channels out of 3 on 32x32) add a little work
CONVOLUTIONS = {"tiny-conv": (1, 4, 1), "one-conv": (3, 32, 8)}


def model_files(name: str, folder: Path) -> tuple[str, dict[str, np.ndarray]]:
    if name in CONVOLUTIONS:
        return one_conv(folder, *CONVOLUTIONS[name])
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


ONNX_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9, "float64": 11}


def ort_timer(work: Path) -> tuple[Path, Path] | None:
    """(benchmarks/ort_time.c built, onnxruntime's shared library), or None when the wheel has no
    libonnxruntime.so (the row then says so)."""
    import onnxruntime as ort

    libraries = sorted((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so*"))
    if not libraries:
        return None
    binary = work / "ort_time"
    if not binary.exists():
        subprocess.run(["gcc", "-O2", "-std=c11", "-o", str(binary), str(HERE / "ort_time.c"), "-ldl"], check=True)
    return binary, libraries[0]


def ort_from_c(timer, path: str, session, feeds: dict, files: dict, calls: int, threads: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """onnxruntime's Run from C: (median microseconds per call, threads the process held)."""
    binary, library = timer
    outputs = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})

    def spec(name: str, array: np.ndarray, file: str = "") -> str:
        shape = ",".join(str(d) for d in np.shape(array))
        return f"{name}|{ONNX_TYPES[np.asarray(array).dtype.name]}|{shape}" + (f"|{file}" if file else "")

    out_specs = ";".join(spec(o.name, a) for o, a in zip(session.get_outputs(), outputs))
    in_specs = [spec(i.name, feeds[i.name], files[i.name]) for i in session.get_inputs()]
    command = [str(binary), str(library), path, str(calls), str(threads), out_specs, *in_specs]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    median, _, tasks, _ = result.stdout.split()
    return float(median), int(tasks)


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
    inputs, files = [], {}
    for v in loaded.input_names:
        file = work / f"{name}-{v}.bin"
        np.ascontiguousarray(feeds[v]).tofile(file)
        inputs.append(str(file))
        files[v] = str(file)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
    timer = ort_timer(work)
    c_times, py_times, ort_times, ort_c_times, ort_tasks = [], [], [], [], 0
    for _ in range(rounds):
        env = {"KILN_TIME_OUT": str(work / f"{name}-out")}
        c_times.append(time_from_c(binary, folder, calls, threads, [Path(i) for i in inputs], env)[0])
        py_times.append(statistics.median(timed(lambda: loaded.run(feeds), calls)))
        ort_times.append(statistics.median(timed(lambda: session.run(None, ort_feeds), calls)))
        if timer is not None:
            median, ort_tasks = ort_from_c(timer, path, session, feeds, files, calls, threads)
            ort_c_times.append(median)
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
        # (None: the onnxruntime wheel has no libonnxruntime.so to call from C)
        "onnxruntime_c_us": statistics.median(ort_c_times) if ort_c_times else None,
        "onnxruntime_c_process_threads": ort_tasks if ort_c_times else None,
        "bit_identical": identical,
    }


RANGED_SIZES = ((1, 1), (1, 7), (2, 33), (1, 128), (2, 128))


def measure_ranged(name: str, calls: int, threads: int, work: Path) -> list[dict]:
    """``name`` over batch 1..2 and seq 1..128 (an image model: batch 1..3) as one C library: per
    size, C against Python."""
    import kiln
    from kiln import zoo
    from kiln.bench.backends.kiln_c_backend import build_timer, time_from_c
    from kiln.driver.emit_c import emit_c

    try:  # a token model: its batch and sequence; an image model: its batch
        path, sizes = str(zoo.onnx_path(name, dynamic_seq=True)), RANGED_SIZES
    except ValueError:
        path, sizes = str(zoo.onnx_path(name)), ((1, 0), (2, 0), (3, 0))
    compiled = kiln.compile(path)
    compiled.declare({"batch": "1..3"} if sizes[0][1] == 0 else {"batch": "1..2", "seq": "1..128"})
    artifact = work / f"{name}-ranged.kiln"
    compiled.save(str(artifact))
    loaded = kiln.load(str(artifact), threads=threads)
    folder = work / f"{name}-ranged-c"
    if sizes[0][1] == 0:
        emit_c(compiled, folder, {}, batch=("batch", 1, 3))
    else:
        emit_c(compiled, folder, {}, batch=("batch", 1, 2), length=("seq", 1, 128))
    binary = build_timer(folder)
    rows = []
    for batch, seq in sizes:
        feeds = zoo.example_inputs(name, batch=batch, **({"seq": seq} if seq else {}))
        files = []
        for v in loaded.input_names:
            files.append(work / f"{name}-{v}-{batch}-{seq}.bin")
            np.ascontiguousarray(feeds[v]).tofile(files[-1])
        env = {"KILN_TIME_OUT": str(work / f"{name}-r-out"), "KILN_TIME_SIZES": f"{batch},{seq or batch}"}
        c_median, c_p90 = time_from_c(binary, folder, calls, threads, files, env)
        python = timed(lambda: loaded.run(feeds), calls)
        want = loaded.run(feeds)
        identical = all(
            np.array_equal(
                np.fromfile(work / f"{name}-r-out{i}.bin", np.asarray(want[o]).dtype), np.asarray(want[o]).reshape(-1)
            )
            for i, o in enumerate(loaded.output_names)
        )
        rows.append({"model": name, "batch": batch, "seq": seq, "threads": threads, "kiln_c_us": c_median,
                     "kiln_c_p90_us": c_p90, "kiln_python_us": statistics.median(python),
                     "kiln_python_p90_us": float(np.percentile(python, 90)), "bit_identical": identical})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-conv,one-conv,resnet50,bert-base,gpt2")
    parser.add_argument("--threads", type=int, default=1, help="threads per engine (0: every CPU)")
    parser.add_argument(
        "--calls", type=int, default=0, help="calls per round (default: 2000 for the convolutions, else 20)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranged", default="", help="models run over batch 1..2 and seq 1..128 from one C library")
    args = parser.parse_args()
    if args.ranged:
        with tempfile.TemporaryDirectory(prefix="kiln-c-bench-") as scratch:
            ranged = [r for name in args.ranged.split(",") for r in measure_ranged(name, args.calls or 10, args.threads, Path(scratch))]  # fmt: skip
        print(
            f"\n{'model':<10} {'batch':>5} {'seq':>4} {'kiln-c us (p90)':>22} {'kiln-python us (p90)':>24}  identical"
        )
        for r in ranged:
            print(json.dumps(r))
            print(f"{r['model']:<10} {r['batch']:>5} {r['seq']:>4} {r['kiln_c_us']:>12.1f} ({r['kiln_c_p90_us']:>8.1f}) "
                  f"{r['kiln_python_us']:>14.1f} ({r['kiln_python_p90_us']:>8.1f})  {r['bit_identical']}")  # fmt: skip
        return 0 if all(r["bit_identical"] for r in ranged) else 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-c-bench-") as scratch:
        for name in args.models.split(","):
            calls = args.calls or (2000 if name in CONVOLUTIONS else 20)
            row = measure(name, calls, args.threads, args.rounds, Path(scratch))
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(
        f"\n{'model':<10} {'threads':>7} {'kiln-c us':>10} {'kiln-python us':>15} {'ORT-c us':>9} "
        f"{'ORT-python us':>14} {'kiln-c / ORT-c':>15}  identical"
    )
    for r in rows:
        ort_c = r["onnxruntime_c_us"]
        ratio = f"{r['kiln_c_us'] / ort_c:>15.2f}" if ort_c else f"{'not installed':>15}"
        print(f"{r['model']:<10} {r['threads']:>7} {r['kiln_c_us']:>10.1f} {r['kiln_python_us']:>15.1f} "
              f"{ort_c or float('nan'):>9.1f} {r['onnxruntime_python_us']:>14.1f} {ratio}  {r['bit_identical']}")  # fmt: skip
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
