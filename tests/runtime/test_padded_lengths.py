"""A sequence length (attention mixes positions: not sample-parallel) run at any length in its
declared range from a few compiled lengths: inputs padded, the masks kiln.passes.padding wrote,
outputs cut back (kiln.driver.sizes.Padder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.errors import ArgumentError, InputError
from tests.helpers import FLOAT, make_model, run_without_a_compiler

WIDTH = 4


def attention_model() -> onnx.ModelProto:
    """One attention head over x [batch, seq, 4] with an additive key mask from an int mask
    input, a residual, a mean over the positions and a sum over them."""
    rng = np.random.default_rng(3)
    weights = {
        "wq": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32),
        "wk": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32),
        "wv": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32),
        "one": np.array(1.0, np.float32),
        "big": np.array(-1e4, np.float32),
        "mid": np.array([1], np.int64),
        "seq_axis": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Cast", ["mask"], ["maskf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "maskf"], ["inverted"]),
        helper.make_node("Mul", ["inverted", "big"], ["additive"]),
        helper.make_node("Unsqueeze", ["additive", "mid"], ["additive3"]),
        helper.make_node("Add", ["scores", "additive3"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["attended"]),
        helper.make_node("Add", ["attended", "x"], ["y"]),
        helper.make_node("ReduceMean", ["y", "seq_axis"], ["pooled"], keepdims=0),
        helper.make_node("ReduceMax", ["y", "seq_axis"], ["peak"], keepdims=0),
    ]
    return make_model(
        nodes,
        [("x", FLOAT, ["batch", "seq", WIDTH]), ("mask", onnx.TensorProto.INT64, ["batch", "seq"])],
        [("y", FLOAT, ["batch", "seq", WIDTH]), ("pooled", FLOAT, ["batch", WIDTH]), ("peak", FLOAT, ["batch", WIDTH])],
        weights,
        opset=18,
    )


def causal_model() -> onnx.ModelProto:
    """attention_model with a causal mask built from the length as exporters write it (Shape,
    Gather, Range, two Unsqueezes, LessOrEqual, Where: a [seq, seq] additive mask)."""
    model = attention_model()
    graph = model.graph
    for name, array in (
        ("i0", np.array(0, np.int64)),
        ("i1", np.array(1, np.int64)),
        ("ax0", np.array([0], np.int64)),
        ("zero", np.array(0.0, np.float32)),
    ):
        graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    nodes = list(graph.node)
    at = next(i for i, n in enumerate(nodes) if list(n.output) == ["masked"]) + 1
    nodes[at - 1].output[0] = "masked0"
    causal = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i1"], ["n"], axis=0),
        helper.make_node("Range", ["i0", "n", "i1"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "mid"], ["rows"]),
        helper.make_node("Unsqueeze", ["positions", "ax0"], ["cols"]),
        helper.make_node("LessOrEqual", ["cols", "rows"], ["causal"]),
        helper.make_node("Where", ["causal", "zero", "big"], ["causal_add"]),
        helper.make_node("Add", ["masked0", "causal_add"], ["masked"]),
    ]
    del graph.node[:]
    graph.node.extend(nodes[:at] + causal + nodes[at:])
    return model


def reference(x: np.ndarray, mask: np.ndarray, causal: bool = False) -> list[np.ndarray]:
    model = attention_model()
    w = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    q, k, v = x @ w["wq"], x @ w["wk"], x @ w["wv"]
    scores = q @ k.transpose(0, 2, 1) + ((1.0 - mask.astype(np.float32)) * -1e4)[:, None, :]
    if causal:
        n = x.shape[1]
        scores = scores + np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, -1e4).astype(np.float32)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    y = (e / e.sum(-1, keepdims=True)) @ v + x
    return [y, y.mean(1), y.max(1)]


def feeds(batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + length)
    mask = np.ones((batch, length), np.int64)
    mask[-1, length // 2 + 1 :] = 0  # the last sample's own padding, as a tokenizer writes it
    return {"x": rng.standard_normal((batch, length, WIDTH)).astype(np.float32), "mask": mask}


def test_every_length_runs_on_one_library_whose_kernels_take_the_length_at_run_time():
    """The default: one compile per batch class (not per length) whose kernels' sizes are
    expressions of the run-time length (kiln.driver.extents); every length 1..40 at batches 1, 2,
    8 and 9 equals NumPy, nothing compiles at run time, the range is checked."""
    compiled = kiln.compile(attention_model(), dims={"seq": (1, 40), "batch": (1, 9)})
    padder = compiled.padder()
    assert padder is not None and padder.classes == (40,) and padder.samples[0] == 40 and padder.floor == 16
    assert compiled.chunking() is not None and compiled.chunking().classes == (1, 8)
    compiled_before = len(compiled.executables())
    assert compiled_before == 2  # one library per batch class, serving every length
    kernels = [k for e in compiled.padded_model.executables() for s in e.plan.steps for k in s.kernels]
    assert sum(k.length is not None for k in kernels) > len(kernels) // 2  # sizes read at run time
    for length in range(1, 41):
        for batch in (1, 2, 8, 9):
            given = feeds(batch, length)
            got = compiled.run(given)
            want = reference(given["x"], given["mask"])
            for name, expected in zip(("y", "pooled", "peak"), want):
                assert got[name].shape == expected.shape
                np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {length}")
    assert len(compiled.executables()) == compiled_before  # nothing compiled at run time
    with pytest.raises(InputError, match="outside the range"):
        compiled.run(feeds(1, 41))


def test_the_run_time_length_is_read_from_the_call():
    """Mutation check: the library run at length 17 told it is 16 (its valid-length input) gives
    other values, so the kernels do compute with the length the call gives them."""
    compiled = kiln.compile(attention_model(), dims={"seq": (1, 24), "batch": 1})
    executable = compiled.padded_model.executables()[0]
    given = feeds(1, 17)
    inputs = [np.pad(given["x"], [(0, 0), (0, 7), (0, 0)]), np.pad(given["mask"], [(0, 0), (0, 7)])]
    right = executable.run([*inputs, np.array(17, np.int64)])
    wrong = executable.run([*inputs, np.array(16, np.int64)])
    want = reference(given["x"], given["mask"])[1]
    np.testing.assert_allclose(right[1], want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(wrong[1], want, rtol=1e-3)


def test_the_arena_is_laid_out_for_the_length_of_each_call():
    """The memory plan of a run-time length is formulas of it (kiln.lower.memory.GrowingLayout):
    a short run's arena is smaller than the capacity's, and calls whose lengths go up and down on
    one request (its table laid out again each time) all equal NumPy. Mutation check: a request
    that kept its first layout would place a longer run's live buffers over each other."""
    compiled = kiln.compile(attention_model(), dims={"seq": (1, 64), "batch": 2})
    executable = compiled.padded_model.executables()[0]
    growing = executable.plan.memory.growing
    assert growing is not None and growing.capacity == 64
    short, full = growing.at(16)[1], growing.at(64)[1]
    assert short < full <= executable.plan.memory.arena_bytes
    assert sum(c1 or c2 for _, c1, c2 in growing.sizes) >= len(growing.sizes) // 2  # most grow with it
    for length in (17, 64, 16, 40, 1, 63, 20, 64, 33):
        given = feeds(2, length)
        got = compiled.run(given)
        for name, expected in zip(("y", "pooled", "peak"), reference(given["x"], given["mask"])):
            np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {length}")
    assert "at length 16" in executable.plan.memory.describe()


