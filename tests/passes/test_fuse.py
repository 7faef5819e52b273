import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.ir.parser import parse_graph
from kiln.ops.interpreter import Interpreter
from kiln.ops.verify import verify
from kiln.passes.fuse import Refusal, fuse
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(0)


def conv_block():
    text = """
graph g(%x: f32[1,2,6,6], %skip: f32[1,3,6,6]) -> (%y) {
  const %w: f32[3,2,3,3]
  const %b: f32[1,3,1,1]
  %c: f32[1,3,6,6] = Conv(%x, %w) {pads=[1, 1, 1, 1]}
  %cb: f32[1,3,6,6] = Add(%c, %b)
  %r: f32[1,3,6,6] = Relu(%cb)
  %y: f32[1,3,6,6] = Add(%r, %skip)
}"""
    return parse_graph(
        text,
        {
            "w": RNG.standard_normal((3, 2, 3, 3)).astype(np.float32),
            "b": RNG.standard_normal((1, 3, 1, 1)).astype(np.float32),
        },
    )


def test_conv_bias_relu_residual_becomes_one_fused_node():
    before = conv_block()
    after = fuse(before)
    verify(after)
    assert [n.op for n in after.nodes] == ["Fused"]
    fused = after.nodes[0]
    assert fused.attrs["kind"] == "epilogue"
    assert [n.op for n in fused.attrs["body"].nodes] == ["Conv", "Add", "Relu", "Add"]
    x, skip = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32), RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(after).run([x, skip])[0], Interpreter(before).run([x, skip])[0], rtol=1e-6)


def test_refusals_say_why():
    graph = parse_graph("""
graph g(%x: f32[4,4]) -> (%y, %shared) {
  %shared: f32[4,4] = Exp(%x)
  %y: f32[4,4] = Relu(%shared)
}""")
    refusals: list[Refusal] = []
    assert fuse(graph, refusals) is graph
    assert any("graph output" in r.reason or "readers" in r.reason for r in refusals), refusals


def test_fused_kernels_compile_and_match():
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["a"]),
            helper.make_node("Gelu", ["a"], ["g"]),
            helper.make_node("Mul", ["g", "s"], ["y"]),
        ],
        [("x", FLOAT, [3, 8])],
        [("y", FLOAT, None)],
        {
            "w": RNG.standard_normal((8, 5)).astype(np.float32),
            "b": RNG.standard_normal(5).astype(np.float32),
            "s": np.array(0.5, np.float32),
        },
    )
    compiled = kiln.compile(model, target="cpu")
    plan = compiled.plans[0]
    kernels = [k for step in plan.steps for k in getattr(step, "kernels", [])]
    assert len(kernels) == 1 and kernels[0].kind == "matmul+epilogue"
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(compiled(x), kiln.compile(model, target="reference")(x), rtol=1e-5, atol=1e-6)


def attention(batch="2,3", queries=17, keys=17, depth=8, mask_shape="1,1,17,17", axis=-1, extra_reader=False):
    text = f"""
graph g(%q: f32[{batch},{queries},{depth}], %kt: f32[{batch},{depth},{keys}], %v: f32[{batch},{keys},{depth}]) -> (%o{", %p" if extra_reader else ""}) {{
  const %scale: f32[] = [0.35]
  const %mask: f32[{mask_shape}]
  %s: f32[{batch},{queries},{keys}] = MatMul(%q, %kt)
  %s2: f32[{batch},{queries},{keys}] = Mul(%s, %scale)
  %s3: f32[{batch},{queries},{keys}] = Add(%s2, %mask)
  %p: f32[{batch},{queries},{keys}] = Softmax(%s3) {{axis={axis}}}
  %o: f32[{batch},{queries},{depth}] = MatMul(%p, %v)
}}"""
    size = [int(d) for d in mask_shape.split(",")]
    causal = np.where(np.tril(np.ones((queries, keys))) > 0, 0.0, -np.inf).astype(np.float32)
    return parse_graph(text, {"mask": np.broadcast_to(causal, size).copy()})


