import concurrent.futures

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.errors import InputError, KilnError
from tests.helpers import FLOAT, INT64, make_model


@pytest.fixture(scope="module", params=["cpu", "reference"])
def model(request):
    onnx_model = make_model(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["sum", "a"], ["prod"])],
        [("a", FLOAT, ["batch", 3]), ("b", FLOAT, ["batch", 3])],
        [("sum", FLOAT, None), ("prod", FLOAT, None)],
    )
    return kiln.compile(onnx_model, target=request.param)


def test_run_call_and_submit_agree(model):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 3), np.float32)
    out = model.run({"a": a, "b": b})
    assert list(out) == ["sum", "prod"]
    np.testing.assert_array_equal(out["sum"], a + b)
    np.testing.assert_array_equal(out["prod"], (a + b) * a)
    total, product = model(a, b)
    np.testing.assert_array_equal(total, out["sum"])
    np.testing.assert_array_equal(product, out["prod"])
    np.testing.assert_array_equal(model(a, b=b)[0], out["sum"])
    future = model.submit({"a": a, "b": b})
    assert isinstance(future, concurrent.futures.Future)
    np.testing.assert_array_equal(future.result(timeout=30)["prod"], out["prod"])


def test_many_requests_in_flight_give_independent_results(model):
    rng = np.random.default_rng(0)
    feeds = [
        {"a": rng.standard_normal((4, 3), dtype=np.float32), "b": rng.standard_normal((4, 3), dtype=np.float32)}
        for _ in range(16)
    ]
    futures = [model.submit(f) for f in feeds]
    for f, future in zip(feeds, futures):
        np.testing.assert_allclose(future.result(timeout=60)["prod"], (f["a"] + f["b"]) * f["a"], rtol=1e-6)


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"a": np.ones((2, 3), np.float32)}, "missing input\\(s\\) \\['b'\\]; the model's inputs are \\['a', 'b'\\]"),
        (
            {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32), "c": 1},
            "unknown input\\(s\\) \\['c'\\]",
        ),
        (
            {"a": np.ones((2, 3), np.float64), "b": np.ones((2, 3), np.float32)},
            "input 'a': expected dtype f32 .*got float64",
        ),
        (
            {"a": np.ones((2, 4), np.float32), "b": np.ones((2, 4), np.float32)},
            "input 'a': expected shape f32\\[batch,3\\], got \\[2, 4\\] \\(axis 1\\)",
        ),
        ({"a": np.ones((3,), np.float32), "b": np.ones((2, 3), np.float32)}, "input 'a': expected rank 2"),
        (
            {"a": np.ones((2, 3), np.float32), "b": np.ones((5, 3), np.float32)},
            "input 'b': dim 'batch' is 5 on axis 0 but 2 in an earlier input",
        ),
        ({"a": "text", "b": np.ones((2, 3), np.float32)}, "input 'a': expected an array"),
    ],
)
def test_wrong_inputs_are_clear_errors(model, feeds, message):
    with pytest.raises(InputError, match=message):
        model.run(feeds)
    with pytest.raises(InputError, match=message):
        model.submit(feeds)  # checked before anything is queued


def test_too_many_positional_inputs(model):
    x = np.ones((1, 3), np.float32)
    with pytest.raises(InputError, match="takes 2 inputs, got 3"):
        model(x, x, x)


def test_unknown_target_lists_the_available_ones():
    onnx_model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2])], [("y", FLOAT, None)])
    with pytest.raises(
        KilnError, match="unknown target 'gpu9'; available targets: cpu, cpu:avx512, cpu:avx2, .*reference"
    ):
        kiln.compile(onnx_model, target="gpu9")


@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_execution_errors_name_the_node(target):
    # Gather with an index out of range only fails at run time; the error names the node.
    onnx_model = make_model(
        [helper.make_node("Gather", ["table", "i"], ["y"], name="lookup", axis=0)],
        [("i", INT64, [2])],
        [("y", FLOAT, None)],
        {"table": np.ones((3, 2), np.float32)},
    )
    compiled = kiln.compile(onnx_model, target=target)
    with pytest.raises(kiln.ExecutionError, match="node 'lookup' \\(Gather\\)"):
        compiled(np.array([0, 7]))


def test_a_size_that_cannot_compile_is_an_error_naming_its_binding_while_others_run():
    """One binding of a symbolic dim may fail where others run (an exporter's reshape to [2, -1]):
    the error names the binding, and the sizes that work keep working."""
    graph = make_model(
        [helper.make_node("Reshape", ["x", "t"], ["y"])],
        [("x", FLOAT, ["batch", 3])],
        [("y", FLOAT, None)],
        {"t": np.array([2, -1], np.int64)},
    )
    compiled = kiln.compile(graph)
    assert compiled.run({"x": np.ones((4, 3), np.float32)})["y"].shape == (2, 6)
    with pytest.raises(KilnError, match=r"3 elements into a multiple of 2 \(compiling for batch=1\)"):
        compiled.run({"x": np.ones((1, 3), np.float32)})
    assert compiled.run({"x": np.ones((2, 3), np.float32)})["y"].shape == (2, 3)
