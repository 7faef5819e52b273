"""Measuring one schedule candidate in an isolated process: a crash or a hang costs that
candidate only (the worker is restarted), never the tuning run."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import numpy as np

MIN_SECONDS = 0.25  # per candidate: enough runs that the median means something on a noisy machine


def build_graph(spec: dict[str, Any], seed: int = 0) -> tuple[Any, list[np.ndarray]]:
    """A one-node model of the kernel: weights as constants (random), the rest as inputs."""
    from onnx import TensorProto, helper, numpy_helper

    from kiln.frontend.onnx import import_onnx

    rng = np.random.default_rng(seed)
    names = [f"in{i}" for i in range(len(spec["shapes"]))]
    inputs, initializers, feeds = [], [], []
    for name, shape, constant in zip(names, spec["shapes"], spec["constant"]):
        if shape is None:
            continue
        data = rng.standard_normal(shape).astype(np.float32)
        if constant:
            initializers.append(numpy_helper.from_array(data, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
            feeds.append(data)
    used = [n if s is not None else "" for n, s in zip(names, spec["shapes"])]
    node = helper.make_node(spec["op"], used, ["out"], **spec["attrs"])
    graph = helper.make_graph(
        [node], "kernel", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return import_onnx(model), feeds


def measure_here(spec: dict[str, Any], candidate: dict[str, Any], runs: int) -> tuple[float, np.ndarray, float]:
    """(median seconds of one run, the output, the runs' spread: interquartile range / median) for
    ``candidate`` applied to the kernel."""
    from kiln.driver.options import CompileOptions
    from kiln.driver.pipeline import compile_plan
    from kiln.lower.lowering import kernel_key
    from kiln.runtime.executable import Executable

    graph, feeds = build_graph(spec)
    key = kernel_key(
        spec["op"], spec["attrs"], [tuple(s) if s is not None else None for s in spec["shapes"]], spec["constant"]
    )
    options = CompileOptions.from_env(level=0, plan_cache=False)
    plan = compile_plan(graph, spec.get("target", "cpu"), options, choices={key: candidate})
    executable = Executable(plan)
    output = np.array(executable.run(feeds)[0])
    executable.run(feeds)  # warm caches and the thread pool
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < max(runs, 1) or time.perf_counter() - began < MIN_SECONDS:
        start = time.perf_counter()
        executable.run(feeds)
        times.append(time.perf_counter() - start)
    low, median, high = np.percentile(times, [25, 50, 75])
    return float(median), output, float((high - low) / median) if median > 0 else 0.0


def _serve(connection: Any) -> None:
    while True:
        request = connection.recv()
        if request is None:
            return
        try:
            connection.send(("ok", measure_here(*request)))
        except Exception as err:
            connection.send(("error", f"{type(err).__name__}: {err}"))


class Measurer:
    """A worker process serving measurements; restarted after a crash or a timeout."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.context = multiprocessing.get_context("spawn")
        self.process: Any = None
        self.connection: Any = None

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        parent, child = self.context.Pipe()
        self.process = self.context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        self.connection = parent

    def close(self) -> None:
        if self.process is not None:
            try:
                self.connection.send(None)
                self.process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
            if self.process.is_alive():
                self.process.kill()
            self.process = None

    def measure(self, spec: dict[str, Any], candidate: dict[str, Any], runs: int) -> tuple[float, np.ndarray, float]:
        if self.process is None or not self.process.is_alive():
            self._start()
        self.connection.send((spec, candidate, runs))
        if not self.connection.poll(self.timeout_s):
            self.process.kill()
            self.process = None
            raise TimeoutError(f"no result within {self.timeout_s:.0f} s")
        try:
            status, payload = self.connection.recv()
        except EOFError:
            self.process = None
            raise RuntimeError("the worker crashed") from None
        if status != "ok":
            raise RuntimeError(payload)
        return payload