def test_compiled_lengths_when_asked_or_when_the_lowering_is_no_polynomial_of_the_length():
    """--disable run-time-length (or size classes given) compiles padded lengths, as does a
    lowering whose integers are no polynomial of the length (here forced): every length still
    runs with no compile."""
    from kiln.driver import extents
    from kiln.driver.options import CompileOptions

    options = CompileOptions.from_env(disabled=frozenset({"run-time-length"}))
    compiled = kiln.compile(attention_model(), dims={"seq": (1, 40), "batch": (1, 9)}, options=options)
    assert compiled.padder().classes == (16, 32, 40) and not compiled.padder().samples
    assert len(compiled.executables()) == 3 * 2  # each length class at each batch class
    refused = kiln.compile(attention_model())
    real = extents.Merge.fit
    try:  # as if some integer were not a polynomial of the length
        extents.Merge.fit = lambda self, values, where: (_ for _ in ()).throw(extents.NotAffine(f"{where}: forced"))
        refused.declare({"seq": (1, 20), "batch": (1, 2)})
    finally:
        extents.Merge.fit = real
    assert "forced" in refused.run_time_refused["seq"] and refused.padder().classes == (16, 20)
    for model in (compiled, refused):
        before = len(model.executables())
        for length in (1, 7, 16, 17, 20):
            given = feeds(2, length)
            got = model.run(given)
            for name, want in zip(("y", "pooled", "peak"), reference(given["x"], given["mask"])):
                np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {length}")
        assert len(model.executables()) == before


