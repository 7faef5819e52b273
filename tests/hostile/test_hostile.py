"""A hostile corpus: model files and caches written by someone else, probed as an attacker and as a
careless user would. Each case failed before kiln guarded against it (issue 12): it must now give
the right answer or a clear KilnError, never run foreign code, crash or hang."""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import kiln
import kiln.driver.variants as native
from kiln import integrity
from kiln.backends.cpu import toolchain
from kiln.driver import plan_cache
from kiln.driver.artifact import ArtifactError
from kiln.errors import KilnError, ShapeInferenceError
from tests.helpers import FLOAT, INT64, make_model

RNG = np.random.default_rng(12)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder with every plan stored (small models too)."""
    plan_cache.wait()
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_PLAN_CACHE", "1")
    monkeypatch.setattr(native, "WORTH_CACHING_S", 0.0)
    for key in plan_cache.STATS:
        monkeypatch.setitem(plan_cache.STATS, key, 0)
    yield tmp_path
    plan_cache.wait()


def same_as_reference(model, feeds, **kwargs):
    compiled = kiln.compile(model, **kwargs)
    got = compiled.run(feeds)
    expected = kiln.compile(model, target="reference").run(feeds)
    for name, value in expected.items():
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)
    return compiled


# -- 1. names never reach generated code as text ------------------------------------------------------

ATTACKS = [
    "*/ __attribute__((constructor)) static void pwn(void) { __builtin_trap(); } /*",
    "*/",
    '"; system("touch pwned"); "',
    "back\\slash\\",
    "new\nline\r\n#define float int",
    "#include </etc/passwd>",
    "ünïcødé ✓ 名前 🔥",
    "x" * 10_000,
]


@pytest.mark.parametrize("attack", ATTACKS, ids=range(len(ATTACKS)))
def test_names_with_c_syntax_compile_as_data(attack, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a `touch pwned` would land
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")  # names never change the plan: a cached one would skip codegen
    w = RNG.standard_normal((4, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["in" + attack, "w" + attack], ["mm" + attack], name=attack),
        helper.make_node("Relu", ["mm" + attack], ["r" + attack], name="relu" + attack),
        helper.make_node("Add", ["r" + attack, "in" + attack], ["out" + attack], name="add" + attack),
    ]
    model = make_model(nodes, [("in" + attack, FLOAT, [2, 4])], [("out" + attack, FLOAT, [2, 4])], {"w" + attack: w})
    model.graph.name = attack
    compiled = same_as_reference(model, {"in" + attack: RNG.standard_normal((2, 4)).astype(np.float32)})
    (plan,) = compiled.plans
    for fragment in ("pwn", "system", "passwd", "#define float", "ünïcødé", "x" * 100):
        if fragment in attack:
            assert fragment not in plan.source
    assert not (tmp_path / "pwned").exists()


# -- 2. loading a file runs no code the user did not choose to trust ----------------------------------


class Payload:
    """Unpickling this runs code: it creates a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def mlp(batch="batch", width=8):
    w = RNG.standard_normal((width, width)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return make_model(nodes, [("x", FLOAT, [batch, width])], [("y", FLOAT, None)], {"w": w})


def rewrite_member(path: Path, name: str, content: bytes, out: Path, fix_manifest: bool = True) -> Path:
    """``path`` with one member replaced (and, if asked, the manifest updated to match)."""
    import hashlib

    with zipfile.ZipFile(path) as source:
        members = {item: source.read(item) for item in source.namelist()}
    members[name] = content
    if fix_manifest:
        manifest = json.loads(members["manifest.json"])
        manifest["sha256"][name] = hashlib.sha256(content).hexdigest()
        members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(out, "w") as target:
        for item, data in members.items():
            target.writestr(item, data)
    return out


def test_an_artifact_with_a_pickle_payload_is_refused_without_running_it(tmp_path):
    saved = kiln.compile(mlp(), dims={"batch": 2}).save(tmp_path / "m.kiln")
    marker = tmp_path / "ran"
    payload = np.empty(1, dtype=object)
    payload[0] = Payload(marker)
    tensors = io.BytesIO()
    np.savez(tensors, t0=payload)  # an object array: pickled inside the .npy
    evil = rewrite_member(saved, "tensors.npz", tensors.getvalue(), tmp_path / "evil.kiln")
    with pytest.raises(ArtifactError, match="damaged artifact"):
        kiln.load(evil)
    assert not marker.exists()


def test_damaged_or_extended_artifacts_are_refused_before_use(tmp_path):
    saved = kiln.compile(mlp(), dims={"batch": 2}).save(tmp_path / "m.kiln")
    with zipfile.ZipFile(saved) as archive:
        library = next(n for n in archive.namelist() if n.startswith("build/"))
        content = bytearray(archive.read(library))
    content[len(content) // 2] ^= 0xFF
    flipped = rewrite_member(saved, library, bytes(content), tmp_path / "flipped.kiln", fix_manifest=False)
    with pytest.raises(ArtifactError, match="does not match its SHA-256"):
        kiln.load(flipped)
    extra = rewrite_member(saved, "build/extra/0.so", b"\x7fELF", tmp_path / "extra.kiln", fix_manifest=False)
    with pytest.raises(ArtifactError, match="not in its manifest"):
        kiln.load(extra)
    data = saved.read_bytes()
    (tmp_path / "cut.kiln").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError):
        kiln.load(tmp_path / "cut.kiln")


def test_rebuild_ignores_the_artifacts_native_code(tmp_path):
    compiled = kiln.compile(mlp(), dims={"batch": 2})
    saved = compiled.save(tmp_path / "m.kiln")
    with zipfile.ZipFile(saved) as archive:
        library = next(n for n in archive.namelist() if n.startswith("build/"))
    # a library that would crash the process if loaded, with a manifest that vouches for it
    planted = rewrite_member(saved, library, b"\x7fELF garbage", tmp_path / "planted.kiln")
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    rebuilt = kiln.load(planted, rebuild=True)
    np.testing.assert_array_equal(rebuilt(x), compiled(x))


def test_string_tensors_round_trip_without_pickle(tmp_path):
    words = np.array([f"word {i} ✓" for i in range(300)], dtype=object).reshape(30, 10)
    from onnx import numpy_helper

    model = make_model([helper.make_node("Identity", ["s"], ["y"])], [], [("y", 8, [30, 10])])
    model.graph.initializer.append(numpy_helper.from_array(words, "s"))
    compiled = kiln.compile(model, target="reference")
    loaded = kiln.load(compiled.save(tmp_path / "s.kiln"))
    assert loaded.run({})["y"].tolist() == words.tolist()


def entry_files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in (root / "cache" / "plans").rglob(pattern) if p.is_file())


