"""kiln's own thread pool (backends/cpu/pool.c): per-model threads, concurrent requests, nested
loops and fork. Speed under contention is measured by benchmarks/contention.py, not here."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import kiln
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(11)


def model():
    """A product on the engine (its parallel tasks) and a wide elementwise loop (an outlined one)."""
    return make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Tanh", ["m"], ["t"]),
            helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0),
        ],
        [("x", FLOAT, [256, 192])],
        [("y", FLOAT, None)],
        {"w": RNG.standard_normal((192, 320)).astype(np.float32), "axes": np.array([1], np.int64)},
    )


def expected(x: np.ndarray, proto) -> np.ndarray:  # type: ignore[no-untyped-def]
    return kiln.compile(proto, target="reference").run({"x": x})["y"]


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_any_thread_count_computes_the_same(threads):
    proto = model()
    x = RNG.standard_normal((256, 192)).astype(np.float32)
    compiled = kiln.compile(proto, threads=threads, spin=0 if threads == 7 else 2000)
    assert compiled.parallelism.threads == threads
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected(x, proto), rtol=1e-4, atol=1e-3)


def test_the_generated_library_uses_kilns_pool_not_an_openmp_runtime():
    compiled = kiln.compile(model())
    (plan,) = compiled.plans
    assert "kiln_parallel_for(" in plan.source and "omp parallel" not in plan.source
    if sys.platform.startswith("linux"):
        linked = subprocess.run(["ldd", str(plan.library)], capture_output=True, text=True).stdout
        assert "gomp" not in linked and "omp" not in linked.replace("kiln", "")


def test_concurrent_requests_share_the_pool_and_all_finish_right():
    proto = model()
    compiled = kiln.compile(proto, threads=2, streams=4)
    inputs = [RNG.standard_normal((256, 192)).astype(np.float32) for _ in range(16)]
    futures = [compiled.submit({"x": x}) for x in inputs]
    for x, future in zip(inputs, futures):
        np.testing.assert_allclose(future.result(timeout=120)["y"], expected(x, proto), rtol=1e-4, atol=1e-3)


def test_a_forked_child_runs_the_model_with_a_pool_of_its_own():
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    proto = model()
    x = RNG.standard_normal((256, 192)).astype(np.float32)
    compiled = kiln.compile(proto, threads=2)
    want = compiled.run({"x": x})["y"]  # the parent's pool has its workers now
    pid = os.fork()
    if pid == 0:  # the child has no worker threads: the pool must start its own, not wait forever
        try:
            ok = np.allclose(compiled.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("bad", [{"threads": -1}, {"spin": -5}, {"streams": 0}])
def test_bad_settings_are_clear_errors(bad):
    with pytest.raises(ValueError, match="threads|spin|streams"):
        kiln.compile(model(), **bad)


def test_a_parallel_loop_over_run_time_sizes_runs_inline_when_its_work_is_small():
    """The schedule chose parallel at the capacity; a call whose run-time sizes leave less than
    PARALLEL_MIN elements of work runs on the calling thread. Known sizes keep the schedule's
    choice, and a nest whose inner extent follows a loop index has no one product to test."""
    from kiln.backends.cpu.c import pool_participants
    from kiln.ir.types import DType
    from kiln.lower.kir import For, Index, Scalar, run_time_dim
    from kiln.lower.kir_expr import Binary, i64
    from kiln.lower.target import PARALLEL_MIN

    rows, inner, past = Index("r"), Index("c"), run_time_dim(1)
    copy = For(rows, 12, [For(inner, Binary("*", i64(64), past), [])])
    decided = pool_participants(copy)
    assert str(PARALLEL_MIN) in decided and decided.endswith("? 1 : 0")
    assert pool_participants(For(rows, 12, [For(inner, 4096, [])])) == "0"
    triangle = For(rows, 12, [For(inner, Binary("+", rows, past), [])])
    assert pool_participants(triangle) == "0"
    local = For(rows, 12, [For(inner, Scalar("t", DType.INT64), [])])
    assert pool_participants(local) == "0"
