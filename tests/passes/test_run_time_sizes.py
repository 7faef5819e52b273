"""A decode step's sizes used as data (a position table row gathered at the cache's length, a
causal mask over ``Range(0, past+1)``, a flattened mask read at positions) are computed from the
dims vector at run time (kiln.passes.run_time_sizes): one compile serves every past length in
the declared range, where each folded to constants that differ per length (issue 49's class,
issue 52's prerequisite: before, one compile per generated token)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.driver import spatial
from kiln.driver.variants import plans_compiled
from kiln.frontend.onnx import import_onnx
from kiln.ir.graph import Value
from kiln.ir.types import DType, TensorType
from kiln.passes.run_time_sizes import SUFFIX, read_at_run_time
from tests.helpers import FLOAT, INT64, make_model

onnxruntime = pytest.importorskip("onnxruntime", reason="the runs are checked against onnxruntime")
WIDTH = 8


def decode_step() -> bytes:
    """One new token [1, 1, 8] attending over a cache [1, past, 8] joined with it (present:
    [1, past+1, 8]); its position embedding is the table's row ``past`` (read from the cache's
    shape, as the exporters spell it), its mask the causal LessOrEqual of Range(0, past+1)
    against that position and the user's mask [1, total] flattened and gathered at the range."""
    rng = np.random.default_rng(5)
    weights = {
        "table": rng.standard_normal((64, WIDTH)).astype(np.float32),
        "axis1": np.array(1, np.int64),
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
        "axes0": np.array([0], np.int64),
        "flat": np.array([-1], np.int64),
        "no": np.array(-1e9, np.float32),
        "yes": np.array(0.0, np.float32),
    }
    nodes = [
        helper.make_node("Concat", ["past", "x"], ["present"], axis=1),
        helper.make_node("Shape", ["past"], ["past_shape"]),
        helper.make_node("Gather", ["past_shape", "axis1"], ["position"], axis=0),
        helper.make_node("Unsqueeze", ["position", "axes0"], ["position1"]),
        helper.make_node("Gather", ["table", "position1"], ["row"], axis=0),
        helper.make_node("Add", ["x", "row"], ["h"]),
        helper.make_node("Transpose", ["present"], ["keys"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "keys"], ["scores"]),
        helper.make_node("Add", ["position", "one"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("LessOrEqual", ["positions", "position"], ["causal"]),
        helper.make_node("Reshape", ["mask", "flat"], ["mask_flat"]),
        helper.make_node("Gather", ["mask_flat", "positions"], ["mask_read"], axis=0),
        helper.make_node("Cast", ["mask_read"], ["mask_bool"], to=9),
        helper.make_node("And", ["causal", "mask_bool"], ["allowed"]),
        helper.make_node("Where", ["allowed", "yes", "no"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "present"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", FLOAT, [1, 1, WIDTH]), ("past", FLOAT, [1, "past", WIDTH]), ("mask", INT64, [1, "total"])],
        [("y", FLOAT, [1, 1, WIDTH]), ("present", FLOAT, [1, "total", WIDTH])],
        weights,
    )
    return model.SerializeToString()


def feeds(past: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + past)
    mask = np.ones((1, past + 1), np.int64)
    mask[0, : past // 3] = 0  # padding on the left, as a batch of prompts of different lengths has
    return {
        "x": rng.standard_normal((1, 1, WIDTH)).astype(np.float32),
        "past": rng.standard_normal((1, past, WIDTH)).astype(np.float32),
        "mask": mask,
    }


def test_a_decode_step_takes_the_past_length_at_run_time(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    path = tmp_path / "step.onnx"
    path.write_bytes(decode_step())
    model = kiln.compile(str(path), dims={"past": "1..40", "total": "2..41"})
    assert not model.run_time_refused, model.run_time_refused
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    compiled = plans_compiled()
    for past in (1, 2, 17, 40, 23):
        inputs = feeds(past)
        got = model.run(inputs)
        want = session.run(None, inputs)
        for name, expected in zip(("y", "present"), want):
            np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-5, err_msg=f"{name} at past {past}")
        assert model.route.name == "run-time sizes", model.route
    assert plans_compiled() == compiled, "a past length compiled after kiln.compile returned"


def test_present_is_typed_past_plus_one():
    """Concat sums its pieces' sizes: the cache joined with one token is ``past+1`` (a fresh
    symbol before, unrelated to ``past``)."""
    graph = import_onnx(decode_step())
    present = next(v for node in graph.nodes for v in node.outputs if v.name == "present")
    assert present.type.shape == (1, "past+1", WIDTH)


def test_only_sizes_read_as_data_are_copied():
    """The row gather, the causal comparison and the mask's gather read the copies (from the dims
    vector); the Range's bounds and the Reshape's target keep the folded sizes."""
    graph = import_onnx(decode_step())
    names = spatial.graph_symbols(graph)
    vector = Value(spatial.DIMS_INPUT, TensorType(DType.INT64, (len(names),)))
    rewritten = read_at_run_time(graph.with_(inputs=[*graph.inputs, vector]), vector, names)
    producer = {out.name: node for node in rewritten.nodes for out in node.outputs}
    h = producer["h"]  # the first node that reads the row with the token: it reads the copy
    assert h.inputs[1].name == "row" + SUFFIX, h.inputs
    assert producer["row" + SUFFIX].inputs[1].name == "position1" + SUFFIX
    causal = producer["allowed"].inputs[0]  # the causal mask the user's mask joins: a copy
    assert causal.name == "causal" + SUFFIX, causal
    assert producer[causal.name].inputs[0].name == "positions", "a Range over folded bounds is not copied"
    assert producer["positions"].inputs[1].name == "length", "a Range's bounds are structure: they keep folding"
    assert producer["mask_read"].inputs[1].name == "positions"
    assert producer["mask_flat"].inputs[1].name == "flat"
    assert any(node.op == "Gather" and node.inputs[0] is vector for node in rewritten.nodes)


def test_a_graph_whose_sizes_only_shape_it_is_unchanged():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Reshape", ["x", "s"], ["y"]),
    ]
    proto = make_model(nodes, [("x", FLOAT, ["n", 4])], [("y", FLOAT, ["n", 4])])
    graph = import_onnx(proto.SerializeToString())
    vector = Value(spatial.DIMS_INPUT, TensorType(DType.INT64, (1,)))
    given = graph.with_(inputs=[*graph.inputs, vector])
    assert read_at_run_time(given, vector, ("n",)) is given


def test_a_size_scaling_data_is_read_from_the_dims_vector(tmp_path, monkeypatch):
    """``x * Size(x)`` (rank 3: the element count, a product of a dim and numbers) runs on one
    compile at every length, matching onnxruntime."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    nodes = [
        helper.make_node("Size", ["x"], ["count"]),
        helper.make_node("Cast", ["count"], ["scale"], to=1),
        helper.make_node("Mul", ["x", "scale"], ["y"]),
    ]
    path = tmp_path / "size.onnx"
    path.write_bytes(make_model(nodes, [("x", FLOAT, [1, "n", 4])], [("y", FLOAT, [1, "n", 4])]).SerializeToString())
    graph = import_onnx(str(path))
    names = spatial.graph_symbols(graph)
    assert spatial.reads_sizes_as_data(graph, names)
    model = kiln.compile(str(path), dims={"n": "1..40"})
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    compiled = plans_compiled()
    for n in (1, 7, 40):
        x = {"x": np.random.default_rng(n).standard_normal((1, n, 4)).astype(np.float32)}
        np.testing.assert_allclose(model.run(x)["y"], session.run(None, x)[0], rtol=1e-6, err_msg=f"n={n}")
    assert plans_compiled() == compiled
