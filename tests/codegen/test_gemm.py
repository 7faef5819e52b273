"""The matrix-multiply engine (kiln/backends/cpu/gemm.c): MatMul and Conv lowered through it, compared
with the reference interpreter across the shapes that exercise its edges: tiles that do not divide
the matrix (rows vs. the micro-tile's rows, columns vs. its two vectors), reductions longer than one
K slice (accumulation across slices), batches folded into rows or kept, packed constant operands on
either side, im2col geometry (padding, stride, dilation, 1-D), and fused epilogues."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.backends.cpu import host
from kiln.driver.pipeline import compile_plan
from kiln.frontend.onnx import import_onnx
from kiln.lower.engine import pack_cols, pack_rows
from kiln.lower.kir import GemmSpec
from kiln.ops.interpreter import Interpreter
from tests.helpers import make_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def check(model, feeds, engine_kinds):
    """Compiled == reference (relative L2 1e-5) and the engine ran the kernels of ``engine_kinds``."""
    want = Interpreter(import_onnx(model)).run(feeds)
    compiled = kiln.compile(model)
    got = compiled.run(dict(zip([i.name for i in model.graph.input], feeds)))
    for expected, actual in zip(want, got.values()):
        error = np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)
        assert error < 1e-5, error
    kernels = [k for step in compiled.plans[0].steps for k in step.kernels]
    through_engine = [k.kind for k in kernels if any(isinstance(s, GemmSpec) for s in k.body)]
    assert through_engine == engine_kinds
    return compiled


def matmul(a_shape, b_shape, b_const=False, a_const=False, epilogue=None):
    a, b = data(*a_shape), data(*b_shape)
    inits, inputs, feeds = {}, [], []
    for name, array, const in (("a", a, a_const), ("b", b, b_const)):
        if const:
            inits[name] = array
        else:
            inputs.append((name, F, list(array.shape)))
            feeds.append(array)
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    out = "y"
    if epilogue == "bias_gelu":
        inits["c"] = data(b_shape[-1])
        nodes += [helper.make_node("Add", ["y", "c"], ["z"]), helper.make_node("Gelu", ["z"], ["g"])]
        out = "g"
    elif epilogue == "residual":
        inputs.append(("r", F, [*np.broadcast_shapes(a_shape[:-2], b_shape[:-2]), a_shape[-2], b_shape[-1]]))
        feeds.append(data(*inputs[-1][2]))
        nodes.append(helper.make_node("Add", ["y", "r"], ["z"]))
        out = "z"
    return make_model(nodes, inputs, [(out, F, None)], inits), feeds


@pytest.mark.parametrize(
    "a_shape,b_shape,b_const,a_const",
    [
        ((5, 7), (7, 9), False, False),  # one edge tile in both directions
        ((5, 7), (7, 9), True, False),  # B packed ahead of time
        ((5, 7), (7, 9), False, True),  # A packed ahead of time
        ((13, 300), (300, 37), True, False),  # K spans two slices of 256
        ((1, 129, 70), (70, 33), True, False),  # batch folded into rows (B has none)
        ((2, 3, 17, 33), (2, 3, 33, 19), False, False),  # batched, both operands per element
        ((4, 6, 20), (20, 16), False, False),  # non-constant B shared by the batch
        ((2, 6, 20), (2, 20, 48), True, False),  # batched constant B: one packed panel set per element
        ((1, 64), (64, 1000), True, False),  # a classifier row
        # one row streamed over sets of 4 panels side by side, then the rest and an edge panel
        ((1, 300), (300, 2100), True, False),
        ((3, 1, 70), (3, 70, 1500), True, False),  # the same per batch element
        ((400, 20), (20, 40), False, False),  # several M blocks: B packed whole once, shared
    ],
)
def test_matmul_through_the_engine_matches_the_reference(a_shape, b_shape, b_const, a_const):
    model, feeds = matmul(a_shape, b_shape, b_const, a_const)
    check(model, feeds, ["matmul"])


@pytest.mark.parametrize("epilogue", ["bias_gelu", "residual"])
@pytest.mark.parametrize("rows,n", [(23, 50), (1, 1700)])  # (one row: the stream's sets of panels)
def test_matmul_epilogues_run_on_finished_tiles(epilogue, rows, n):
    model, feeds = matmul((1, rows, 40), (40, n), b_const=True, epilogue=epilogue)
    compiled = check(model, feeds, ["matmul+epilogue"])
    # the helper applied per finished tile (named kiln_t0_e0, or kiln_k1_epilogue in KILN_DEBUG builds)
    assert re.search(r"g\.epilogue = kiln_\w+;", compiled.plans[0].source)


def test_partial_batch_broadcast_keeps_the_loop_nest():
    model, feeds = matmul((3, 1, 4, 5), (1, 2, 5, 6))
    check(model, feeds, [])


def conv(x_shape, w_shape, bias=True, relu=True, residual=False, **attrs):
    inits = {"w": data(*w_shape)}
    names = ["x", "w"]
    if bias:
        inits["b"] = data(w_shape[0])
        names.append("b")
    nodes = [helper.make_node("Conv", names, ["y"], **attrs)]
    x = data(*x_shape)
    want = Interpreter(import_onnx(make_model(nodes, [("x", F, list(x_shape))], [("y", F, None)], inits))).run([x])[0]
    inputs, feeds, out = [("x", F, list(x_shape))], [x], "y"
    if residual:
        inputs.append(("r", F, list(want.shape)))
        feeds.append(data(*want.shape))
        nodes.append(helper.make_node("Add", ["y", "r"], ["s"]))
        out = "s"
    if relu:
        nodes.append(helper.make_node("Relu", [out], ["o"]))
        out = "o"
    return make_model(nodes, inputs, [(out, F, None)], inits), feeds


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs,kind",
    [
        ((2, 3, 9, 9), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "conv"),
        ((1, 16, 13, 13), (70, 16, 1, 1), {}, "conv1x1"),  # X read directly; 70 rows: an edge panel
        ((1, 5, 10, 11), (7, 5, 3, 3), {"strides": [2, 2], "pads": [1, 2, 0, 1]}, "conv"),  # asymmetric pads
        ((1, 4, 12, 12), (6, 4, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, "conv"),
        ((1, 3, 30, 30), (9, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, "conv"),  # a ResNet stem
        ((1, 32, 20, 20), (24, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "conv"),  # K = 288: two slices
        ((1, 8, 9, 9), (4, 8, 1, 1), {"strides": [2, 2]}, "conv"),  # strided 1x1 goes through im2col
        ((2, 6, 40), (5, 6, 3), {"pads": [1, 1]}, "conv"),  # 1-D
        ((2, 8, 6, 6), (200, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "conv"),  # 2 M blocks: shared im2col
    ],
)
def test_conv_through_the_engine_matches_the_reference(x_shape, w_shape, attrs, kind, monkeypatch):
    monkeypatch.setenv("KILN_DISABLE", "winograd")  # the im2col path (Winograd has its own tests)
    model, feeds = conv(x_shape, w_shape, **attrs)
    check(model, feeds, [f"{kind}+epilogue"])


def test_conv_without_bias_or_epilogue_and_with_a_residual():
    model, feeds = conv((1, 4, 6, 6), (5, 4, 3, 3), bias=False, relu=False, pads=[1, 1, 1, 1])
    check(model, feeds, ["conv"])
    model, feeds = conv((1, 4, 6, 6), (4, 4, 3, 3), residual=True, pads=[1, 1, 1, 1])
    check(model, feeds, ["conv+epilogue"])


def test_grouped_conv_keeps_the_loop_nest():
    model, feeds = conv((1, 4, 8, 8), (4, 1, 3, 3), group=4, pads=[1, 1, 1, 1])
    check(model, feeds, [])


def test_weights_are_packed_once_and_the_originals_leave_the_plan():
    model, _ = conv((1, 16, 8, 8), (32, 16, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])  # im2col
    graph = import_onnx(model)
    plan = compile_plan(graph)
    target = host()
    weight = next(a for a in graph.constants.values() if a.ndim == 4)
    # nor does the plan's graph hold the original beside its packed form
    assert not any(a.ndim == 4 for a in plan.graph.constants.values())
    packed = [a for b, a in plan.constants.items() if b.name.startswith("w")]
    assert len(packed) == 1
    np.testing.assert_array_equal(packed[0], pack_rows(weight.reshape(1, 32, -1), target.gemm_rows))
    assert packed[0].ctypes.data % 64 == 0  # aligned vector loads
    assert not any(
        a is weight or (a.shape == weight.shape and np.array_equal(a, weight)) for a in plan.constants.values()
    )


def test_packing_layouts():
    matrix = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    rows = pack_rows(matrix, 4)  # [B, panels, K, rows]
    assert rows.shape == (2, 2, 3, 4)
    assert rows[1, 0, 2, 3] == matrix[1, 3, 2] and rows[0, 1, 1, 0] == matrix[0, 4, 1] and rows[0, 1, 1, 1] == 0
    cols = pack_cols(matrix, 2)  # [B, panels, K, cols]
    assert cols.shape == (2, 2, 5, 2)
    assert cols[1, 1, 4, 0] == matrix[1, 4, 2] and cols[0, 1, 0, 1] == 0


@pytest.mark.parametrize(
    "x_shape,w_shape,pads,tile",
    [
        ((1, 16, 10, 10), (24, 16, 3, 3), [1, 1, 1, 1], 4),  # F(4x4, 3x3)
        ((2, 8, 13, 9), (8, 8, 3, 3), [1, 1, 1, 1], 4),  # clipped edge tiles, two images
        ((1, 32, 7, 7), (16, 32, 3, 3), [0, 0, 0, 0], 2),  # 5x5 output: F(2x2, 3x3)
        ((1, 8, 6, 11), (12, 8, 3, 3), [1, 0, 2, 1], 2),  # asymmetric padding
        ((1, 12, 20, 20), (10, 12, 3, 3), [1, 1, 1, 1], 4),  # interior tiles (no bounds tests) too
        ((3, 8, 9, 9), (8, 8, 3, 3), [2, 2, 2, 2], 4),  # pads wider than a tile's overlap; lanes span images' rows
    ],
)
def test_winograd_matches_the_reference(x_shape, w_shape, pads, tile, monkeypatch):
    from kiln.lower import winograd

    model, feeds = conv(x_shape, w_shape, pads=pads)
    compiled = check(model, feeds, ["winograd-gemm"])
    kinds = [k.kind for step in compiled.plans[0].steps for k in step.kernels]
    assert kinds == ["winograd-in", "winograd-gemm", "winograd-out+epilogue"]
    out_shape = (x_shape[0], w_shape[0], x_shape[2] + pads[0] + pads[2] - 2, x_shape[3] + pads[1] + pads[3] - 2)
    assert winograd.tile_size(out_shape) == tile
    # KILN_DISABLE=winograd falls back to im2col (and is a different plan-cache entry)
    monkeypatch.setenv("KILN_DISABLE", "winograd")
    check(model, feeds, ["conv+epilogue"])


@pytest.mark.parametrize(
    "x_shape,w_shape",
    [
        (
            (1, 16, 5, 5),
            (21, 16, 3, 3),
        ),  # F(2x2, 3x3), 9 tiles: tile-major on every target (a last block of 5 channels)
        ((1, 24, 7, 7), (40, 24, 3, 3)),  # ResNet's last stage, 16 tiles: tile-major on AVX-512 (32-column panels)
        ((1, 16, 40, 40), (20, 16, 3, 3)),  # 100 tiles: channel-major products
    ],
)
def test_winograd_products_of_few_tiles_run_with_the_tiles_as_rows(x_shape, w_shape):
    """With fewer tiles than a panel of the engine's columns, the a*a products run transposed
    (tiles x output channels, the output transform reading them tile-major), so no panel is mostly
    padding; with more, as output channels x tiles. Both match the reference."""
    from kiln.backends import parse
    from kiln.lower.kir import WinogradOutput
    from kiln.lower.winograd import tile_size

    model, feeds = conv(x_shape, w_shape, pads=[1, 1, 1, 1], residual=True)  # bias, residual add, Relu
    compiled = check(model, feeds, ["winograd-gemm"])
    calls = [s for step in compiled.plans[0].steps for k in step.kernels for s in k.body]
    (out,) = [s for s in calls if isinstance(s, WinogradOutput)]
    (product,) = [s for s in calls if isinstance(s, GemmSpec)]
    m = tile_size((x_shape[0], w_shape[0], x_shape[2], x_shape[3]))
    tiles = x_shape[0] * (-(-x_shape[2] // m)) * (-(-x_shape[3] // m))
    assert out.tile_major == (tiles < parse("cpu").gemm_cols)
    assert (product.m, product.n) == ((tiles, w_shape[0]) if out.tile_major else (w_shape[0], tiles))


def test_winograd_transforms_reproduce_the_direct_convolution():
    from kiln.lower.winograd import TRANSFORMS

    rng = np.random.default_rng(1)
    for m, t in TRANSFORMS.items():
        bt, g, at = (np.array(t[k], np.float64) for k in ("BT", "G", "AT"))
        patch, kernel = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
        direct = np.array([[np.sum(patch[i : i + 3, j : j + 3] * kernel) for j in range(m)] for i in range(m)])
        winograd = at @ ((g @ kernel @ g.T) * (bt @ patch @ bt.T)) @ at.T
        np.testing.assert_allclose(winograd, direct, atol=1e-12)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_convolutions_have_their_own_direct_kernel(stride):
    # one input channel per output channel: not im2col on the engine (a K of 9 wastes it) but a
    # per-plane kernel, bias + Relu fused
    model, feeds = conv((1, 24, 15, 15), (24, 1, 3, 3), group=24, pads=[1, 1, 1, 1], strides=[stride, stride])
    compiled = check(model, feeds, [])
    kinds = [k.kind for step in compiled.plans[0].steps for k in step.kernels]
    assert kinds == ["depthwise-conv+epilogue"], kinds


def test_cache_blocks_come_from_the_machines_caches():
    """A B micro-panel in half of L1d, an A block in half of L2: the sizes follow the caches sysfs
    reports (any vendor's), with stated defaults when a size is unknown."""
    from kiln.backends.cpu.c_unit import gemm_prelude
    from kiln.backends.cpu.target import Caches, CpuTarget

    zen = CpuTarget(isa="avx2", simd_bytes=32, caches=Caches(l1d=32 << 10, l2=512 << 10, l3=8 << 20))
    assert (zen.blocking.kc, zen.blocking.a_block) == (256, 65536)
    big = CpuTarget(isa="avx2", simd_bytes=32, caches=Caches(l1d=64 << 10, l2=2 << 20))
    assert (big.blocking.kc, big.blocking.a_block) == (512, 262144)
    wide = CpuTarget(isa="avx512", simd_bytes=64, caches=Caches(l1d=48 << 10, l2=2 << 20))
    assert wide.blocking.kc == 192  # 32-float panels: half of 48 KiB holds 192 rows of them
    unknown = CpuTarget(isa="avx2", simd_bytes=32)
    assert unknown.blocking.kc == 256 and "unknown" in unknown.blocking.source
    prelude = gemm_prelude(big)
    assert "#define KILN_KC 512" in prelude and "#define KILN_A_BLOCK 262144" in prelude


def test_a_small_cache_block_still_sums_every_slice(monkeypatch):
    """The engine with the blocks of a tiny L1d (64-deep slices): a 300-deep product accumulates
    five slices, edge tiles included, and matches the reference."""
    from kiln.backends.cpu.target import Blocking, CpuTarget

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    monkeypatch.setattr(CpuTarget, "blocking", property(lambda self: Blocking(64, 16384, "test")))
    model, feeds = matmul((13, 300), (300, 37), b_const=True)
    compiled = check(model, feeds, ["matmul"])
    # the engine object the library links was compiled with those blocks (and is keyed by them)
    from kiln.backends.cpu import host
    from kiln.backends.cpu.c_unit import engine_source, linked_engine

    assert linked_engine(compiled.plans[0].source) == () and "#define KILN_KC 64" in engine_source(host())


@pytest.mark.parametrize("kind", ["conv_bias_clip", "matmul_bias_relu", "matmul_clip_min_only"])
def test_simple_epilogues_are_applied_to_the_accumulators_and_keep_nan(kind):
    """A bias and a Relu or a Clip run in the micro-kernel's registers (no helper call per tile);
    edge tiles get the same in memory; NaN and infinities come out as the reference's."""
    if kind == "conv_bias_clip":
        x = data(1, 16, 11, 13)
        inits = {"w": data(70, 16, 1, 1), "b": data(70), "lo": np.float32(0), "hi": np.float32(6)}
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
        engine = "conv1x1+epilogue"
    else:
        x = data(1, 29, 40)
        inits = {"w": data(40, 50), "b": data(50)}
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["c"])]
        if kind == "matmul_bias_relu":
            nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        else:
            inits["lo"] = np.float32(-0.5)
            nodes.append(helper.make_node("Clip", ["c", "lo", ""], ["y"]))
        engine = "matmul+epilogue"
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30]
    model = make_model(nodes, [("x", F, list(x.shape))], [("y", F, None)], inits)
    compiled = kiln.compile(model)
    got = compiled.run({"x": x})["y"]
    want = Interpreter(import_onnx(model)).run([x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert np.isnan(got).any()  # the NaN input reached some outputs, and stayed NaN
    source = compiled.plans[0].source
    assert "g.f_on = 1;" in source and "g.epilogue =" not in source
    kinds = [k.kind for step in compiled.plans[0].steps for k in step.kernels]
    assert kinds == [engine]
