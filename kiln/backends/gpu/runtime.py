"""Running a plan's Triton kernels: the generated module executed once per process, one device
arena per loaded plan (the memory plan's offsets), weights uploaded once, every segment's launches
from one table, and what crosses between host and device timed apart from the kernels.

``gpu`` runs on a CUDA device; ``gpu:interpret`` runs the very same kernels in Triton's interpreter
with the CPU as the "device" (the same arena, uploads and downloads, on CPU tensors), which is how
this target is tested on machines without a GPU.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import threading
import time
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.backends.gpu import tuning
from kiln.backends.gpu.render import Launch
from kiln.backends.gpu.tuning import Entry, Tuner
from kiln.errors import ExecutionError, KilnError
from kiln.ir.types import DType
from kiln.lower.kir import Buffer, buffers_in

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns unless it is said

_modules: dict[tuple[str, bool], dict[str, Any]] = {}
_lock = threading.Lock()


def triton_missing() -> str:
    """'' when Triton can be imported, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return f"Triton is not installed ({err}); install kiln's gpu extra: pip install -e '.[gpu]'"
    return ""


def cuda_missing() -> str:
    """'' when a CUDA device is present, else why not."""
    try:
        import torch
    except ImportError:
        return "no CUDA device: PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device on this machine (torch.cuda.is_available() is False)"
    return ""


def _numpy_function(function: Callable[..., Any]) -> Callable[..., Any]:
    """A libdevice function for the interpreter: NumPy on the interpreter's tensors."""

    def call(*args: Any) -> Any:
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        first = next(a for a in args if isinstance(a, tl.tensor))
        data = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        with np.errstate(all="ignore"):
            result = np.asarray(function(*data)).astype(first.handle.data.dtype)
        return tl.tensor(TensorHandle(result, first.handle.dtype.scalar), first.type)

    return call


def _interpreter_libdevice() -> types.SimpleNamespace:
    """The libdevice functions the renderer calls, as the kernel-IR interpreter computes them."""
    from kiln.backends.gpu.render import LIBDEVICE
    from kiln.lower.kir_interpreter import BINARY, FUNCTIONS

    table = {**FUNCTIONS, **BINARY, "rint": FUNCTIONS["round_even"]}
    return types.SimpleNamespace(**{name: _numpy_function(table[name]) for name in LIBDEVICE})


def module(source: str, interpret: bool) -> dict[str, Any]:
    """The generated module's namespace (executed once per process and mode). Its text is what this
    process rendered from the plan's kernel IR, never a file read back."""
    key = (hashlib.sha256(source.encode()).hexdigest()[:24], interpret)
    with _lock:
        found = _modules.get(key)
        if found is not None:
            return found
        missing = triton_missing()
        if missing:
            raise KilnError(missing)
        import triton.knobs as knobs

        name = f"kiln_gpu_{key[0]}" + ("_interpreted" if interpret else "")
        filename = f"<{name}>"
        # Triton reads a kernel's source through inspect: the text lives in linecache, not on disk
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        previous = knobs.runtime.interpret
        knobs.runtime.interpret = interpret
        try:
            namespace: dict[str, Any] = {"__name__": name}
            exec(compile(source, filename, "exec"), namespace)
        finally:
            knobs.runtime.interpret = previous
        if interpret:
            namespace["libdevice"] = _interpreter_libdevice()
        _modules[key] = namespace
        return namespace


TORCH_VIEW = {DType.BFLOAT16: np.uint16}  # numpy types torch has no twin of: their bits


def _torch_dtype(buffer: Buffer) -> Any:
    import torch

    numpy = np.dtype(TORCH_VIEW.get(buffer.dtype, buffer.dtype.numpy))
    return torch.from_numpy(np.empty(0, dtype=numpy)).dtype


def _host(array: np.ndarray, buffer: Buffer) -> Any:
    """A host array as a torch tensor over the same memory."""
    import torch

    view = array.reshape(-1)
    if buffer.dtype in TORCH_VIEW:
        view = view.view(TORCH_VIEW[buffer.dtype])
    with warnings.catch_warnings():  # a read-only array is only ever copied from
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(view)


