"""Layout assignment (kiln.passes.layout): which regions run channels last, the conversions moved
until they cancel, and kiln::DepthwiseConv's channels-last kernel against the reference."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.backends import parse
from kiln.ir.parser import parse_graph
from kiln.ops.interpreter import Interpreter
from kiln.ops.verify import verify
from kiln.passes.layout import assign_layouts, conversion_bytes, layout_decision, propagate, rewrite_channels_last
from tests.helpers import FLOAT, make_model

CPU = parse("cpu")


def run(graph, *inputs):
    return Interpreter(graph).run(list(inputs))


def ops(graph):
    return [f"{n.domain}::{n.op}" if n.domain else n.op for n in graph.nodes]


def _convnext_block(channels=8, size=6):
    """A channels-last input (a stem's permute) and two of ConvNeXt's blocks as the exporters write them: a depthwise 7x7 on NCHW, a permute to
    channels last around the LayerNorm and the two linear layers, a permute back, the residual add."""
    rng = np.random.default_rng(0)
    data = {
        "dw": rng.standard_normal((channels, 1, 7, 7)).astype(np.float32),
        "db": rng.standard_normal(channels).astype(np.float32),
        "w1": rng.standard_normal((channels, 4 * channels)).astype(np.float32),
        "w2": rng.standard_normal((4 * channels, channels)).astype(np.float32),
        "g": rng.standard_normal(channels).astype(np.float32),
    }
    c, s = channels, size
    block = """
  %d{i}: f32[1,{c},{s},{s}] = Conv(%{x}, %dw, %db) {{group={c}, pads=[3, 3, 3, 3]}}
  %t{i}: f32[1,{s},{s},{c}] = Transpose(%d{i}) {{perm=[0, 2, 3, 1]}}
  %n{i}: f32[1,{s},{s},{c}] = LayerNormalization(%t{i}, %g) {{axis=-1}}
  %h{i}: f32[1,{s},{s},{c4}] = MatMul(%n{i}, %w1)
  %a{i}: f32[1,{s},{s},{c4}] = Gelu(%h{i})
  %o{i}: f32[1,{s},{s},{c}] = MatMul(%a{i}, %w2)
  %b{i}: f32[1,{c},{s},{s}] = Transpose(%o{i}) {{perm=[0, 3, 1, 2]}}
  %{y}: f32[1,{c},{s},{s}] = Add(%{x}, %b{i})"""
    blocks = block.format(i=0, x="xc", y="y0", c=c, s=s, c4=4 * c) + block.format(
        i=1, x="y0", y="y", c=c, s=s, c4=4 * c
    )
    text = f"""
graph g(%x: f32[1,{s},{s},{c}]) -> (%y) {{
  const %dw: f32[{c},1,7,7]
  const %db: f32[{c}]
  const %w1: f32[{c},{4 * c}]
  const %w2: f32[{4 * c},{c}]
  const %g: f32[{c}]
  %xc: f32[1,{c},{s},{s}] = Transpose(%x) {{perm=[0, 3, 1, 2]}}{blocks}
}}"""
    return parse_graph(text, data)


def test_a_region_already_permuted_to_channels_last_keeps_no_conversion_inside():
    before = _convnext_block()
    after = assign_layouts(before, CPU)
    verify(after)
    assert "kiln::DepthwiseConv" in ops(after) and "Conv" not in ops(after)
    # the input's and the blocks' five permutes are gone but the one the NCHW output needs
    assert ops(before).count("Transpose") == 5 and ops(after).count("Transpose") == 1
    assert conversion_bytes(after) < conversion_bytes(before)
    decision = layout_decision(before, CPU)
    assert decision.channels_last and decision.depthwise == 2
    x = np.random.default_rng(1).standard_normal((1, 6, 6, 8)).astype(np.float32)
    np.testing.assert_allclose(run(after, x)[0], run(before, x)[0], rtol=1e-4, atol=1e-4)


def test_a_graph_the_conversions_would_only_add_to_stays_nchw():
    """A 3x3 convolution (no channels-last kernel) between two 1x1s, as in a ResNet bottleneck:
    channels last would convert around the 3x3, so the graph is left exactly as it was."""
    rng = np.random.default_rng(0)
    data = {
        "w1": rng.standard_normal((4, 8, 1, 1)).astype(np.float32),
        "w2": rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        "w3": rng.standard_normal((8, 4, 1, 1)).astype(np.float32),
    }
    before = parse_graph(
        """
graph g(%x: f32[1,8,6,6]) -> (%y) {
  const %w1: f32[4,8,1,1]
  const %w2: f32[4,4,3,3]
  const %w3: f32[8,4,1,1]
  %a: f32[1,4,6,6] = Conv(%x, %w1)
  %r: f32[1,4,6,6] = Relu(%a)
  %b: f32[1,4,6,6] = Conv(%r, %w2) {pads=[1, 1, 1, 1]}
  %c: f32[1,8,6,6] = Conv(%b, %w3)
  %y: f32[1,8,6,6] = Add(%c, %x)
}""",
        data,
    )
    assert assign_layouts(before, CPU) is before
    decision = layout_decision(before, CPU)
    assert not decision.channels_last and decision.pointwise == 2
    assert decision.conversions_after > decision.conversions_before == 0


def test_an_inverted_residual_with_a_3x3_depthwise_goes_channels_last():
    """MobileNetV2's block (1x1 expand, 3x3 depthwise, 1x1 project, residual) on NCHW data: the
    depthwise convolution saves the conversion of its (expanded) input and output, more than the
    two conversions at the graph's edges cost, so the block runs channels last."""
    rng = np.random.default_rng(0)
    data = {
        "w1": rng.standard_normal((24, 4, 1, 1)).astype(np.float32),
        "dw": rng.standard_normal((24, 1, 3, 3)).astype(np.float32),
        "w3": rng.standard_normal((4, 24, 1, 1)).astype(np.float32),
        "lo": np.float32(0),
        "hi": np.float32(6),
    }
    before = parse_graph(
        """
graph g(%x: f32[1,4,8,8]) -> (%y) {
  const %w1: f32[24,4,1,1]
  const %dw: f32[24,1,3,3]
  const %w3: f32[4,24,1,1]
  const %lo: f32[]
  const %hi: f32[]
  %a: f32[1,24,8,8] = Conv(%x, %w1)
  %r: f32[1,24,8,8] = Clip(%a, %lo, %hi)
  %d: f32[1,24,8,8] = Conv(%r, %dw) {group=24, pads=[1, 1, 1, 1]}
  %s: f32[1,24,8,8] = Clip(%d, %lo, %hi)
  %c: f32[1,4,8,8] = Conv(%s, %w3)
  %y: f32[1,4,8,8] = Add(%c, %x)
}""",
        data,
    )
    decision = layout_decision(before, CPU)
    assert decision.channels_last and decision.depthwise == 1 and decision.pointwise == 2, decision
    assert decision.saved == 2 * 2 * (24 * 8 * 8 * 4) > decision.conversions_after - decision.conversions_before
    after = assign_layouts(before, CPU)
    verify(after)
    assert "kiln::DepthwiseConv" in ops(after) and ops(after).count("Transpose") == 2  # the input's and the output's
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run(after, x)[0], run(before, x)[0], rtol=1e-4, atol=1e-4)


