"""Before/Expected tests in the IR's text form, compared structurally, plus numeric checks."""

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.ir.parser import parse_graph
from kiln.ops.interpreter import Interpreter
from kiln.ops.verify import verify
from kiln.passes import optimize, specialize
from kiln.passes.cse import cse
from kiln.passes.dce import dce
from kiln.passes.fold_batchnorm import fold_batchnorm
from kiln.passes.fold_constants import fold_constants
from kiln.passes.gemm import canonicalize_gemm
from kiln.passes.simplify import RULES, simplify
from kiln.passes.transpose import sink_transposes


def assert_same(got, expected_text, data=None):
    expected = parse_graph(expected_text, data)
    verify(got)
    assert got == expected, f"got:\n{got}\n\nexpected:\n{expected}"


def run(graph, *inputs):
    return Interpreter(graph).run(list(inputs))


def test_dce_removes_unread_nodes_and_constants():
    before = parse_graph("""
graph g(%x: f32[2]) -> (%y) {
  const %unused: f32[] = [3.0]
  %dead: f32[2] = Exp(%x)
  %deader: f32[2] = Neg(%dead)
  %y: f32[2] = Relu(%x)
}""")
    assert_same(
        dce(before),
        """
graph g(%x: f32[2]) -> (%y) {
  %y: f32[2] = Relu(%x)
}""",
    )


def test_cse_merges_equal_nodes_and_constants():
    before = parse_graph("""
graph g(%x: f32[2,2]) -> (%y) {
  const %w1: f32[2] = [1.0, 2.0]
  const %w2: f32[2] = [1.0, 2.0]
  %a: f32[2,2] = Mul(%x, %w1)
  %b: f32[2,2] = Mul(%x, %w2)
  %y: f32[2,2] = Add(%a, %b)
}""")
    assert_same(
        cse(before),
        """
graph g(%x: f32[2,2]) -> (%y) {
  const %w: f32[2] = [1.0, 2.0]
  %a: f32[2,2] = Mul(%x, %w)
  %y: f32[2,2] = Add(%a, %a)
}""",
    )


def test_cse_merges_large_constants_only_when_every_element_is_equal():
    """Large constants are compared by a sample of their elements first: two that agree there
    but not elsewhere stay apart; equal ones merge."""
    from kiln.ir.graph import Graph, Node, Value
    from kiln.ir.types import DType, TensorType

    rng = np.random.default_rng(0)
    base = rng.standard_normal((300, 200)).astype(np.float32)
    other = base.copy()
    other[1, 1] += 1.0  # not one of the sampled elements
    same = base.copy()
    t = TensorType(DType.FLOAT32, (300, 200))
    x = Value("x", t)
    consts = [Value(n, t) for n in ("a", "b", "c")]
    outs = [Value(f"y{i}", t) for i in range(3)]
    nodes = [Node("Add", [x, c], [y]) for c, y in zip(consts, outs)]
    graph = Graph([x], outs, nodes, dict(zip(consts, (base, other, same))))
    merged = cse(graph)
    assert sorted(v.name for v in merged.constants) == ["a", "b"]
    assert [n.inputs[1].name for n in merged.nodes] == ["a", "b"]  # y2 is y0 now


def test_fold_constants_evaluates_and_collapses_shape_subgraphs():
    before = parse_graph("""
graph g(%x: f32[4,6]) -> (%y) {
  const %zero: i64[] = [0]
  const %axes: i64[1] = [0]
  const %rest: i64[1] = [-1]
  const %a: f32[2] = [1.0, 2.0]
  const %b: f32[2] = [3.0, 4.0]
  %s: i64[2] = Shape(%x)
  %d0: i64[] = Gather(%s, %zero) {axis=0}
  %d: i64[1] = Unsqueeze(%d0, %axes)
  %target: i64[2] = Concat(%d, %rest) {axis=0}
  %r: f32[r0,r1] = Reshape(%x, %target)
  %c: f32[2] = Add(%a, %b)
  %y: f32[r0,r1] = Relu(%r)
}""")
    folded = dce(fold_constants(before))
    assert_same(
        folded,
        """
graph g(%x: f32[4,6]) -> (%y) {
  const %target: i64[2] = [4, -1]
  %r: f32[4,6] = Reshape(%x, %target)
  %y: f32[4,6] = Relu(%r)
}""",
    )