@dataclass
class TransferTimes:
    """Seconds spent per run, summed since load: host -> device, kernels, device -> host."""

    runs: int = 0
    upload: float = 0.0
    compute: float = 0.0
    download: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, upload: float, compute: float, download: float) -> None:
        with self.lock:
            self.runs += 1
            self.upload += upload
            self.compute += compute
            self.download += download

    def summary(self) -> dict[str, float]:
        runs = max(1, self.runs)
        return {
            "runs": self.runs,
            "upload_ms": 1e3 * self.upload / runs,
            "compute_ms": 1e3 * self.compute / runs,
            "download_ms": 1e3 * self.download / runs,
        }


class DevicePlan:
    """What one loaded plan keeps on its device: the weights (uploaded once), one arena laid out
    by the memory plan, a buffer for each input, output and the status word. Runs of one plan take
    turns on it (``lock``)."""

    def __init__(self, plan: Any, device: str) -> None:
        import torch

        self.device = torch.device(device)
        self.plan = plan
        self.lock = threading.Lock()
        self.times = TransferTimes()
        self.tensors: dict[Buffer, Any] = {}
        for buffer, array in plan.constants.items():
            self.tensors[buffer] = _host(np.ascontiguousarray(array), buffer).to(self.device)
        self.arena = torch.empty(max(1, plan.memory.arena_bytes), dtype=torch.uint8, device=self.device)
        self.tuner: Tuner | None = None
        wanted = tuning.mode()
        if wanted == "force" or (wanted == "on" and self.device.type == "cuda"):
            name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "interpret"
            self.tuner = Tuner(name, launch_one, self.synchronize, self.device.type == "cuda")

    def tensor(self, buffer: Buffer) -> Any:
        found = self.tensors.get(buffer)
        if found is None:
            import torch

            offset = self.plan.memory.offsets.get(buffer)
            if offset is not None:
                found = self.arena[offset : offset + buffer.nbytes].view(_torch_dtype(buffer))
            else:
                found = torch.empty(buffer.size, dtype=_torch_dtype(buffer), device=self.device)
            self.tensors[buffer] = found
        return found

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)


def graphs_wanted() -> bool:
    """CUDA graphs for a segment's launches unless ``KILN_GPU_GRAPHS=0``."""
    return os.environ.get("KILN_GPU_GRAPHS", "1").strip() not in ("0", "false", "no", "off")


def launch_one(function: Any, launch: Launch, args: list[Any]) -> None:
    function[launch.grid](*args, **launch.constants, num_warps=launch.num_warps, num_stages=launch.num_stages)


class SegmentRunner:
    """One native segment: upload what it reads from the host, launch its kernels in order,
    download what later steps or the caller read.

    On a CUDA device the launches are captured once into a CUDA graph (after the first run, which
    compiles every kernel) and later runs replay it: one launch of the graph instead of ~100 Python
    kernel launches, which cost more than ResNet-50's kernels at batch 1 (an H100, 2026-11-27).
    Everything a launch names stays where it was captured: the arena, the weights and each input's
    device buffer are allocated once per loaded plan, and uploads copy into them before a replay.
    A capture that fails keeps the direct launches and says why (``graph_note``).

    Before the first run the plan's tuner (``tuning``) compiles every kernel and its block-size
    candidates in threads; after it, it measures them on the run's buffers and the graph captures
    the chosen ones."""

    def __init__(
        self,
        state: DevicePlan,
        launches: list[Launch],
        functions: dict[str, Any],
        slots: dict[int, Buffer],
        upload: list[Buffer],
        download: list[Buffer],
        status: Buffer | None,
    ) -> None:
        self.state = state
        self.launches = [(functions[x.function], x, [slots[s] for s in x.slots]) for x in launches]
        self.entries: list[Entry] | None = None  # the launches with their tensors, from the first run on
        self.upload = upload
        self.download = download
        self.status = status
        self.graph: Any = None  # torch.cuda.CUDAGraph of the launches, once captured
        self.graph_note = "" if graphs_wanted() else "off (KILN_GPU_GRAPHS=0)"  # set by the one capture try

    def prepared(self) -> list[Entry]:
        if self.entries is None:
            state = self.state
            entries = [(f, x, [state.tensor(b) for b in buffers]) for f, x, buffers in self.launches]
            self.entries = state.tuner.prepare(entries) if state.tuner else entries
        return self.entries

    def launch(self) -> None:
        state = self.state
        for function, launch, args in self.prepared():
            try:
                launch_one(function, launch, args)
            except KilnError:
                raise
            except Exception as err:
                raise ExecutionError(
                    f"kernel {launch.function} ({launch.kind}, grid {launch.grid}) failed on "
                    f"{state.device}: {type(err).__name__}: {err}"
                ) from err

    def capture(self) -> None:
        """The launches as a CUDA graph (kernels compiled by the run before; nothing runs now)."""
        import torch

        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.launch()
        except Exception as err:  # a driver or Triton that cannot: launch directly, and say so
            self.graph_note = f"not captured: {type(err).__name__}: {str(err)[:300]}"
            return
        self.graph = graph
        self.graph_note = "captured"

    def after_run(self) -> None:
        """After the first run: block sizes measured (the run left real values in the buffers), then
        the launches captured as a graph (once: a failed capture leaves its note)."""
        state = self.state
        if state.tuner is not None and state.tuner.pending and self.entries is not None:
            self.entries = state.tuner.tune(self.entries)
        if self.graph is None and not self.graph_note and state.device.type == "cuda":
            self.capture()  # once, after the first run (which compiled every kernel)

    def __call__(self, table: Any, views: dict[Buffer, np.ndarray], status: np.ndarray) -> None:
        state = self.state
        with state.lock, np.errstate(all="ignore"):
            started = time.perf_counter()
            for buffer in self.upload:
                state.tensor(buffer).copy_(_host(views[buffer], buffer))
            if self.status is not None:
                state.tensor(self.status).zero_()
            state.synchronize()
            uploaded = time.perf_counter()
            if self.graph is not None:
                self.graph.replay()
            else:
                self.launch()
            state.synchronize()
            computed = time.perf_counter()
            self.after_run()
            for buffer in self.download:
                _host(views[buffer], buffer).copy_(state.tensor(buffer))
            if self.status is not None:
                status[:] = state.tensor(self.status).cpu().numpy()[:1]
            state.synchronize()
            state.times.add(uploaded - started, computed - uploaded, time.perf_counter() - computed)