def test_a_binding_first_seen_at_run_time_that_does_not_lower_apart_runs_at_compiled_lengths():
    """A batch the model mixes (centred over the batch: it never chunks) compiles when it first
    runs: one whose lowering is no polynomial of the length (here forced) switches the dim to
    compiled lengths, with right answers."""
    from kiln.driver import extents
    from kiln.driver.options import CompileOptions

    source = attention_model()
    source.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "batch_axis"))
    source.graph.node.extend(
        [
            helper.make_node("ReduceMean", ["pooled", "batch_axis"], ["batch_mean"], keepdims=1),
            helper.make_node("Sub", ["pooled", "batch_mean"], ["centred"]),
        ]
    )
    source.graph.output.append(helper.make_tensor_value_info("centred", FLOAT, ["batch", WIDTH]))
    model = kiln.compile(source, options=CompileOptions.from_env(plan_cache=False))
    model.declare({"seq": (1, 20)})
    assert model.chunking() is None and model.padder().samples  # the length at run time, for now
    real = extents.Merge.fit
    try:
        extents.Merge.fit = lambda self, values, where: (_ for _ in ()).throw(extents.NotAffine(f"{where}: forced"))
        for length in (3, 20):
            given = feeds(2, length)
            got = model.run(given)
            y, pooled, peak = reference(given["x"], given["mask"])
            for name, want in zip(("y", "pooled", "peak", "centred"), (y, pooled, peak, pooled - pooled.mean(0))):
                np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {length}")
    finally:
        extents.Merge.fit = real
    assert "forced" in model.run_time_refused["seq"] and model.padder().classes == (16, 20)


def test_a_causal_mask_built_from_the_length_is_computed_by_a_kernel_at_run_time():
    """A [seq, seq] mask folded at each length would be the capacity's constant (no shorter
    length's dense layout is a prefix of it): kiln keeps it computed (by kernels that take the
    length), so the model still compiles one library; every length 1..40 equals NumPy."""
    from kiln.driver import extents

    compiled = kiln.compile(causal_model(), dims={"seq": (1, 40), "batch": (1, 2)})
    assert compiled.padder().classes == (40,) and not compiled.run_time_refused, compiled.run_time_refused
    kept = extents.computed_at_run_time(compiled.padded_model.graph, {"batch": 1}, "seq", (40, 17))
    assert {"causal", "causal_add"} <= kept and not kept & {"positions", "rows", "cols", "n"}, kept
    for length in range(1, 41):
        given = feeds(2, length)
        got = compiled.run(given)
        for name, want in zip(("y", "pooled", "peak"), reference(given["x"], given["mask"], causal=True)):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {length}")


