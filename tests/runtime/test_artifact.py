import json
import zipfile

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.backends.cpu import toolchain
from kiln.driver.artifact import ArtifactError
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(0)


def model():
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [("x", FLOAT, ["batch", 4])],
        [("y", FLOAT, None)],
        {"w": RNG.standard_normal((4, 3)).astype(np.float32)},
    )


@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_save_load_round_trip(tmp_path, target):
    compiled = kiln.compile(model(), target=target, **({"dims": {"batch": 2}} if target == "cpu" else {}))
    path = compiled.save(tmp_path / "m.kiln")
    loaded = kiln.load(path)
    assert loaded.target == target
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), compiled(x))


def test_loading_needs_no_c_compiler(tmp_path, monkeypatch):
    compiled = kiln.compile(model(), target="cpu", dims={"batch": 3})
    path = compiled.save(tmp_path / "m.kiln")

    def no_compiler(*args, **kwargs):
        raise AssertionError("the C compiler ran while loading an artifact")

    monkeypatch.setattr(toolchain.subprocess, "run", no_compiler)
    loaded = kiln.load(path)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), compiled(x))
    assert loaded.is_native


def test_corrupt_foreign_and_newer_files_are_clear_errors(tmp_path):
    corrupt = tmp_path / "corrupt.kiln"
    corrupt.write_bytes(b"\x00not a zip")
    with pytest.raises(ArtifactError, match="corrupt.kiln: not a kiln artifact"):
        kiln.load(corrupt)
    foreign = tmp_path / "foreign.kiln"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("meta.json", json.dumps({"format": "something-else"}))
    with pytest.raises(ArtifactError, match="format 'something-else'"):
        kiln.load(foreign)
    path = kiln.compile(model(), target="reference").save(tmp_path / "ok.kiln")
    newer = tmp_path / "newer.kiln"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(newer, "w") as target:
        for item in source.namelist():
            data = source.read(item)
            if item == "meta.json":
                meta = json.loads(data)
                meta["version"] = 99
                data = json.dumps(meta).encode()
            target.writestr(item, data)
    with pytest.raises(ArtifactError, match="version 99 is newer"):
        kiln.load(newer)
    with pytest.raises(ArtifactError, match="no such file"):
        kiln.load(tmp_path / "missing.kiln")
