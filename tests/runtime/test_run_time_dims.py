"""An image's height and width (a convolution mixes pixels: neither chunked nor padded) taken by
the kernels at run time (kiln.driver.spatial): one library per batch class serves every size in
the declared ranges, the sizes read from the dims vector each call passes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.driver import extents, spatial
from kiln.driver.options import CompileOptions
from kiln.driver.variants import plans_compiled
from kiln.errors import InputError
from tests.helpers import FLOAT, make_model, run_without_a_compiler

RANGES = {"batch": (1, 9), "h": (6, 40), "w": (6, 40)}


def strided_cnn() -> onnx.ModelProto:
    """A convolution, a strided depthwise one, a max pool, a 1x1 convolution, global pooling and
    a linear layer: every layer's size is a floor division of the image's. Outputs the logits and
    the strided feature map (whose shape follows the image)."""
    rng = np.random.default_rng(7)
    weights = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(8).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3,
        "w3": rng.standard_normal((6, 8, 1, 1)).astype(np.float32) * 0.3,
        "wl": rng.standard_normal((5, 6)).astype(np.float32),
        "bl": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=8, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["f"]),
        helper.make_node("MaxPool", ["f"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w3"], ["c3"]),
        helper.make_node("GlobalAveragePool", ["c3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wl", "bl"], ["y"], transB=1),
    ]
    return make_model(
        nodes,
        [("x", FLOAT, ["batch", 3, "h", "w"])],
        [("y", FLOAT, ["batch", 5]), ("f", FLOAT, ["batch", 8, None, None])],
        weights,
        opset=17,
    )


def image(batch: int, height: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1000 * height + width)
    return {"x": rng.standard_normal((batch, 3, height, width)).astype(np.float32)}


def sizes() -> list[tuple[int, int, int]]:
    """Every height in the range, each with a width spread over the range, at several batches."""
    low, high = RANGES["h"]
    rng = np.random.default_rng(11)
    return [(int(rng.choice([1, 2, 8, 9])), h, int(rng.integers(low, high + 1))) for h in range(low, high + 1)]


def test_every_image_size_runs_on_one_library_per_batch_class():
    """One compile per batch class; every height 6..40 (widths spread) equals the reference
    interpreter, the feature map comes back at each size's shape, nothing compiles at run time,
    and the ranges are checked."""
    model = strided_cnn()
    compiled = kiln.compile(model, dims=RANGES)
    assert compiled.dims_model is not None, compiled.run_time_refused
    before = len(compiled.executables())
    assert before == 2  # batch classes 1 and 8, each serving every height and width
    kernels = [k for e in compiled.executables() for s in e.plan.steps for k in s.kernels]
    assert sum(k.dims is not None for k in kernels) > len(kernels) // 2  # sizes read at run time
    # the strided depthwise layer runs output by output (borders tested at run time), not per tap
    assert any(k.kind.startswith("depthwise-conv") and k.dims is not None for k in kernels), [k.kind for k in kernels]
    reference = kiln.compile(model, target="reference")
    for batch, height, width in sizes():
        given = image(batch, height, width)
        got, want = compiled.run(given), reference.run(given)
        for name in ("y", "f"):
            assert got[name].shape == want[name].shape, (name, batch, height, width)
            np.testing.assert_allclose(
                got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} at {(batch, height, width)}"
            )
    assert len(compiled.executables()) == before  # nothing compiled at run time
    with pytest.raises(InputError, match="outside the range"):
        compiled.run(image(1, 41, 8))


def test_the_sizes_are_read_from_the_dims_vector():
    """Mutation check: the library run on an image of 17 x 23 told (by its dims vector) the
    sizes of 16 x 23 gives other logits, so the kernels compute with the sizes each call gives."""
    compiled = kiln.compile(strided_cnn(), dims={"batch": 1, "h": (6, 40), "w": (6, 40)})
    model = compiled.dims_model
    executable = model.executables()[0]
    given = image(1, 17, 23)["x"]
    laid = extents.lay_out(given, (1, 3, 40, 40))
    right = executable.run([laid, model.dims_vector({"batch": 1, "h": 17, "w": 23})])
    wrong = executable.run([laid, model.dims_vector({"batch": 1, "h": 16, "w": 23})])
    want = kiln.compile(strided_cnn(), target="reference").run({"x": given})["y"]
    np.testing.assert_allclose(right[0], want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(wrong[0], want, rtol=1e-3)


def test_two_terms_that_agree_where_lowered_are_told_apart():
    """A size that fits d_0 and d_1 at the bindings lowered, which differ at a check binding:
    ambiguous (the compile lowers there too), never a guess."""
    values = np.array([[40, 40], [21, 21], [13, 13], [7, 7]], np.int64)
    checked = np.array([[10, 12], [30, 30]], np.int64)
    fitter = spatial.TermFitter(values, checked)
    with pytest.raises(spatial.Ambiguous):
        fitter.fit([80, 42, 26, 14], "k1.n")
    values[:, 1] = [40, 23, 13, 7]  # now they differ where lowered: 2 * d_0 fits alone
    size = spatial.TermFitter(values, checked).fit([80, 42, 26, 14], "k1.n")
    assert (size.c0, size.c, size.dims) == (0, 2, (0,))


def test_a_floor_division_of_a_dim_is_a_term():
    """A strided window's bound, floor((d + 1) / 2), fits where no product of dims does."""
    d = np.array([40, 27, 13, 8, 33], np.int64)
    values, checked = d[:4, None], d[4:, None]
    size = spatial.TermFitter(values, checked).fit([int(v) for v in (d[:4] + 1) // 2], "k1.extent")
    assert size.factors == ((0, 1, 2),) and size.at(np.array([33])) == 17
    assert str(size) == "((int64_t)0 + (int64_t)1 * ((kiln_d0 + 1) / 2))"


def large_window_cnn() -> onnx.ModelProto:
    """A stride-2 convolution, then a 7x7 depthwise one (channels last: its interior runs groups of
    pixels, ``width // 4`` of them, with no stride 4 anywhere in the model) and a 1x1 one."""
    rng = np.random.default_rng(3)
    weights = {
        "w1": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.3,
        "w2": rng.standard_normal((16, 1, 7, 7)).astype(np.float32) * 0.2,
        "b2": rng.standard_normal(16).astype(np.float32) * 0.1,
        "w3": rng.standard_normal((8, 16, 1, 1)).astype(np.float32) * 0.3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], group=16, pads=[3, 3, 3, 3]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["y"]),
    ]
    return make_model(
        nodes, [("x", FLOAT, ["batch", 8, "h", "w"])], [("y", FLOAT, ["batch", 8, None, None])], weights, opset=17
    )


