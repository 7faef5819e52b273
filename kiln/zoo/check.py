"""Run a zoo model on kiln and compare it with onnxruntime (the reference point users trust)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import kiln
from kiln import zoo


@dataclass
class CheckResult:
    name: str
    import_seconds: float
    run_seconds: float
    relative_l2: float | None
    max_abs: float | None
    note: str = ""


def relative_l2(got: np.ndarray, expected: np.ndarray) -> float:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    denominator = np.linalg.norm(expected)
    return float(np.linalg.norm(got - expected) / (denominator if denominator else 1.0))


def run_onnxruntime(path: str, feeds: dict[str, np.ndarray], threads: int = 2) -> list[np.ndarray]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check_model(name: str, target: str = "reference", progress: Callable[[str], None] | None = None) -> CheckResult:
    path = str(zoo.onnx_path(name, progress=progress))
    feeds = zoo.example_inputs(name)
    start = time.perf_counter()
    model = kiln.compile(path, target=target)
    imported = time.perf_counter() - start
    start = time.perf_counter()
    outputs = list(model.run(feeds).values())
    ran = time.perf_counter() - start
    try:
        expected = run_onnxruntime(path, feeds)
    except ImportError:
        return CheckResult(name, imported, ran, None, None, "onnxruntime not installed")
    errors = [relative_l2(g, e) for g, e in zip(outputs, expected)]
    max_abs = max(float(np.max(np.abs(np.asarray(g, np.float64) - e))) for g, e in zip(outputs, expected))
    return CheckResult(name, imported, ran, max(errors), max_abs)