def test_a_planted_plan_pickle_never_runs(cache):
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    model = mlp()
    expected = kiln.compile(model, dims={"batch": 2})(x)
    plan_cache.wait()
    marker = cache / "ran"
    (planted,) = entry_files(cache, "plan.pkl")
    planted.write_bytes(pickle.dumps(Payload(marker)))
    again = kiln.compile(model, dims={"batch": 2})
    np.testing.assert_array_equal(again(x), expected)
    assert not marker.exists()
    assert plan_cache.STATS["damaged"] == 1


def test_even_a_sealed_pickle_can_only_build_kilns_own_data(cache):
    marker = cache / "ran"
    with pytest.raises(pickle.UnpicklingError, match="kiln never stores"):
        integrity.safe_loads(pickle.dumps(Payload(marker)))
    assert not marker.exists()


def test_flipped_weights_in_the_plan_cache_are_rebuilt_not_used(cache):
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    model = mlp(width=64)  # weights large enough to be blobs beside the pickle
    expected = kiln.compile(model, dims={"batch": 2})(x)
    plan_cache.wait()
    blobs = entry_files(cache, "blobs/*")
    assert blobs
    for blob in blobs:
        data = bytearray(blob.read_bytes())
        data[7] ^= 0x40
        blob.write_bytes(bytes(data))
    np.testing.assert_array_equal(kiln.compile(model, dims={"batch": 2})(x), expected)
    assert plan_cache.STATS["damaged"] == 1


