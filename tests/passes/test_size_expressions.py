"""Sizes computed by the exporters' shape arithmetic are expressions (kiln.ir.dims), so a size
computed twice is one dim and a count merged with other sizes divides back out: the window
partition/reverse of Swin and the patch folding of MobileViT are proven sample-parallel and run
at every batch on one compile (issue 49; before: refused at their views, a compile per batch)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.driver.variants import plans_compiled
from kiln.frontend.onnx import import_onnx
from kiln.passes.batching import Parallel, sample_parallel
from tests.helpers import FLOAT, make_model

onnxruntime = pytest.importorskip("onnxruntime", reason="the runs are checked against onnxruntime")
RNG = np.random.default_rng(3)
I64 = np.int64


def _size(nodes: list, source: str, axis: int, out: str) -> None:
    """``out`` = the scalar size ``source.shape[axis]`` (each call its own nodes, as an exporter
    writes a size again wherever it needs it)."""
    nodes += [
        helper.make_node("Shape", [source], [f"{out}_shape"]),
        helper.make_node("Gather", [f"{out}_shape", f"axis{axis}"], [out], axis=0),
    ]


def _padded(nodes: list, size: str, out: str) -> None:
    """``out`` = size + (4 - size % 4) % 4, computed as the dynamo exporter writes it."""
    nodes += [
        helper.make_node("Mod", [size, "four"], [f"{out}_m"]),
        helper.make_node("Mul", [f"{out}_m", "minus_one"], [f"{out}_n"]),
        helper.make_node("Add", ["four", f"{out}_n"], [f"{out}_a"]),
        helper.make_node("Mod", [f"{out}_a", "four"], [f"{out}_pad"]),
        helper.make_node("Add", [size, f"{out}_pad"], [out]),
    ]


def _vector(nodes: list, parts: list[str], out: str) -> None:
    for part in parts:
        if not part.startswith("c_"):
            nodes.append(helper.make_node("Unsqueeze", [part, "axis0"], [f"{out}_{part}"]))
    pieces = [p if p.startswith("c_") else f"{out}_{p}" for p in parts]
    nodes.append(helper.make_node("Concat", pieces, [out], axis=0))


def windows_model() -> bytes:
    """x [batch, h, w, 8] padded to multiples of 4 (pads from the sizes), partitioned into 4x4
    windows ([batch*nh*nw, 16, 8]), scaled, merged back and cut to [batch, h, w, 8]: every size
    the views take is computed again where it is used (the partition's and the reverse's)."""
    nodes: list = []
    _size(nodes, "x", 1, "h")
    _size(nodes, "x", 2, "w")
    for name, size in (("hp_pad", "h"), ("wp_pad", "w")):
        _padded(nodes, size, name)
    nodes += [
        helper.make_node("Sub", ["hp_pad", "h"], ["pad_h"]),
        helper.make_node("Sub", ["wp_pad", "w"], ["pad_w"]),
    ]
    _vector(nodes, ["c_zero", "c_zero", "c_zero", "c_zero", "c_zero", "pad_h", "pad_w", "c_zero"], "pads")
    nodes.append(helper.make_node("Pad", ["x", "pads"], ["padded"]))
    _size(nodes, "padded", 0, "b1")
    for tag in ("p", "r"):  # the partition's sizes and the reverse's, each computed on its own
        _size(nodes, "x", 1, f"h_{tag}")
        _size(nodes, "x", 2, f"w_{tag}")
        _padded(nodes, f"h_{tag}", f"hp_{tag}")
        _padded(nodes, f"w_{tag}", f"wp_{tag}")
        nodes += [
            helper.make_node("Div", [f"hp_{tag}", "four"], [f"nh_{tag}"]),
            helper.make_node("Div", [f"wp_{tag}", "four"], [f"nw_{tag}"]),
        ]
    _vector(nodes, ["b1", "nh_p", "c_four", "nw_p", "c_four", "c_eight"], "split")
    nodes += [
        helper.make_node("Reshape", ["padded", "split"], ["split_x"]),
        helper.make_node("Transpose", ["split_x"], ["moved"], perm=[0, 1, 3, 2, 4, 5]),
        helper.make_node("Reshape", ["moved", "rows"], ["windows"]),  # [-1, 16, 8]
        helper.make_node("Mul", ["windows", "scale"], ["scaled"]),
    ]
    _vector(nodes, ["c_minus_one", "nh_r", "nw_r", "c_four", "c_four", "c_eight"], "merge")
    nodes += [
        helper.make_node("Reshape", ["scaled", "merge"], ["merged"]),
        helper.make_node("Transpose", ["merged"], ["back"], perm=[0, 1, 3, 2, 4, 5]),
    ]
    _vector(nodes, ["c_minus_one", "hp_r", "wp_r", "c_eight"], "plane")
    nodes.append(helper.make_node("Reshape", ["back", "plane"], ["whole"]))
    _vector(nodes, ["h", "w"], "ends")
    nodes.append(helper.make_node("Slice", ["whole", "c_zeros2", "ends", "c_axes12"], ["y"]))
    constants = {
        "four": np.array(4, I64),
        "minus_one": np.array(-1, I64),
        "axis0": np.array([0], I64),
        "axis1": np.array(1, I64),
        "axis2": np.array(2, I64),
        "axis0_": np.array(0, I64),
        "c_zero": np.array([0], I64),
        "c_four": np.array([4], I64),
        "c_eight": np.array([8], I64),
        "c_minus_one": np.array([-1], I64),
        "c_zeros2": np.array([0, 0], I64),
        "c_axes12": np.array([1, 2], I64),
        "rows": np.array([-1, 16, 8], I64),
        "scale": RNG.standard_normal((16, 8)).astype(np.float32),
    }
    for node in nodes:  # Gather's axis-0 index is a scalar named axis0_ (Unsqueeze's axes are [0])
        if node.op_type == "Gather" and node.input[1] == "axis0":
            node.input[1] = "axis0_"
    model = make_model(nodes, [("x", FLOAT, ["batch", "h", "w", 8])], [("y", FLOAT, None)], constants)
    return model.SerializeToString()


def patches_model() -> bytes:
    """MobileViT's patch folding: the patch grid's size computed through floats,
    ``int(ceil(h / 2.0) * 2.0) // 2``, then x [batch, 4, h, w] viewed as [batch*4*nh, 2, nw, 2],
    transposed, scaled and folded back."""
    nodes: list = []
    for axis, tag in ((0, "b"), (1, "c"), (2, "h"), (3, "w")):
        _size(nodes, "x", axis, tag)
    for tag in ("h", "w"):
        nodes += [
            helper.make_node("Cast", [tag], [f"{tag}_f"], to=1),
            helper.make_node("Div", [f"{tag}_f", "two_f"], [f"{tag}_half"]),
            helper.make_node("Ceil", [f"{tag}_half"], [f"{tag}_up"]),
            helper.make_node("Mul", [f"{tag}_up", "two_f"], [f"{tag}_even_f"]),
            helper.make_node("Cast", [f"{tag}_even_f"], [f"{tag}_even"], to=7),
            helper.make_node("Div", [f"{tag}_even", "two"], [f"n{tag}"]),
        ]
    nodes += [
        helper.make_node("Mul", ["b", "c"], ["bc"]),
        helper.make_node("Mul", ["bc", "nh"], ["rows"]),
    ]
    _vector(nodes, ["rows", "c_two", "nw", "c_two"], "view")
    nodes += [
        helper.make_node("Reshape", ["x", "view"], ["patches"]),
        helper.make_node("Transpose", ["patches"], ["moved"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["moved", "scale"], ["scaled"]),
        helper.make_node("Transpose", ["scaled"], ["back"], perm=[0, 2, 1, 3]),
    ]
    _vector(nodes, ["b", "c", "h_even", "w_even"], "folded")
    nodes.append(helper.make_node("Reshape", ["back", "folded"], ["y"]))
    constants = {
        "axis0": np.array([0], I64),
        "axis0_": np.array(0, I64),
        "axis1": np.array(1, I64),
        "axis2": np.array(2, I64),
        "axis3": np.array(3, I64),
        "two_f": np.array(2.0, np.float32),
        "two": np.array(2, I64),
        "c_two": np.array([2], I64),
        "scale": RNG.standard_normal((2, 2)).astype(np.float32),
    }
    for node in nodes:
        if node.op_type == "Gather" and node.input[1] == "axis0":
            node.input[1] = "axis0_"
    model = make_model(nodes, [("x", FLOAT, ["batch", 4, "h", "w"])], [("y", FLOAT, None)], constants)
    return model.SerializeToString()


@pytest.mark.parametrize(
    ("build", "sizes", "shape"),
    [(windows_model, {"h": 10, "w": 7}, (10, 7, 8)), (patches_model, {"h": 6, "w": 8}, (4, 6, 8))],
    ids=["swin-windows", "mobilevit-patches"],
)
def test_views_by_sizes_computed_twice_or_through_floats_are_sample_parallel_at_every_batch(build, sizes, shape):
    model_bytes = build()
    graph = import_onnx(model_bytes)
    assert sample_parallel(graph)["batch"] == Parallel("batch", (0,), (0,))
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    model = kiln.compile(model_bytes, dims={"batch": "1..6", **sizes})
    compiled = plans_compiled()
    for batch in (1, 5, 6, 3):
        x = RNG.standard_normal((batch, *shape)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert plans_compiled() == compiled, "a batch size compiled after kiln.compile returned"


def folded_rows_model() -> bytes:
    """x [batch, 16, h, w] viewed as [-1, 2, 2, 2], then as [-1, 16, 4, 4] (rows: batch*h*w // 16,
    whole per sample only where h*w is a multiple of 16), scaled, and viewed back by x's shape."""
    nodes = [
        helper.make_node("Reshape", ["x", "eights"], ["small"]),
        helper.make_node("Reshape", ["small", "blocks"], ["rows"]),
        helper.make_node("Mul", ["rows", "scale"], ["scaled"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Reshape", ["scaled", "shape"], ["y"]),
    ]
    constants = {
        "eights": np.array([-1, 2, 2, 2], I64),
        "blocks": np.array([-1, 16, 4, 4], I64),
        "scale": RNG.standard_normal((16, 4, 4)).astype(np.float32),
    }
    model = make_model(nodes, [("x", FLOAT, ["batch", 16, "h", "w"])], [("y", FLOAT, None)], constants)
    return model.SerializeToString()


def test_a_view_whose_rows_per_sample_are_whole_only_at_some_sizes_chunks_only_there():
    """The count's rows are ``(batch*h*w)//16``: sample-parallel with the guard ``(h*w)%16 == 0``,
    checked per run. Where it holds (4x8 planes) every batch runs on the classes; where it does
    not (3x3 planes: a batch of 16 is valid as a whole, not as chunks of 8) a run compiles for its
    size instead of running as chunks that would not reshape."""
    model_bytes = folded_rows_model()
    found = sample_parallel(import_onnx(model_bytes))["batch"]
    assert isinstance(found, Parallel) and found.guards == ("(h*w)%16",)
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    model = kiln.compile(model_bytes, dims={"batch": "1..16", "h": 4, "w": 8})
    compiled = plans_compiled()
    for batch in (1, 5, 16, 3):
        x = RNG.standard_normal((batch, 16, 4, 8)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert plans_compiled() == compiled
    from kiln.driver.sizes import Chunking

    chunking = Chunking(found, (1, 8))  # 3x3 planes: a batch of 16 is valid whole, its chunks of 8 are not
    assert chunking.holds({"batch": 5, "h": 4, "w": 8}) and not chunking.holds({"batch": 16, "h": 3, "w": 3})
    assert not chunking.holds({"batch": 5})  # a guard kiln cannot evaluate does not hold


def test_kiln_explain_says_where_the_batch_chunks(tmp_path):
    """``kiln explain`` names the guard under which the batch runs as chunks (and --json lists it)."""
    import json

    from click.testing import CliRunner

    from kiln.cli import main

    path = tmp_path / "folded.onnx"
    path.write_bytes(folded_rows_model())
    said = CliRunner().invoke(main, ["explain", str(path), "--dim", "h=4", "--dim", "w=8"], catch_exceptions=False)
    assert said.exit_code == 0 and "sample-parallel where (h*w)%16 == 0" in said.output, said.output
    listed = CliRunner().invoke(main, ["explain", str(path), "--dim", "h=4", "--dim", "w=8", "--json"])
    assert json.loads(listed.stdout)["sizes"]["batch"]["guards"] == ["(h*w)%16"]


def test_a_long_chain_of_strided_windows_names_its_sizes_until_they_grow_too_long():
    """300 stride-2 convolutions over a symbolic plane: each size is an expression of the one
    before until its text would pass kiln.ir.dims.NAMEABLE, then a fresh symbol starts the chain
    again (before that limit existed, the 65th name failed the type check and the import with it)."""
    from kiln.ir import dims

    w = np.ones((1, 1, 1, 1), np.float32)
    nodes = [
        helper.make_node("Conv", ["x" if i == 0 else f"c{i - 1}", "w"], [f"c{i}"], strides=[2, 2], pads=[1, 1, 1, 1])
        for i in range(300)
    ]
    graph = import_onnx(
        make_model(nodes, [("x", FLOAT, ["b", 1, "h", "w"])], [("c299", FLOAT, None)], {"w": w}).SerializeToString()
    )
    shapes = [n.outputs[0].type.shape for n in graph.nodes]
    assert shapes[0][2] == "(h+1)//2+1" and all(len(s[2]) <= dims.NAMEABLE for s in shapes)
    assert "h" not in dims.symbols(dims.parse(shapes[-1][2]))  # a fresh symbol took over
