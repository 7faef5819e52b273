"""Fuzzing (hypothesis): random valid graphs compiled and compared with the reference; damaged
models must give clear kiln errors, never a crash or a hang.

CI runs a quick budget; ``KILN_FUZZ_EXAMPLES=2000 pytest tests/fuzz`` is the long local mode.
"""

import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError

EXAMPLES = int(os.environ.get("KILN_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

UNARY = ["Relu", "Tanh", "Sigmoid", "Abs", "Neg", "Exp", "Erf", "Softsign", "Floor"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@st.composite
def graphs(draw):
    """A chain of ops over one float input of random shape; constants random."""
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 9)) for _ in range(rank)]
    nodes, inits = [], {}
    current, current_shape = "x", list(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    for step in range(draw(st.integers(1, 6))):
        out = f"t{step}"
        kind = draw(st.sampled_from(["unary", "binary", "matmul", "transpose", "softmax", "reduce", "reshape"]))
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            if op == "Exp":  # keep values finite through chains
                nodes.append(helper.make_node("Tanh", [current], [out + "_in"]))
                current = out + "_in"
            nodes.append(helper.make_node(op, [current], [out]))
        elif kind == "binary":
            op = draw(st.sampled_from(BINARY))
            # a constant broadcastable to the current shape: some trailing dims, some of them 1
            keep = draw(st.integers(0, len(current_shape)))
            cshape = [d if draw(st.booleans()) else 1 for d in current_shape[len(current_shape) - keep :]]
            inits[f"c{step}"] = rng.standard_normal(cshape).astype(np.float32)
            operands = [current, f"c{step}"] if draw(st.booleans()) else [f"c{step}", current]
            nodes.append(helper.make_node(op, operands, [out]))
        elif kind == "matmul":
            if len(current_shape) < 2:
                continue
            n = draw(st.integers(1, 24))
            inits[f"w{step}"] = (rng.standard_normal((current_shape[-1], n)) / np.sqrt(current_shape[-1])).astype(
                np.float32
            )
            nodes.append(helper.make_node("MatMul", [current, f"w{step}"], [out]))
            current_shape = [*current_shape[:-1], n]
        elif kind == "transpose":
            perm = draw(st.permutations(list(range(len(current_shape)))))
            nodes.append(helper.make_node("Transpose", [current], [out], perm=list(perm)))
            current_shape = [current_shape[p] for p in perm]
        elif kind == "softmax":
            axis = draw(st.integers(-len(current_shape), len(current_shape) - 1))
            nodes.append(helper.make_node("Softmax", [current], [out], axis=axis))
        elif kind == "reduce":
            axis = draw(st.integers(0, len(current_shape) - 1))
            keepdims = draw(st.booleans()) or len(current_shape) == 1
            op = draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
            inits[f"a{step}"] = np.array([axis], np.int64)
            nodes.append(helper.make_node(op, [current, f"a{step}"], [out], keepdims=int(keepdims)))
            current_shape = (
                [1 if i == axis else d for i, d in enumerate(current_shape)]
                if keepdims
                else [d for i, d in enumerate(current_shape) if i != axis]
            )
        else:
            inits[f"s{step}"] = np.array([-1], np.int64)
            nodes.append(helper.make_node("Reshape", [current, f"s{step}"], [out]))
            current_shape = [int(np.prod(current_shape))]
        current = out
    if not nodes:
        nodes.append(helper.make_node("Relu", [current], ["t_final"]))
        current = "t_final"
    graph = helper.make_graph(
        nodes,
        "fuzz",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    x = rng.standard_normal(shape).astype(np.float32)
    return model, x


@FUZZ
@given(graphs())
def test_random_graphs_compile_and_match_the_reference(case):
    model, x = case
    want = kiln.compile(model, target="reference")(x)
    got = kiln.compile(model)(x)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5, err_msg=onnx.printer.to_text(model.graph))


def valid_model_bytes() -> bytes:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["y"], name="act"),
    ]
    weights = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weights],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


@FUZZ
@given(st.data())
def test_damaged_models_give_clear_errors(data):
    raw = bytearray(valid_model_bytes())
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]  # truncated
    else:
        for _ in range(data.draw(st.integers(1, 8))):  # flipped bytes
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        model = kiln.compile(bytes(raw))
    except KilnError as err:
        assert str(err)  # says something
        return
    # it still parsed as a model: running it must be right or a clear error too
    try:
        model(np.ones((2, 4), np.float32))
    except KilnError:
        pass


@pytest.mark.parametrize(
    "bad,expected",
    [
        (np.ones((2, 5), np.float32), "shape"),
        (np.ones((2, 4), np.float64), "dtype"),
        (np.ones((4,), np.float32), "rank"),
    ],
)
def test_wrong_inputs_are_named(bad, expected):
    model = kiln.compile(valid_model_bytes())
    with pytest.raises(KilnError, match="x"):
        model(bad)


def test_non_contiguous_and_nan_inputs_are_handled():
    model = kiln.compile(valid_model_bytes())
    base = np.arange(16, dtype=np.float32).reshape(4, 4)
    strided = base[::2]  # non-contiguous view, shape (2, 4)
    np.testing.assert_allclose(model(strided), np.maximum(strided @ np.ones((4, 3), np.float32), 0))
    nan = np.full((2, 4), np.nan, np.float32)
    assert np.isnan(model(nan)).all()  # NaN propagates (Relu keeps NaN, as the reference does)
    reference = kiln.compile(valid_model_bytes(), target="reference")
    for special in (np.inf, -np.inf):  # +inf sums stay inf; -inf through Relu gives 0; mixed gives NaN
        x = np.full((2, 4), special, np.float32)
        x[1, 0] = -special
        with np.errstate(invalid="ignore"):  # inf - inf in the reference's dot is the point
            np.testing.assert_array_equal(model(x), reference(x))