def test_a_target_without_channels_last_kernels_keeps_nchw():
    before = _convnext_block()
    assert assign_layouts(before, None) is before
    assert assign_layouts(before, parse("gpu")) is before


def test_conversions_move_through_elementwise_ops_reductions_and_concat():
    rng = np.random.default_rng(0)
    data = {"scale": rng.standard_normal((3, 1, 1)).astype(np.float32), "lo": np.float32(0), "hi": np.float32(6)}
    data["axes"] = np.array([3], dtype=np.int64)
    before = parse_graph(
        """
graph g(%x: f32[1,4,5,3], %z: f32[1,4,5,3]) -> (%y, %m) {
  const %scale: f32[3,1,1]
  const %lo: f32[]
  const %hi: f32[]
  const %axes: i64[1]
  %t: f32[1,3,4,5] = Transpose(%x) {perm=[0, 3, 1, 2]}
  %u: f32[1,3,4,5] = Transpose(%z) {perm=[0, 3, 1, 2]}
  %s: f32[1,3,4,5] = Mul(%t, %scale)
  %c: f32[1,3,4,5] = Clip(%s, %lo, %hi)
  %sg: f32[1,3,4,5] = Sigmoid(%c)
  %w: f32[1,3,4,5] = Mul(%c, %sg)
  %a: f32[1,3,4,5] = Add(%w, %u)
  %k: f32[1,6,4,5] = Concat(%a, %u) {axis=1}
  %p: f32[1,6,1,1] = GlobalAveragePool(%k)
  %y: f32[1,6] = Flatten(%p)
  %m: f32[1,6,4] = ReduceMax(%k, %axes) {keepdims=0}
}""",
        data,
    )
    after = propagate(before)
    verify(after)
    # every op ran on the channels-last inputs; the pooled result needed no conversion (unit dims)
    # and the one left converts ReduceMax's result
    assert ops(after).count("Transpose") == 1
    assert "GlobalAveragePool" not in ops(after) and "ReduceMean" in ops(after)
    x, z = (rng.standard_normal((1, 4, 5, 3)).astype(np.float32) for _ in range(2))
    for got, want in zip(run(after, x, z), run(before, x, z)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_conversion_with_another_reader_is_not_lost():
    before = parse_graph(
        """
graph g(%x: f32[1,2,3,4]) -> (%y, %t) {
  %t: f32[1,4,2,3] = Transpose(%x) {perm=[0, 3, 1, 2]}
  %y: f32[1,4,2,3] = Relu(%t)
}"""
    )
    after = propagate(before)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    for got, want in zip(run(after, x), run(before, x)):
        np.testing.assert_array_equal(got, want)


# -- the channels-last depthwise kernel ------------------------------------------------------------


def _channels_last_depthwise(channels, size, kernel, stride, pads, dilation, activation):
    """An ONNX model whose input and output are channels last around a depthwise convolution:
    the pass runs it as kiln::DepthwiseConv with no conversion left."""
    rng = np.random.default_rng(channels * 31 + size)
    weights = {
        "w": rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32),
        "b": rng.standard_normal(channels).astype(np.float32),
    }
    import onnx.helper as oh

    nodes = [
        oh.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
        oh.make_node(
            "Conv",
            ["xc", "w", "b"],
            ["c"],
            group=channels,
            pads=pads,
            strides=[stride, stride],
            dilations=[dilation, dilation],
            kernel_shape=[kernel, kernel],
        ),
        oh.make_node(activation, ["c"], ["a"]),
        oh.make_node("Transpose", ["a"], ["y"], perm=[0, 2, 3, 1]),
    ]
    model = make_model(nodes, [("x", FLOAT, [2, size, size + 1, channels])], [("y", FLOAT, None)], weights)
    return model, rng.standard_normal((2, size, size + 1, channels)).astype(np.float32)