def test_attention_becomes_one_kernel_that_matches_the_reference():
    before = attention()
    refusals = []
    after = fuse(before, refusals)
    verify(after)
    assert [n.op for n in after.nodes] == ["Fused"]
    assert after.nodes[0].attrs["kind"] == "attention"
    assert [n.op for n in after.nodes[0].attrs["body"].nodes] == ["MatMul", "Mul", "Add", "Softmax", "MatMul"]
    feeds = [RNG.standard_normal(tuple(int(d) for d in v.type.shape)).astype(np.float32) for v in before.inputs]
    want = Interpreter(before).run(feeds)[0]
    np.testing.assert_allclose(Interpreter(after).run(feeds)[0], want, rtol=1e-5, atol=1e-6)
    compiled = kiln.compile(before)
    plan = compiled.plans[0]
    kernels = [k for step in plan.steps for k in step.kernels]
    assert [k.kind for k in kernels] == ["attention"]
    # the [2, 3, 17, 17] score tensor never exists: the arena holds one 17 x 17 scores block per
    # thread (the slices run in parallel, each on its own block)
    from kiln.lower.memory import engine_threads

    blocks = min(engine_threads(), 2 * 3)
    assert plan.memory.arena_bytes <= blocks * 17 * 17 * 4 + 64
    got = compiled.run(dict(zip([v.name for v in before.inputs], feeds)))["o"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attention_with_a_full_per_head_mask_and_a_rectangular_score_matrix():
    before = attention(batch="1,2", queries=5, keys=40, depth=16, mask_shape="1,2,5,40")
    after = fuse(before)
    assert after.nodes[0].attrs["kind"] == "attention"
    feeds = [RNG.standard_normal(tuple(int(d) for d in v.type.shape)).astype(np.float32) for v in before.inputs]
    want = Interpreter(before).run(feeds)[0]
    got = kiln.compile(before).run(dict(zip([v.name for v in before.inputs], feeds)))["o"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attention_refusals_name_the_reason():
    refusals = []
    after = fuse(attention(axis=1), refusals)
    assert all(n.attrs.get("kind") != "attention" for n in after.nodes)
    assert any("not over the last axis" in r.reason for r in refusals)
    refusals = []
    after = fuse(attention(extra_reader=True), refusals)  # the probabilities are a graph output
    assert all(n.attrs.get("kind") != "attention" for n in after.nodes)
    assert any("attention" in r.candidate for r in refusals)


def test_gelu_dag_after_a_reshape_fuses_into_the_matmul_epilogue():
    # GPT-2's MLP as exported: Gemm on 2-D rows, a reshape back to [1, T, C], then tanh-GELU
    # written as a DAG that reads x four times, then a residual add.
    c = {n: np.array(v, np.float32) for n, v in (("c3", 0.044715), ("k", 0.7978845608), ("one", 1.0), ("half", 0.5))}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Reshape", ["m", "shape"], ["r"]),
        helper.make_node("Mul", ["r", "r"], ["sq"]),
        helper.make_node("Mul", ["sq", "r"], ["cube"]),
        helper.make_node("Mul", ["cube", "c3"], ["cc"]),
        helper.make_node("Add", ["r", "cc"], ["inner"]),
        helper.make_node("Mul", ["inner", "k"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["r", "half"], ["hx"]),
        helper.make_node("Mul", ["hx", "t1"], ["g"]),
        helper.make_node("Add", ["g", "skip"], ["y"]),
    ]
    weights = {"w": RNG.standard_normal((16, 24)).astype(np.float32), "shape": np.array([1, 10, 24]), **c}
    model = make_model(nodes, [("x", FLOAT, [10, 16]), ("skip", FLOAT, [1, 10, 24])], [("y", FLOAT, None)], weights)
    compiled = kiln.compile(model)
    kernels = [k for step in compiled.plans[0].steps for k in step.kernels]
    assert [k.kind for k in kernels] == ["matmul+epilogue"], [k.sources for k in kernels]
    x, skip = RNG.standard_normal((10, 16)).astype(np.float32), RNG.standard_normal((1, 10, 24)).astype(np.float32)
    want = kiln.compile(model, target="reference")(x, skip)
    np.testing.assert_allclose(compiled(x, skip), want, rtol=1e-5, atol=1e-6)


def test_an_intermediate_read_twice_joins_when_both_readers_are_in_the_group():
    """SiLU after a biased product (Sigmoid and Mul both read the sum): one loop, the intermediate
    computed once per element and never stored; read outside the group too, it stays outside."""
    graph = parse_graph("""
graph g(%x: f32[4,4]) -> (%y) {
  %e: f32[4,4] = Exp(%x)
  %a: f32[4,4] = Relu(%e)
  %b: f32[4,4] = Neg(%e)
  %y: f32[4,4] = Add(%a, %b)
}""")
    after = fuse(graph)
    assert [n.op for n in after.nodes] == ["Fused"]
    assert sorted(n.op for n in after.nodes[0].attrs["body"].nodes) == ["Add", "Exp", "Neg", "Relu"]
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(after).run([x])[0], Interpreter(graph).run([x])[0], rtol=1e-6)

    shared = parse_graph("""
graph g(%x: f32[4,4]) -> (%y, %m) {
  %e: f32[4,4] = Exp(%x)
  %a: f32[4,4] = Relu(%e)
  %b: f32[4,4] = Neg(%e)
  %y: f32[4,4] = Add(%a, %b)
  %m: f32[1,1] = ReduceMax(%e)
}""")
    refusals: list[Refusal] = []
    after = fuse(shared, refusals)
    assert [n.op for n in after.nodes][:2] == ["Exp", "Fused"]
    assert [n.op for n in after.nodes[1].attrs["body"].nodes] == ["Relu", "Neg", "Add"]
    assert any("3 readers" in r.reason for r in refusals)


def heads_model(batch=2, length=9, heads=3, depth=4, kv_length=None, out_perm=(0, 2, 1, 3)):
    """Multi-head attention as exporters write it: [B, L, H*D] projections reshaped to heads and
    transposed (K straight to K^T), the result transposed back and merged."""
    kv_length = kv_length or length
    hidden = heads * depth
    split = np.array([batch, -1, heads, depth], np.int64)
    merged_shape = [batch, length, hidden] if out_perm == (0, 2, 1, 3) else None
    nodes = [
        helper.make_node("Reshape", ["q", "split"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["k", "split"], ["k4"]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["v", "split"], ["v4"]),
        helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qh", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vh"], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=list(out_perm)),
    ]
    outputs = [("y", FLOAT, merged_shape)]
    if merged_shape is not None:
        nodes.append(helper.make_node("Reshape", ["ot", "merge"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    return make_model(
        nodes,
        [
            ("q", FLOAT, [batch, length, hidden]),
            ("k", FLOAT, [batch, kv_length, hidden]),
            ("v", FLOAT, [batch, kv_length, hidden]),
        ],
        outputs,
        {
            "split": split,
            "merge": np.array([batch, length, hidden], np.int64),
            "scale": np.array(depth**-0.5, np.float32),
        },
    )


def test_head_split_and_merge_transposes_fold_into_the_attention_kernel():
    model = heads_model(length=9, kv_length=13)
    compiled = kiln.compile(model)
    kernels = [k for step in compiled.plans[0].steps for k in step.kernels]
    # no copies: the transposes became the products' strides
    assert [k.kind for k in kernels] == ["attention"], [k.kind for k in kernels]
    (fused,) = [n for n in compiled.plans[0].graph.nodes if n.op == "Fused"]
    assert [n.op for n in fused.attrs["body"].nodes].count("Transpose") == 4
    assert not [n for n in compiled.plans[0].graph.nodes if n.op == "Transpose"]
    feeds = {
        "q": RNG.standard_normal((2, 9, 12)).astype(np.float32),
        "k": RNG.standard_normal((2, 13, 12)).astype(np.float32),
        "v": RNG.standard_normal((2, 13, 12)).astype(np.float32),
    }
    want = kiln.compile(model, target="reference").run(feeds)["y"]
    np.testing.assert_allclose(compiled.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)


def test_an_output_transpose_that_moves_the_last_axis_stays_a_copy():
    # [B, H, L, D] -> [B, D, L, H]: the output's rows would not be contiguous, so it is not folded
    model = heads_model(out_perm=(0, 3, 2, 1))
    compiled = kiln.compile(model)
    kinds = [k.kind for step in compiled.plans[0].steps for k in step.kernels]
    assert kinds.count("attention") == 1 and len(kinds) == 2, kinds
    feeds = {name: RNG.standard_normal((2, 9, 12)).astype(np.float32) for name in "qkv"}
    want = kiln.compile(model, target="reference").run(feeds)["y"]
    np.testing.assert_allclose(compiled.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)


def test_attention_view_merges_batch_dims_and_refuses_what_it_cannot_stride():
    from kiln.passes.fuse import attention_view

    # K [B=2, L=5, H=3, D=4] read as K^T [B, H, D, L]: row (d) stride 1, column (l) stride H*D
    assert attention_view((2, 5, 3, 4), (0, 2, 3, 1), inverse=False) == (2, 60, 3, 4, 1, 12)
    # contiguous [2, 3, 7, 8]: batch dims merge into one of 6 with stride 56
    assert attention_view((2, 3, 7, 8), (0, 1, 2, 3), inverse=False) == (1, 0, 6, 56, 8, 1)
    # the output [B, H, L, D] stored as [B, L, H, D]
    assert attention_view((2, 5, 3, 4), (0, 2, 1, 3), inverse=True) == (2, 60, 3, 4, 12, 1)
    # three batch dims that do not merge: [A, B, C, L, D] stored as [C, A, L, B, D]
    assert attention_view((4, 2, 6, 3, 5), (1, 3, 0, 2, 4), inverse=False) is None


def gated_mlp():
    """Llama's MLP, w2(silu(x w1) * (x w3)): the SiLU runs on the *other* product's output."""
    text = """
graph g(%x: f32[1,5,8]) -> (%y) {
  const %w1: f32[8,12]
  const %w3: f32[8,12]
  const %w2: f32[12,8]
  %a: f32[1,5,12] = MatMul(%x, %w1)
  %s: f32[1,5,12] = Sigmoid(%a)
  %silu: f32[1,5,12] = Mul(%a, %s)
  %b: f32[1,5,12] = MatMul(%x, %w3)
  %g: f32[1,5,12] = Mul(%silu, %b)
  %y: f32[1,5,8] = MatMul(%g, %w2)
}"""
    shapes = {"w1": (8, 12), "w3": (8, 12), "w2": (12, 8)}
    return parse_graph(text, {k: RNG.standard_normal(s).astype(np.float32) for k, s in shapes.items()})


def test_a_gated_mlps_silu_joins_the_second_products_epilogue_anchor_first():
    before = gated_mlp()
    after = fuse(before)
    verify(after)
    assert [n.op for n in after.nodes] == ["MatMul", "Fused", "MatMul"]
    fused = after.nodes[1]
    # once, the group was ordered by the graph (Sigmoid first), called "pointwise", and ran on NumPy
    assert fused.attrs["kind"] == "epilogue"
    assert [n.op for n in fused.attrs["body"].nodes] == ["MatMul", "Sigmoid", "Mul", "Mul"]
    x = RNG.standard_normal((1, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(after).run([x])[0], Interpreter(before).run([x])[0], rtol=1e-6)


def test_a_gated_mlp_compiles_with_no_host_fallback(target):
    graph = gated_mlp()
    compiled = kiln.compile(graph, target=target)
    x = RNG.standard_normal((1, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(compiled(x), kiln.compile(graph, target="reference")(x), rtol=1e-4, atol=1e-5)
    assert compiled.is_native, [(f.node.label, f.reason) for p in compiled.plans for f in p.fallbacks]
    kinds = [k.kind for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
    assert "matmul+epilogue" in kinds or target == "kir:loops"


def test_attention_behind_the_exporters_nan_guard_is_one_kernel_and_a_fully_masked_row_is_zeros(target):
    """The dynamo exporter writes softmax as Where(IsNaN(Softmax(s)), 0, Softmax(s)) (simplify makes
    it kiln::SafeSoftmax): attention must still fuse, and keep the guard's meaning."""
    from kiln.passes import optimize

    text = """
graph g(%q: f32[2,2,5,8], %kt: f32[2,2,8,5], %v: f32[2,2,5,8], %mask: f32[1,1,5,5]) -> (%o) {
  const %scale: f32[] = [0.35]
  const %zero: f32[] = [0.0]
  %s: f32[2,2,5,5] = MatMul(%q, %kt)
  %ss: f32[2,2,5,5] = Mul(%s, %scale)
  %sm: f32[2,2,5,5] = Add(%ss, %mask)
  %p: f32[2,2,5,5] = Softmax(%sm) {axis=-1}
  %nan: bool[2,2,5,5] = IsNaN(%p)
  %pg: f32[2,2,5,5] = Where(%nan, %zero, %p)
  %o: f32[2,2,5,8] = MatMul(%pg, %v)
}"""
    graph = parse_graph(text, {"scale": np.array(0.35, np.float32), "zero": np.array(0.0, np.float32)})
    fused = optimize(graph)
    (node,) = fused.nodes
    assert node.attrs["kind"] == "attention" and "SafeSoftmax" in [n.op for n in node.attrs["body"].nodes]
    mask = np.where(np.tril(np.ones((5, 5))) > 0, 0.0, -np.inf).astype(np.float32)[None, None]
    mask[..., 2, :] = -np.inf  # a fully masked query row: NaN softmax, zeros after the guard
    feeds = {
        "q": RNG.standard_normal((2, 2, 5, 8)).astype(np.float32),
        "kt": RNG.standard_normal((2, 2, 8, 5)).astype(np.float32),
        "v": RNG.standard_normal((2, 2, 5, 8)).astype(np.float32),
        "mask": mask,
    }
    want = kiln.compile(graph, target="reference").run(feeds)["o"]
    assert np.all(want[:, :, 2] == 0) and not np.isnan(want).any()
    compiled = kiln.compile(graph, target=target)
    got = compiled.run(feeds)["o"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kinds = [k.kind for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
    assert kinds == ["attention"] or target == "kir:loops"


def test_a_group_the_target_cannot_run_is_split_back_into_its_ops():
    from kiln.passes.fuse import unfuse

    before = conv_block()
    fused = fuse(before)
    assert unfuse(fused, lambda node: True) is fused  # kept: nothing changes
    split = unfuse(fused, lambda node: False)
    verify(split)
    assert [n.op for n in split.nodes] == ["Conv", "Add", "Relu", "Add"]
    assert split.outputs == fused.outputs  # the group's output is the last op's
    x, skip = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32), RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(split).run([x, skip])[0], Interpreter(before).run([x, skip])[0], rtol=1e-6)


@pytest.mark.parametrize(
    "q_batch, kv_batch",
    # multi-query; grouped (5-D); K/V shared across the batch; K/V of lower rank (MatMul broadcasting)
    [("1,4", "1,1"), ("2,2,3", "2,1,1"), ("2,3", "1,3"), ("2,3", "")],
)
def test_attention_whose_keys_and_values_broadcast_over_heads_is_one_kernel(q_batch, kv_batch, target):
    queries, keys, depth = 6, 9, 8
    kv = f"{kv_batch}," if kv_batch else ""
    text = f"""
graph g(%q: f32[{q_batch},{queries},{depth}], %kt: f32[{kv}{depth},{keys}], %v: f32[{kv}{keys},{depth}]) -> (%o) {{
  const %scale: f32[] = [0.35]
  %s: f32[{q_batch},{queries},{keys}] = MatMul(%q, %kt)
  %s2: f32[{q_batch},{queries},{keys}] = Mul(%s, %scale)
  %p: f32[{q_batch},{queries},{keys}] = Softmax(%s2) {{axis=-1}}
  %o: f32[{q_batch},{queries},{depth}] = MatMul(%p, %v)
}}"""
    before = parse_graph(text)
    after = fuse(before)
    assert [n.attrs.get("kind") for n in after.nodes] == ["attention"]
    feeds = [RNG.standard_normal(tuple(int(d) for d in v.type.shape)).astype(np.float32) for v in before.inputs]
    want = Interpreter(before).run(feeds)[0]
    compiled = kiln.compile(before, target=target)
    got = compiled.run(dict(zip([v.name for v in before.inputs], feeds)))["o"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert compiled.is_native
    if target != "kir:loops":  # no attention engine there: the group is split back into its ops
        kinds = [k.kind for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
        assert kinds == ["attention"], kinds


def test_attention_behind_a_where_based_causal_mask_is_one_kernel(target):
    # GPT-Neo's spelling: scores kept where a bool causal mask allows, else the dtype's minimum,
    # then the padding mask added: Where is an elementwise op of the chain (its condition a bool mask)
    text = """
graph g(%q: f32[1,2,6,8], %kt: f32[1,2,8,6], %v: f32[1,2,6,8]) -> (%o) {
  const %causal: bool[1,1,6,6]
  const %floor: f32[] = [-3.4028234663852886e+38]
  const %pad: f32[1,1,1,6]
  %s: f32[1,2,6,6] = MatMul(%q, %kt)
  %m: f32[1,2,6,6] = Where(%causal, %s, %floor)
  %a: f32[1,2,6,6] = Add(%m, %pad)
  %p: f32[1,2,6,6] = Softmax(%a) {axis=-1}
  %o: f32[1,2,6,8] = MatMul(%p, %v)
}"""
    pad = np.zeros((1, 1, 1, 6), np.float32)
    pad[..., -2:] = -1e9
    before = parse_graph(text, {"causal": np.tril(np.ones((6, 6), bool))[None, None], "pad": pad})
    after = fuse(before)
    assert [n.attrs.get("kind") for n in after.nodes] == ["attention"]
    assert [n.op for n in after.nodes[0].attrs["body"].nodes] == ["MatMul", "Where", "Add", "Softmax", "MatMul"]
    feeds = [RNG.standard_normal(tuple(int(d) for d in v.type.shape)).astype(np.float32) for v in before.inputs]
    want = Interpreter(before).run(feeds)[0]
    got = kiln.compile(before, target=target).run(dict(zip([v.name for v in before.inputs], feeds)))["o"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
