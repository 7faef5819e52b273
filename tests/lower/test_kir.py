"""The kernel IR without a C compiler: its printer (Before/Expected text), its verifier (scopes,
index types, static bounds) and its NumPy interpreter, which runs lowered loop nests as an oracle
against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from kiln.driver.options import CompileOptions
from kiln.driver.pipeline import compile_plan
from kiln.frontend.onnx import import_onnx
from kiln.ir.types import DType
from kiln.lower.kir import (
    Binary,
    Buffer,
    For,
    GemmSpec,
    Index,
    Kernel,
    Let,
    Load,
    PackedOperand,
    Scalar,
    Store,
    i64,
    run_time_dim,
)
from kiln.lower.kir_interpreter import KernelIndexError, run_kernel
from kiln.lower.kir_printer import print_kernel
from kiln.lower.kir_verify import verify_kernel
from kiln.ops.interpreter import Interpreter, evaluate_node
from kiln.runtime.plan import Fallback, Segment
from tests.helpers import FLOAT, INT64, make_model

RNG = np.random.default_rng(9)
F32 = DType.FLOAT32


def plan_for(model):
    return compile_plan(import_onnx(model), "cpu", CompileOptions.from_env(level=2), build_library=False)


def interpret(plan, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a plan with its kernels interpreted (fallbacks on the reference), like the runtime does."""
    arrays = {buffer: np.zeros(buffer.size, buffer.dtype.numpy) for buffer in plan.table}
    for buffer, array in plan.constants.items():
        arrays[buffer] = np.ascontiguousarray(array).reshape(-1).copy()
    for value, buffer in zip(plan.graph.inputs, plan.inputs):
        arrays[buffer] = np.ascontiguousarray(feeds[value.name], buffer.dtype.numpy).reshape(-1).copy()
    for step in plan.steps:
        if isinstance(step, Segment):
            for kernel in step.kernels:
                run_kernel(kernel, arrays)
        else:
            assert isinstance(step, Fallback)
            node = step.node
            args = [
                None if v is None else arrays[plan.roots[v]].reshape([int(d) for d in v.type.shape])
                for v in node.inputs
            ]
            for value, result in zip(node.outputs, evaluate_node(node, args)):
                arrays[plan.roots[value]][:] = np.asarray(result).reshape(-1)
    return [
        arrays[buffer].reshape([int(d) for d in value.type.shape])
        for value, buffer in zip(plan.graph.outputs, plan.outputs)
    ]


