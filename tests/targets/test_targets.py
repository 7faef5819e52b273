"""Every target this machine can run compiles the same cases and must match the reference: ``cpu``
(this machine, -march=native), ``cpu:<isa>`` (one ISA's baseline, e.g. the AVX2 path on an AVX-512
server; a path the machine lacks is skipped with the reason) and ``kir``, the third target, which
only the tests register (``kir_backend.py``): the kernel-IR interpreter, no C (``kir`` runs the
engine calls by their specification, ``kir:loops`` has no engines: loop nests, attention falls
back)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.backends import cpu as cpu_backend
from kiln.backends import parse
from kiln.lower.target import TargetError
from tests.conftest import runnable
from tests.helpers import FLOAT, INT64, make_model

HOST = cpu_backend.host()


@pytest.fixture(autouse=True)
def stores_finish(monkeypatch):
    """Plan-cache stores run in the background: let them finish before the test's cache folder goes."""
    from kiln.driver import plan_cache

    yield
    plan_cache.wait()


def cases():
    rng = np.random.default_rng(5)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    yield (
        "winograd conv + relu",
        make_model(
            [
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"]),
            ],
            [("x", FLOAT, [1, 16, 8, 8])],
            [("y", FLOAT, None)],
            {"w": f(16, 16, 3, 3), "b": f(16)},
        ),
        {"x": f(1, 16, 8, 8)},
    )
    yield (
        "strided 1x1 conv",
        make_model(
            [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2])],
            [("x", FLOAT, [1, 24, 15, 15])],
            [("y", FLOAT, None)],
            {"w": f(40, 24, 1, 1)},
        ),
        {"x": f(1, 24, 15, 15)},
    )
    yield (
        "depthwise conv",
        make_model(
            [helper.make_node("Conv", ["x", "w"], ["y"], group=16, pads=[1, 1, 1, 1])],
            [("x", FLOAT, [1, 16, 9, 9])],
            [("y", FLOAT, None)],
            {"w": f(16, 1, 3, 3)},
        ),
        {"x": f(1, 16, 9, 9)},
    )
    yield (
        "pooling",
        make_model(
            [
                helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                helper.make_node("GlobalAveragePool", ["p"], ["y"]),
            ],
            [("x", FLOAT, [2, 8, 17, 17])],
            [("y", FLOAT, None)],
        ),
        {"x": f(2, 8, 17, 17)},
    )
    yield (
        "matmul + bias + gelu",
        make_model(
            [
                helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Add", ["h", "b"], ["g"]),
                helper.make_node("Gelu", ["g"], ["y"]),
            ],
            [("x", FLOAT, [37, 64])],
            [("y", FLOAT, None)],
            {"w": f(64, 96), "b": f(96)},
            opset=20,
        ),
        {"x": f(37, 64)},
    )
    attention = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    yield (
        "attention",
        make_model(
            attention,
            [("q", FLOAT, [2, 4, 19, 16]), ("kt", FLOAT, [2, 4, 16, 19]), ("v", FLOAT, [2, 4, 19, 16])],
            [("y", FLOAT, None)],
            {"scale": np.array(0.25, np.float32)},
        ),
        {"q": f(2, 4, 19, 16), "kt": f(2, 4, 16, 19), "v": f(2, 4, 19, 16)},
    )
    yield (
        "layernorm",
        make_model(
            [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
            [("x", FLOAT, [3, 7, 40])],
            [("y", FLOAT, None)],
            {"g": f(40), "b": f(40)},
        ),
        {"x": f(3, 7, 40)},
    )
    yield (
        "gather + reduce",
        make_model(
            [helper.make_node("Gather", ["w", "i"], ["g"]), helper.make_node("ReduceSum", ["g", "axes"], ["y"])],
            [("i", INT64, [5])],
            [("y", FLOAT, None)],
            {"w": f(10, 33), "axes": np.array([1], np.int64)},
        ),
        {"i": np.array([0, 9, 3, 3, 7], np.int64)},
    )


CASES = list(cases())


@pytest.mark.parametrize("name,model,feeds", CASES, ids=[c[0] for c in CASES])
def test_every_isa_path_matches_the_reference(target, name, model, feeds, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    compiled = kiln.compile(model, target=target)
    expected = kiln.compile(model, target="reference").run(feeds)
    got = compiled.run(feeds)
    # every target runs every case natively: on kir:loops, with no attention engine, the attention
    # group is split back into its ops (loop nests) instead of running on the host
    assert compiled.target == target and compiled.is_native, [
        (f.node.label, f.reason) for p in compiled.plans for f in p.fallbacks
    ]
    for key, value in expected.items():
        # absolute error scaled by the output's size: Winograd F(4x4,3x3) rounds like a longer sum
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=2e-5 * scale, err_msg=f"{name} on {target}")


def vector_registers(library) -> set[str]:
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed: cannot read the built code's instructions")
    listing = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True).stdout
    return {register for register in ("xmm", "ymm", "zmm") if f"%{register}" in listing}


