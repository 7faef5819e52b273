"""Per-kernel profiles and the machine's matrix-multiply peak.

``profile_graph`` builds a plan whose library times every kernel (``compile_plan(profile=True)``:
each kernel adds its wall time to ``kiln_profile_seconds[i]``), runs it, and reads the times back.
``matmul_peak`` measures what kiln's own engine reaches on a large square product: the reference
the profile's "% of peak" column divides by (a measured figure, not a datasheet one).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from kiln.backends import Threading
from kiln.driver.options import CompileOptions
from kiln.driver.pipeline import compile_plan
from kiln.ir.graph import Graph
from kiln.lower.kir import GemmSpec, Kernel
from kiln.lower.target import Target
from kiln.runtime.executable import Executable
from kiln.runtime.plan import Segment


@dataclass
class KernelTime:
    kernel: Kernel
    seconds: float  # mean per run

    @property
    def gflops(self) -> float | None:
        return self.kernel.flops / self.seconds / 1e9 if self.kernel.flops and self.seconds > 0 else None

    @property
    def schedule(self) -> str:
        """Which schedule ran (default / tuned / cached) and what it is."""
        if any(isinstance(s, GemmSpec) for s in self.kernel.body):
            blocking = [
                f"{name}={value}"
                for s in self.kernel.body
                if isinstance(s, GemmSpec)
                for name, value in zip(("mc", "nc", "kc"), s.blocking)
                if value
            ]
            return f"engine {self.kernel.tuning}" + (f" ({', '.join(blocking)})" if blocking else "")
        parts = [
            f"parallel {self.kernel.schedule.parallel}" if self.kernel.schedule.parallel else "",
            "simd" if self.kernel.schedule.vectorize else "",
        ]
        return "loops: " + (", ".join(p for p in parts if p) or "serial")


@dataclass
class Profile:
    kernels: list[KernelTime]
    run_seconds: float  # median wall time of one whole run (timers included)
    fallback_seconds: float  # what the host fallbacks took per run (run minus kernels, roughly)
    arena_bytes: int = 0  # the memory plan's one arena (every intermediate tensor)
    weight_bytes: int = 0  # the plan's constants as the kernels read them (packed, converted)


def _inputs(graph: Graph, feeds: dict[str, np.ndarray] | None, seed: int) -> list[np.ndarray]:
    from kiln.ir.types import random_tensor

    rng = np.random.default_rng(seed)
    feeds = feeds or {}
    inputs = []
    for value in graph.inputs:
        shape = [int(d) for d in value.type.shape]  # type: ignore[union-attr]
        given = feeds.get(value.name)
        # example inputs of another shape than the bound graph's: random data instead
        inputs.append(
            np.asarray(given)
            if given is not None and list(np.shape(given)) == shape
            else random_tensor(value.type.dtype, shape, rng)
        )  # type: ignore[union-attr]
    return inputs


def profile_graph(
    graph: Graph,
    feeds: dict[str, np.ndarray] | None = None,
    runs: int = 10,
    warmup: int = 2,
    target: Target | str | None = None,
    options: CompileOptions | None = None,
) -> Profile:
    """Profile a graph with static shapes (``specialize``d), compiled by the pipeline as any
    compile is, with per-kernel timers (``options.profile``)."""
    options = (options or CompileOptions.from_env()).with_(profile=True, plan_cache=False)
    plan = compile_plan(graph, target, options)
    if plan.whole_graph_reason:
        raise ValueError(f"nothing to profile: {plan.whole_graph_reason}")
    executable = Executable(plan)
    inputs = _inputs(plan.graph, feeds, seed=0)
    kernels = [k for step in plan.steps if isinstance(step, Segment) for k in step.kernels]
    if plan.library is None or not kernels:
        raise ValueError("nothing to profile: the plan has no native kernels")
    timers = (ctypes.c_double * len(kernels)).in_dll(ctypes.CDLL(str(plan.library)), "kiln_profile_seconds")
    for _ in range(warmup):
        executable.run(inputs)
    ctypes.memset(timers, 0, ctypes.sizeof(timers))
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        executable.run(inputs)
        walls.append(time.perf_counter() - start)
    times = [KernelTime(k, timers[i] / runs) for i, k in enumerate(kernels)]
    wall = float(np.median(walls))
    host = max(0.0, float(np.mean(walls)) - sum(t.seconds for t in times))
    weights = sum(int(np.asarray(array).nbytes) for array in plan.constants.values())
    return Profile(times, wall, host, plan.memory.arena_bytes, weights)


def square_product(size: int) -> Any:
    """A ``size``-square float32 product as an ONNX model (input ``a`` times a constant ``w``): what
    a machine's matrix-multiply peak is measured on."""
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        "peak",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])],
        [numpy_helper.from_array(weights, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@lru_cache(maxsize=4)
def matmul_peak(size: int = 1024, runs: int = 5, threads: int = 0) -> float:
    """GFLOP/s of kiln's engine on a ``size``-square float32 product (best of ``runs``), on
    ``threads`` participants (0: the threads this process may use)."""
    from kiln.frontend.onnx import import_onnx

    plan = compile_plan(import_onnx(square_product(size)))
    executable = Executable(plan, parallelism=Threading(threads=threads))
    a = np.ones((size, size), np.float32)
    model = lambda x: executable.run([x])  # noqa: E731
    model(a)
    best = min(_timed(model, a) for _ in range(runs))
    return 2 * size**3 / best / 1e9


def _timed(model, a: np.ndarray) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    model(a)
    return time.perf_counter() - start


def chrome_trace(profile: Profile, runs: int, title: str) -> dict[str, Any]:
    """``profile`` as a Chrome/Perfetto trace (the JSON trace-event format ``ui.perfetto.dev`` and
    ``chrome://tracing`` open): one inference, each kernel a complete event ("X") of its mean time
    over ``runs`` runs, laid end to end in execution order (a segment runs its kernels one after
    another, each on every thread), then the host's share (runtime, fallbacks) as one event."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"kiln: {title}"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "kernels"}},
    ]
    start = 0.0
    for timed in profile.kernels:
        duration = timed.seconds * 1e6
        args = {"computes": "; ".join(timed.kernel.sources), "schedule": timed.schedule, "runs": runs}
        if timed.gflops is not None:
            args["gflops"] = round(timed.gflops, 2)
        events.append(
            {
                "name": timed.kernel.name,
                "cat": timed.kernel.kind,
                "ph": "X",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": duration,
                "args": args,
            }
        )
        start += duration
    if profile.fallback_seconds > 0:
        events.append(
            {
                "name": "host (runtime, fallbacks)",
                "cat": "host",
                "ph": "X",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": profile.fallback_seconds * 1e6,
                "args": {"note": "the run's wall time less its kernels' (mean over runs)"},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "kiln explain --profile",
            "runs": runs,
            "run_ms": profile.run_seconds * 1e3,
            "arena_bytes": profile.arena_bytes,
            "weight_bytes": profile.weight_bytes,
        },
    }
