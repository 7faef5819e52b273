"""ONNX Runtime's contrib ops that its GenAI builder writes (``kiln.frontend.contrib``,
``contrib_attention``): each compiled by kiln and checked against ONNX Runtime's own CPU kernels
on the same model (onnxruntime implements the com.microsoft domain): MatMulNBits at 4 and 8 bits,
with and without zero points and a bias, K not a multiple of the block; the simplified (RMS) norms;
GroupQueryAttention for a prompt and a decode step after a past, with and without rotary (halves
and interleaved), packed QKV, a local window and a softcap. Forms kiln does not convert are named
errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import UnsupportedModelError

ort = pytest.importorskip("onnxruntime", reason="the contrib ops' reference is onnxruntime's own kernels")
RNG = np.random.default_rng(21)
MS = "com.microsoft"


def model(nodes, inputs, outputs, constants) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes,
        "contrib",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def both(proto: onnx.ModelProto, feeds: dict, dims: dict) -> tuple[list, list]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    compiled = kiln.compile(proto, dims=dims)
    got = compiled.run(feeds)
    return [got[o.name] for o in proto.graph.output], want


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_points", [None, "uint8", "float"])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_nbits_is_the_product_of_its_dequantized_weights(bits, zero_points, bias):
    k, n, block = 100, 24, 32  # K past the last whole block
    blocks = -(-k // block)
    codes = RNG.integers(0, 1 << bits, (n, blocks * block)).astype(np.uint8)
    per = 8 // bits
    packed = np.zeros((n, blocks * block // per), np.uint8)
    for i in range(per):
        packed |= (codes[:, i::per] << (bits * i)).astype(np.uint8)
    scales = RNG.uniform(0.01, 0.1, n * blocks).astype(np.float32)
    zeros = np.full((n, blocks), 1 << (bits - 1), np.float32)
    constants = {"b": packed.reshape(n, blocks, -1), "s": scales}
    inputs = ["x", "b", "s"]
    if zero_points == "uint8":
        codes_z = RNG.integers(0, 1 << bits, (n, blocks)).astype(np.uint8)
        zeros = codes_z.astype(np.float32)
        row = -(-blocks * bits // 8)
        packed_zeros = np.zeros((n, row * per), np.uint8)
        packed_zeros[:, :blocks] = codes_z
        constants["z"] = (
            sum((packed_zeros[:, i::per] << (bits * i)).astype(np.uint8) for i in range(per)).astype(np.uint8).ravel()
        )
        inputs.append("z")
    elif zero_points == "float":
        constants["z"] = RNG.uniform(0, (1 << bits) - 1, n * blocks).astype(np.float32)
        zeros = constants["z"].reshape(n, blocks)
        inputs.append("z")
    if bias:
        inputs += [""] * (5 - len(inputs)) + ["bias"]
        constants["bias"] = RNG.standard_normal(n).astype(np.float32)
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain=MS, K=k, N=n, bits=bits, block_size=block)
    proto = model([node], [("x", TensorProto.FLOAT, ["rows", k])], ["y"], constants)
    x = RNG.standard_normal((3, k)).astype(np.float32)
    weights = (codes.astype(np.float64) - np.repeat(zeros, block, axis=1)) * np.repeat(
        scales.reshape(n, blocks), block, axis=1
    )
    want = x.astype(np.float64) @ weights[:, :k].T + (constants["bias"] if bias else 0)
    got = kiln.compile(proto, dims={"rows": (1, 4)}).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    if not (bits == 8 and zero_points == "float"):  # (onnxruntime's CPU kernel refuses that form)
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_simplified_norms_are_rms_norms():
    gamma, bias = RNG.standard_normal(16).astype(np.float32), RNG.standard_normal(16).astype(np.float32)
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["a"], epsilon=1e-5, axis=-1),
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            ["a", "skip", "g", "bias"],
            ["b", "", "", "sum"],
            domain=MS,
            epsilon=1e-6,
        ),
    ]
    inputs = [("x", TensorProto.FLOAT, ["n", 5, 16]), ("skip", TensorProto.FLOAT, ["n", 5, 16])]
    proto = model(nodes, inputs, ["b", "sum"], {"g": gamma, "bias": bias})
    feeds = {name: RNG.standard_normal((2, 5, 16)).astype(np.float32) for name in ("x", "skip")}
    got, want = both(proto, feeds, {"n": (1, 2)})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


HEADS, KV_HEADS, DEPTH, CACHE = 4, 2, 16, 64


def gqa(past: bool, rotary: str, packed: bool, **attrs) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    names = ["qkv", "", ""] if packed else ["q", "k", "v"]
    names += ["past_key", "past_value"] if past else ["", ""]
    names += ["seqlens_k", "total"]
    constants = {}
    if rotary != "none":
        angles = np.outer(np.arange(CACHE), 1.0 / 10000 ** (np.arange(0, DEPTH, 2) / DEPTH))
        constants = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
        names += ["cos", "sin"]
        attrs.update(do_rotary=1, rotary_interleaved=int(rotary == "interleaved"))
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"], domain=MS,
                            num_heads=HEADS, kv_num_heads=KV_HEADS, **attrs)  # fmt: skip
    inputs = [("seqlens_k", TensorProto.INT32, ["b"]), ("total", TensorProto.INT32, [1])]
    width = (HEADS + 2 * KV_HEADS) * DEPTH
    if packed:
        inputs.append(("qkv", TensorProto.FLOAT, ["b", "s", width]))
    else:
        inputs += [("q", TensorProto.FLOAT, ["b", "s", HEADS * DEPTH])]
        inputs += [(n, TensorProto.FLOAT, ["b", "s", KV_HEADS * DEPTH]) for n in ("k", "v")]
    if past:
        inputs += [(n, TensorProto.FLOAT, ["b", KV_HEADS, "p", DEPTH]) for n in ("past_key", "past_value")]
    return model([node], inputs, ["out", "present_key", "present_value"], constants)


@pytest.mark.parametrize(
    "rotary, packed, attrs",
    [("none", False, {}), ("halves", False, {}), ("interleaved", False, {}), ("halves", True, {}),
     ("halves", False, {"local_window_size": 5}), ("none", False, {"softcap": 2.0, "scale": 0.3})],
)  # fmt: skip
@pytest.mark.parametrize("past, new", [(0, 6), (9, 1), (9, 3)])  # a prompt; decode steps after a past
def test_group_query_attention_matches_onnxruntime(rotary, packed, attrs, past, new):
    batch = 1 if past and new > 1 else 2  # (onnxruntime takes several new tokens after a past at batch 1 only)
    proto = gqa(past > 0, rotary, packed, **attrs)
    feeds = {"seqlens_k": np.full(batch, past + new - 1, np.int32), "total": np.array([past + new], np.int32)}
    if packed:
        feeds["qkv"] = RNG.standard_normal((batch, new, (HEADS + 2 * KV_HEADS) * DEPTH)).astype(np.float32)
    else:
        feeds["q"] = RNG.standard_normal((batch, new, HEADS * DEPTH)).astype(np.float32)
        feeds.update({n: RNG.standard_normal((batch, new, KV_HEADS * DEPTH)).astype(np.float32) for n in ("k", "v")})
    dims = {"b": (batch, batch), "s": (new, new)}
    if past:
        feeds.update({n: RNG.standard_normal((batch, KV_HEADS, past, DEPTH)).astype(np.float32) for n in ("past_key", "past_value")})  # fmt: skip
        dims["p"] = (past, past)
    got, want = both(proto, feeds, dims)
    for name, g, w in zip(("out", "present_key", "present_value"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)


def test_contrib_forms_kiln_does_not_convert_are_named():
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total", "", "", "pos"], ["out"],
                            domain=MS, num_heads=HEADS, kv_num_heads=KV_HEADS)  # fmt: skip
    inputs = [("q", TensorProto.FLOAT, [1, 2, HEADS * DEPTH])]
    inputs += [(n, TensorProto.FLOAT, [1, 2, KV_HEADS * DEPTH]) for n in ("k", "v")]
    inputs += [
        ("seqlens_k", TensorProto.INT32, [1]),
        ("total", TensorProto.INT32, [1]),
        ("pos", TensorProto.INT64, [1, 2]),
    ]
    with pytest.raises(UnsupportedModelError, match="GroupQueryAttention with position_ids"):
        kiln.compile(model([node], inputs, ["out"], {}))
    node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain=MS, K=8, N=2, bits=3, block_size=16)
    proto = model([node], [("x", TensorProto.FLOAT, [1, 8])], ["y"], {"b": np.zeros((2, 1, 6), np.uint8), "s": np.ones(2, np.float32)})  # fmt: skip
    with pytest.raises(UnsupportedModelError, match="MatMulNBits with K=8, N=2, bits=3"):
        kiln.compile(proto)


@pytest.mark.parametrize("zero_points", [False, True])
def test_gather_block_quantized_gathers_dequantized_rows(zero_points):
    rows, columns, block = 10, 64, 32
    table = RNG.integers(0, 256, (rows, columns // 2)).astype(np.uint8)
    constants = {"t": table, "s": RNG.uniform(0.01, 0.1, (rows, columns // block)).astype(np.float32)}
    names = ["t", "ids", "s"]
    if zero_points:
        constants["z"] = RNG.integers(0, 256, (rows, 1)).astype(np.uint8)  # two 4-bit zero points a byte
        names.append("z")
    node = helper.make_node("GatherBlockQuantized", names, ["y"], domain=MS, gather_axis=0, quantize_axis=1, block_size=block, bits=4)  # fmt: skip
    proto = model([node], [("ids", TensorProto.INT64, ["b", "s"])], ["y"], constants)
    feeds = {"ids": RNG.integers(0, rows, (2, 3)).astype(np.int64)}
    (got,), (want,) = both(proto, feeds, {"b": (1, 2), "s": (1, 4)})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
