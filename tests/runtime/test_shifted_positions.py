"""Positions shifted by a slice (kiln.passes.padding_shifts): ``ids[:, :-1]`` copied one position
to the right behind a start token (an encoder-decoder's "shift tokens right", in the spellings
the exporters write) pads like any other value, so every length runs on what kiln.compile made;
shifted values that would be cut or masked at the wrong length refuse the length instead."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.driver.variants import plans_compiled
from kiln.frontend.onnx import import_onnx
from kiln.passes.padding import Padding, paddable
from tests.helpers import FLOAT, make_model

INT64 = onnx.TensorProto.INT64
WIDTH, VOCAB, START = 4, 11, 7
LENGTHS = (1, 2, 5, 9, 16)


def constants() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "table": rng.standard_normal((VOCAB, WIDTH)).astype(np.float32),
        "zero": np.array([0], np.int64),
        "zero_scalar": np.array(0, np.int64),
        "one": np.array([1], np.int64),
        "one_scalar": np.array(1, np.int64),
        "minus_one": np.array([-1], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "start": np.array([[START]], np.int64),
    }


def embedded(shifted: str) -> list:
    """The shifted ids looked up in a table, then a softmax over the positions (masks must reach
    it: the length is padded)."""
    return [
        helper.make_node("Gather", ["table", shifted], ["e"]),
        helper.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["e", "et"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "e"], ["y"]),
    ]


def dynamo_shift() -> onnx.ModelProto:
    """The dynamo exporter's spelling: a ScatterND of ``ids[:, :-1]`` (transposed) at the
    positions ``arange(seq)[1:]`` into zeros, then a ScatterElements of the start token at 0."""
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node(
            "ConstantOfShape", ["shape"], ["zeros"], value=onnx.numpy_helper.from_array(np.zeros(1, np.int64))
        ),
        helper.make_node("Slice", ["ids", "zero", "minus_one", "one", "one"], ["head"]),
        helper.make_node("Gather", ["shape", "one_scalar"], ["length"], axis=0),
        helper.make_node("Range", ["zero_scalar", "length", "one_scalar"], ["positions"]),
        helper.make_node("Slice", ["positions", "one", "end", "zero", "one"], ["after_first"]),
        helper.make_node("Unsqueeze", ["after_first", "minus_one"], ["where"]),
        helper.make_node("Transpose", ["head"], ["head_t"], perm=[1, 0]),
        helper.make_node("Transpose", ["zeros"], ["zeros_t"], perm=[1, 0]),
        helper.make_node("ScatterND", ["zeros_t", "where", "head_t"], ["scattered_t"]),
        helper.make_node("Transpose", ["scattered_t"], ["scattered"], perm=[1, 0]),
        helper.make_node("Shape", ["ids"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "one"], ["column"], axis=0),
        helper.make_node("Expand", ["zero", "column"], ["at_zero"]),
        helper.make_node("Expand", ["start", "column"], ["starts"]),
        helper.make_node("ScatterElements", ["scattered", "at_zero", "starts"], ["shifted"], axis=1),
        *embedded("shifted"),
    ]
    return make_model(nodes, [("ids", INT64, ["batch", "seq"])], [("y", FLOAT, ["batch", "seq", WIDTH])], constants())


def concat_shift() -> onnx.ModelProto:
    """``cat([start, ids[:, :-1]], 1)``: one constant column, then the shifted ids."""
    nodes = [
        helper.make_node("Slice", ["ids", "zero", "minus_one", "one", "one"], ["head"]),
        helper.make_node("Shape", ["ids"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "one"], ["column"], axis=0),
        helper.make_node("Expand", ["start", "column"], ["starts"]),
        helper.make_node("Concat", ["starts", "head"], ["shifted"], axis=1),
        *embedded("shifted"),
    ]
    return make_model(nodes, [("ids", INT64, ["batch", "seq"])], [("y", FLOAT, ["batch", "seq", WIDTH])], constants())


def runs_every_length_on_one_compile(model: onnx.ModelProto) -> None:
    import onnxruntime

    compiled = kiln.compile(model, dims={"batch": 3, "seq": f"1..{max(LENGTHS)}"})
    before = plans_compiled()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in LENGTHS:
        ids = np.random.default_rng(length).integers(0, VOCAB, size=(3, length), dtype=np.int64)
        want = session.run(None, {"ids": ids})[0]
        np.testing.assert_allclose(compiled.run({"ids": ids})["y"], want, rtol=1e-5, atol=1e-6)
    assert plans_compiled() == before, "a length compiled after kiln.compile returned"


@pytest.mark.parametrize("spelling", [dynamo_shift, concat_shift], ids=["scatter", "concat"])
def test_tokens_shifted_right_behind_a_start_token_pad_and_run_every_length(spelling):
    pytest.importorskip("onnxruntime", reason="the lengths are checked against onnxruntime")
    model = spelling()
    found = paddable(import_onnx(model), "seq")
    assert isinstance(found, Padding), found  # before: "slices the padded dim at positions not valid ..."
    runs_every_length_on_one_compile(model)


def shifted_model(nodes: list, output: str = "y") -> onnx.ModelProto:
    return make_model(nodes, [("x", FLOAT, ["batch", "seq", WIDTH])], [(output, FLOAT, None)], constants(), opset=18)


def test_a_sum_over_all_but_the_last_position_is_no_prefix_of_constant_length():
    """``x[:, :-1].sum(1)`` reads positions up to the length: it must not pass for a prefix every
    length has (an end of -1 counts from the end; before, it was taken for 'a prefix below the
    low end' and the padded run summed garbage), and the length then compiles per size, right."""
    pytest.importorskip("onnxruntime", reason="the lengths are checked against onnxruntime")
    nodes = [
        helper.make_node("Slice", ["x", "zero", "minus_one", "one", "one"], ["head"]),
        helper.make_node("ReduceSum", ["head", "one"], ["y"], keepdims=0),
    ]
    model = shifted_model(nodes)
    found = paddable(import_onnx(model), "seq")
    assert not isinstance(found, Padding) and "shifted" in str(found), found
    import onnxruntime

    compiled = kiln.compile(model, dims={"batch": 2, "seq": "2..12"})
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in (2, 5, 12):
        x = np.random.default_rng(length).standard_normal((2, length, WIDTH)).astype(np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_shifted_positions_returned_or_scattered_short_of_the_end_are_refused():
    """Differences of neighbours returned (cut at the length they would be cut wrong), and a
    shifted copy written at positions that stop before the end: each refuses, naming the node."""
    differences = [
        helper.make_node("Slice", ["x", "one", "end", "one", "one"], ["tail"]),
        helper.make_node("Slice", ["x", "zero", "minus_one", "one", "one"], ["head"]),
        helper.make_node("Sub", ["tail", "head"], ["y"]),
    ]
    assert "cannot cut off" in str(paddable(import_onnx(shifted_model(differences)), "seq"))
    short = [  # x[:, 1:] written at positions 0.. of zeros: the last position keeps a zero at L, not at E
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
        helper.make_node("Slice", ["x", "one", "end", "one", "one"], ["tail"]),
        helper.make_node("Gather", ["shape", "one_scalar"], ["length"], axis=0),
        helper.make_node("Range", ["zero_scalar", "length", "one_scalar"], ["positions"]),
        helper.make_node("Slice", ["positions", "zero", "minus_one", "zero", "one"], ["before_last"]),
        helper.make_node("Unsqueeze", ["before_last", "minus_one"], ["where"]),
        helper.make_node("Transpose", ["tail"], ["tail_t"], perm=[1, 0, 2]),
        helper.make_node("Transpose", ["zeros"], ["zeros_t"], perm=[1, 0, 2]),
        helper.make_node("ScatterND", ["zeros_t", "where", "tail_t"], ["y"]),
    ]
    found = paddable(import_onnx(shifted_model(short)), "seq")
    assert not isinstance(found, Padding) and "ScatterND" in str(found), found


def test_a_cut_longer_than_the_shortest_length_is_refused():
    """``cat([start, start], ids[:, :-2])`` is the run's length only where the length is at least 2
    (at 1, ``ids[:, :-2]`` is empty, not one shorter than nothing): padded when the range starts at
    2, refused when it starts at 1."""
    nodes = [
        helper.make_node("Slice", ["ids", "zero", "minus_two", "one", "one"], ["head"]),
        helper.make_node("Shape", ["ids"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "two"], ["columns"], axis=0),
        helper.make_node("Expand", ["start", "columns"], ["starts"]),
        helper.make_node("Concat", ["starts", "head"], ["shifted"], axis=1),
        *embedded("shifted"),
    ]
    weights = {**constants(), "minus_two": np.array([-2], np.int64), "two": np.array([2], np.int64)}
    graph = import_onnx(
        make_model(nodes, [("ids", INT64, ["batch", "seq"])], [("y", FLOAT, ["batch", "seq", WIDTH])], weights)
    )
    assert isinstance(paddable(graph, "seq", low=2), Padding)
    assert not isinstance(paddable(graph, "seq", low=1), Padding)
