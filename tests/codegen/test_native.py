"""Every case compiled for every target this machine runs (the ``target`` fixture: cpu, its ISA
paths, the test-only kir target) and compared with the reference interpreter."""

import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.backends.cpu import host, toolchain
from kiln.errors import ExecutionError
from tests.helpers import make_model

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(0)


def case(op, shapes, attrs=None, dtype=F, inits=None, outputs=1):
    """One ``op`` node over inputs x0.. of ``shapes``; ``dtype`` is one element type or one per input."""
    names = [f"x{i}" for i in range(len(shapes))]
    dtypes = dtype if isinstance(dtype, list) else [dtype] * len(shapes)
    node = helper.make_node(op, names + list(inits or {}), [f"y{i}" for i in range(outputs)], **(attrs or {}))
    return make_model(
        [node],
        [(n, t, list(s)) for n, t, s in zip(names, dtypes, shapes)],
        [(f"y{i}", 0, None) for i in range(outputs)],
        inits,
    )


def data(shape, dtype=np.float32, positive=False):
    array = RNG.standard_normal(shape).astype(dtype)
    return np.abs(array) + 0.1 if positive else array


CASES = {
    "relu": (case("Relu", [(2, 3, 4)]), [data((2, 3, 4))]),
    "sigmoid": (case("Sigmoid", [(5, 7)]), [data((5, 7))]),
    "tanh": (case("Tanh", [(5, 7)]), [data((5, 7))]),
    "log": (case("Log", [(9,)]), [data((9,), positive=True)]),
    "erf": (case("Erf", [(33,)]), [data((33,))]),
    "gelu_tanh": (case("Gelu", [(4, 8)], {"approximate": "tanh"}), [data((4, 8))]),
    "leaky_relu": (case("LeakyRelu", [(4, 8)], {"alpha": 0.2}), [data((4, 8))]),
    "hardswish": (case("HardSwish", [(4, 8)]), [data((4, 8))]),
    "add_broadcast": (case("Add", [(2, 3, 4), (4,)]), [data((2, 3, 4)), data((4,))]),
    "mul_broadcast_both": (case("Mul", [(2, 1, 4), (3, 1)]), [data((2, 1, 4)), data((3, 1))]),
    "div": (case("Div", [(3, 4), (3, 4)]), [data((3, 4)), data((3, 4), positive=True)]),
    "pow": (case("Pow", [(3, 4), ()]), [data((3, 4), positive=True), np.array(1.5, np.float32)]),
    "max_nan": (
        case("Max", [(4,), (4,)]),
        [np.array([1, np.nan, 3, -1], np.float32), np.array([2, 0, np.nan, -2], np.float32)],
    ),
    "min_nan": (
        case("Min", [(4,), (4,)]),
        [np.array([1, np.nan, 3, -1], np.float32), np.array([2, 0, np.nan, -2], np.float32)],
    ),
    # a Clip is a max then a min (the chain GCC must vectorize); NaN in the data or a bound is the result
    "clip_nan": (
        case("Clip", [(6,), (), ()]),
        [np.array([np.nan, -3, 0.5, 7, np.inf, -np.inf], np.float32), np.array(0, np.float32), np.array(6, np.float32)],
    ),
    "clip_nan_bound": (
        case("Clip", [(4,), (), ()]),
        [np.array([np.nan, -3, 0.5, 7], np.float32), np.array(np.nan, np.float32), np.array(6, np.float32)],
    ),
    "int_add": (case("Add", [(5,), (5,)], dtype=I64), [np.arange(5), np.arange(5) * 3]),
    "less": (case("Less", [(6,), (6,)]), [data((6,)), data((6,))]),
    "where": (case("Where", [(2, 3), (2, 3), (3,)], dtype=[B, F, F]), [data((2, 3)) > 0, data((2, 3)), data((3,))]),
    "reduce_mean": (case("ReduceMean", [(2, 3, 4)], inits={"axes": np.array([-1])}), [data((2, 3, 4))]),
    "reduce_sum_all": (case("ReduceSum", [(2, 3, 4)], {"keepdims": 0}), [data((2, 3, 4))]),
    "reduce_max_middle": (case("ReduceMax", [(2, 3, 4)], inits={"axes": np.array([1])}), [data((2, 3, 4))]),
    # integers (a position's maximum): exact in their own type, the type's own extremes included
    "reduce_max_int32": (
        case("ReduceMax", [(2, 3, 4)], dtype=TensorProto.INT32, inits={"axes": np.array([1])}),
        [np.array(RNG.integers(-(2**31), 2**31, (2, 3, 4)), np.int32)],
    ),
    "reduce_min_int64_all": (
        case("ReduceMin", [(3, 5)], {"keepdims": 0}, dtype=I64),
        [np.array([[2**62, -(2**63), 5, 0, 1]] * 3, np.int64)],
    ),
    "softmax_axis1": (case("Softmax", [(2, 5, 3)], {"axis": 1}), [data((2, 5, 3))]),
    "log_softmax": (case("LogSoftmax", [(3, 7)]), [data((3, 7))]),
    "layer_norm": (
        case(
            "LayerNormalization", [(2, 4, 8)], {"axis": -1, "epsilon": 1e-5}, inits={"s": data((8,)), "b": data((8,))}
        ),
        [data((2, 4, 8))],
    ),
    "matmul": (case("MatMul", [(5, 7), (7, 3)]), [data((5, 7)), data((7, 3))]),
    "matmul_batched_broadcast": (case("MatMul", [(2, 1, 3, 4), (3, 4, 5)]), [data((2, 1, 3, 4)), data((3, 4, 5))]),
    "conv_stride_pad_bias": (
        case(
            "Conv",
            [(1, 3, 9, 9)],
            {"strides": [2, 2], "pads": [1, 2, 1, 0]},
            inits={"w": data((4, 3, 3, 3)), "b": data((4,))},
        ),
        [data((1, 3, 9, 9))],
    ),
    "conv_group_dilation": (
        case(
            "Conv",
            [(2, 4, 8, 8)],
            {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]},
            inits={"w": data((6, 2, 3, 3))},
        ),
        [data((2, 4, 8, 8))],
    ),
    "conv_same_upper": (
        case("Conv", [(1, 2, 7, 7)], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, inits={"w": data((3, 2, 4, 4))}),
        [data((1, 2, 7, 7))],
    ),
    "conv_1x1": (case("Conv", [(1, 8, 5, 5)], inits={"w": data((16, 8, 1, 1))}), [data((1, 8, 5, 5))]),
    "maxpool": (
        case("MaxPool", [(1, 2, 7, 7)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        [data((1, 2, 7, 7))],
    ),
    "maxpool_ceil": (
        case("MaxPool", [(1, 1, 6, 6)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        [data((1, 1, 6, 6))],
    ),
    "avgpool_include_pad": (
        case("AveragePool", [(1, 2, 5, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        [data((1, 2, 5, 5))],
    ),
    "avgpool_exclude_pad": (
        case("AveragePool", [(1, 2, 5, 5)], {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]}),
        [data((1, 2, 5, 5))],
    ),
    "global_avgpool": (case("GlobalAveragePool", [(2, 3, 4, 4)]), [data((2, 3, 4, 4))]),
    "transpose": (case("Transpose", [(2, 3, 4)], {"perm": [2, 0, 1]}), [data((2, 3, 4))]),
    "concat": (case("Concat", [(2, 3), (2, 5)], {"axis": 1}), [data((2, 3)), data((2, 5))]),
    "split": (case("Split", [(6, 4)], {"axis": 0}, inits={"split": np.array([2, 4])}, outputs=2), [data((6, 4))]),
    "slice_negative_step": (
        case(
            "Slice",
            [(5, 6)],
            inits={"s": np.array([4, 1]), "e": np.array([0, 6]), "a": np.array([0, 1]), "st": np.array([-1, 2])},
        ),
        [data((5, 6))],
    ),
    "gather_negative": (
        case("Gather", [(5, 3)], {"axis": 0}, inits={"i": np.array([[0, -1], [2, 4]])}),
        [data((5, 3))],
    ),
    "pad": (case("Pad", [(2, 3)], inits={"p": np.array([1, 0, 0, 2]), "v": np.array(7.0, np.float32)}), [data((2, 3))]),
    "cast_bool_to_float": (case("Cast", [(4,)], {"to": 1}, dtype=B), [np.array([True, False, True, True])]),
    "reshape_to_output": (case("Flatten", [(2, 3, 4)], {"axis": 1}), [data((2, 3, 4))]),
    "gather_nd": (
        case("GatherND", [(4, 5, 3), (2, 2)], dtype=[F, I64]),
        [data((4, 5, 3)), np.array([[3, -1], [0, 2]], np.int64)],
    ),
    "gather_nd_batch_dims": (
        case("GatherND", [(2, 4, 3), (2, 1, 1)], {"batch_dims": 1}, dtype=[F, I64]),
        [data((2, 4, 3)), np.array([[[1]], [[3]]], np.int64)],
    ),
    "instance_norm": (
        case("InstanceNormalization", [(2, 3, 5, 4)], {"epsilon": 1e-3}, inits={"s": data((3,)), "b": data((3,))}),
        [data((2, 3, 5, 4))],
    ),
    "layer_norm_no_bias": (case("LayerNormalization", [(3, 8)], {"axis": -1}, inits={"s": data((8,))}), [data((3, 8))]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_native_matches_reference(name, target):
    model, inputs = CASES[name]
    compiled = kiln.compile(model, target=target)
    reference = kiln.compile(model, target="reference")
    got, expected = compiled(*inputs), reference(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    fallbacks = [(f.node.op, f.reason) for plan in compiled.plans for f in plan.fallbacks]
    assert compiled.is_native, fallbacks


def test_ops_without_lowering_fall_back_and_say_so():
    model = case("TopK", [(2, 6)], {"axis": 1}, inits={"k": np.array([3])}, outputs=2)
    compiled = kiln.compile(model, target="cpu")
    x = data((2, 6))
    values, indices = compiled(x)
    reference = kiln.compile(model)(x)
    np.testing.assert_array_equal(values, reference[0])
    np.testing.assert_array_equal(indices, reference[1])
    assert compiled.is_native is False
    assert [f.node.op for f in compiled.plans[0].fallbacks] == ["TopK"]


def test_symbolic_batch_compiles_one_variant_per_binding():
    """Softmax over the last dim: the batch is sample-parallel, so batch 3 runs as three batch-1
    chunks (one variant); with size classes disabled, each batch size is its own variant."""
    from kiln.driver.options import CompileOptions

    model = case("Softmax", [("batch", 5)])
    for disabled, variants in ((frozenset(), 1), (frozenset({"size-classes"}), 2)):
        compiled = kiln.compile(model, target="cpu", options=CompileOptions.from_env(disabled=disabled))
        for batch in (1, 3, 1):
            x = data((batch, 5))
            np.testing.assert_allclose(compiled(x), kiln.compile(model, target="reference")(x), rtol=1e-6)
        assert len(compiled.plans) == variants


def test_out_of_range_gather_is_an_error_not_a_wild_read():
    model = make_model(
        [helper.make_node("Gather", ["t", "i"], ["y"], name="lookup")],
        [("i", I64, [2])],
        [("y", F, None)],
        {"t": data((3, 2))},
    )
    compiled = kiln.compile(model, target="cpu")
    np.testing.assert_allclose(compiled(np.array([0, -1])), kiln.compile(model)(np.array([0, -1])))
    # the node, its opset and the types it was compiled for, and the stage
    message = r"'lookup' \(Gather\) \(opset 17\) with inputs %t: f32\[3,2\], %i: i64\[2\]: an index input is out of range.*stage: run"
    with pytest.raises(ExecutionError, match=message):
        compiled(np.array([0, 3]))


def test_out_of_range_gather_nd_is_an_error_not_a_wild_read(target):
    model = make_model(
        [helper.make_node("GatherND", ["t", "i"], ["y"], name="nd")],
        [("i", I64, [2, 2])],
        [("y", F, None)],
        {"t": data((3, 4, 2))},
    )
    compiled = kiln.compile(model, target=target)
    good = np.array([[2, -4], [0, 3]])
    np.testing.assert_array_equal(compiled(good), kiln.compile(model, target="reference")(good))
    with pytest.raises(ExecutionError, match=r"'nd' \(GatherND\).*an index input is out of range"):
        compiled(np.array([[0, 0], [0, 4]]))


def test_gather_nd_of_its_grids_own_coordinates_reads_no_index_buffer_and_stops_past_the_dim(target):
    """mask[arange(b)[:, None, None], arange(n)]: index tuples that are their grid's coordinates
    (the dynamo exports' mask lookup, folded) are read from the loops, not from a buffer whose
    layout follows the sizes; the same values as the reference, and an arange past the dim stops
    the run with the node named, as a stored index past it does."""

    def model_with(n: int):  # type: ignore[no-untyped-def]
        rows = np.broadcast_to(np.arange(3).reshape(3, 1, 1), (3, 1, n))
        cols = np.broadcast_to(np.arange(n).reshape(1, 1, n), (3, 1, n))
        indices = np.stack([rows, cols], axis=-1).astype(np.int64)
        return make_model(
            [helper.make_node("GatherND", ["t", "i"], ["y"], name="lookup")],
            [("t", F, [3, 5])],
            [("y", F, None)],
            {"i": indices},
        )

    x = data((3, 5))
    compiled = kiln.compile(model_with(4), target=target)
    np.testing.assert_array_equal(compiled(x), x[:, None, :4])
    kernels = [k for plan in compiled.plans for step in plan.steps for k in getattr(step, "kernels", [])]
    copies = [k for k in kernels if "lookup" in " ".join(k.sources)]
    assert copies and all(len(k.reads) == 1 for k in copies), [(k.kind, k.reads) for k in copies]
    held = [np.asarray(a) for plan in compiled.plans for a in plan.constants.values()]
    assert not any(a.dtype == np.int64 and a.size == 3 * 4 * 2 for a in held), "the index tuples are held"
    past = kiln.compile(model_with(6), target=target)  # (column 5 is past t's 5 columns)
    with pytest.raises(ExecutionError, match=r"'lookup' \(GatherND\).*an index input is out of range"):
        past(x)


def test_scatter_nd_writes_in_order_natively_and_an_out_of_range_index_is_an_error_not_a_wild_write(target):
    """BART's "shift tokens right": ScatterND writing the first token of each row; duplicates
    apply in order; a negative index counts from the end; one past the end stops the run."""
    model = make_model(
        [helper.make_node("ScatterND", ["t", "i", "u"], ["y"], name="shift", reduction="add")],
        [("i", I64, [3, 2]), ("u", F, [3, 2])],
        [("y", F, None)],
        {"t": data((3, 4, 2))},
    )
    compiled = kiln.compile(model, target=target)
    reference = kiln.compile(model, target="reference")
    assert compiled.is_native
    good = (np.array([[2, -4], [0, 3], [2, 0]]), data((3, 2)))  # [2, 0] twice: both added
    np.testing.assert_allclose(compiled(*good), reference(*good), rtol=1e-6)
    with pytest.raises(ExecutionError, match=r"'shift' \(ScatterND\).*an index input is out of range"):
        compiled(np.array([[0, 0], [0, 4], [1, 1]]), data((3, 2)))


def test_concurrent_requests_have_their_own_arenas():
    model, _ = CASES["layer_norm"]
    compiled = kiln.compile(model, target="cpu")
    feeds = [data((2, 4, 8)) for _ in range(24)]
    futures = [compiled.submit({"x0": f}) for f in feeds]
    reference = kiln.compile(model)
    for f, future in zip(feeds, futures):
        np.testing.assert_allclose(future.result(timeout=60)["y0"], reference(f), rtol=1e-5, atol=1e-6)


def test_second_compile_reuses_the_built_library(monkeypatch):
    model, inputs = CASES["conv_1x1"]
    kiln.compile(model, target="cpu")

    def no_compiler(*args, **kwargs):
        raise AssertionError("the C compiler ran again for an identical model")

    monkeypatch.setattr(toolchain.subprocess, "run", no_compiler)
    compiled = kiln.compile(model, target="cpu")
    assert compiled(*inputs).shape == (1, 16, 5, 5)


def test_c_compiler_failure_names_the_generated_file():
    with pytest.raises(toolchain.CompilerError, match=r"failed on generated code .*\.c"):
        toolchain.build("int broken(void) { return }", host())


def test_elementwise_chains_reuse_dying_buffers_in_place():
    # Exp -> Neg -> Abs at -O1 (no fusion): each output may take over its input's buffer.
    model = make_model(
        [
            helper.make_node("Exp", ["x"], ["a"]),
            helper.make_node("Neg", ["a"], ["b"]),
            helper.make_node("Abs", ["b"], ["c"]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        [("x", F, [64, 64])],
        [("y", F, None)],
    )
    compiled = kiln.compile(model, target="cpu", opt_level=1)
    plan = compiled.plans[0]
    assert len(plan.memory.offsets) == 1  # a, b and c share one buffer
    x = data((64, 64))
    np.testing.assert_allclose(compiled(x), kiln.compile(model, target="reference")(x), rtol=1e-6)


def test_a_damaged_cached_library_is_counted_and_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    model, feeds = CASES["relu"]
    first = kiln.compile(model)(*feeds)
    (library,) = list((tmp_path / "lib").glob("*.so"))
    # damaged on disk (a new file: the loaded library's pages stay mapped, as in another process)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"garbage, not a shared library")
    os.replace(garbage, library)
    before = toolchain.DAMAGED["libraries"]
    np.testing.assert_array_equal(kiln.compile(model)(*feeds), first)
    assert toolchain.DAMAGED["libraries"] == before + 1
    assert library.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize(
    ("source", "to"), [(F, TensorProto.INT64), (F, TensorProto.INT32), (TensorProto.DOUBLE, TensorProto.INT64)]
)
def test_float_to_int_casts_of_nan_and_out_of_range_values_run_natively_where_the_rule_is_known(source, to, target):
    """Casts of NaN, infinities and values out of the integer's range (a relative-position bucket
    casts log(0) = -inf): native on the x86 paths, giving what the reference (NumPy on this kind of
    CPU) gives, the integer indefinite; on a target whose rule kiln does not know, the reference's."""
    from kiln.backends import parse

    model = case("Cast", [(12,)], {"to": to}, dtype=[source])
    kind = np.float64 if source == TensorProto.DOUBLE else np.float32
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 1e19, -1e19, 2.7, -2.7, 0.0, -0.5, 1234.9], kind)
    compiled = kiln.compile(model, target=target)
    with np.errstate(invalid="ignore"):
        want = kiln.compile(model, target="reference")(x)
    np.testing.assert_array_equal(compiled(x), want)
    if parse(target).float_to_int == "x86":
        assert compiled.is_native, [(f.node.op, f.reason) for plan in compiled.plans for f in plan.fallbacks]