def test_a_constant_that_changes_with_the_length_is_refused_unless_it_is_the_capacitys_prefix():
    """The library keeps the capacity's constants: one that differs at another length must be the
    first part of the capacity's (a Range of positions), and one of the same size must be equal.
    One no kernel reads (a shape vector only inference read) may differ."""
    from types import SimpleNamespace

    from kiln.driver import extents
    from kiln.ir.types import DType
    from kiln.lower.kir import Buffer, Kernel

    def state(array: np.ndarray, read: bool = True) -> SimpleNamespace:
        buffer = Buffer("c", DType.FLOAT32, array.size)
        kernel = Kernel("k0", "copy", [], [buffer] if read else [], [], [])
        return SimpleNamespace(constants={buffer: array}, lowerer=None, steps=[], segments=[[kernel]])

    shape = np.array([8, 40], np.float32)
    extents.check_constants([state(shape, read=False), state(np.array([8, 17], np.float32), read=False)])
    with pytest.raises(extents.NotAffine, match="not the same prefix"):
        extents.check_constants([state(shape), state(np.array([8, 17], np.float32))])

    positions = np.arange(40, dtype=np.float32)
    extents.check_constants([state(positions), state(positions[:17].copy()), state(positions[:16].copy())])
    square = np.tril(np.ones((40, 40), np.float32))  # a causal mask: [17, 17] is no prefix of [40, 40]
    with pytest.raises(extents.NotAffine, match="not the same prefix"):
        extents.check_constants([state(square), state(np.tril(np.ones((17, 17), np.float32)))])
    with pytest.raises(extents.NotAffine, match="not the same prefix"):  # a scale 1/length: same size
        extents.check_constants([state(np.array([1 / 40], np.float32)), state(np.array([1 / 17], np.float32))])


def test_integer_constants_that_follow_the_length_are_written_at_run_time():
    """A small integer constant of one size whose values are polynomials of the length (a
    TorchScript export's flat-index offsets arange(batch) * seq) is returned with each element's
    terms, for the runtime to write at the length it runs at; one that is no polynomial, or of
    floats, is refused; without the lengths (image sizes) as before."""
    from types import SimpleNamespace

    from kiln.driver import extents
    from kiln.ir.types import DType
    from kiln.lower.kir import Buffer, Kernel
    from kiln.lower.memory import GrowingLayout

    def state(array: np.ndarray) -> SimpleNamespace:
        buffer = Buffer("c", DType.from_numpy(array.dtype), array.size)
        kernel = Kernel("k0", "copy", [], [buffer], [], [])
        return SimpleNamespace(constants={buffer: array}, lowerer=None, steps=[], segments=[[kernel]])

    lengths = (40, 21, 16, 23)
    offsets = [state(np.arange(4, dtype=np.int64) * n + 3) for n in lengths]  # b * seq + 3
    ((buffer, terms),) = extents.check_constants(offsets, lengths)
    assert terms == ((3, 0, 0), (3, 1, 0), (3, 2, 0), (3, 3, 0))
    layout = GrowingLayout(buffer, 16, 40, (), (), (), ((buffer, terms),))
    np.testing.assert_array_equal(layout.values(7)[0], [3, 19, 35, 51])  # (below the floor: at 16)
    np.testing.assert_array_equal(layout.values(33)[0], np.arange(4) * 33 + 3)
    with pytest.raises(extents.NotAffine, match="polynomial"):
        extents.check_constants([state(np.array([n * n * n], np.int64)) for n in lengths], lengths)
    with pytest.raises(extents.NotAffine, match="not the same prefix"):
        extents.check_constants([state(np.array([n], np.float32)) for n in lengths], lengths)
    with pytest.raises(extents.NotAffine, match="not the same prefix"):
        extents.check_constants(offsets)  # (no lengths: image sizes keep the old rule)