@pytest.mark.parametrize(("target", "allowed"), [("cpu:avx2", {"xmm", "ymm"}), ("cpu:generic", {"xmm"})])
def test_an_isa_target_builds_only_that_isas_instructions(target, allowed, tmp_path, monkeypatch):
    runnable(target)
    if HOST.isa not in ("avx512", "avx2"):
        pytest.skip(f"x86 register names; this machine is {HOST.isa}")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    model = CASES[0][1]
    compiled = kiln.compile(model, target=target)
    (plan,) = compiled.plans
    used = vector_registers(plan.library)
    assert used <= allowed, f"{target} code uses {sorted(used - allowed)} registers"
    assert "xmm" in used  # it is vector code at all


def test_unknown_and_unrunnable_targets_are_clear_errors():
    with pytest.raises(kiln.KilnError, match="unknown target 'tpu'"):
        kiln.compile(
            make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2])], [("y", FLOAT, None)]),
            target="tpu",
        )
    with pytest.raises(TargetError, match="unknown target 'cpu:sse9'"):
        parse("cpu:sse9")
    foreign = "neon" if HOST.isa != "neon" else "avx512"
    with pytest.raises(TargetError, match="cannot run on this machine"):
        parse(f"cpu:{foreign}")


def test_an_artifact_records_its_isa_and_is_refused_where_it_cannot_run(tmp_path):
    import hashlib
    import json
    import zipfile

    from kiln.driver.artifact import ArtifactError

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)])
    target = "cpu:avx2" if "avx2" in cpu_backend.runnable_isas() else "cpu"
    saved = kiln.compile(model, target=target).save(tmp_path / "m.kiln")
    loaded = kiln.load(saved)
    assert loaded.target == target
    x = np.array([-1, 0, 2, -3], np.float32)
    np.testing.assert_array_equal(loaded(x), np.maximum(x, 0))
    with zipfile.ZipFile(saved) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    meta = json.loads(members["meta.json"])
    meta["target"], meta["isa"] = "cpu", "neon" if HOST.isa != "neon" else "avx512"
    members["meta.json"] = json.dumps(meta).encode()
    manifest = json.loads(members["manifest.json"])
    manifest["sha256"]["meta.json"] = hashlib.sha256(members["meta.json"]).hexdigest()
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(tmp_path / "foreign.kiln", "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(ArtifactError, match="cannot run on this machine"):
        kiln.load(tmp_path / "foreign.kiln")


def test_the_interpreted_target_needs_no_c_compiler(tmp_path, monkeypatch):
    from kiln.backends.cpu import toolchain

    def no_compiler(*args, **kwargs):
        raise AssertionError("the C compiler ran for the kir target")

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    monkeypatch.setattr(toolchain.subprocess, "run", no_compiler)
    name, model, feeds = CASES[4]  # matmul + bias + gelu: a loop nest instead of the engine
    compiled = kiln.compile(model, target="kir")
    (plan,) = compiled.plans
    assert plan.library is None and plan.source == "" and compiled.is_native
    expected = kiln.compile(model, target="reference").run(feeds)
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected["y"], rtol=1e-4, atol=1e-4, err_msg=name)
