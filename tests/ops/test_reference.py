"""kiln's own reference implementations (where onnx's is missing or wrong), against NumPy."""

import numpy as np
import pytest

from kiln.ir.graph import Node, Value
from kiln.ir.types import DType, OptionalType, TensorType, tensor
from kiln.ops.interpreter import evaluate_node

F = DType.FLOAT32


def test_gather_elements_beyond_32_choices_and_negative_indices():
    # onnx's version uses np.choose, which is limited to 32 choices along the axis.
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2, 512)).astype(np.float32)
    indices = rng.integers(-512, 512, size=(2, 128)).astype(np.int64)
    node = Node(
        "GatherElements",
        [Value("d", tensor(F, 2, 512)), Value("i", tensor(DType.INT64, 2, 128))],
        [Value("o", tensor(F, 2, 128))],
        {"axis": 1},
    )
    (result,) = evaluate_node(node, [data, indices])
    expected = np.take_along_axis(data, np.where(indices < 0, indices + 512, indices), axis=1)
    np.testing.assert_array_equal(result, expected)
    with pytest.raises(IndexError, match="out of range"):
        evaluate_node(node, [data, np.full((2, 128), 600, np.int64)])


def test_optional_wraps_sequences_without_nesting():
    seq_type = OptionalType(TensorType(F, (3,)))
    node = Node("Optional", [Value("s", tensor(F, 3))], [Value("o", seq_type)])
    value = [np.ones(3, np.float32)]
    assert evaluate_node(node, [value])[0] is value
    has = Node("OptionalHasElement", [Value("o", seq_type)], [Value("b", tensor(DType.BOOL))])
    assert evaluate_node(has, [None])[0] == np.array(False)
    assert evaluate_node(has, [value])[0] == np.array(True)


@pytest.mark.parametrize(
    "op,pads,expected",
    [
        ("MaxPool", [1, 0, 0, 0], [[1, 2], [4, 5]]),
        ("MaxPool", [0, 1, 0, 0], [[3, 4, 5]]),  # onnx's reference (1.23) gives [[4, 5], [4, 5]]
        ("MaxPool", [0, 0, 1, 0], [[4, 5], [4, 5]]),
        ("AveragePool", [0, 1, 0, 0], [[1.5, 2, 3]]),
        ("AveragePool", [0, 0, 0, 1], [[2, 3, 3.5]]),
    ],
)
def test_pooling_reference_reads_asymmetric_pads_in_onnx_order(op, pads, expected):
    # pads are [top, left, bottom, right]; x = [[0, 1, 2], [3, 4, 5]], 2x2 windows, stride 1
    from onnx import TensorProto, helper

    import kiln

    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], kernel_shape=[2, 2], pads=pads)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    for target in ("reference", "cpu"):
        np.testing.assert_allclose(kiln.compile(model, target=target)(x)[0, 0], np.array(expected, np.float32))
