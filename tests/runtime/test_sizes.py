"""Declared ranges of symbolic dims, and every size of a sample-parallel dim run from its size
classes (kiln.driver.sizes): one compile, one artifact, no compiler at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.driver.artifact import ArtifactError
from kiln.driver.sizes import Chunking
from kiln.errors import ArgumentError, InputError
from kiln.passes.batching import Parallel
from tests.helpers import FLOAT, make_model, run_without_a_compiler, write_signed_artifact

RNG = np.random.default_rng(7)


def small_cnn() -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> flatten to [Shape(x)[0], -1] -> Gemm, times a shared scale input
    (no samples' dim: every chunk reads it whole)."""
    rng = np.random.default_rng(7)
    weights = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "fc": rng.standard_normal((36, 5)).astype(np.float32),
        "bias": rng.standard_normal(5).astype(np.float32),
        "zero": np.array(0, np.int64),
        "axes": np.array([0], np.int64),
        "rest": np.array([-1], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "bias"], ["g"]),
        helper.make_node("Mul", ["g", "scale"], ["y"]),
    ]
    return make_model(
        nodes,
        [("x", FLOAT, ["batch", 3, 6, 6]), ("scale", FLOAT, [1])],
        [("y", FLOAT, ["batch", 5])],
        weights,
    )


