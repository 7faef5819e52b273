"""The walk from ``kiln.compile`` to a run: the driver compiles, then the runtime loads and runs
what it was given. No compile stage (frontend, passes, lowering, the pipeline) runs once the
runtime's executable code has been entered, and a run of a model compiled ahead compiles nothing."""

from __future__ import annotations

import sys
import threading

import numpy as np
from onnx import TensorProto, helper

import kiln
from tests.helpers import make_model

COMPILING = ("kiln.frontend", "kiln.lower", "kiln.driver.pipeline")  # (the pipeline runs every pass)
RUNTIME = ("kiln.runtime.executable",)  # (runtime.plan holds the data classes the pipeline fills in)


def record(action):  # type: ignore[no-untyped-def]
    """The kiln modules whose functions ``action`` calls, in call order (this thread)."""
    calls: list[str] = []

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_name != "<module>":  # (importing is not a step)
            module = frame.f_globals.get("__name__", "")
            if module.startswith("kiln") and (not calls or calls[-1] != module):
                calls.append(module)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        result = action()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return result, calls


def first(calls: list[str], prefixes: tuple[str, ...]) -> int:
    return next((i for i, m in enumerate(calls) if m.startswith(prefixes)), len(calls))


def last(calls: list[str], prefixes: tuple[str, ...]) -> int:
    return max((i for i, m in enumerate(calls) if m.startswith(prefixes)), default=-1)


def model(shape):  # type: ignore[no-untyped-def]
    weights = {"w": np.full((4, 3), 0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return make_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, None)], weights)


def warm_up() -> None:
    """Every module the walk uses imported first (importing runs module code: not a step)."""
    kiln.compile(model(["n", 4]), dims={"n": 1}).run({"x": np.ones((1, 4), np.float32)})


def test_compiling_ends_before_the_runtime_begins_and_a_run_compiles_nothing(monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    warm_up()
    compiled, calls = record(lambda: kiln.compile(model([2, 4])))
    assert first(calls, COMPILING) < first(calls, RUNTIME) < len(calls), calls
    assert last(calls, COMPILING) < first(calls, RUNTIME), [m for m in calls if m.startswith(COMPILING + RUNTIME)]
    x = np.ones((2, 4), np.float32)
    result, calls = record(lambda: compiled.run({"x": x}))
    np.testing.assert_allclose(result["y"], np.maximum(x @ np.full((4, 3), 0.5, np.float32), 0))
    assert first(calls, COMPILING) == len(calls), calls  # compiled ahead: the run only runs


def test_a_new_binding_compiles_completely_before_the_runtime_runs_it(monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    warm_up()
    compiled = kiln.compile(model(["n", 4]))
    _, calls = record(lambda: compiled.run({"x": np.ones((3, 4), np.float32)}))
    assert first(calls, COMPILING) < len(calls)  # the binding n=3 compiled in this run...
    assert last(calls, COMPILING) < first(calls, RUNTIME)  # ...all of it before the runtime took over