def test_without_the_masks_a_padded_run_would_be_wrong():
    """The masks are what make padding exact: the padded graph run with its valid length at the
    class size (no masking) gives other values, so the test above would catch their loss."""
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.padding import Padding, pad, paddable

    graph = import_onnx(attention_model())
    found = paddable(graph, "seq")
    assert isinstance(found, Padding)
    assert sorted((m.fill, m.divide) for m in found.masks) == [(-np.inf, 0), (-np.inf, 0), (0.0, 0), (0.0, 1)]
    unmasked = kiln.compile(pad(graph, Padding(found.symbol, found.inputs, found.outputs, ())), target="reference")
    masked = kiln.compile(pad(graph, found), target="reference")
    given = feeds(2, 5)
    padded = {
        "x": np.pad(given["x"], [(0, 0), (0, 3), (0, 0)], constant_values=7.0),
        "mask": np.pad(given["mask"], [(0, 0), (0, 3)], constant_values=1),
        found.valid_input: np.array(5, np.int64),
    }
    want = reference(given["x"], given["mask"])
    good = masked.run(padded)
    np.testing.assert_allclose(good["y"][:, :5], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(good["pooled"], want[1], rtol=1e-4, atol=1e-5)
    bad = unmasked.run(padded)
    assert not np.allclose(bad["y"][:, :5], want[0], rtol=1e-3)
    assert not np.allclose(bad["pooled"], want[1], rtol=1e-3)


def test_padded_classes_are_checked():
    with pytest.raises(ArgumentError, match="below the range's end"):
        kiln.compile(attention_model()).declare({"seq": (1, 40)}, {"seq": [8, 16]})
    compiled = kiln.compile(attention_model()).declare({"seq": (1, 20)}, {"seq": [8, 20]})
    assert compiled.padder().classes == (8, 20)
    given = feeds(2, 9)
    np.testing.assert_allclose(compiled.run(given)["y"], reference(given["x"], given["mask"])[0], rtol=1e-4, atol=1e-5)


def test_an_artifact_runs_every_length_without_a_compiler(tmp_path):
    """Compiled once with seq=1..24 and batch=1..9 (a library per batch class, taking the length
    at run time), saved; a process with no compiler on its PATH and an empty cache loads it and
    runs every length 1..24 at batches 1 and 9 against NumPy."""
    compiled = kiln.compile(attention_model(), dims={"seq": (1, 24), "batch": (1, 9)})
    compiled.save(tmp_path / "m.kiln")
    script = f"""
import numpy as np, kiln, sys
sys.path.insert(0, {os.getcwd()!r})
from tests.runtime.test_padded_lengths import feeds, reference
model = kiln.load({str(tmp_path / "m.kiln")!r})
assert model.padder().classes == (24,) and model.padder().samples, model.padder()
before = len(model.executables())
for length in range(1, 25):
    for batch in (1, 9):
        given = feeds(batch, length)
        got = model.run(given)
        for name, want in zip(("y", "pooled", "peak"), reference(given["x"], given["mask"])):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{{name}} at {{length}}")
assert len(model.executables()) == before == 2, (before, len(model.executables()))
try:
    model.run(feeds(1, 25))
except kiln.errors.InputError as err:
    assert "seq=1..24" in str(err)
else:
    raise AssertionError("seq 25 ran outside the declared range")
print("ok")
"""
    stdout = run_without_a_compiler(script, tmp_path)
    assert stdout.split()[-1] == "ok"


def test_the_cli_says_which_dim_pads_and_the_artifact_keeps_its_lengths(tmp_path):
    from click.testing import CliRunner

    from kiln.cli import main

    onnx.save(attention_model(), tmp_path / "m.onnx")
    runner = CliRunner()
    done = runner.invoke(
        main,
        [
            "compile",
            str(tmp_path / "m.onnx"),
            "--dim",
            "seq=1..20",
            "--dim",
            "batch=1..2",
            "-o",
            str(tmp_path / "m.kiln"),
        ],
    )
    assert done.exit_code == 0, done.output
    assert "seq (1..20): run-time length" in done.output and "lowered at 20, " in done.output, done.output
    loaded = kiln.load(tmp_path / "m.kiln")
    assert loaded.padder().classes == (20,) and loaded.padder().samples
    given = feeds(2, 11)
    np.testing.assert_allclose(loaded.run(given)["y"], reference(given["x"], given["mask"])[0], rtol=1e-4, atol=1e-5)
    shown = runner.invoke(main, ["explain", str(tmp_path / "m.onnx"), "--dim", "seq=1..20", "--json"])
    assert shown.exit_code == 0, shown.output
    sizes = json.loads(shown.output)["sizes"]
    assert sizes["seq"]["padded"] == [16, 20] and sizes["seq"]["masks"] == 4, sizes
    listing = sizes["seq"]["run_time"]
    assert listing["lowered"][0] == 20 and not listing["refused"], listing
    assert any(k["run_time"] and k["kind"] == "attention" for k in listing["kernels"]), listing
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "kiln",
            "compile",
            str(tmp_path / "m.onnx"),
            "--dim",
            "seq=1..20",
            "--size-classes",
            "seq=8",
            "-o",
            str(tmp_path / "n.kiln"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "below the range's end" in bad.stderr and "kiln bug" not in bad.stderr, bad.stderr


def refusal(body: list, outputs: list, inputs: list | None = None) -> str:
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.padding import Padding, paddable

    weights = {
        "w": np.ones((WIDTH, WIDTH), np.float32),
        "last": np.array([-1], np.int64),
        "two": np.array([2], np.int64),
    }
    model = make_model(body, inputs or [("x", FLOAT, ["batch", "seq", WIDTH])], outputs, weights, opset=18)
    found = paddable(import_onnx(model), "seq")
    assert not isinstance(found, Padding), found
    assert getattr(found, "__traceback__", None) is None  # (kept by models: no frames holding the graph)
    return str(found)


@pytest.mark.parametrize(
    ("why", "body", "outputs", "said"),
    [
        (
            "a LayerNormalization over the positions",
            [helper.make_node("LayerNormalization", ["x", "one"], ["y"], axis=1)],
            [("y", FLOAT, ["batch", "seq", WIDTH])],
            "works along the padded dim",
        ),
        (
            "the last token (an index counted from the end)",
            [helper.make_node("Gather", ["x", "last"], ["y"], axis=1)],
            [("y", FLOAT, ["batch", 1, WIDTH])],
            "not valid at every length",
        ),
        (
            "a concat along the positions",
            [helper.make_node("Concat", ["x", "x"], ["y"], axis=1)],
            [("y", FLOAT, ["batch", None, WIDTH])],
            "along the padded dim",
        ),
        (
            "rows merged with the batch, returned merged",
            [
                helper.make_node("Reshape", ["x", "flat"], ["y"]),
            ],
            [("y", FLOAT, [None, WIDTH])],
            "cannot cut off",
        ),
        (
            "the length used as a number (a Shape cast to floats)",
            [
                helper.make_node("Shape", ["x"], ["s"]),
                helper.make_node("Cast", ["s"], ["y"], to=onnx.TensorProto.FLOAT),
            ],
            [("y", FLOAT, [3])],
            "computed from the length",
        ),
    ],
)
def test_what_mixes_positions_is_refused_naming_its_node(why, body, outputs, said):
    if any(n.op_type == "LayerNormalization" for n in body):
        body = [
            helper.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.ones(1, np.float32))),
            *body,
        ]
    if any(n.op_type == "Reshape" for n in body):
        body = [
            helper.make_node("Constant", [], ["flat"], value=onnx.numpy_helper.from_array(np.array([-1, WIDTH]))),
            *body,
        ]
    assert said in refusal(body, outputs), why


