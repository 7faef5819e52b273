"""One native call per inference: the cpu target's plan runs from its library's entry, host
fallbacks called back between segments; one thread pool per process, whatever the number of
loaded models."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import ExecutionError
from kiln.runtime import executable as executable_module
from tests.helpers import make_model

F = TensorProto.FLOAT


def fallback_between_segments():
    """Relu (native) -> TopK (no lowering: a host fallback) -> Exp, Add (native again)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=1),
        helper.make_node("Exp", ["v"], ["e"]),
        helper.make_node("Add", ["e", "v"], ["y"]),
    ]
    return make_model(nodes, [("x", F, [3, 8])], [("y", F, None)], {"k": np.array([4])})


def the_executable(compiled):
    (executable,) = compiled.executables()
    return executable


def test_a_plan_with_fallbacks_runs_from_one_native_call(monkeypatch):
    compiled = kiln.compile(fallback_between_segments(), target="cpu")
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    expected = kiln.compile(fallback_between_segments(), target="reference")(x)
    executable = the_executable(compiled)
    assert executable.api is not None and len(executable.runners) == 2, "two native segments, one entry"

    def no_segment_from_python(*args):
        raise AssertionError("a segment ran from Python: the entry should run them")

    executable.runners = [no_segment_from_python] * len(executable.runners)
    ran = []
    real = executable._fallback
    monkeypatch.setattr(executable, "_fallback", lambda step, views: (ran.append(step.node.op), real(step, views)))
    np.testing.assert_allclose(compiled(x), expected, rtol=1e-6)
    assert ran == ["TopK"], "the entry called the host back once, for the fallback between its segments"


def test_an_error_in_a_fallback_reaches_the_caller_and_the_next_run_works(monkeypatch):
    compiled = kiln.compile(fallback_between_segments(), target="cpu")
    x = np.ones((3, 8), np.float32)
    good = compiled(x)
    executable = the_executable(compiled)

    def failing(step, views):
        raise ExecutionError(f"node {step.node.op}: failed on purpose")

    monkeypatch.setattr(executable, "_fallback", failing)
    with pytest.raises(ExecutionError, match="TopK: failed on purpose"):
        compiled(x)
    monkeypatch.undo()
    np.testing.assert_array_equal(compiled(x), good)


def test_a_request_table_is_prepared_once_not_per_call(monkeypatch):
    """A call writes its inputs' and outputs' addresses only: the weights' and arena buffers' are
    in the request's table from when it was made (so a call's cost does not grow with the plan)."""
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"]) for i in range(40)]
    weights = {f"w{i}": np.eye(4, dtype=np.float32) * 0.5 for i in range(40)}
    model = make_model(nodes, [("x", F, [4, 4])], [("h39", F, None)], weights)
    compiled = kiln.compile(model, target="cpu")
    made = []
    original = executable_module._Request.__init__
    monkeypatch.setattr(
        executable_module._Request, "__init__", lambda self, ex: (made.append(1), original(self, ex))[1]
    )
    x = np.ones((4, 4), np.float32)
    for _ in range(20):
        np.testing.assert_allclose(compiled(x), x * 0.5**40, rtol=1e-5)
    assert len(made) <= 1, f"{len(made)} request tables made for 20 sequential calls"


# the pool's worker threads in this process (a script's helper: it runs in a fresh process)
POOL_THREADS = """
def pool_threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as comm:
            names.append(comm.read().strip())
    return names.count("kiln-pool")
"""

POOL_SCRIPT = textwrap.dedent(
    """
    import os, threading
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import kiln

    def model(seed):  # three sizes: three libraries (the weights are data, not code)
        rng = np.random.default_rng(seed)
        n = 128 + 64 * seed
        w = numpy_helper.from_array(rng.standard_normal((256, n)).astype(np.float32), "w")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], f"m{seed}",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)

    models = [kiln.compile(model(seed), threads=2) for seed in range(3)]
    libraries = {str(m.executables()[0].plan.library) for m in models}
    x = np.ones((256, 256), np.float32)
    first = [m.run({"x": x})["y"] for m in models]

    POOL_THREADS
    # concurrent requests of the three models share the one pool (each request's loops run on
    # the pool or, when it is busy, on the request's own thread)
    errors = []
    def hammer(m, expected):
        try:
            for _ in range(20):
                np.testing.assert_array_equal(m.run({"x": x})["y"], expected)
        except Exception as err:
            errors.append(err)
    threads = [threading.Thread(target=hammer, args=(m, y)) for m, y in zip(models, first) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(len(libraries), pool_threads(), len(errors))
    """
).replace("POOL_THREADS\n", POOL_THREADS)


def test_three_loaded_models_share_one_thread_pool(tmp_path):
    """Each library carries the pool's code; the first one loaded lends its pool to the others:
    three models asking for two participants start one worker, not three."""
    env = {"KILN_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", POOL_SCRIPT], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    libraries, workers, errors = (int(v) for v in done.stdout.split())
    assert libraries == 3, "three distinct libraries loaded"
    assert workers == 1, f"{workers} pool workers for three models of two threads each (one pool: one worker)"
    assert errors == 0


LOADED_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import kiln
    from kiln.runtime import executable

    POOL_THREADS
    model = kiln.load(sys.argv[1], threads=2)
    ready = [e.requests.qsize() for e in model.executables()]
    workers = pool_threads()
    made = []
    original = executable._Request.__init__
    executable._Request.__init__ = lambda self, ex: (made.append(1), original(self, ex))[1]
    model.run({"x": np.ones((64, 64), np.float32)})
    print(workers, sum(ready), len(made))
    """
).replace("POOL_THREADS\n", POOL_THREADS)


def test_a_loaded_model_starts_its_workers_and_first_memory_at_load(tmp_path):
    """The first inference after ``kiln.load`` pays no thread starts and no first touch of its
    working memory: the pool's workers and one request's arena are made by the load."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counting the pool's threads reads /proc (Linux)")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    weights = {"w": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)}
    compiled = kiln.compile(make_model(nodes, [("x", F, [64, 64])], [("y", F, None)], weights), threads=2)
    compiled.save(tmp_path / "m.kiln")
    env = {"KILN_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", LOADED_SCRIPT, str(tmp_path / "m.kiln")],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    workers, ready, made = (int(v) for v in done.stdout.split())
    assert workers == 1, f"{workers} pool workers after loading a model of two threads (one expected)"
    assert ready == 1 and made == 0, (ready, made)


def test_the_native_entry_can_be_timed_alone_but_not_with_fallbacks():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [4, 8])], [("y", F, None)])
    compiled = kiln.compile(model, target="cpu")
    x = -np.ones((4, 8), np.float32)
    compiled(x)
    seconds = the_executable(compiled).native_seconds([x], 10)
    assert 0 < seconds < 1
    with_fallback = kiln.compile(fallback_between_segments(), target="cpu")
    with_fallback(np.ones((3, 8), np.float32))
    with pytest.raises(ValueError, match="no host fallback"):
        the_executable(with_fallback).native_seconds([np.ones((3, 8), np.float32)], 1)