@pytest.mark.parametrize(
    ("before", "expected"),
    [
        ("%y: f32[2,3] = Identity(%x)", ""),
        ("const %one: f32[] = [1.0]\n  %y: f32[2,3] = Mul(%x, %one)", ""),
        ("const %one: f32[] = [1.0]\n  %y: f32[2,3] = Mul(%one, %x)", ""),
        ("const %z: f32[3] = [0.0, 0.0, 0.0]\n  %y: f32[2,3] = Add(%x, %z)", ""),
        ("const %one: f32[] = [1.0]\n  %y: f32[2,3] = Div(%x, %one)", ""),
        ("%t: f32[3,2] = Transpose(%x) {perm=[1, 0]}\n  %y: f32[2,3] = Transpose(%t) {perm=[1, 0]}", ""),
        ("%y: f32[2,3] = Cast(%x) {to=1}", ""),
        ("%y: f32[2,3] = Concat(%x) {axis=0}", ""),
        ("%y: f32[2,3] = Dropout(%x)", ""),
    ],
)
def test_simplify_rules_that_remove_the_node(before, expected):
    graph = parse_graph(f"graph g(%x: f32[2,3]) -> (%y) {{\n  {before}\n}}")
    got = dce(simplify(graph))
    assert got.outputs[0] is got.inputs[0], str(got)
    assert not got.nodes


def test_simplify_keeps_broadcasting_rules_honest():
    # x * ones([2, 3]) with x: [3] broadcasts: replacing it by x would change the shape.
    graph = parse_graph("""
graph g(%x: f32[3]) -> (%y) {
  const %ones: f32[2,3] = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
  %y: f32[2,3] = Mul(%x, %ones)
}""")
    assert simplify(graph) is graph


def test_simplify_merges_transposes_reshapes_and_casts():
    graph = parse_graph("""
graph g(%x: f32[2,3,4], %i: i32[5]) -> (%y, %r, %c) {
  const %s1: i64[2] = [6, 4]
  const %s2: i64[2] = [4, 6]
  %t1: f32[3,2,4] = Transpose(%x) {perm=[1, 0, 2]}
  %y: f32[4,3,2] = Transpose(%t1) {perm=[2, 0, 1]}
  %a: f32[6,4] = Reshape(%x, %s1)
  %r: f32[4,6] = Reshape(%a, %s2)
  %wide: i64[5] = Cast(%i) {to=7}
  %c: f32[5] = Cast(%wide) {to=1}
}""")
    assert_same(
        dce(simplify(graph)),
        """
graph g(%x: f32[2,3,4], %i: i32[5]) -> (%y, %r, %c) {
  const %shape: i64[2] = [4, 6]
  %y: f32[4,3,2] = Transpose(%x) {perm=[2, 1, 0]}
  %r: f32[4,6] = Reshape(%x, %shape)
  %c: f32[5] = Cast(%i) {to=1}
}""",
    )


def test_every_simplify_rule_states_its_rule():
    assert all("->" in text for _, text, _ in RULES)


def test_fold_batchnorm_into_conv_is_exact():
    rng = np.random.default_rng(0)
    data = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "b": rng.standard_normal(4).astype(np.float32),
        "gamma": rng.uniform(0.5, 2, 4).astype(np.float32),
        "beta": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32),
        "var": rng.uniform(0.5, 2, 4).astype(np.float32),
    }
    text = """
graph g(%x: f32[1,3,8,8]) -> (%y) {
  const %w: f32[4,3,3,3]
  const %b: f32[4]
  const %gamma: f32[4]
  const %beta: f32[4]
  const %mean: f32[4]
  const %var: f32[4]
  %c: f32[1,4,8,8] = Conv(%x, %w, %b) {pads=[1, 1, 1, 1]}
  %y: f32[1,4,8,8] = BatchNormalization(%c, %gamma, %beta, %mean, %var) {epsilon=1e-05}
}"""
    before = parse_graph(text, data)
    after = fold_batchnorm(before)
    verify(after)
    assert [n.op for n in after.nodes] == ["Conv"]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run(after, x)[0], run(before, x)[0], rtol=1e-5, atol=1e-5)


def test_fold_batchnorm_refuses_when_conv_output_is_shared():
    text = """
graph g(%x: f32[1,1,2,2]) -> (%y, %c) {
  const %w: f32[1,1,1,1] = [2.0]
  const %p: f32[1] = [1.0]
  %c: f32[1,1,2,2] = Conv(%x, %w)
  %y: f32[1,1,2,2] = BatchNormalization(%c, %p, %p, %p, %p)
}"""
    graph = parse_graph(text)
    assert fold_batchnorm(graph) is graph