@pytest.mark.parametrize(
    "channels,size,kernel,stride,pads,dilation",
    [
        (16, 12, 3, 1, [1, 1, 1, 1], 1),  # MobileNet's 3x3, whole vectors of channels
        (24, 11, 3, 2, [1, 1, 1, 1], 1),  # strided, odd size
        (40, 7, 5, 1, [2, 2, 2, 2], 1),  # EfficientNet's 5x5 on a small plane (threads take channel blocks)
        (12, 9, 7, 1, [3, 3, 3, 3], 1),  # ConvNeXt's 7x7: no interior column
        (5, 10, 3, 1, [0, 2, 1, 0], 2),  # channels not a vector's multiple, asymmetric pads, dilated
        (8, 6, 3, 1, [20, 20, 20, 20], 1),  # a border too wide to unroll: every tap tested
        # from PADDED_MIN_TAPS taps the input is copied zero-bordered first:
        (16, 13, 7, 1, [3, 3, 3, 3], 1),  # threads take rows, two channel blocks
        (16, 13, 5, 2, [2, 1, 1, 2], 1),  # strided, asymmetric pads
        (16, 12, 5, 1, [4, 0, 3, 4], 2),  # dilated: rows of zeros past the input on one side only
        (24, 5, 7, 1, [3, 3, 3, 3], 1),  # a small plane: threads take channel blocks
        (6, 8, 5, 1, [0, 0, 0, 0], 1),  # no padding at all, channels not a vector's multiple
    ],
)
def test_channels_last_depthwise_matches_onnxruntime(tmp_path, channels, size, kernel, stride, pads, dilation):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the reference) is not installed")
    import onnx

    model, x = _channels_last_depthwise(channels, size, kernel, stride, pads, dilation, "Relu")
    path = tmp_path / "dw.onnx"
    onnx.save(model, path)
    compiled = kiln.compile(str(path), threads=2)
    got = compiled.run({"x": x})["y"]
    kinds = [k.kind for p in compiled.plans for step in p.steps for k in getattr(step, "kernels", [])]
    assert kinds == ["depthwise-conv+epilogue"], kinds  # no conversion left on either side
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_large_depthwise_kernel_is_compact_code(tmp_path):
    """A 7x7 layer on a 56x56 plane (ConvNeXt's first stage) is one row of code over a
    zero-bordered copy, not every border pixel written out with its own taps (hundreds of
    kilobytes of C: most of a cold compile)."""
    import onnx

    from kiln.backends.cpu.c_unit import Templates
    from kiln.lower.kir import buffers_in
    from kiln.lower.kir_verify import verify_kernel

    model, x = _channels_last_depthwise(32, 56, 7, 1, [3, 3, 3, 3], 1, "Relu")
    path = tmp_path / "dw7.onnx"
    onnx.save(model, path)
    compiled = kiln.compile(str(path), threads=2)
    compiled.run({"x": x})
    (kernel,) = [k for p in compiled.plans for step in p.steps for k in getattr(step, "kernels", [])]
    templates = Templates()
    templates.function_for(kernel)
    text = "\n".join(templates.parts)
    assert len(text) < 100_000, len(text)  # the bordered form: over 600,000 characters
    assert any(b.name.startswith("dwpad") for b in buffers_in(kernel.body))
    assert verify_kernel(kernel) == []  # its scratch among its writes: memory planning places it


