"""The second hostile probe (issue 26): each class it found, tested as a class. State-mutating
torch graphs, integer edge values, the cache's trust boundary, artifacts that lie, arguments and
run-time values, files that are not files, and artifacts built for a CPU that lacks an extension.
Every case failed (a wrong answer, a crash, a hang, data loss or "kiln bug") before its fix."""

from __future__ import annotations

import os
import stat
import sys
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import KilnError
from tests.conftest import runnable
from tests.helpers import make_model, write_signed_artifact

# -- 2. integer division-like ops at their edges: never SIGFPE ----------------------------------------

INTEGER_EDGES = [(np.int32, TensorProto.INT32), (np.int64, TensorProto.INT64)]


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype,code", INTEGER_EDGES, ids=["int32", "int64"])
def test_integer_mod_of_the_most_negative_value_by_minus_one_or_zero_is_zero(target, dtype, code, fmod):
    model = make_model(
        [helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
        [("a", code, [6]), ("b", code, [6])],
        [("y", code, [6])],
    )
    low = np.iinfo(dtype).min
    a = np.array([low, low, 7, -7, low + 1, 9], dtype)
    b = np.array([-1, 0, 0, -1, -1, -4], dtype)
    got = kiln.compile(model, target=target).run({"a": a, "b": b})["y"]
    want = kiln.compile(model, target="reference").run({"a": a, "b": b})["y"]
    np.testing.assert_array_equal(got, want)
    assert list(got[:5]) == [0, 0, 0, 0, 0]


def test_the_kernel_ir_defines_integer_division_by_zero_and_minus_one():
    from kiln.lower.kir_interpreter import BINARY

    assert BINARY["/"](7, 0) == 0 and BINARY["%"](7, 0) == 0
    assert BINARY["%"](-(2**63), -1) == 0
    assert BINARY["/"](-7, 2) == -3 and BINARY["%"](-7, 2) == -1


# -- 3. the cache's trust boundary ----------------------------------------------------------------------


def relu_model():
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, [4])]
    )


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A fresh cache root and key file, every plan stored, warnings of earlier tests forgotten."""
    import kiln.driver.variants as native
    from kiln import integrity
    from kiln.driver import plan_cache

    plan_cache.wait()
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_KEY_FILE", str(tmp_path / "config" / "cache.key"))
    monkeypatch.setenv("KILN_PLAN_CACHE", "1")
    monkeypatch.setattr(native, "WORTH_CACHING_S", 0.0)
    monkeypatch.setattr(integrity, "_key", None)
    monkeypatch.setattr(integrity, "_warned", set())
    yield tmp_path
    plan_cache.wait()


def compile_and_run(**kwargs):
    """Compile and run the Relu model; returns the warnings kiln gave."""
    from kiln.driver import plan_cache

    x = np.array([-1, 2, -3, 4], np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = kiln.compile(relu_model(), **kwargs).run({"x": x})["y"]
        plan_cache.wait()
    np.testing.assert_array_equal(got, np.maximum(x, 0))
    return [str(w.message) for w in caught if "kiln" in str(w.message)]


def _plant_key(kind, path):
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if kind == "readable by others":
        path.write_bytes(os.urandom(32))
        path.chmod(0o644)
    elif kind == "empty":
        path.write_bytes(b"")
        path.chmod(0o600)
    elif kind == "a folder":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path, 0o600)
    elif kind == "a link to /dev/zero":
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("caching", ["1", "0"])
@pytest.mark.parametrize("kind", ["readable by others", "empty", "a folder", "a FIFO", "a link to /dev/zero"])
def test_a_key_kiln_cannot_trust_turns_caching_off_with_one_warning_and_never_fails_or_hangs(
    private_cache, monkeypatch, kind, caching
):
    _plant_key(kind, private_cache / "config" / "cache.key")
    monkeypatch.setenv("KILN_PLAN_CACHE", caching)
    said = compile_and_run()
    assert len(said) == 1 and "cache off" in said[0], said
    assert compile_and_run() == []  # once per process


def test_dev_zero_as_the_key_is_refused_without_reading_it(private_cache, monkeypatch):
    monkeypatch.setenv("KILN_KEY_FILE", "/dev/zero")
    said = compile_and_run()
    assert "not a regular file" in said[0]


def test_a_cache_folder_others_can_write_is_not_used_and_its_linked_plans_folder_is_never_followed(
    private_cache, monkeypatch
):
    victim = private_cache / "someone-elses"
    victim.mkdir()
    (victim / "precious.txt").write_text("mine")
    entry_like = victim / ("a" * 32)  # named like a cache entry: eviction must still not touch it
    entry_like.mkdir()
    (entry_like / "data").write_bytes(b"1" * 100_000)
    cache = private_cache / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    (cache / "plans").symlink_to(victim)
    monkeypatch.setenv("KILN_PLAN_CACHE_GB", "0")  # every store would evict everything it may
    said = compile_and_run()
    assert len(said) == 1 and "writable by other users" in said[0]
    assert sorted(p.name for p in victim.iterdir()) == ["a" * 32, "precious.txt"]
    assert (entry_like / "data").stat().st_size == 100_000


def test_a_linked_level_inside_an_own_cache_folder_is_refused_and_nothing_is_deleted_through_it(
    private_cache, monkeypatch
):
    victim = private_cache / "someone-elses"
    (victim / ("b" * 32)).mkdir(parents=True)
    cache = private_cache / "cache"
    cache.mkdir(mode=0o700)
    (cache / "plans").symlink_to(victim)
    monkeypatch.setenv("KILN_PLAN_CACHE_GB", "0")
    said = compile_and_run()
    assert "symbolic link" in said[0]
    assert (victim / ("b" * 32)).is_dir()


def test_eviction_removes_only_entries_kiln_made(private_cache, monkeypatch):
    from kiln.driver import plan_cache

    compile_and_run()
    plans = private_cache / "cache" / "plans"
    (plans / "notes.txt").write_text("the user's")
    (plans / "not-an-entry").mkdir()
    outside = private_cache / "outside"
    (outside / "d").mkdir(parents=True)
    (plans / ("e" * 32)).symlink_to(outside)
    monkeypatch.setenv("KILN_PLAN_CACHE_GB", "0")
    plan_cache.evict()
    assert (plans / "notes.txt").exists() and (plans / "not-an-entry").is_dir() and (outside / "d").is_dir()
    assert not any(plan_cache.is_entry(p) for p in plans.iterdir())  # kiln's own entries went


def test_a_file_where_the_cache_folder_belongs_turns_caching_off(private_cache, monkeypatch):
    (private_cache / "cache").write_text("not a folder")
    said = compile_and_run()
    assert len(said) == 1 and "not a folder" in said[0]


def test_compiles_survive_another_process_deleting_the_cache_under_them(private_cache):
    import shutil
    import threading

    stop = threading.Event()
    cache = private_cache / "cache"

    def clean() -> None:
        while not stop.is_set():
            for part in ("plans", "lib"):
                shutil.rmtree(cache / part, ignore_errors=True)

    cleaner = threading.Thread(target=clean)
    cleaner.start()
    try:
        for size in range(2, 7):
            model = make_model(
                [helper.make_node("Relu", ["x"], ["y"])],
                [("x", TensorProto.FLOAT, [size])],
                [("y", TensorProto.FLOAT, [size])],
            )
            x = np.linspace(-1, 1, size, dtype=np.float32)
            np.testing.assert_array_equal(kiln.compile(model).run({"x": x})["y"], np.maximum(x, 0))
    finally:
        stop.set()
        cleaner.join()


# -- 4. artifacts that lie (re-signed: the manifest detects damage, not malice) ---------------------------


def _symbolic_model():
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 1000  # big enough to be stored as .npy
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, ["batch", 64])],
        [("y", TensorProto.FLOAT, ["batch", 32])],
        {"w": w},
    )


@pytest.fixture(scope="module")
def saved_artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("artifact") / "model.kiln"
    kiln.compile(_symbolic_model(), dims={"batch": 2}).save(path)
    return path


def forge(source, destination, change):
    """The artifact at ``source`` with its members changed by ``change(members)`` and its manifest
    signed again, as an attacker who knows the format would."""
    import zipfile

    with zipfile.ZipFile(source) as archive:
        members = {name: archive.read(name) for name in archive.namelist() if name != "manifest.json"}
    change(members)
    write_signed_artifact(members, destination)
    return destination


def _meta(change):
    import json

    def edit(members):
        meta = json.loads(members["meta.json"])
        change(meta)
        members["meta.json"] = json.dumps(meta).encode()

    return edit


def _weight(array):
    import io

    def edit(members):
        buffer = io.BytesIO()
        np.savez(buffer, t0=array)
        members["tensors.npz"] = buffer.getvalue()

    return edit


def _huge_npy_header(members):
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as npz:
        npz.writestr("t0.npy", header.getvalue() + b"\0" * 48)
    members["tensors.npz"] = buffer.getvalue()


def _deep_json(members):
    members["meta.json"] = b"[" * 200_000 + b"]" * 200_000


def _inflating_member(members):
    members["strings.json"] = b"{" + b" " * (200 << 20) + b"}"  # 200 MB of JSON that deflates ~1000:1


LIES = {
    "meta.json nested 200,000 deep": (_deep_json, "nests deeper"),
    "a member inflating 1000:1 to 200 MB": (_inflating_member, "inflate"),
    "a negative variant dim": (_meta(lambda m: m.update(variants=[{"batch": -5}])), "batch=-5"),
    "a text variant dim": (_meta(lambda m: m.update(variants=[{"batch": "3"}])), "batch=3"),
    "a fractional variant dim": (_meta(lambda m: m.update(variants=[{"batch": 2.5}])), "batch=2.5"),
    "a boolean variant dim": (_meta(lambda m: m.update(variants=[{"batch": True}])), "batch=True"),
    "a variant of an unknown dim": (_meta(lambda m: m.update(variants=[{"height": 3}])), "symbolic dims"),
    "10,000 variants": (_meta(lambda m: m.update(variants=[{"batch": i} for i in range(10_000)])), "variants listed"),
    "variants not a list": (_meta(lambda m: m.update(variants={"batch": 1})), "not a list"),
    "tensor names not a list": (_meta(lambda m: m.update(tensor_names="w")), "tensor_names"),
    "a float16 weight for an f32 one": (_weight(np.zeros((64, 32), np.float16)), "declares"),
    "an int32 view of an f32 weight": (_weight(np.zeros((64, 32), np.float32).view(np.int32)), "declares"),
    "a short weight": (_weight(np.zeros((64, 31), np.float32)), "declares"),
    "a transposed weight": (_weight(np.zeros((32, 64), np.float32)), "declares"),
    "an .npy header claiming 2**40 elements": (_huge_npy_header, "claims"),
}


@pytest.mark.parametrize("lie", list(LIES))
def test_an_artifact_that_lies_is_an_artifact_error_naming_the_field_before_anything_is_allocated(
    lie, saved_artifact, tmp_path
):
    import resource

    from kiln.driver.artifact import ArtifactError

    change, named = LIES[lie]
    forged = forge(saved_artifact, tmp_path / "forged.kiln", change)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ArtifactError, match=named.replace("*", r"\*")):
        kiln.load(forged)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 400, f"loading the forged artifact grew the process by {grown_mb:.0f} MB"


def test_the_unforged_artifact_still_loads_and_runs(saved_artifact, tmp_path):
    forged = forge(saved_artifact, tmp_path / "resigned.kiln", lambda members: None)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(kiln.load(forged).run({"x": x})["y"], kiln.compile(_symbolic_model()).run({"x": x})["y"])


# -- 5. arguments and run-time values: a user's mistake is a named error, never "kiln bug" --------------


@pytest.mark.parametrize(
    "arguments",
    [
        {"dims": {"batch": -1}},
        {"dims": {"batch": "3"}},
        {"dims": {"batch": 2.5}},
        {"dims": {"batch": True}},
        {"dims": {"batch": 2**40}},
        {"dims": {"not_a_dim": 2}},
        {"dims": [("batch", 2)]},
        {"threads": -3},
        {"threads": 2.0},
        {"streams": 0},
        {"streams": -1},
        {"spin": -1},
        {"spin": "fast"},
    ],
    ids=repr,
)
def test_arguments_out_of_their_domain_are_argument_errors_naming_them(arguments):
    from kiln.errors import ArgumentError

    with pytest.raises(ArgumentError, match=next(iter(arguments)) if "dims" not in arguments else "dims"):
        kiln.compile(_symbolic_model(), **arguments)


def _run_time_value_models():
    x = np.ones((2, 5), np.float32)
    topk = make_model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"])],
        [("x", TensorProto.FLOAT, [2, 5]), ("k", TensorProto.INT64, [1])],
        [("v", TensorProto.FLOAT, None), ("i", TensorProto.INT64, None)],
    )
    pad = make_model(
        [helper.make_node("Pad", ["x", "p"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 5]), ("p", TensorProto.INT64, [4])],
        [("y", TensorProto.FLOAT, None)],
    )
    one_hot = make_model(
        [helper.make_node("OneHot", ["i", "d", "v"], ["y"])],
        [("i", TensorProto.INT64, [3]), ("d", TensorProto.INT64, [1]), ("v", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, None)],
    )
    values = np.array([0, 1], np.float32)
    return {
        "TopK k=-1": (topk, {"x": x, "k": np.array([-1])}, "k=-1"),
        "TopK k past its axis": (topk, {"x": x, "k": np.array([7])}, "k=7"),
        "Pad removing more than an axis holds": (pad, {"x": x, "p": np.array([0, -3, 0, -3])}, "negative dim"),
        "OneHot with a negative depth": (
            one_hot,
            {"i": np.array([0, 1, 2]), "d": np.array([-3]), "v": values},
            "depth",
        ),
    }


@pytest.mark.parametrize("case", list(_run_time_value_models()))
@pytest.mark.parametrize("where", ["cpu", "reference"])
def test_run_time_values_that_make_no_valid_shape_are_named_errors_on_every_path(case, where):
    from kiln.errors import InternalError

    model, feeds, named = _run_time_value_models()[case]
    compiled = kiln.compile(model, target=where)
    with pytest.raises(KilnError, match=named) as raised:
        compiled.run(feeds)
    assert not isinstance(raised.value, InternalError)


def test_an_npy_input_whose_header_claims_2_to_the_40_elements_is_exit_2_not_kiln_bug(tmp_path):
    import subprocess

    header = tmp_path / "huge.npy"
    with open(header, "wb") as out:
        np.lib.format.write_array_header_1_0(out, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
        out.write(b"\0" * 64)
    model = tmp_path / "m.onnx"
    model.write_bytes(relu_model().SerializeToString())
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "run", str(model), "--input", f"x={header}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "claims" in result.stderr and "kiln bug" not in result.stderr


# -- 6. files that are not files -------------------------------------------------------------------------


def test_compiling_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    from kiln.errors import ModelLoadError

    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        with pytest.raises(ModelLoadError, match="not a regular file"):
            kiln.compile(str(path))


def test_an_external_data_file_replaced_by_a_fifo_after_a_cached_compile_is_refused(private_cache):
    import onnx

    w = np.ones((64, 64), np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, [1, 64])],
        [("y", TensorProto.FLOAT, [1, 64])],
        {"w": w},
    )
    path = private_cache / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    kiln.compile(str(path)).run({"x": np.ones((1, 64), np.float32)})
    from kiln.driver import plan_cache

    plan_cache.wait()
    (private_cache / "weights.bin").unlink()
    os.mkfifo(private_cache / "weights.bin")
    with pytest.raises(KilnError, match="FIFO"):
        kiln.compile(str(path))


def _not_a_file(kind, path):
    """A FIFO, a folder, or a character device like /dev/null at ``path`` (a private one: a kiln
    that got this wrong must not replace the machine's /dev/null while the test finds out)."""
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a folder":
        path.mkdir()
    else:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
        except PermissionError:
            pytest.skip("making a device node needs root (the FIFO and folder cases test the same check)")
    return path


@pytest.mark.parametrize("where", ["a device", "a FIFO", "a folder"])
def test_saving_an_artifact_over_something_that_is_not_a_regular_file_is_refused(tmp_path, where):
    from kiln.driver.artifact import ArtifactError

    target = _not_a_file(where, tmp_path / "out.kiln")
    before = os.stat(target)
    with pytest.raises(ArtifactError, match="regular file"):
        kiln.compile(relu_model()).save(target)
    after = os.stat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert not list(tmp_path.glob("*.partial"))


def test_the_cli_refuses_o_at_a_device_with_exit_2(tmp_path):
    import subprocess

    model = tmp_path / "m.onnx"
    model.write_bytes(relu_model().SerializeToString())
    device = _not_a_file("a device", tmp_path / "null")
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "compile", str(model), "-o", str(device)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "regular file" in result.stderr
    assert stat.S_ISCHR(os.stat(device).st_mode)


# -- 7. native code records the CPU extensions it may use -------------------------------------------------


def test_native_code_is_keyed_by_the_cpus_extensions():
    from kiln.backends.cpu import features, host

    assert host().features == features.isa_features() and host().features
    assert "features=" in repr(host())


@pytest.fixture
def artifact_for_a_richer_cpu(tmp_path, monkeypatch):
    """(a native artifact built here, the extension this process then pretends its CPU lacks)."""
    from kiln.backends.cpu import features, host

    runnable("cpu")
    path = tmp_path / "native.kiln"
    kiln.compile(_symbolic_model(), dims={"batch": 2}).save(path)
    lacking = next(f for f in host().features if f not in ("avx2", "avx512f", "sse", "sse2"))
    reduced = features.cpu_flags() - {lacking}
    monkeypatch.setattr(features, "cpu_flags", lambda: reduced)
    return path, lacking


def test_an_artifact_built_for_a_cpu_with_an_extension_this_one_lacks_is_rebuilt_not_run(
    artifact_for_a_richer_cpu, caplog
):
    path, lacking = artifact_for_a_richer_cpu
    with caplog.at_level("WARNING", logger="kiln"):
        model = kiln.load(path)
    assert lacking in caplog.text and "again" in caplog.text
    assert not model.compilation.prebuilt  # none of the artifact's libraries was loaded
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(
        model.run({"x": x})["y"], kiln.compile(_symbolic_model(), target="reference").run({"x": x})["y"], rtol=1e-5
    )


def test_without_a_compiler_such_an_artifact_is_refused_naming_the_missing_extension(
    artifact_for_a_richer_cpu, monkeypatch
):
    from kiln.backends import backend
    from kiln.driver.artifact import ArtifactError

    path, lacking = artifact_for_a_richer_cpu
    monkeypatch.setattr(type(backend("cpu")), "available", lambda self: "no C compiler found")
    with pytest.raises(ArtifactError, match=lacking):
        kiln.load(path)


def test_a_fifo_named_like_an_image_in_a_dataset_folder_is_a_named_error(tmp_path):
    from kiln.bench.dataset import load_image_folder

    (tmp_path / "cats").mkdir()
    os.mkfifo(tmp_path / "cats" / "a.png")
    with pytest.raises(KilnError, match="FIFO"):
        load_image_folder(tmp_path, 8)


def test_kiln_debug_without_the_sanitizer_runtime_is_a_named_error_not_a_dead_process(tmp_path):
    import subprocess

    model = tmp_path / "m.onnx"
    model.write_bytes(relu_model().SerializeToString())
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(KILN_DEBUG="1", KILN_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "run", str(model)], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "LD_PRELOAD" in result.stderr