def test_groups_of_pixels_take_the_width_at_run_time():
    """The channels-last depthwise kernel's interior (groups of 4 pixels, then the rest) is one
    program at every width (either loop may run no times) whose group count is a floor division
    the lowering declares: every width's residue modulo 4 matches the reference with nothing
    compiled after kiln.compile (before: 'no constant plus a multiple of a product of the model's
    dims', a compile per size)."""
    model = large_window_cnn()
    compiled = kiln.compile(model, dims={"batch": 1, "h": (16, 60), "w": (16, 60)})
    assert compiled.dims_model is not None, compiled.run_time_refused
    kinds = [k.kind for e in compiled.executables() for s in e.plan.steps for k in s.kernels if k.dims is not None]
    assert any(kind.startswith("depthwise-conv") for kind in kinds), kinds
    reference = kiln.compile(model, target="reference")
    before = plans_compiled()
    for height, width in [(16, 16), (60, 60), (23, 41), (37, 19), (50, 57), (29, 22)]:
        given = {"x": np.random.default_rng(width).standard_normal((1, 8, height, width)).astype(np.float32)}
        got, want = compiled.run(given)["y"], reference.run(given)["y"]
        assert got.shape == want.shape == (1, 8, (height + 1) // 2, (width + 1) // 2)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert plans_compiled() == before


def test_a_floor_division_that_is_zero_at_small_sizes_is_a_term():
    """A loop over groups of 4 pixels of a plane that is 3 pixels wide at the smallest size runs no
    times there: floor(d / 4) is 0 at that binding and still the term (ConvNeXtV2's last stage
    through torch.compile, whose range starts at 16: before, 'no constant plus a multiple of a
    product of the model's dims' and a compile per size)."""
    d = np.array([40, 27, 13, 3, 33], np.int64)
    values, checked = d[:4, None], d[4:, None]
    size = spatial.TermFitter(values, checked, (4,)).fit([int(v) for v in d[:4] // 4], "k1.extent")
    assert size.factors == ((0, 0, 4),) and size.at(np.array([33])) == 8 and size.at(np.array([2])) == 0


def test_the_route_can_be_turned_off_and_then_compiles_per_size():
    options = CompileOptions.from_env().with_(disabled=frozenset({"run-time-dims"}))
    compiled = kiln.compile(strided_cnn(), dims={"batch": 1, "h": (6, 40), "w": (6, 40)}, options=options)
    assert compiled.dims_model is None
    reference = kiln.compile(strided_cnn(), target="reference")
    given = image(1, 9, 31)
    np.testing.assert_allclose(compiled.run(given)["y"], reference.run(given)["y"], rtol=1e-4, atol=1e-5)


def test_one_artifact_runs_every_image_size_without_a_compiler(tmp_path):
    """Compiled once with h, w = 6..40, saved; a process with no compiler on its PATH and an empty
    cache loads it and runs sizes across the ranges, each against the reference interpreter."""
    model = strided_cnn()
    compiled = kiln.compile(model, dims=RANGES)
    compiled.save(tmp_path / "m.kiln")
    reference = kiln.compile(model, target="reference")
    chosen = sizes()[::3]
    expected = {f"y{i}": reference.run(image(*size))["y"] for i, size in enumerate(chosen)}
    np.savez(tmp_path / "expected.npz", **expected)
    script = f"""
import numpy as np, kiln, sys
sys.path.insert(0, {os.getcwd()!r})
from tests.runtime.test_run_time_dims import image
model = kiln.load({str(tmp_path / "m.kiln")!r})
expected = np.load({str(tmp_path / "expected.npz")!r})
worst = 0.0
for i, size in enumerate({chosen!r}):
    got = model.run(image(*size))["y"]
    want = expected[f"y{{i}}"]
    worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
assert len(model.executables()) == 2, len(model.executables())  # nothing compiled: the classes only
assert model.dims_model.spatial.program is not None  # the dims program came back with the artifact
print("worst", worst)
"""
    stdout = run_without_a_compiler(script, tmp_path)
    assert float(stdout.split()[-1]) <= 1e-5


def test_the_dims_program_gives_the_specialized_vector_at_every_size():
    """The route's dims program (each dim a term of earlier ones) gives, at every height and a
    spread of widths, exactly the vector specializing the graph gives; the artifact keeps it."""
    compiled = kiln.compile(strided_cnn(), dims={"batch": 1, "h": (6, 40), "w": (6, 40)})
    route = compiled.dims_model.spatial
    assert route.program is not None
    # every layer's size is named by its expression ((h+1)//2, ...): evaluated, nothing fitted
    assert set(route.program.named) | set(route.program.inputs) >= {i for i, n in enumerate(route.names) if "h" in n}
    assert not [step for step in route.program.steps if step[3]], route.program.steps
    graph = compiled.dims_model.graph
    for _, height, width in sizes():
        dims = {"batch": 1, "h": height, "w": width}
        want = spatial.dim_values(graph, route.names, dims)
        got = route.program(dims)
        assert got is not None and got.tolist() == want.tolist(), (height, width, got, want)


def test_the_dims_program_defers_where_it_could_be_wrong_unseen():
    """Where the program's vector has a dim below 1, above the capacity's, or two dims apart that
    were equal at every binding specialized (a skip connection's sizes), it gives None: the
    binding is specialized instead (InputError where the model has no shapes)."""
    from kiln.driver.dims_program import DimsProgram

    # d1 = 2 * floor(d0 / 2) (down and up again), d2 = d0 (the skip): equal at even sizes only
    program = DimsProgram(
        ("h", "down_up", "skip"), (0,), ((1, 0, 2, ((0, 0, 2),)), (2, 0, 1, ((0, 0, 1),))), (40, 40, 40), ((1, 2),)
    )
    assert program({"h": 12}).tolist() == [12, 12, 12]
    assert program({"h": 13}) is None  # the skip and the upsampled map disagree
    assert program({"h": 41}) is None  # above the capacity
    assert program({"h": 0}) is None
    with pytest.raises(ValueError):  # a step that reads a later dim, from a damaged artifact
        DimsProgram.from_meta(
            {"inputs": [0], "steps": [[1, 0, 1, [[2, 0, 1]]]], "capacity": [4, 4, 4], "equal": []},
            ("a", "b", "c"),
            (2,),
        )
    meta = program.as_meta()
    assert DimsProgram.from_meta(meta, program.names, (2,)) == program
    with pytest.raises(ValueError):  # a named entry that is no expression of the inputs
        DimsProgram.from_meta({**meta, "named": [2]}, program.names, (2,))
    named = DimsProgram(("h", "(h+1)//2"), (0,), (), (40, 20), (), (1,))
    assert named({"h": 13}).tolist() == [13, 7] and DimsProgram.from_meta(named.as_meta(), named.names, ()) == named


def test_the_dims_program_checks_each_size_class_against_its_own_capacity():
    """A dim outside the route (a size class's batch) is fixed per variant: the vector is checked
    against the capacity of the class it binds, and a binding of it no class has is specialized."""
    from kiln.driver.dims_program import DimsProgram

    # (batch, t, batch*t): t at run time up to 10, batch classes 1 and 4
    program = DimsProgram(("batch", "t", "batch*t"), (0, 1), (), (1, 10, 10), (), (2,), (0,), ((4, 10, 40),))
    assert program({"batch": 1, "t": 7}).tolist() == [1, 7, 7]
    assert program({"batch": 4, "t": 7}).tolist() == [4, 7, 28]  # above class 1's capacity, inside class 4's
    assert program({"batch": 2, "t": 7}) is None  # no class of 2
    assert program({"batch": 4, "t": 11}) is None
    assert DimsProgram.from_meta(program.as_meta(), program.names, ()) == program
    with pytest.raises(ValueError):  # a class's capacity of another length, from a damaged artifact
        DimsProgram.from_meta({**program.as_meta(), "classes": [[4, 10]]}, program.names, ())
    earlier = DimsProgram(program.names, (0, 1), (), (1, 10, 10), (), (2,))  # (fitted at class 1 only)
    assert earlier({"batch": 4, "t": 7}) is None


def test_kiln_explain_lists_the_kernels_that_take_the_sizes_at_run_time(tmp_path):
    """kiln explain --dim h=.. --dim w=..: the route kiln compile takes, each kernel with whether
    it reads the dims vector (text and --json); --disable run-time-dims says each size compiles."""
    import json

    from click.testing import CliRunner

    from kiln.cli import main

    onnx.save(strided_cnn(), tmp_path / "m.onnx")
    runner = CliRunner()
    ranges = ["--dim", "batch=1..1", "--dim", "h=6..40", "--dim", "w=6..40", "--no-kernels"]
    shown = runner.invoke(main, ["explain", str(tmp_path / "m.onnx"), *ranges, "--json"])
    assert shown.exit_code == 0, shown.output
    sizes = json.loads(shown.output)["sizes"]
    listing = sizes["h"]["run_time_dims"]
    assert listing is sizes["w"]["run_time_dims"] or listing == sizes["w"]["run_time_dims"]
    assert not listing["refused"] and listing["dims"] == ["h", "w"] and listing["program"], listing
    assert listing["lowered"][0] == [40, 40], listing
    kinds = {k["kind"]: k["run_time"] for k in listing["kernels"]}
    assert kinds["depthwise-conv+epilogue"] and kinds["pool"], kinds
    text = runner.invoke(main, ["explain", str(tmp_path / "m.onnx"), *ranges])
    assert "kernels take h and w at run time" in text.output, text.output
    off = runner.invoke(main, ["explain", str(tmp_path / "m.onnx"), *ranges, "--disable", "run-time-dims"])
    assert "compiles each new size" in off.output and "at run time" not in off.output, off.output