def test_a_damaged_cached_source_graph_is_not_used_for_a_new_batch_size(cache):
    import onnx

    path = cache / "m.onnx"
    onnx.save(mlp(width=64), path)
    kiln.compile(str(path))(RNG.standard_normal((2, 64)).astype(np.float32))
    plan_cache.wait()
    assert entry_files(cache, "source/graph.pkl")  # the imported graph is cached for the file
    for blob in entry_files(cache, "blobs/*"):
        data = bytearray(blob.read_bytes())
        data[-5] ^= 0x08
        blob.write_bytes(bytes(data))
    x = RNG.standard_normal((3, 64)).astype(np.float32)  # a binding never compiled: built from the source
    np.testing.assert_allclose(
        kiln.compile(str(path))(x), kiln.compile(str(path), target="reference")(x), rtol=1e-5, atol=1e-5
    )
    assert plan_cache.STATS["damaged"] >= 1


def test_a_full_disk_while_building_is_a_resource_error_and_leaves_no_partial_files(cache, monkeypatch):
    import subprocess

    from kiln.errors import ResourceError

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")

    def full_disk(command, **kwargs):
        output = command[command.index("-o") + 1]
        open(output, "wb").close()  # what a compiler leaves when the disk fills
        return subprocess.CompletedProcess(
            command, 1, "", "fatal error: error writing to /tmp/cc.s: No space left on device"
        )

    monkeypatch.setattr(toolchain.subprocess, "run", full_disk)
    with pytest.raises(ResourceError, match="no space left"):
        kiln.compile(mlp(2))
    assert not [p for p in (cache / "cache" / "lib").iterdir() if p.suffix in (".c", ".so")]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_cached_library_is_rebuilt_not_loaded(cache, monkeypatch, damage):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")  # the C library cache alone
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    model = mlp(2)
    expected = kiln.compile(model)(x)
    (library,) = sorted((cache / "cache" / "lib").glob("*.so"))
    data = library.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 3]
    else:
        flipped = bytearray(data)
        for offset in range(64, len(flipped), 997):
            flipped[offset] ^= 0xFF
        data = bytes(flipped)
    # damaged at rest (a new file in its place: this process still has the old one mapped, and
    # truncating a mapped library under a running process is SIGBUS for any program)
    (cache / "damaged").write_bytes(data)
    os.replace(cache / "damaged", library)
    before = toolchain.DAMAGED["libraries"]
    np.testing.assert_array_equal(kiln.compile(model)(x), expected)
    assert toolchain.DAMAGED["libraries"] == before + 1


def test_an_unwritable_cache_folder_turns_caching_off_with_a_warning(tmp_path, monkeypatch):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        blocked = tmp_path / "file-not-folder"  # root writes anywhere: block with a file instead
        blocked.write_text("")
        monkeypatch.setenv("KILN_CACHE_DIR", str(blocked / "cache"))
    else:
        blocked = tmp_path / "ro"
        blocked.mkdir(mode=0o500)
        monkeypatch.setenv("KILN_CACHE_DIR", str(blocked))
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    model = mlp(2)
    with pytest.warns(RuntimeWarning, match="cache off"):
        compiled = kiln.compile(model)
    np.testing.assert_allclose(compiled(x), kiln.compile(model, target="reference")(x), rtol=1e-5)


# -- 3. code size linear in the graph; nothing recursive over graph depth -----------------------------


def chain(ops: list[str], length: int, dtype=FLOAT):
    nodes, previous = [], "x"
    for i in range(length):
        op = ops[i % len(ops)]
        inputs = [previous, "x"] if op == "Add" else [previous]
        nodes.append(helper.make_node(op, inputs, [f"v{i}"]))
        previous = f"v{i}"
    return make_model(nodes, [("x", dtype, [64])], [(previous, dtype, [64])])


def test_a_10000_node_activation_chain_compiles_to_linear_code():
    ops = ["Neg", "Relu", "LeakyRelu", "HardSigmoid", "Clip", "Tanh"]
    x = np.linspace(-3, 3, 64).astype(np.float32)
    compiled = same_as_reference(chain(ops, 10_000), {"x": x})
    (plan,) = compiled.plans
    assert len(plan.source) < 100 * 10_000  # each select's operand once: was 2^n


def test_a_deep_chain_of_unfused_kernels_compiles():
    x = np.arange(64, dtype=np.int64)
    same_as_reference(chain(["Add"], 3000, INT64), {"x": x})


# -- 4. zero-size dims on every kernel path -------------------------------------------------------------