def test_a_slice_at_half_a_static_dim_read_from_a_shape_with_the_batch_unbound_pads():
    """Llama's rotate_half as TorchScript writes it: ``x[..., : x.shape[-1] // 2]`` with the end a
    Shape -> Gather -> Div of a [batch, seq, 8] tensor (batch unbound): the end folds to 4 at any
    batch, so the slice is along another dim and the length still pads; at every length the run
    matches onnxruntime."""
    import onnxruntime

    from kiln.frontend.onnx import import_onnx
    from kiln.passes.padding import Padding, paddable

    body = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "minus_one"], ["d"], axis=0),
        helper.make_node("Div", ["d", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "zero"], ["end"]),
        helper.make_node("Slice", ["x", "zero", "end", "minus_one1"], ["first"]),
        helper.make_node("Slice", ["x", "end", "big", "minus_one1"], ["second"]),
        helper.make_node("Neg", ["second"], ["negated"]),
        helper.make_node("Concat", ["negated", "first"], ["y"], axis=-1),
    ]
    weights = {
        "minus_one": np.array(-1, np.int64),
        "minus_one1": np.array([-1], np.int64),
        "two": np.array(2, np.int64),
        "zero": np.array([0], np.int64),
        "big": np.array([1 << 40], np.int64),
    }
    model = make_model(body, [("x", FLOAT, ["batch", "seq", 8])], [("y", FLOAT, None)], weights, opset=18)
    assert isinstance(paddable(import_onnx(model), "seq"), Padding)
    compiled = kiln.compile(model, dims={"batch": 2, "seq": "1..12"})
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in (1, 5, 12):
        x = np.random.default_rng(length).standard_normal((2, length, 8)).astype(np.float32)
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], session.run(None, {"x": x})[0])