def feeds(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    return {
        "x": rng.standard_normal((batch, 3, 6, 6)).astype(np.float32),
        "scale": np.array([0.5], np.float32),
    }


def test_one_artifact_runs_every_batch_from_1_to_64_without_a_compiler(tmp_path):
    """Compiled once with batch=1..64, saved; a process with no compiler on its PATH and an empty
    cache loads it and runs batch 1..64, each against the reference interpreter."""
    model = small_cnn()
    compiled = kiln.compile(model, dims={"batch": (1, 64)})
    assert compiled.chunking() == Chunking(Parallel("batch", (0, None), (0,)), (1, 8))
    assert sorted(dims["batch"] for dims, _ in compiled.bindings()) == [1, 8]  # the classes, compiled ahead
    compiled.save(tmp_path / "m.kiln")
    reference = kiln.compile(model, target="reference")
    expected = {f"y{b}": reference.run(feeds(b))["y"] for b in range(1, 65)}
    np.savez(tmp_path / "expected.npz", **expected)
    script = f"""
import numpy as np, kiln, sys
sys.path.insert(0, {os.getcwd()!r})
from tests.runtime.test_sizes import feeds
model = kiln.load({str(tmp_path / "m.kiln")!r})
expected = np.load({str(tmp_path / "expected.npz")!r})
worst = 0.0
for b in range(1, 65):
    got = model.run(feeds(b))["y"]
    assert got.shape == (b, 5), got.shape
    worst = max(worst, float(np.abs(got - expected[f"y{{b}}"]).max() / np.abs(expected[f"y{{b}}"]).max()))
assert len(model.variants) == 2, len(model.variants)  # nothing compiled: classes 1 and 8 only
try:
    model.run(feeds(65))
except kiln.errors.InputError as err:
    assert "batch=1..64" in str(err)
else:
    raise AssertionError("batch 65 ran outside the declared range")
print("worst", worst)
"""
    stdout = run_without_a_compiler(script, tmp_path)
    assert float(stdout.split()[-1]) <= 1e-5


def test_a_run_at_a_size_that_is_no_class_is_its_chunks_joined():
    compiled = kiln.compile(small_cnn(), dims={"batch": (1, 64)})
    chunking = compiled.chunking()
    assert chunking.chunks(37) == [8, 8, 8, 8, 1, 1, 1, 1, 1]
    reference = kiln.compile(small_cnn(), target="reference")
    for batch in (3, 8, 37):
        got = compiled.run(feeds(batch))["y"]
        np.testing.assert_allclose(got, reference.run(feeds(batch))["y"], rtol=1e-5, atol=1e-5)
    assert len(compiled.variants) == 2


def test_size_classes_may_be_chosen_and_must_sum_to_every_size():
    compiled = kiln.compile(small_cnn())
    compiled.declare({"batch": "1..32"}, {"batch": "1,4,16"})
    assert compiled.chunking().classes == (1, 4, 16)
    assert compiled.chunking().chunks(27) == [16, 4, 4, 1, 1, 1]
    with pytest.raises(ArgumentError, match="must include 1"):
        compiled.declare({"batch": "1..32"}, {"batch": "4,16"})
    with pytest.raises(ArgumentError, match="past the range"):
        compiled.declare({"batch": "1..8"}, {"batch": "1,16"})
    with pytest.raises(ArgumentError, match="not a range"):
        compiled.declare({"batch": "1-8"})
    with pytest.raises(ArgumentError, match="too large a class"):
        compiled.declare({"batch": "1..100000"}, {"batch": "1,65536"})
    with pytest.raises(ArgumentError, match="not a list of sizes"):
        compiled.declare({"batch": "1..8"}, {"batch": "1,x"})
    with pytest.raises(ArgumentError, match="not a range of sizes"):
        compiled.declare({"batch": (1, 1 << 40)})
    with pytest.raises(ArgumentError, match="not a symbolic input dim"):
        compiled.declare({"seq": "1..8"})


def test_a_dim_that_is_not_sample_parallel_keeps_its_range_and_compiles_per_size():
    """Softmax over the samples: no chunking (it would change the result); the range still holds."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=0)]
    model = make_model(nodes, [("x", FLOAT, ["batch", 4])], [("y", FLOAT, ["batch", 4])])
    compiled = kiln.compile(model, dims={"batch": (1, 16)})
    assert compiled.chunking() is None
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(compiled.run({"x": x})["y"], e / e.sum(0), rtol=1e-5)
    with pytest.raises(InputError, match="outside the range"):
        compiled.run({"x": np.zeros((17, 4), np.float32)})


def test_an_artifact_with_damaged_ranges_is_refused(tmp_path):
    compiled = kiln.compile(small_cnn(), dims={"batch": (1, 8)})
    compiled.save(tmp_path / "m.kiln")
    with zipfile.ZipFile(tmp_path / "m.kiln") as archive:
        members = {name: archive.read(name) for name in archive.namelist() if name != "manifest.json"}
    for ranges, classes in (({"batch": [8, 1]}, {}), ({"nope": [1, 2]}, {}), ({}, {"batch": [0, 2]}), ("x", {})):
        meta = json.loads(members["meta.json"])
        meta["ranges"], meta["size_classes"] = ranges, classes
        write_signed_artifact({**members, "meta.json": json.dumps(meta).encode()}, tmp_path / "bad.kiln")
        with pytest.raises(ArtifactError, match="damaged artifact"):
            kiln.load(tmp_path / "bad.kiln")


def test_the_cli_declares_ranges_and_explains_which_dims_run_every_size(tmp_path):
    from click.testing import CliRunner

    from kiln.cli import main

    model = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), model)
    result = CliRunner().invoke(main, ["compile", str(model), "--dim", "batch=1..32", "-o", str(tmp_path / "m.kiln")])
    assert result.exit_code == 0, result.output
    assert "batch (1..32): sample-parallel; every size runs from the size classes 1, 8" in result.output
    loaded = kiln.load(tmp_path / "m.kiln")
    assert loaded.ranges == {"batch": (1, 32)}
    result = CliRunner().invoke(main, ["explain", str(model), "--dim", "batch=1..32", "--json"])
    assert result.exit_code == 0, result.output
    sizes = json.loads(result.output)["sizes"]
    assert sizes == {
        "batch": {
            "range": [1, 32],
            "sample_parallel": True,
            "classes": [1, 8],
            "guards": [],
            "reason": "",
            "padded": None,
        }
    }
    # the pipeline is shown at a size inside the range (its low end), never at 1 below it
    result = CliRunner().invoke(main, ["explain", str(model), "--dim", "batch=3..32", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["dims"] == {"batch": 3}
    from kiln.cli_sizes import inside_ranges

    # a dim is bound by --dim only when named: "batch=2" binds batch, not h (whose name it ends in)
    assert inside_ranges({"h": {"range": [8, 64]}, "batch": {"range": None}}, ("batch=2",)) == {"h": 8}
    assert inside_ranges({"h": {"range": [8, 64]}}, ("h=16",)) == {}
    for bad, said in (
        ("batch=9..2", "not a range of sizes"),
        ("batch=1..x", "integers"),
        ("seq=1..4", "not a symbolic"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "kiln", "compile", str(model), "--dim", bad, "-o", str(tmp_path / "n.kiln")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and said in done.stderr and "kiln bug" not in done.stderr, (bad, done.stderr)


def test_a_run_overriding_a_default_keeps_the_declared_range():
    """An initializer listed as an input is a default a run may override (a model of its own,
    derived): it serves the same range, and refuses the same sizes."""
    model = make_model(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        [("x", FLOAT, ["batch", 2]), ("b", FLOAT, [2])],
        [("y", FLOAT, ["batch", 2])],
        {"b": np.array([10, 20], np.float32)},
    )
    compiled = kiln.compile(model, dims={"batch": (1, 4)})
    x = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x, "b": np.zeros(2, np.float32)})["y"], x)
    with pytest.raises(InputError, match="batch=5 is outside"):
        compiled.run({"x": np.ones((5, 2), np.float32), "b": np.zeros(2, np.float32)})
