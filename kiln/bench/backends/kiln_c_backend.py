"""The ``kiln-c`` row: kiln's cpu target as the C library ``kiln compile --emit c`` writes. The
bench's queries call ``kiln_infer`` through ctypes (the API a C program uses, with DLPack tensors);
a small C driver (``kiln/bench/kiln_time.c``) then times the library with no Python in the loop,
so the report shows what a call costs from C and what Python adds (``native_latency_ms``)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench.backends.base import Session, Unavailable
from kiln.bench.backends.kiln_backend import KilnBackend, return_freed

TIMER = Path(__file__).resolve().parents[1] / "kiln_time.c"
NATIVE_SECONDS = 2.0  # how long the C driver times the library, in all (after its warm-up)
ROUNDS = 3  # alternating with as many calls through Python
NUMPY = {(2, 32): np.float32, (2, 64): np.float64, (2, 16): np.float16, (0, 8): np.int8, (0, 16): np.int16,
         (0, 32): np.int32, (0, 64): np.int64, (1, 8): np.uint8, (6, 8): np.bool_}  # fmt: skip


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", _DLDataType),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("min_shape", ctypes.POINTER(ctypes.c_int64)),
        ("max_shape", ctypes.POINTER(ctypes.c_int64)),
    ]


class CLibrarySession(Session):
    """An emitted folder's library through its C API (one context: one caller at a time)."""

    def __init__(self, folder: Path, threads: int, on_close: Any = None) -> None:
        self.on_close = on_close  # (the folder its backend made: removed with it)
        lib = self.lib = ctypes.CDLL(str(folder / "libkiln_model.so"))
        lib.kiln_last_error.restype = ctypes.c_char_p
        lib.kiln_model_workspace_size.restype = ctypes.c_size_t
        self.model, self.context = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(lib.kiln_model_load(str(folder / "model.kw").encode(), ctypes.byref(self.model)))
        self._check(lib.kiln_context_create(self.model, ctypes.byref(self.context)))
        lib.kiln_set_thread_count(threads)
        self.inputs = [self._describe(lib.kiln_model_input, i) for i in range(lib.kiln_model_input_count(self.model))]
        self.outputs = [
            self._describe(lib.kiln_model_output, i) for i in range(lib.kiln_model_output_count(self.model))
        ]
        self.in_tensors = (_DLTensor * max(len(self.inputs), 1))()
        self.out_tensors = (_DLTensor * max(len(self.outputs), 1))()
        self.results = [np.empty(shape, dtype) for _, dtype, shape, _ in self.outputs]
        for tensors, described, arrays in ((self.in_tensors, self.inputs, None), (self.out_tensors, self.outputs, self.results)):  # fmt: skip
            for i, (*_, info) in enumerate(described):
                tensor = tensors[i]
                tensor.device.device_type = 1  # kDLCPU
                tensor.ndim, tensor.dtype, tensor.shape = info.ndim, info.dtype, info.shape
                if arrays is not None:
                    tensor.data = arrays[i].ctypes.data

    def _check(self, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"kiln's C library: status {status}: {self.lib.kiln_last_error().decode()}")

    def _describe(self, function: Any, index: int) -> tuple[str, Any, tuple[int, ...], _TensorInfo]:
        info = _TensorInfo()
        self._check(function(self.model, index, ctypes.byref(info)))
        shape = tuple(int(info.shape[d]) for d in range(info.ndim))
        return info.name.decode(), NUMPY[(info.dtype.code, info.dtype.bits)], shape, info

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        held = []
        for i, (name, dtype, shape, _) in enumerate(self.inputs):
            array = np.ascontiguousarray(feeds[name], dtype=dtype)
            if array.shape != shape:
                raise ValueError(f"input {name!r}: shape {array.shape}, the library's is {shape}")
            held.append(array)
            self.in_tensors[i].data = array.ctypes.data
        self._check(
            self.lib.kiln_infer(self.context, self.in_tensors, len(self.inputs), self.out_tensors, len(self.outputs))
        )
        return [result.copy() for result in self.results]

    def close(self) -> None:
        if self.context:
            self.lib.kiln_context_free(self.context)
            self.context = ctypes.c_void_p()
        if self.model:
            self.lib.kiln_model_free(self.model)
            self.model = ctypes.c_void_p()
        if self.on_close is not None:
            self.on_close()
            self.on_close = None