def test_a_causal_window_cut_from_a_table_with_computed_ends_pads_and_runs_every_length():
    """GPT-Neo's causal mask as both exporters write it: ``bias[k - q : k, :k]`` of a [64, 64]
    table, ``k`` and ``q`` read from shapes (``k - q`` is 0 at every length), the end capped at the
    table (``min(seq, 64)``, dynamo's guard), sliced along a dim of the table's own; the length
    pads (0 compiles after kiln.compile) and every length matches onnxruntime."""
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.padding import Padding, paddable

    body = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xt"], ["scores"]),
        helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
        helper.make_node("Squeeze", ["s", "zero"], ["k"]),
        helper.make_node("Shape", ["scores"], ["s2"]),
        helper.make_node("Slice", ["s2", "minus_two", "minus_one", "zero"], ["q1"]),
        helper.make_node("Squeeze", ["q1", "zero"], ["q"]),
        helper.make_node("Sub", ["k", "q"], ["start0"]),
        helper.make_node("Min", ["k", "cap"], ["end0"]),
        helper.make_node("Unsqueeze", ["start0", "zero"], ["start"]),
        helper.make_node("Unsqueeze", ["end0", "zero"], ["end"]),
        helper.make_node("Slice", ["table", "start", "end", "zero"], ["rows"]),
        helper.make_node("Slice", ["rows", "zero", "end", "one"], ["window"]),
        helper.make_node("Where", ["window", "scores", "lowest"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "x"], ["y"]),
    ]
    weights = {
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "minus_one": np.array([-1], np.int64),
        "minus_two": np.array([-2], np.int64),
        "cap": np.array(64, np.int64),
        "table": np.tril(np.ones((64, 64), bool)),
        "lowest": np.array(-3.4e38, np.float32),
    }
    model = make_model(body, [("x", FLOAT, ["batch", "seq", WIDTH])], [("y", FLOAT, None)], weights, opset=18)
    graph = import_onnx(model)
    assert isinstance(paddable(graph, "seq", 1, 12), Padding)
    assert not isinstance(paddable(graph, "seq", 1, 100), Padding)  # min(seq, 64) is not the length past 64
    _matches_onnxruntime_at_every_length(model, (1, 4, 7, 12))
    # up to the table's 64 rows the length is taken at run time: min(seq, 64) is read as seq from
    # the declared range, so no kernel integer is fitted to the lowered lengths
    from kiln.driver.extents import sizes_found

    found = sizes_found()
    _matches_onnxruntime_at_every_length(model, (3, 64))
    assert sizes_found()["read"] > found["read"] and sizes_found()["fitted"] == found["fitted"]


