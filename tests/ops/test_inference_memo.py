"""Inference and constant folding remember results by what they read; these check that what
they remember never answers for a node that differs in anything inference or evaluation reads."""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node, Value
from kiln.ir.types import DType, TensorType
from kiln.ops import inference
from kiln.ops.inference import infer_node
from kiln.passes import fold_constants

F32 = DType.FLOAT32
I64 = DType.INT64


def _reshape(name: str, target: list[int]) -> tuple[Node, list, list]:
    data = Value(f"{name}_x", TensorType(F32, (2, 6)))
    shape = Value(f"{name}_s", TensorType(I64, (len(target),)))
    node = Node("Reshape", (data, shape), (Value(f"{name}_y", TensorType(F32, None)),), name=name)
    return node, [data.type, shape.type], [None, np.array(target, np.int64)]


def test_a_remembered_type_is_for_the_same_known_values_only():
    for target, want in (([3, 4], (3, 4)), ([4, 3], (4, 3)), ([3, 4], (3, 4)), ([12], (12,))):
        node, types, known = _reshape("r", target)
        got, _ = infer_node(node, types, known, [None, None])
        assert got[0].shape == want


def test_fresh_symbols_are_named_for_each_node():
    """NonZero's count is a new symbol named after its output: never another node's."""
    names = []
    for name in ("first", "second"):
        x = Value(f"{name}_x", TensorType(F32, (4,)))
        node = Node("NonZero", (x,), (Value(name, TensorType(I64, None)),), name=name)
        got, _ = infer_node(node, [x.type], [None], [None])
        names.append(got[0].shape[1])
    assert names[0] != names[1] and names[0].startswith("first") and names[1].startswith("second")


def test_a_large_value_read_by_inference_is_never_part_of_a_remembered_answer():
    """A Reshape whose target is larger than the key keeps (SMALL_VALUE elements) is inferred
    every time: two targets of equal length but different contents get their own shapes."""
    size = inference.SMALL_VALUE + 1
    first = [1] * (size - 1) + [6]
    second = [1] * (size - 2) + [2, 3]
    (a, ta, ka), (b, tb, kb) = _reshape("a", first), _reshape("b", second)
    x = Value("x", TensorType(F32, (6,)))
    got_a, _ = infer_node(a, [x.type, ta[1]], ka, [None, None])
    got_b, _ = infer_node(b, [x.type, tb[1]], kb, [None, None])
    assert got_a[0].shape[-1] == 6 and got_b[0].shape[-2:] == (2, 3)


def test_folding_remembers_by_exact_values_and_attributes():
    """Two Constants differing only in the sign of zero, and two Adds of equal-looking inputs of
    different dtypes, fold to their own values."""
    keys = set()
    for value in (0.0, -0.0):
        node = Node("Constant", (), (Value("c", TensorType(F32, ())),), {"value_float": value})
        keys.add(fold_constants._evaluation_key(node, []))
    assert len(keys) == 2
    for dtype in (np.int64, np.int32):
        a = np.array([1, 2], dtype)
        node = Node(
            "Add",
            (Value("a", TensorType(DType.from_numpy(a.dtype), (2,))),) * 2,
            (Value("y", TensorType(DType.from_numpy(a.dtype), (2,))),),
        )
        keys.add(fold_constants._evaluation_key(node, [a, a]))
    assert len(keys) == 4
