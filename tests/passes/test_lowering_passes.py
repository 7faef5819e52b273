"""Passes that serve the native path: decomposition, half widening, value specialization."""

import numpy as np
from onnx import TensorProto, helper

import kiln
from kiln.frontend.onnx import import_onnx
from kiln.ops.interpreter import Interpreter
from kiln.passes.decompose import decompose
from kiln.passes.widen_half import widen_half
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(0)


def test_decompose_inlines_the_onnx_function_and_keeps_semantics():
    model = make_model(
        [helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-1)],
        [("x", FLOAT, [2, 8])],
        [("y", FLOAT, None)],
        {"s": RNG.standard_normal(8).astype(np.float32)},
        opset=23,
    )
    graph = import_onnx(model)
    decomposed = decompose(graph, keep=lambda node: False)
    assert "RMSNormalization" not in {n.op for n in decomposed.nodes}
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(decomposed).run([x])[0], Interpreter(graph).run([x])[0], rtol=1e-5)
    compiled = kiln.compile(model, target="cpu")
    assert compiled.is_native
    np.testing.assert_allclose(compiled(x), kiln.compile(model, target="reference")(x), rtol=1e-5)


def test_widen_half_runs_matmul_in_float32_between_casts():
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [("a", TensorProto.FLOAT16, [4, 6]), ("b", TensorProto.FLOAT16, [6, 3])],
        [("y", TensorProto.FLOAT16, None)],
    )
    widened = widen_half(import_onnx(model))
    assert [n.op for n in widened.nodes] == ["Cast", "Cast", "MatMul", "Cast"]
    a, b = RNG.standard_normal((4, 6)).astype(np.float16), RNG.standard_normal((6, 3)).astype(np.float16)
    compiled = kiln.compile(model, target="cpu")
    assert compiled.is_native
    np.testing.assert_allclose(
        compiled(a, b).astype(np.float32), (a.astype(np.float32) @ b.astype(np.float32)), rtol=2e-3, atol=2e-3
    )


def test_small_shape_inputs_are_specialized_by_value():
    # Range's length depends on the input's value: compiled once per value, natively.
    model = make_model(
        [helper.make_node("Range", ["start", "limit", "delta"], ["r"]), helper.make_node("Mul", ["r", "r"], ["y"])],
        [("start", TensorProto.INT64, []), ("limit", TensorProto.INT64, []), ("delta", TensorProto.INT64, [])],
        [("y", TensorProto.INT64, None)],
    )
    compiled = kiln.compile(model, target="cpu")
    for limit in (5, 9):
        got = compiled(np.array(1), np.array(limit), np.array(2))
        np.testing.assert_array_equal(got, np.arange(1, limit, 2) ** 2)
    assert compiled.is_native