def build_timer(folder: Path) -> Path:
    """The C driver that times ``folder``'s library (``kiln/bench/kiln_time.c``), built beside it."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise Unavailable("no C compiler to build the C driver")
    binary = folder / "kiln_time"
    command = [compiler, "-std=c99", "-O2", str(TIMER), f"-I{folder}", f"-L{folder}", "-lkiln_model",
               f"-Wl,-rpath,{folder}", "-o", str(binary)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the C driver failed: {result.stderr[-2000:]}")
    return binary


def time_from_c(binary: Path, folder: Path, calls: int, threads: int, inputs: list[Path], env: dict | None = None) -> tuple[float, float]:  # fmt: skip
    """(median, p90) microseconds of ``calls`` kiln_infer calls timed by the C driver."""
    result = subprocess.run([str(binary), str(folder / "model.kw"), str(calls), str(threads), *map(str, inputs)],
                            capture_output=True, text=True, env=env or {})  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"the C driver failed: {result.stderr[-2000:]}")
    median, p90 = (float(v) for v in result.stdout.split()[:2])
    return median, p90


class KilnCBackend(KilnBackend):
    """kiln's cpu target as a C library: one size per library (the example's)."""

    name = "kiln-c"

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import kiln
        from kiln.driver.emit_c import emit_c
        from kiln.passes.batching import symbols

        if model.batch_range is not None:
            raise Unavailable("a C library runs one size: no variable-batch rows yet")
        self.figures = {}
        start = time.perf_counter()
        compiled = kiln.compile(str(model.onnx_path), target=self.target)
        named = set(symbols(compiled.signature))
        dims = {
            dim: int(np.shape(example[value.name])[axis])
            for value in compiled.signature.inputs
            for axis, dim in enumerate(value.type.shape or ())
            if isinstance(dim, str) and dim in named and value.name in example
        }
        self.folder = Path(tempfile.mkdtemp(prefix="kiln-c-"))
        emit_c(compiled, self.folder, dims)
        del compiled  # the runs hold only the library and its mapped weights
        return_freed(collect=True)
        self.timer = build_timer(self.folder)
        self.figures["compile_cached_s"] = time.perf_counter() - start
        self.example = example

    def load(self) -> Session:
        folder = self.folder
        self.session = CLibrarySession(folder, self.threads, lambda: shutil.rmtree(folder, ignore_errors=True))
        return self.session

    def run_figures(self) -> dict[str, Any]:
        """kiln_infer timed from C on the example (no Python in the loop), in rounds alternating with
        the same calls through Python, so both see the machine in the same state."""
        session = getattr(self, "session", None)
        if session is None:
            return {}
        paths = []
        for name, dtype, _, _ in session.inputs:
            path = self.folder / f"input-{len(paths)}.bin"
            np.ascontiguousarray(self.example[name], dtype=dtype).tofile(path)
            paths.append(path)
        probe, _ = time_from_c(self.timer, self.folder, 5, self.threads, paths)
        calls = max(10, min(100_000, int(NATIVE_SECONDS / ROUNDS / max(probe * 1e-6, 1e-7))))
        native, through_python = [], []
        for _ in range(ROUNDS):
            native.append(time_from_c(self.timer, self.folder, calls, self.threads, paths))
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                session.run(self.example)
                times.append(time.perf_counter() - start)
            through_python.append(float(np.median(times)) * 1e3)
        return {
            "native_latency_ms": {
                "p50": float(np.median([m for m, _ in native])) / 1e3,
                "p90": float(np.median([p for _, p in native])) / 1e3,
                "calls": calls * ROUNDS,
                "python_p50": float(np.median(through_python)),
            }
        }