def zero_size_cases():
    f = lambda *s: RNG.standard_normal(s).astype(np.float32)  # noqa: E731
    yield (
        "winograd conv",
        make_model(
            [
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"]),
            ],
            [("x", FLOAT, ["N", 16, 14, 14])],
            [("y", FLOAT, None)],
            {"w": f(32, 16, 3, 3), "b": f(32)},
        ),
        {"x": f(0, 16, 14, 14)},
    )
    yield (
        "1x1 strided conv",
        make_model(
            [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2])],
            [("x", FLOAT, ["N", 16, 14, 14])],
            [("y", FLOAT, None)],
            {"w": f(32, 16, 1, 1)},
        ),
        {"x": f(0, 16, 14, 14)},
    )
    yield (
        "depthwise conv",
        make_model(
            [helper.make_node("Conv", ["x", "w"], ["y"], group=16, pads=[1, 1, 1, 1])],
            [("x", FLOAT, ["N", 16, 14, 14])],
            [("y", FLOAT, None)],
            {"w": f(16, 1, 3, 3)},
        ),
        {"x": f(0, 16, 14, 14)},
    )
    yield (
        "pooling",
        make_model(
            [
                helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
                helper.make_node("GlobalAveragePool", ["p"], ["y"]),
            ],
            [("x", FLOAT, ["N", 4, 9, 9])],
            [("y", FLOAT, None)],
        ),
        {"x": f(0, 4, 9, 9)},
    )
    yield (
        "matmul epilogue",
        make_model(
            [
                helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Add", ["h", "b"], ["g"]),
                helper.make_node("Tanh", ["g"], ["y"]),
            ],
            [("x", FLOAT, ["N", 64])],
            [("y", FLOAT, None)],
            {"w": f(64, 96), "b": f(96)},
        ),
        {"x": f(0, 64)},
    )
    attention = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    model = make_model(
        attention,
        [("q", FLOAT, ["B", 4, "L", 16]), ("kt", FLOAT, ["B", 4, 16, "L"]), ("v", FLOAT, ["B", 4, "L", 16])],
        [("y", FLOAT, None)],
        {"scale": np.array(0.25, np.float32)},
    )
    yield "attention, batch 0", model, {"q": f(0, 4, 8, 16), "kt": f(0, 4, 16, 8), "v": f(0, 4, 8, 16)}
    yield "attention, sequence 0", model, {"q": f(2, 4, 0, 16), "kt": f(2, 4, 16, 0), "v": f(2, 4, 0, 16)}
    yield (
        "layernorm",
        make_model(
            [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
            [("x", FLOAT, ["N", 8, 32])],
            [("y", FLOAT, None)],
            {"g": f(32), "b": f(32)},
        ),
        {"x": f(0, 8, 32)},
    )
    yield (
        "softmax",
        make_model(
            [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", FLOAT, ["N", 5])], [("y", FLOAT, None)]
        ),
        {"x": f(0, 5)},
    )
    yield (
        "reduction over an empty axis",
        make_model(
            [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
            [("x", FLOAT, [4, "N"])],
            [("y", FLOAT, None)],
            {"axes": np.array([1], np.int64)},
        ),
        {"x": f(4, 0)},
    )
    yield (
        "gather",
        make_model(
            [helper.make_node("Gather", ["w", "i"], ["y"])],
            [("i", INT64, ["N"])],
            [("y", FLOAT, None)],
            {"w": f(10, 4)},
        ),
        {"i": np.zeros(0, np.int64)},
    )


@pytest.mark.parametrize("name,model,feeds", list(zero_size_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_zero_size_dims_work_on_every_kernel_path(name, model, feeds):
    same_as_reference(model, feeds)


def test_an_ambiguous_reshape_of_an_empty_tensor_is_the_users_error_not_kiln_bug():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"]),
        helper.make_node("Concat", ["n", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", FLOAT, ["N", 6])],
        [("y", FLOAT, None)],
        {"zero": np.array([0], np.int64), "rest": np.array([-1, 3], np.int64)},
    )
    compiled = kiln.compile(model)
    assert compiled.run({"x": np.ones((2, 6), np.float32)})["y"].shape == (2, 2, 3)
    with pytest.raises(ShapeInferenceError, match="-1 is ambiguous"):
        compiled.run({"x": np.ones((0, 6), np.float32)})


# -- 5. specializations share weights; variants are bounded -------------------------------------------


def big_mlp():
    w1 = (RNG.standard_normal((256, 1024)) * 0.05).astype(np.float32)
    w2 = (RNG.standard_normal((1024, 256)) * 0.05).astype(np.float32)  # 2 MB of weights
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    return make_model(nodes, [("x", FLOAT, ["batch", 256])], [("y", FLOAT, None)], {"w1": w1, "w2": w2})


def distinct_weights(compiled) -> int:
    return sum({id(a): a.nbytes for plan in compiled.plans for a in plan.constants.values()}.values())


def test_every_batch_size_shares_one_copy_of_the_weights_and_variants_are_bounded(cache, monkeypatch):
    monkeypatch.setenv("KILN_MAX_VARIANTS", "6")
    monkeypatch.setenv("KILN_DISABLE", "size-classes")  # each size its own variant (the MLP's batch is sample-parallel)
    model = big_mlp()
    compiled = kiln.compile(model)
    compiled(RNG.standard_normal((1, 256)).astype(np.float32))
    one = distinct_weights(compiled)
    reference = kiln.compile(model, target="reference")
    for batch in range(2, 65):
        x = RNG.standard_normal((batch, 256)).astype(np.float32)
        if batch % 9 == 0:
            np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)
        else:
            compiled(x)
    plan_cache.wait()
    assert len(compiled.plans) == 6 and compiled.evicted == 63 - 6 + 1
    assert distinct_weights(compiled) == one  # six variants, one copy
    # the cache stores each weight once for all 64 batch sizes (was once per batch size)
    stored = sum(p.stat().st_size for p in entry_files(cache, "blobs/*"))
    weights = sum(a.nbytes for a in compiled.graph.constants.values())
    assert stored < 3 * weights
    # and a new process's variants from the cache share their mapped weights too
    again = kiln.compile(model)
    for batch in (3, 4, 5):
        again(RNG.standard_normal((batch, 256)).astype(np.float32))
    assert distinct_weights(again) == one


# -- 6. every failure is a KilnError in the user's language --------------------------------------------


def test_run_time_domain_errors_name_the_node_on_every_target():
    from kiln.errors import ExecutionError

    model = make_model(
        [helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")], [("s", INT64, [2])], [("y", FLOAT, None)]
    )
    for target in ("cpu", "reference"):
        with pytest.raises(ExecutionError, match="'fill'.*negative dim"):
            kiln.compile(model, target=target).run({"s": np.array([2, -3])})
    ranged = make_model(
        [helper.make_node("Range", ["a", "b", "d"], ["y"], name="steps")],
        [("a", INT64, []), ("b", INT64, []), ("d", INT64, [])],
        [("y", INT64, None)],
    )
    with pytest.raises(KilnError, match="steps"):
        kiln.compile(ranged, target="reference").run({"a": np.array(0), "b": np.array(5), "d": np.array(0)})


def test_out_of_memory_is_a_resource_error_naming_the_size():
    from kiln.errors import ResourceError

    model = make_model(
        [helper.make_node("Expand", ["x", "s"], ["y"])], [("x", FLOAT, [1]), ("s", INT64, [2])], [("y", FLOAT, None)]
    )
    with pytest.raises(ResourceError, match="GiB"):  # 2^36 floats: under kiln's 1 TiB limit, over this machine
        kiln.compile(model).run({"x": np.ones(1, np.float32), "s": np.array([1 << 18, 1 << 18])})


@pytest.mark.parametrize("data", [[[1.0, 2.0], [3.0]], [["a", "b"], ["c", "d"]]], ids=["ragged", "strings"])
def test_a_list_numpy_cannot_read_is_an_input_error(data):
    from kiln.errors import InputError

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2, 2])], [("y", FLOAT, None)])
    with pytest.raises(InputError, match="input 'x'"):
        kiln.compile(model).run({"x": data})


def test_the_cli_says_error_with_exit_2_for_bad_input_and_never_a_traceback(tmp_path):
    import subprocess
    import sys

    good = tmp_path / "m.onnx"
    import onnx

    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2])], [("y", FLOAT, None)]), good)
    (tmp_path / "junk.kiln").write_bytes(b"junk")
    (tmp_path / "junk.npy").write_bytes(b"junk")
    cases = [
        ["run", str(tmp_path / "junk.kiln")],
        ["run", str(tmp_path / "missing.kiln")],
        ["run", str(good), "--input", f"x={tmp_path / 'missing.npy'}"],
        ["run", str(good), "--input", f"x={tmp_path / 'junk.npy'}"],
        ["compile", str(good), "-o", str(tmp_path / "no" / "such" / "folder" / "m.kiln")],
    ]
    for arguments in cases:
        result = subprocess.run([sys.executable, "-m", "kiln.cli", *arguments], capture_output=True, text=True)
        assert result.returncode == 2, (arguments, result.stderr)
        assert "Traceback" not in result.stderr and "rror" in result.stderr, (arguments, result.stderr)