def loop_nest_models():
    f = lambda *s: RNG.standard_normal(s).astype(np.float32)  # noqa: E731
    yield (
        "activation chain with broadcast",
        make_model(
            [
                helper.make_node("Mul", ["x", "s"], ["m"]),
                helper.make_node("Relu", ["m"], ["r"]),
                helper.make_node("Sub", ["r", "x"], ["d"]),
                helper.make_node("Tanh", ["d"], ["y"]),
            ],
            [("x", FLOAT, [3, 5])],
            [("y", FLOAT, None)],
            {"s": f(5)},
        ),
        {"x": f(3, 5)},
    )
    yield (
        "softmax",
        make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", FLOAT, [4, 7])], [("y", FLOAT, None)]),
        {"x": f(4, 7)},
    )
    yield (
        "layernorm",
        make_model(
            [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
            [("x", FLOAT, [2, 3, 8])],
            [("y", FLOAT, None)],
            {"g": f(8), "b": f(8)},
        ),
        {"x": f(2, 3, 8)},
    )
    yield (
        "reductions",
        make_model(
            [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)],
            [("x", FLOAT, [3, 4, 5])],
            [("y", FLOAT, None)],
            {"axes": np.array([1], np.int64)},
        ),
        {"x": f(3, 4, 5)},
    )
    yield (
        "transpose, slice, concat",
        make_model(
            [
                helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                helper.make_node("Slice", ["t", "starts", "ends"], ["s"]),
                helper.make_node("Concat", ["s", "s"], ["y"], axis=0),
            ],
            [("x", FLOAT, [4, 6])],
            [("y", FLOAT, None)],
            {"starts": np.array([1], np.int64), "ends": np.array([5], np.int64)},
        ),
        {"x": f(4, 6)},
    )
    yield (
        "gather and pad",
        make_model(
            [
                helper.make_node("Gather", ["w", "i"], ["g"]),
                helper.make_node("Pad", ["g", "pads"], ["y"], mode="reflect"),
            ],
            [("i", INT64, [3])],
            [("y", FLOAT, None)],
            {"w": f(6, 5), "pads": np.array([0, 2, 0, 2], np.int64)},
        ),
        {"i": np.array([5, 0, -1], np.int64)},
    )
    yield (
        "max pool",
        make_model(
            [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
            [("x", FLOAT, [1, 2, 7, 7])],
            [("y", FLOAT, None)],
        ),
        {"x": f(1, 2, 7, 7)},
    )


MODELS = list(loop_nest_models())


@pytest.mark.parametrize("name,model,feeds", MODELS, ids=[m[0] for m in MODELS])
def test_lowered_loop_nests_interpreted_match_the_reference(name, model, feeds):
    plan = plan_for(model)
    kernels = [k for step in plan.steps if isinstance(step, Segment) for k in step.kernels]
    assert kernels, "the model lowers to kernels"
    for kernel in kernels:
        assert verify_kernel(kernel) == []
    got = interpret(plan, feeds)
    graph = import_onnx(model)
    expected = Interpreter(graph).run([feeds[v.name] for v in graph.inputs])
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_engine_calls_are_interpreted_by_their_specification_and_checked_against_their_buffers():
    weights = RNG.standard_normal((48, 40)).astype(np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [("x", FLOAT, [19, 48])],
        [("y", FLOAT, None)],
        {"w": weights},
    )
    plan = plan_for(model)
    (kernel,) = [k for s in plan.steps if isinstance(s, Segment) for k in s.kernels]
    (call,) = kernel.body
    assert isinstance(call, GemmSpec) and isinstance(call.b, PackedOperand) and call.epilogue is not None
    assert "gemm(batch=1, m=19, n=40, k=48, a=view(" in print_kernel(kernel)
    x = RNG.standard_normal((19, 48)).astype(np.float32)
    (got,) = interpret(plan, {"x": x})
    np.testing.assert_allclose(got, np.maximum(x @ weights, 0), rtol=1e-5, atol=1e-5)
    call.m += 1  # one row too many: A and the output are too small for it
    with pytest.raises(KernelIndexError, match="gemm operand A reads"):
        interpret(plan, {"x": x})


def relu_kernel(size: int = 4, extent: int = 4) -> tuple[Kernel, Buffer, Buffer]:
    x, y = Buffer("b0", F32, size), Buffer("b1", F32, size)
    i = Index("i1")
    from kiln.lower.pointwise import FLOAT_OPS

    value = FLOAT_OPS["Relu"]([Load(x, i)], {}, F32)
    kernel = Kernel("k1", "pointwise", [For(i, extent, [Store(y, i, value)])], [x], [y], ["relu"])
    return kernel, x, y


def test_the_printer_names_shared_operands_once():
    kernel, _, _ = relu_kernel()
    assert print_kernel(kernel) == (
        "kernel k1 (pointwise) reads b0: f32[4] writes b1: f32[4]\n"
        "  for i1 in 0..4:\n"
        "    %t0 = b0[i1]\n"
        "    b1[i1] = select((%t0 < 0.0), 0.0, %t0)"
    )


def test_the_verifier_finds_out_of_bounds_use_before_definition_and_stores_into_inputs():
    kernel, x, y = relu_kernel(size=4, extent=5)
    assert verify_kernel(kernel) == [
        "kernel k1 (pointwise): load of b0[0, 4) at indices 0..4",
        "kernel k1 (pointwise): store of b1[0, 4) at indices 0..4",
    ]
    s = Scalar("s9", F32)
    i = Index("i1")
    kernel = Kernel("k2", "copy", [For(i, 4, [Store(x, i, s)]), Let(s, Load(y, i64(0)))], [x], [y], ["bad"])
    problems = verify_kernel(kernel)
    assert "kernel k2 (copy): s9 is used outside the loop or block that defines it" in problems
    assert "kernel k2 (copy): stores into b0, which it only reads" in problems


def test_the_interpreter_checks_every_index():
    kernel, x, y = relu_kernel(size=4, extent=5)
    arrays = {x: np.arange(4, dtype=np.float32) - 2, y: np.zeros(4, np.float32)}
    with pytest.raises(KernelIndexError, match="index 4 outside b[01]"):
        run_kernel(kernel, arrays)
    kernel, x, y = relu_kernel()
    arrays = {x: np.arange(4, dtype=np.float32) - 2, y: np.zeros(4, np.float32)}
    run_kernel(kernel, arrays)
    np.testing.assert_array_equal(arrays[y], [0, 0, 0, 1])


def test_kiln_debug_compiles_verify_the_kernel_ir_before_any_c(monkeypatch):
    from kiln.lower import lowering
    from kiln.lower.kir import add

    def off_by_one(lw, node):  # a deliberately wrong lowering: reads x[i + 1]
        src, dst = lw.buffer(node.inputs[0]), lw.buffer(node.outputs[0])
        body, _ = lowering.nest(lw, (dst.size,), lambda i: [Store(dst, i[0], Load(src, add(i[0], i64(1))))])
        return [lw.kernel(node, "pointwise", body, [node.inputs[0]], [node.outputs[0]], lowering.Schedule())]

    from kiln.lower.families import lowerings

    monkeypatch.setitem(lowerings(), "Neg", off_by_one)
    monkeypatch.setenv("KILN_DEBUG", "1")
    model = make_model([helper.make_node("Neg", ["x"], ["y"])], [("x", FLOAT, [8])], [("y", FLOAT, None)])
    with pytest.raises(AssertionError, match=r"load of b0\[0, 8\) at indices 1..8") as caught:
        plan_for(model)
    assert "kiln stage: verify" in caught.value.__notes__


def test_the_interpreter_evaluates_only_the_branch_a_select_takes_as_c_does():
    from kiln.lower.kir import Binary, Const, Select

    x, y = Buffer("b0", F32, 4), Buffer("b1", F32, 6)
    i = Index("i1")
    inside = Binary("&&", Binary("<", i, i64(4)), Binary(">=", Load(x, i), Const(0.0, F32)))  # reads x only if i < 4
    value = Select(Binary("<", i, i64(4)), Select(inside, Load(x, i), Const(0.0, F32)), Const(-1.0, F32))
    kernel = Kernel("k1", "pointwise", [For(i, 6, [Store(y, i, value)])], [x], [y], ["pad"])
    arrays = {x: np.array([1, -2, 3, -4], np.float32), y: np.zeros(6, np.float32)}
    run_kernel(kernel, arrays)  # the loads at i = 4, 5 sit on paths not taken
    np.testing.assert_array_equal(arrays[y], [1, 0, 3, 0, -1, -1])


@pytest.mark.timeout(60)  # evaluated as a tree, depth 60 would never end
@pytest.mark.parametrize("depth", [60, 5000])  # closures, and the iterative walk past kir_interpreter.DEEP
def test_the_interpreter_evaluates_a_shared_operand_once_and_any_depth(depth):
    """Lowering shares operands: (e + e) % p nested 60 times is 2^60 nodes as a tree, and fused
    chains nest thousands deep. Both evaluate in linear time, to C's integer result."""
    from kiln.lower.kir import Binary

    x, y = Buffer("b0", DType.INT64, 1), Buffer("b1", DType.INT64, 3)
    i = Index("i1")
    value = Binary("+", Load(x, i64(0)), i)
    for _ in range(depth):
        value = Binary("%", Binary("+", value, value), i64(1_000_003))
    kernel = Kernel("k1", "pointwise", [For(i, 3, [Store(y, i, value)])], [x], [y], ["chain"])
    arrays = {x: np.array([7], np.int64), y: np.zeros(3, np.int64)}
    run_kernel(kernel, arrays)
    expected = []
    for start in range(7, 10):
        for _ in range(depth):
            start = (2 * start) % 1_000_003
        expected.append(start)
    np.testing.assert_array_equal(arrays[y], expected)


def test_the_interpreter_stores_a_requantized_output_as_the_c_engine_does():
    """An int8 product's Requantize: the finished output also stored as unsigned activations,
    rint(x * inv) + zero clamped to [0, qmax], NaN -> 0, +inf -> qmax (gemm_lowp.c's formula)."""
    from kiln.lower.kir import MatrixOperand, Requantize

    a, b = Buffer("b0", F32, 6), Buffer("b1", F32, 3)
    out, q = Buffer("b2", F32, 2), Buffer("q0", DType.UINT8, 2)
    call = GemmSpec(1, 2, 1, 3, MatrixOperand(a, 0, 3, 1), MatrixOperand(b, 0, 1, 1), out, 2, 1,
                    requant=Requantize(q, 2.0, 10, 127))  # fmt: skip
    kernel = Kernel("k1", "matmul", [call], [a, b], [out, q], ["m"])
    for row, want in (([1.0, 2.0, 3.25], 22), ([-20.0, 0.0, 0.0], 0), ([np.nan, 0, 0], 0), ([np.inf, 0, 0], 127)):
        arrays = {a: np.array([*row, 0.5, 0.25, 0.0], np.float32), b: np.ones(3, np.float32),
                  out: np.zeros(2, np.float32), q: np.full(2, 99, np.uint8)}  # fmt: skip
        run_kernel(kernel, arrays)
        assert arrays[q].tolist() == [want, 12]  # 6.25 * 2 = 12.5 -> 12 and 0.75 * 2 = 1.5 -> 2: rint, to even


def test_the_verifier_bounds_loops_over_run_time_sizes_by_their_ranges():
    """A loop over a run-time dim (the dims vector's kiln_d0) is checked at every size its range
    allows: a 40-element buffer holds rows of 4 for d0 up to 10, not 11 (issue 49's interval
    verifier); without the ranges the access is not checked (the run-time checks' part)."""
    x, y = Buffer("b0", F32, 40), Buffer("b1", F32, 40)
    i, j = Index("i1"), Index("j1")
    rows = run_time_dim(0)
    index = Binary("+", Binary("*", i, i64(4)), j)
    body = [For(i, rows, [For(j, 4, [Store(y, index, Load(x, index))])])]
    kernel = Kernel("k1", "copy", body, [x], [y], ["rows"])
    assert verify_kernel(kernel, {rows.name: (1, 10)}) == []
    assert verify_kernel(kernel, {rows.name: (1, 11)}) == [
        "kernel k1 (copy): load of b0[0, 40) at indices 0..43",
        "kernel k1 (copy): store of b1[0, 40) at indices 0..43",
    ]
    assert verify_kernel(kernel) == []