def test_depthwise_conv_reference_matches_a_grouped_conv():
    """kiln::DepthwiseConv's own reference (what the interpreter and kiln diff use) against
    Conv's: the same numbers, the layouts apart."""
    rng = np.random.default_rng(0)
    data = {"w": rng.standard_normal((6, 1, 3, 3)).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32)}
    conv = parse_graph(
        """
graph g(%x: f32[1,6,7,7]) -> (%y) {
  const %w: f32[6,1,3,3]
  const %b: f32[6]
  %y: f32[1,6,4,2] = Conv(%x, %w, %b) {group=6, pads=[1, 0, 1, 0], strides=[2, 2], dilations=[1, 2]}
}""",
        data,
    )
    after = assign_layouts(conv, CPU)  # one conversion in and one out: the decision keeps NCHW
    assert after is conv
    rewritten = propagate(rewrite_channels_last(conv, {id(conv.nodes[0]): "depthwise"}))
    assert "kiln::DepthwiseConv" in ops(rewritten)
    x = rng.standard_normal((1, 6, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, x)[0], run(conv, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "op,axes,keepdims", [("ReduceMean", [1, 2], 1), ("ReduceMax", [1], 0), ("ReduceSum", [0, 2], 1)]
)
def test_reductions_keeping_the_channels_axis_match_onnxruntime(tmp_path, op, axes, keepdims):
    """Channels-last global pooling (over H and W, C kept innermost) runs as rows of running sums,
    NaN propagated as kiln's reference does (NumPy's; onnxruntime's ReduceMax drops NaN)."""
    import onnx
    import onnx.helper as oh

    from kiln.frontend.onnx import import_onnx

    x = np.random.default_rng(3).standard_normal((2, 5, 7, 24)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    model = make_model(
        [oh.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
        [("x", FLOAT, list(x.shape))],
        [("y", FLOAT, None)],
        {"axes": np.array(axes, dtype=np.int64)},
        opset=18,
    )
    path = tmp_path / "r.onnx"
    onnx.save(model, path)
    compiled = kiln.compile(str(path))
    got = compiled.run({"x": x})["y"]
    want = Interpreter(import_onnx(model)).run([x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(got).sum() == np.isnan(want).sum() > 0
    scratch = [b.name for step in compiled.plans[0].steps for k in step.kernels for b in k.writes]
    assert any(name.startswith("rsum") for name in scratch), scratch  # rows of sums, not a strided sum each


def test_a_product_an_earlier_stage_marked_is_kept_as_it_is():
    """A pre-quantized model's convolution (kiln.passes.quantized marks it for the int8 path) keeps
    its op and its marks: rewritten, it would lose its own quantization."""
    from kiln.ir.graph import Node
    from kiln.passes.layout import _candidate

    graph = _convnext_block()
    conv = next(n for n in graph.nodes if n.op == "Conv")
    assert _candidate(graph, conv) == "depthwise"
    marked = Node(conv.op, conv.inputs, conv.outputs, {**conv.attrs, "kiln_qdq": (0.1, 0)}, name=conv.name)
    assert _candidate(graph, marked) is None


def test_reduced_precision_compiles_run_every_direct_convolution_channels_last():
    """With an int8/bf16 compile's say (Narrow), single-group convolutions of 32+ channels (any
    stride) become kiln::ConvNHWC, their bias an Add; the rewritten graph computes what the NCHW
    one does (the op's reference), and an fp32 compile, or a layer kept in fp32, keeps them NCHW."""
    from kiln.passes.layout import RANGE_OF, Narrow

    rng = np.random.default_rng(4)
    data = {
        "w1": rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1,
        "b1": rng.standard_normal(32).astype(np.float32),
        "w2": rng.standard_normal((40, 32, 3, 3)).astype(np.float32) * 0.1,
    }
    text = """
graph g(%x: f32[1,32,9,10]) -> (%y) {
  const %w1: f32[32,32,3,3]
  const %b1: f32[32]
  const %w2: f32[40,32,3,3]
  %c: f32[1,32,9,10] = Conv(%x, %w1, %b1) {pads=[1, 1, 1, 1]} name="c1"
  %r: f32[1,32,9,10] = Relu(%c)
  %y: f32[1,40,4,5] = Conv(%r, %w2) {pads=[0, 1, 1, 0], strides=[2, 2]} name="c2"
}"""
    before = parse_graph(text, data)
    x = rng.standard_normal((1, 32, 9, 10)).astype(np.float32)
    after = assign_layouts(before, CPU, Narrow("bf16"))
    verify(after)
    assert ops(after).count("kiln::ConvNHWC") == 2 and "Conv" not in ops(after)
    assert sorted(n.attrs[RANGE_OF] for n in after.nodes if n.op == "ConvNHWC") == ["r", "x"]
    np.testing.assert_allclose(run(after, x)[0], run(before, x)[0], rtol=1e-4, atol=1e-4)
    assert "kiln::ConvNHWC" not in ops(assign_layouts(before, CPU))  # fp32: no direct path to pay for it
    kept = assign_layouts(before, CPU, Narrow("int8", frozenset({"x", "r"}), frozenset({"c1"})))
    assert "c1" in [n.name for n in kept.nodes if n.op == "Conv"]  # kept in fp32: NCHW
    uncalibrated = assign_layouts(before, CPU, Narrow("int8", frozenset({"x"})))
    assert "c2" in [n.name for n in uncalibrated.nodes if n.op == "Conv"]  # no range for r: fp32, NCHW