def test_relative_positions_gathered_from_a_table_of_distances_pad_and_run_every_length():
    """DeBERTa's content-to-position scores: ``c2p = x @ table^T`` ([batch, seq, 2*span]) gathered
    along its table dim by the clamped distance ``clip(i - j + span, 0, 2*span - 1)`` of positions
    from ``Range(0, seq)``: a gather along a dim that is not padded, each valid (i, j) reading its own
    row, so the length pads; every length matches onnxruntime with no compile after kiln.compile."""
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.padding import Padding, paddable

    span = 3
    body = [
        helper.make_node("MatMul", ["x", "table_t"], ["c2p"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["length"], axis=0),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "last"], ["rows"]),
        helper.make_node("Unsqueeze", ["positions", "first"], ["cols"]),
        helper.make_node("Sub", ["rows", "cols"], ["distance"]),
        helper.make_node("Add", ["distance", "span"], ["shifted"]),
        helper.make_node("Clip", ["shifted", "zero", "top"], ["index2"]),
        helper.make_node("Slice", ["s", "first", "two"], ["batch_and_length"]),
        helper.make_node("Slice", ["s", "last1", "two"], ["length1"]),
        helper.make_node("Concat", ["batch_and_length", "length1"], ["target"], axis=0),
        helper.make_node("Expand", ["index2", "target"], ["index"]),
        helper.make_node("GatherElements", ["c2p", "index"], ["scores"], axis=2),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "x"], ["y"]),
    ]
    weights = {
        "table_t": np.random.default_rng(0).standard_normal((WIDTH, 2 * span)).astype(np.float32),
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
        "span": np.array(span, np.int64),
        "top": np.array(2 * span - 1, np.int64),
        "first": np.array([0], np.int64),
        "last": np.array([-1], np.int64),
        "last1": np.array([1], np.int64),
        "two": np.array([2], np.int64),
    }
    model = make_model(body, [("x", FLOAT, ["batch", "seq", WIDTH])], [("y", FLOAT, None)], weights, opset=18)
    assert isinstance(paddable(import_onnx(model), "seq", 1, 12), Padding)
    _matches_onnxruntime_at_every_length(model, (1, 5, 8, 12))


def _matches_onnxruntime_at_every_length(model: onnx.ModelProto, lengths: tuple[int, ...]) -> None:
    """``model`` (x: [batch, seq, WIDTH]) compiled once for seq 1..max(lengths) at batch 2: every
    length matches onnxruntime on the same file and none compiles after kiln.compile returned."""
    import onnxruntime

    from kiln.driver.variants import plans_compiled

    compiled = kiln.compile(model, dims={"batch": 2, "seq": f"1..{max(lengths)}"})
    before = plans_compiled()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in lengths:
        x = np.random.default_rng(length).standard_normal((2, length, WIDTH)).astype(np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert plans_compiled() == before


def test_what_no_output_reads_does_not_refuse_padding():
    """An ArgMax along the length that no output reads (CLIP's pooled features when only the
    hidden states are returned) does not stop the length from padding; returned, it does."""
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.padding import Padding, paddable

    body = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("ArgMax", ["x"], ["pooled"], axis=1),
    ]
    dead = make_model(body, [("x", FLOAT, ["batch", "seq", WIDTH])], [("y", FLOAT, ["batch", "seq", WIDTH])], {})
    assert isinstance(paddable(import_onnx(dead), "seq"), Padding)
    read = make_model(
        body,
        [("x", FLOAT, ["batch", "seq", WIDTH])],
        [("y", FLOAT, ["batch", "seq", WIDTH]), ("pooled", onnx.TensorProto.INT64, ["batch", 1, WIDTH])],
        {},
    )
    assert "works along the padded dim" in str(paddable(import_onnx(read), "seq"))


def test_an_expand_whose_computed_target_keeps_the_padded_dims_pads():
    """``bias.unsqueeze(0).expand(batch, -1, seq, seq)`` spelled with 1s for the kept dims in a
    target computed from the batch (MPNet's relative-position bias): the positions stay put."""
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.padding import Padding, paddable

    body = [
        helper.make_node("MatMul", ["x", "xt"], ["scores"]),  # [batch, seq, seq]
        helper.make_node("ReduceMean", ["scores"], ["bias"], axes=[0], keepdims=1),  # [1, seq, seq]
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "one", "one"], ["target"], axis=0),
        helper.make_node("Expand", ["bias", "target"], ["y"]),
    ]
    body = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.array([1], np.int64))),
        *body,
    ]
    model = make_model(body, [("x", FLOAT, ["batch", "seq", WIDTH])], [("y", FLOAT, ["batch", "seq", "seq"])], {})
    found = paddable(import_onnx(model), "seq")
    assert isinstance(found, Padding), found
