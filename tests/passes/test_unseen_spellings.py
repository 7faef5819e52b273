"""Spellings found in architectures kiln's suite did not have (issue 49's probes of Falcon, GPT-J,
Swin and SegFormer exports): a head picked from a fused QKV by constant index tuples, positions
tiled along the rotary pairs, a window's pad computed from the image size, a view whose target
mixes the count with sizes computed from the image. Each keeps the batch sample-parallel and the
length paddable, and runs every size on what kiln.compile made, matching onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.driver.variants import plans_compiled
from kiln.frontend.onnx import import_onnx
from kiln.passes.batching import Parallel, sample_parallel
from kiln.passes.padding import Padding, paddable
from tests.helpers import FLOAT, make_model

onnxruntime = pytest.importorskip("onnxruntime", reason="the sizes are checked against onnxruntime")

INT64 = onnx.TensorProto.INT64


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def attention_tail(source: str) -> list:
    """Scores of ``source`` [.., seq, d] with itself, a softmax over the keys, the values: a length
    that pads needs its masks here."""
    return [
        helper.make_node("Transpose", [source], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", [source, "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", source], ["y"]),
    ]


def fused_heads() -> onnx.ModelProto:
    """Falcon's multi-query split: the fused projection viewed as 6 heads, heads moved in front,
    the key head picked by ``GatherND(heads, [[4]])``."""
    weights = {"shape": ints(0, 0, 6, 4), "pick": ints(4).reshape(1, 1)}
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["front"], perm=[2, 0, 1, 3]),  # [6, batch, seq, 4]
        helper.make_node("GatherND", ["front", "pick"], ["key"]),  # [1, batch, seq, 4]
        *attention_tail("key"),
    ]
    return make_model(nodes, [("x", FLOAT, ["batch", "seq", 24])], [("y", FLOAT, None)], weights, opset=18)


def tiled_positions() -> onnx.ModelProto:
    """GPT-J's rotary angles: positions unsqueezed and tiled along the pairs (a repeat of 1 along
    the length), a sine added to the features."""
    weights = {"zero": ints(0)[0], "one": ints(1)[0], "last": ints(-1), "repeats": ints(1, 4), "axes": ints(0, 1)}
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=2, end=3),
        helper.make_node("Squeeze", ["shape"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "last"], ["column"]),  # [seq, 1]
        helper.make_node("Tile", ["column", "repeats"], ["tiled"]),  # [seq, 4]
        helper.make_node("Cast", ["tiled"], ["angles"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Sin", ["angles"], ["sines"]),
        helper.make_node("Add", ["x", "sines"], ["rotated"]),
        *attention_tail("rotated"),
    ]
    return make_model(nodes, [("x", FLOAT, ["batch", 1, "seq", 4])], [("y", FLOAT, None)], weights, opset=18)


def runs_every_size(model: onnx.ModelProto, dims: dict, sizes: list[tuple[int, ...]], shape) -> None:  # type: ignore[no-untyped-def]
    compiled = kiln.compile(model, dims=dims)
    before = plans_compiled()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in sizes:
        x = np.random.default_rng(sum(size)).standard_normal(shape(*size)).astype(np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert plans_compiled() == before, "a size compiled after kiln.compile returned"


def test_a_head_picked_by_constant_index_tuples_keeps_the_batch_and_the_length():
    """Before: 'GatherND: an op kiln cannot tell the per-sample (positional) behaviour of', a
    compile per batch and per length."""
    graph = import_onnx(fused_heads())
    assert isinstance(sample_parallel(graph)["batch"], Parallel)
    assert isinstance(paddable(graph, "seq"), Padding), paddable(graph, "seq")
    sizes = [(1, 1), (3, 7), (4, 16), (2, 11)]
    runs_every_size(fused_heads(), {"batch": "1..4", "seq": "1..16"}, sizes, lambda b, s: (b, s, 24))


def test_positions_tiled_along_other_dims_pad():
    """Before: 'Tile: an op kiln cannot tell the positional behaviour of', a compile per length."""
    graph = import_onnx(tiled_positions())
    assert isinstance(paddable(graph, "seq"), Padding), paddable(graph, "seq")
    runs_every_size(tiled_positions(), {"batch": 2, "seq": "1..16"}, [(1,), (6,), (16,), (9,)], lambda s: (2, 1, s, 4))


def windows_padded() -> onnx.ModelProto:
    """Swin's window padding: the plane padded at its end up to a multiple of 4, the amounts
    computed from the image's size (no constant to read), then a view by the padded value's own
    count (``x.view(Shape(padded)[0], -1)``) and a linear layer."""
    weights = {
        "four": ints(4),
        "zeros": ints(0, 0),
        "two": ints(2),
        "three": ints(3),
        "flat": ints(-1),
        "w": np.random.default_rng(1).standard_normal((1, 3)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["h"], axis=0),
        helper.make_node("Gather", ["shape", "three"], ["w_size"], axis=0),
        helper.make_node("Sub", ["four", "h"], ["h_rest"]),
        helper.make_node("Mod", ["h_rest", "four"], ["pad_h"]),
        helper.make_node("Sub", ["four", "w_size"], ["w_rest"]),
        helper.make_node("Mod", ["w_rest", "four"], ["pad_w"]),
        helper.make_node("Concat", ["zeros", "zeros", "zeros", "pad_h", "pad_w"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"]),
        helper.make_node("ReduceMean", ["padded", "flat"], ["pooled"], keepdims=1),  # [batch, 4, h', 1]
        helper.make_node("Shape", ["padded"], ["count"], start=0, end=1),
        helper.make_node("Concat", ["count", "flat"], ["target"], axis=0),
        helper.make_node("Reshape", ["pooled", "target"], ["rows"]),  # [batch, 4 * h']
        helper.make_node("ReduceSum", ["rows", "flat"], ["total"], keepdims=1),
        helper.make_node("MatMul", ["total", "w"], ["y"]),
    ]
    return make_model(nodes, [("x", FLOAT, ["batch", 4, "h", "w"])], [("y", FLOAT, None)], weights, opset=18)


def test_a_pad_computed_from_the_image_size_keeps_the_batch_sample_parallel():
    """Before: 'Pad: dims kiln cannot read at compile time' (then its output's fresh dims lost the
    batch): a compile per batch size."""
    model = windows_padded()
    found = sample_parallel(import_onnx(model))["batch"]
    assert isinstance(found, Parallel), found
    runs_every_size(model, {"batch": "1..8", "h": 7, "w": 5}, [(1,), (8,), (3,), (5,)], lambda b: (b, 4, 7, 5))


def viewed_by_computed_sizes() -> onnx.ModelProto:
    """SegFormer's patch embedding as the dynamo exporter writes it: a stride-2 convolution viewed
    as ``[count, 4, oh * ow]`` with ``oh``, ``ow`` scalars computed from the image's size by floor
    division and a ceiling through floats (contents inference cannot name), the count a slice of the input's shape."""
    rng = np.random.default_rng(2)
    weights = {
        "kernel": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "two": np.array(2, np.int64),
        "three": np.array(3, np.int64),
        "one": np.array(1, np.int64),
        "half": np.array(2.0, np.float32),
        "four": ints(4),
        "flat": ints(-1),
    }
    nodes = [
        helper.make_node("Conv", ["x", "kernel"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["x"], ["count"], start=0, end=1),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["h"], axis=0),  # scalars, as dynamo's sym ints
        helper.make_node("Gather", ["shape", "three"], ["w"], axis=0),
        helper.make_node("Add", ["h", "one"], ["h1"]),
        helper.make_node("Div", ["h1", "two"], ["oh"]),
        helper.make_node("Cast", ["w"], ["wf"], to=onnx.TensorProto.FLOAT),  # ceil(w / 2) through floats
        helper.make_node("Div", ["wf", "half"], ["w2"]),
        helper.make_node("Ceil", ["w2"], ["w3"]),
        helper.make_node("Cast", ["w3"], ["ow"], to=INT64),
        helper.make_node("Mul", ["oh", "ow"], ["plane"]),
        helper.make_node("Reshape", ["plane", "flat"], ["plane1"]),
        helper.make_node("Concat", ["count", "four", "plane1"], ["target"], axis=0),
        helper.make_node("Reshape", ["c", "target"], ["viewed"]),
        helper.make_node("Softmax", ["viewed"], ["y"], axis=-1),
    ]
    return make_model(nodes, [("x", FLOAT, ["batch", 3, "h", "w"])], [("y", FLOAT, None)], weights, opset=18)


def test_a_view_whose_target_mixes_the_count_with_computed_sizes_keeps_the_batch():
    """Before: the target's unknown piece made every dim of the view a fresh one (the count's name
    lost): 'Reshape: a reshape that moves elements across the samples' dim', a compile per batch."""
    model = viewed_by_computed_sizes()
    found = sample_parallel(import_onnx(model))["batch"]
    assert isinstance(found, Parallel), found
    runs_every_size(model, {"batch": "1..8", "h": 9, "w": 6}, [(1,), (8,), (3,), (6,)], lambda b: (b, 3, 9, 6))