def test_canonicalize_gemm_folds_transpose_and_scales():
    rng = np.random.default_rng(1)
    data = {"b": rng.standard_normal((5, 4)).astype(np.float32), "c": rng.standard_normal(5).astype(np.float32)}
    before = parse_graph(
        """
graph g(%a: f32[batch,4]) -> (%y) {
  const %b: f32[5,4]
  const %c: f32[5]
  %y: f32[batch,5] = Gemm(%a, %b, %c) {alpha=0.5, beta=2.0, transB=1}
}""",
        data,
    )
    after = canonicalize_gemm(before)
    assert_same(
        after,
        """
graph g(%a: f32[batch,4]) -> (%y) {
  const %bt: f32[4,5]
  const %c2: f32[5]
  %m: f32[batch,5] = MatMul(%a, %bt)
  %y: f32[batch,5] = Add(%m, %c2)
}""",
        {"bt": (data["b"].T * 0.5).astype(np.float32), "c2": (data["c"] * 2).astype(np.float32)},
    )
    a = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(run(after, a)[0], run(before, a)[0], rtol=1e-5)


def test_sink_transposes_lets_pairs_cancel():
    before = parse_graph("""
graph g(%x: f32[2,3]) -> (%y) {
  %t: f32[3,2] = Transpose(%x) {perm=[1, 0]}
  %r: f32[3,2] = Relu(%t)
  %e: f32[3,2] = Exp(%r)
  %y: f32[2,3] = Transpose(%e) {perm=[1, 0]}
}""")
    after = dce(simplify(sink_transposes(before)))
    assert_same(
        after,
        """
graph g(%x: f32[2,3]) -> (%y) {
  %r: f32[2,3] = Relu(%x)
  %y: f32[2,3] = Exp(%r)
}""",
    )


def test_specialize_binds_symbols_and_folds_shapes():
    before = parse_graph("""
graph g(%x: f32[batch,6]) -> (%y) {
  const %rest: i64[1] = [-1]
  const %zero: i64[1] = [0]
  %s: i64[2] = Shape(%x)
  %b: i64[1] = Gather(%s, %zero) {axis=0}
  %target: i64[2] = Concat(%b, %rest) {axis=0}
  %y: f32[batch,r] = Reshape(%x, %target)
}""")
    after = dce(specialize(before, {"batch": 3}))
    assert_same(
        after,
        """
graph g(%x: f32[3,6]) -> (%y) {
  const %target: i64[2] = [3, -1]
  %y: f32[3,6] = Reshape(%x, %target)
}""",
    )


def test_pipeline_reports_stages_and_rejects_unknown_passes():
    graph = parse_graph("""
graph g(%x: f32[2]) -> (%y) {
  %a: f32[2] = Identity(%x)
  %y: f32[2] = Relu(%a)
}""")
    seen = []
    optimized = optimize(graph, level=2, after=lambda name, g: seen.append(name))
    assert seen[0] == "fold_constants" and seen[-1] == "dce" and "simplify" in seen
    assert [n.op for n in optimized.nodes] == ["Relu"]
    assert [n.op for n in optimize(graph, level=0).nodes] == ["Identity", "Relu"]
    assert [n.op for n in optimize(graph, level=2, disable=["simplify"]).nodes] == ["Identity", "Relu"]
    with pytest.raises(KilnError, match="unknown pass\\(es\\) \\['fuse_everything'\\]"):
        optimize(graph, disable=["fuse_everything"])


def test_simplify_never_trusts_unknown_shapes():
    # zeros [2,3] + x [3] broadcasts; with both typed f32[...] the types alone prove nothing.
    graph = parse_graph("""
graph g(%x: f32[...]) -> (%y) {
  const %zeros: f32[2,3] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
  %y: f32[...] = Add(%zeros, %x)
}""")
    assert simplify(graph) is graph


NAN_GUARD = """
graph g(%x: f32[3,4]) -> (%y) {
  const %zero: f32[] = [0.0]
  %s: f32[3,4] = Softmax(%x) {axis=-1}
  %bad: bool[3,4] = IsNaN(%s)
  %y: f32[3,4] = Where(%bad, %zero, %s)
}"""


def test_exporters_nan_guard_after_softmax_becomes_one_op():
    after = dce(simplify(parse_graph(NAN_GUARD)))
    assert_same(
        after,
        """
graph g(%x: f32[3,4]) -> (%y) {
  %y: f32[3,4] = kiln::SafeSoftmax(%x) {axis=-1}
}""",
    )