# -- 7. ONNX's rules --------------------------------------------------------------------------------


def relu_model():
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2])], [("y", FLOAT, [2])])


def test_versions_newer_than_kiln_knows_and_missing_opsets_are_refused():
    from kiln.errors import InvalidModelError, UnsupportedModelError

    model = relu_model()
    model.opset_import[0].version = 99
    with pytest.raises(UnsupportedModelError, match="opset 99"):
        kiln.compile(model)
    model = relu_model()
    model.ir_version = 99
    with pytest.raises(UnsupportedModelError, match="IR version 99"):
        kiln.compile(model)
    model = relu_model()
    del model.opset_import[:]
    with pytest.raises(InvalidModelError, match="imports no opset"):
        kiln.compile(model)


def test_duplicate_names_and_contradicting_declarations_are_refused_naming_them():
    from onnx import TensorProto, numpy_helper

    from kiln.errors import InvalidModelError

    model = relu_model()
    model.graph.input.append(helper.make_tensor_value_info("x", FLOAT, [2]))
    with pytest.raises(InvalidModelError, match="graph input name 'x' is used twice"):
        kiln.compile(model)
    model = relu_model()
    for _ in range(2):
        model.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "w"))
    with pytest.raises(InvalidModelError, match="initializer name 'w' is used twice"):
        kiln.compile(model)
    model = relu_model()
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 3
    with pytest.raises(InvalidModelError, match="graph output 'y' is declared f32\\[3\\] but is f32\\[2\\]"):
        kiln.compile(model)
    model = relu_model()
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(InvalidModelError, match="declared i64"):
        kiln.compile(model)
    model = make_model(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        [("x", FLOAT, [2]), ("b", FLOAT, [3])],
        [("y", FLOAT, [2])],
        {"b": np.ones(2, np.float32)},
    )
    with pytest.raises(InvalidModelError, match="'b' \\(an initializer\\) is declared f32\\[3\\] but is f32\\[2\\]"):
        kiln.compile(model)