def traffic(plan: Any) -> list[tuple[list[Buffer], list[Buffer]]]:
    """Per native segment: (buffers it reads that the host holds: inputs and what earlier steps
    wrote; buffers it writes that the caller or later steps read)."""
    steps = plan.steps
    access: list[tuple[set[Buffer], set[Buffer]]] = []
    for step in steps:
        if hasattr(step, "kernels"):
            writes = {b for k in step.kernels for b in k.writes}
            # everything it touches: a buffer it writes in part keeps what the host wrote elsewhere in it
            reads = {b for k in step.kernels for b in (*k.reads, *buffers_in(k.body))} | writes
        else:
            reads = {plan.roots[v] for v in step.node.inputs if v is not None}
            writes = {plan.roots[v] for v in step.node.outputs}
        access.append((reads, writes))
    constants = set(plan.constants)
    result = []
    for position, step in enumerate(steps):
        if not hasattr(step, "kernels"):
            continue
        reads, writes = access[position]
        earlier = set(plan.inputs).union(*(w for _, w in access[:position]))
        later = set(plan.outputs).union(*(r for r, _ in access[position + 1 :]))
        order = list(plan.table)  # a fixed order: the pointer table's
        result.append(
            (
                [b for b in order if b in reads and b in earlier and b not in constants],
                [b for b in order if b in writes and b in later],
            )
        )
    return result


def transfer_times(runners: Sequence[Any]) -> dict[str, float] | None:
    """Per-run host->device, kernel and device->host times of a loaded plan's runners (None when
    they are not the gpu target's)."""
    states = {id(r.state): r.state for r in runners if isinstance(r, SegmentRunner)}
    if not states:
        return None
    total: dict[str, Any] = {"runs": 0, "upload_ms": 0.0, "compute_ms": 0.0, "download_ms": 0.0}
    for state in states.values():
        for key, value in state.times.summary().items():
            total[key] = max(total[key], value) if key == "runs" else total[key] + value
        for part in ("upload", "compute", "download"):  # seconds since load, every segment's runs
            total[f"{part}_s"] = total.get(f"{part}_s", 0.0) + getattr(state.times, part)
    notes = sorted({r.graph_note for r in runners if isinstance(r, SegmentRunner) and r.graph_note})
    total["cuda_graphs"] = "; ".join(notes) or "none (not a CUDA device)"
    reports = [s.tuner.report.summary() for s in states.values() if s.tuner is not None]
    total["tuning"] = {k: sum(r[k] for r in reports) for k in reports[0]} if reports else "off"
    return total