def test_safe_softmax_is_exactly_the_guarded_pattern_including_nan_rows():
    import kiln

    before = parse_graph(NAN_GUARD)
    after = dce(simplify(before))
    x = np.array([[1.0, 2.0, 3.0, 4.0], [np.nan, 0.0, 1.0, 2.0], [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32)
    expected = run(before, x)[0]
    np.testing.assert_array_equal(run(after, x)[0], expected)
    assert np.all(expected[1:] == 0) and not np.isnan(expected).any()
    native = kiln.compile(before, target="cpu")
    assert native.is_native
    np.testing.assert_allclose(native(x), expected, rtol=1e-6)


def test_simplify_turns_small_integer_powers_into_products():
    graph = parse_graph("""
graph g(%x: f32[4]) -> (%y, %z, %w) {
  const %two: f32[] = [2.0]
  const %three: f32[] = [3.0]
  const %half: f32[] = [0.5]
  %y: f32[4] = Pow(%x, %two)
  %z: f32[4] = Pow(%x, %three)
  %w: f32[4] = Pow(%x, %half)
}""")
    got = dce(simplify(graph))
    assert [n.op for n in got.nodes] == ["Mul", "Mul", "Mul", "Pow"]  # x^0.5 stays a pow
    x = np.array([-1.5, 0.0, 2.0, 3.0], np.float32)
    want = Interpreter(graph).run([x])
    for expected, actual in zip(want, Interpreter(got).run([x])):
        np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_elementwise_ops_sink_below_reshapes():
    graph = parse_graph("""
graph g(%x: f32[6,4], %skip: f32[1,6,4]) -> (%y) {
  const %shape: i64[3] = [1, 6, 4]
  const %half: f32[] = [0.5]
  const %bias: f32[4] = [1.0, 2.0, 3.0, 4.0]
  %r: f32[1,6,4] = Reshape(%x, %shape)
  %a: f32[1,6,4] = Mul(%r, %half)
  %b: f32[1,6,4] = Add(%a, %bias)
  %y: f32[1,6,4] = Add(%b, %skip)
}""")
    got = dce(simplify(simplify(graph)))
    # the elementwise ops now run on x's own [6,4] shape; one reshape at the end
    assert [n.op for n in got.nodes if n.op != "Reshape"] == ["Mul", "Add", "Add"]
    assert got.nodes[-1].op == "Reshape"
    assert all(tuple(n.outputs[0].type.shape) == (6, 4) for n in got.nodes if n.op in ("Mul", "Add"))
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((1, 6, 4)).astype(np.float32)]
    np.testing.assert_allclose(Interpreter(got).run(feeds)[0], Interpreter(graph).run(feeds)[0], rtol=1e-6)


def test_reshape_sinking_refuses_operands_that_would_change_meaning():
    # [2,6] -> [3,4]: a [4] vector aligns with different elements in the two shapes
    graph = parse_graph("""
graph g(%x: f32[2,6]) -> (%y) {
  const %shape: i64[2] = [3, 4]
  const %v: f32[4] = [1.0, 2.0, 3.0, 4.0]
  %r: f32[3,4] = Reshape(%x, %shape)
  %y: f32[3,4] = Add(%r, %v)
}""")
    assert [n.op for n in dce(simplify(graph)).nodes] == ["Reshape", "Add"]


def test_a_pool_whose_one_window_covers_the_input_becomes_a_global_pool():
    # transformers' EfficientNet: AveragePool with a kernel far larger than the 7x7 map, ceil_mode
    before = parse_graph(
        """
graph g(%x: f32[1,8,7,7]) -> (%y, %z) {
  %y: f32[1,8,1,1] = AveragePool(%x) {ceil_mode=1, kernel_shape=[1280, 1280], strides=[1280, 1280]}
  %z: f32[1,8,1,1] = MaxPool(%x) {kernel_shape=[7, 7]}
}"""
    )
    after = simplify(before)
    assert_same(
        after,
        """
graph g(%x: f32[1,8,7,7]) -> (%y, %z) {
  %y: f32[1,8,1,1] = GlobalAveragePool(%x)
  %z: f32[1,8,1,1] = GlobalMaxPool(%x)
}""",
    )
    x = np.random.default_rng(0).standard_normal((1, 8, 7, 7)).astype(np.float32)
    for got, want in zip(run(after, x), run(before, x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_pool_that_counts_padding_or_has_several_windows_is_kept():
    text = """
graph g(%x: f32[1,2,4,4]) -> (%y, %z) {
  %y: f32[1,2,1,1] = AveragePool(%x) {count_include_pad=1, kernel_shape=[5, 5], pads=[0, 0, 1, 1]}
  %z: f32[1,2,2,2] = AveragePool(%x) {kernel_shape=[2, 2], strides=[2, 2]}
}"""
    after = simplify(parse_graph(text))
    assert [n.op for n in after.nodes] == ["AveragePool", "AveragePool"]