@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_an_initializer_listed_as_an_input_is_a_default_a_run_may_override(target, tmp_path):
    from kiln.errors import InputError

    model = make_model(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        [("x", FLOAT, [2]), ("b", FLOAT, [2])],
        [("y", FLOAT, [2])],
        {"b": np.array([10, 20], np.float32)},
    )
    compiled = kiln.compile(model, target=target)
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], [11, 22])
    np.testing.assert_array_equal(compiled.run({"x": x, "b": np.array([100, 200], np.float32)})["y"], [101, 202])
    np.testing.assert_array_equal(compiled(x, b=np.array([0, 1], np.float32)), [1, 3])
    np.testing.assert_array_equal(compiled.submit({"x": x, "b": np.ones(2, np.float32)}).result()["y"], [2, 3])
    with pytest.raises(InputError, match="input 'b'"):
        compiled.run({"x": x, "b": np.ones(3, np.float32)})
    loaded = kiln.load(compiled.save(tmp_path / "m.kiln"))  # the defaults survive an artifact
    np.testing.assert_array_equal(loaded.run({"x": x, "b": np.zeros(2, np.float32)})["y"], x)


@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_an_output_declared_twice_comes_back_twice(target):
    model = relu_model()
    model.graph.output.append(model.graph.output[0])
    first, second = kiln.compile(model, target=target)(np.array([-1, 1], np.float32))
    np.testing.assert_array_equal(first, [0, 1])
    np.testing.assert_array_equal(second, [0, 1])


def test_submit_copies_its_inputs_so_the_caller_may_reuse_them():
    model = relu_model()
    compiled = kiln.compile(model)
    x = np.array([1, 2], np.float32)
    futures = []
    for value in range(50):
        x[:] = value
        futures.append(compiled.submit({"x": x}))
    for value, future in enumerate(futures):
        np.testing.assert_array_equal(future.result()["y"], [value, value])
