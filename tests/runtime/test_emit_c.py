"""A compiled model as a C library (``kiln compile --emit c``): C programs written against kiln.h,
built with -std=c99 -Wall -Wextra -Werror (and with AddressSanitizer and UBSan), run the model
bit for bit as the Python runtime does, and every misuse or damaged file is a status and a message."""

from __future__ import annotations

import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.driver.emit_c import emit_c
from kiln.driver.emit_c_length import length_variants
from kiln.errors import ArgumentError
from tests.runtime.test_sizes import small_cnn

CHECK = Path(__file__).parent / "c" / "capi_check.c"
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler to build the C programs")
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"]


def embedding_model() -> onnx.ModelProto:
    """Token ids (int64) through an embedding table, a product and a softmax: integer inputs."""
    rng = np.random.default_rng(3)
    table = numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.standard_normal((16, 7)).astype(np.float32), "weight")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "weight"], ["m"]),
        helper.make_node("Softmax", ["m"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, 7])],
        [table, weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build(
    folder: Path, extra: list[str] = (), sources: list[str] = (), libraries: list[str] = ("-lkiln_model",)
) -> Path:  # type: ignore[assignment]
    binary = folder / ("check" + ("-sanitized" if extra else ""))
    command = [CC, *STRICT, *extra, str(CHECK), *sources, f"-I{folder}", f"-L{folder}", *libraries,
               f"-Wl,-rpath,{folder}", "-o", str(binary)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return binary


@pytest.fixture(scope="module", params=["cnn", "embedding"])
def emitted(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"c-{request.param}")
    if request.param == "cnn":
        model, dims = kiln.compile(small_cnn()), {"batch": 2}
    else:
        model, dims = kiln.compile(embedding_model()), {}
    emit_c(model, folder, dims)
    return model, folder, build(folder)


def feeds_of(model) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    if "ids" in model.input_names:
        return {"ids": rng.integers(0, 50, (3, 5)).astype(np.int64)}
    return {"x": rng.standard_normal((2, 3, 6, 6)).astype(np.float32), "scale": np.float32([0.5])}


def run_c(
    binary: Path, folder: Path, model, feeds, tmp_path: Path, batch: int = 1, mode: str = "run", length: int = -1,
    shapes: str = "",
) -> list[np.ndarray]:  # type: ignore[no-untyped-def]  # fmt: skip
    paths = []
    for name in model.input_names:
        path = tmp_path / f"in-{name}.bin"
        np.ascontiguousarray(feeds[name]).tofile(path)
        paths.append(str(path))
    outs = [str(tmp_path / f"out-{i}.bin") for i in range(len(model.output_names))]
    result = subprocess.run(
        [str(binary), f"batch={batch}", *([f"len={length}"] if length >= 0 else []), *([f"shapes={shapes}"] if shapes else []),
         mode, str(folder / "model.kw"), *paths, *outs],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return [np.fromfile(path, np.float32) for path in outs]


def test_the_c_library_computes_what_python_does_bit_for_bit(emitted, tmp_path):
    model, folder, binary = emitted
    feeds = feeds_of(model)
    want = model.run(feeds)
    got = run_c(binary, folder, model, feeds, tmp_path)
    for name, array in zip(model.output_names, got):
        np.testing.assert_array_equal(array, np.asarray(want[name], np.float32).reshape(-1))


def test_weights_in_memory_and_a_workspace_of_the_callers_compute_the_same(emitted, tmp_path):
    """kiln_model_load_memory (the weights file's bytes in the caller's aligned memory, read in
    place) and kiln_context_create_in (a workspace the caller owns): the same outputs bit for bit;
    NULL, unaligned, truncated, too small -> statuses with messages."""
    model, folder, binary = emitted
    feeds = feeds_of(model)
    got = run_c(binary, folder, model, feeds, tmp_path, mode="memory")
    for name, array in zip(model.output_names, got):
        np.testing.assert_array_equal(array, np.asarray(model.run(feeds)[name], np.float32).reshape(-1))
    result = subprocess.run([str(binary), "memory", str(folder / "model.kw")], capture_output=True, text=True)
    assert "memory: not aligned: status 1" in result.stdout and "memory: truncated: status 2" in result.stdout
    assert "workspace: too small: status 1" in result.stdout or "workspace: no model: status 1" in result.stdout


def test_misuse_at_the_c_boundary_is_a_status_and_a_message(emitted):
    _, folder, binary = emitted
    result = subprocess.run([str(binary), "misuse", str(folder / "model.kw")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrong dims: status 4" in result.stdout and "NULL data: status 1" in result.stdout


def damaged_files(folder: Path, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    data = (folder / "model.kw").read_bytes()
    flipped = bytearray(data)
    flipped[-1] ^= 0x40
    cases = {
        "truncated": (data[: len(data) // 2], "truncated"),
        "a header only": (data[:40], "truncated"),
        "empty": (b"", "cannot map"),
        "another format": (b"PK\x03\x04" + data[4:], "not a kiln weights file"),
        "a flipped bit": (bytes(flipped), "checksum"),
        "another ABI": (data[:8] + bytes([9]) + data[9:], "ABI version"),
        "another model": (data[:40] + b"0" * 8 + data[48:], "another model"),
    }
    paths = {}
    for name, (content, reason) in cases.items():
        path = tmp_path / (name.replace(" ", "-") + ".kw")
        path.write_bytes(content)
        paths[name] = (path, reason)
    paths["a folder"] = (tmp_path, "not a regular file")
    paths["missing"] = (tmp_path / "nothing.kw", "cannot open")
    return paths


def test_damaged_or_foreign_weights_files_are_refused_with_the_reason(emitted, tmp_path):
    _, folder, binary = emitted
    for name, (path, reason) in damaged_files(folder, tmp_path).items():
        result = subprocess.run([str(binary), "load", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, (name, result.stderr)
        assert "load: status 2" in result.stdout and reason in result.stdout, (name, result.stdout)


def forged_descriptions(folder: Path, tmp_path: Path) -> dict[str, Path]:
    """model.kw with its tensors' descriptions changed and its checksum made right again (what a
    hostile file does): each lies about where a tensor lives or how large it is."""
    data = bytearray((folder / "model.kw").read_bytes())
    count, words = int.from_bytes(data[8:16], "little") >> 32, int.from_bytes(data[96:104], "little")
    start = 104 + 8 * count
    original = np.frombuffer(bytes(data[start : start + 8 * words]), np.int64).copy()
    # ranges (4), counts (3), the first plan's length, id (8), weight count and arrays, then its first
    # tensor: its name's length and words, then its code
    name_at = 4 + 3 + 1 + 8 + 1 + int(original[16])
    first = name_at + 1 + int(original[name_at]) // 8 + 1
    cases = {
        "another slot": (first + 3, lambda v: v + 1),
        "wider dtype": (first + 1, lambda v: 64 if v != 64 else 32),
        "a larger dim": (first + 6, lambda v: v + 1),
        "one more dim": (first + 2, lambda v: v + 1),
        "a huge name": (name_at, lambda v: 1 << 40),
        "an unterminated name": (name_at, lambda v: max(v - 1, 0)),
        "another plan count": (6, lambda v: v + 1),
        "a weight of another array": (17, lambda v: v + 1000),
        "another weight count": (16, lambda v: v + 1),
        "one input more": (4, lambda v: v + 1),
        "an inverted batch range": (0, lambda v: 5),
        "a length axis it lacks": (first + 5, lambda v: 1),
        "batched on a dim of many": (first + 4, lambda v: 1 - v),
        "a huge rank": (first + 2, lambda v: 1 << 20),
    }
    paths = {}
    for name, (index, change) in cases.items():
        forged = original.copy()
        forged[index] = change(int(forged[index]))
        content = bytearray(data)
        content[start : start + 8 * words] = forged.tobytes()
        content[24:32] = zlib.crc32(bytes(content[104:])).to_bytes(8, "little")
        path = tmp_path / (name.replace(" ", "-") + ".kw")
        path.write_bytes(bytes(content))
        paths[name] = path
    claims = bytearray(data)
    claims[96:104] = (words + 10_000).to_bytes(8, "little")
    claims[24:32] = zlib.crc32(bytes(claims[104:])).to_bytes(8, "little")
    paths["more words than the file"] = tmp_path / "claims.kw"
    paths["more words than the file"].write_bytes(bytes(claims))
    return paths


def test_forged_descriptions_are_refused_never_read_past_a_buffer(emitted, tmp_path):
    """The weights file's descriptions (names, dtypes, dims, slots) are checked against the
    library's compiled tables: a file whose checksum is right but whose descriptions lie is refused
    with status 2 and the reason, under AddressSanitizer and UBSan too."""
    _, folder, _ = emitted
    binaries = programs(folder, tmp_path)
    for name, path in forged_descriptions(folder, tmp_path).items():
        for program in binaries:
            result = subprocess.run([str(program), "load", str(path)], capture_output=True, text=True)
            assert result.returncode == 0, (name, result.stdout + result.stderr)
            assert "load: status 2" in result.stdout and "damaged" in result.stdout, (name, result.stdout)


def sanitizers_work(tmp_path: Path) -> bool:
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    result = subprocess.run(
        [CC, "-fsanitize=address,undefined", str(probe), "-o", str(tmp_path / "probe")], capture_output=True
    )
    return result.returncode == 0 and subprocess.run([str(tmp_path / "probe")]).returncode == 0


def programs(folder: Path, tmp_path: Path) -> list[Path]:
    """The checker built against ``folder``, and again with the API's own source under
    AddressSanitizer and UBSan where this compiler can build and run such programs."""
    binaries = [build(folder)]
    if sanitizers_work(tmp_path):
        flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-g", f"-I{folder / 'src'}"]
        binaries.append(build(folder, flags, [str(folder / "src" / "capi.c")], ["-lkiln_model"]))
    return binaries


def test_the_api_library_passes_under_asan_and_ubsan(emitted, tmp_path):
    """The API's own code (src/capi.c) and the C program built with AddressSanitizer and UBSan
    against the plan's library: a run, the misuse, the damaged files."""
    model, folder, _ = emitted
    if not sanitizers_work(tmp_path):
        pytest.skip("this compiler cannot build and run AddressSanitizer/UBSan programs")
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-g", f"-I{folder / 'src'}"]
    binary = build(folder, flags, [str(folder / "src" / "capi.c")], ["-lkiln_model"])
    feeds = feeds_of(model)
    got = run_c(binary, folder, model, feeds, tmp_path)
    want = model.run(feeds)
    np.testing.assert_array_equal(got[0], np.asarray(want[model.output_names[0]], np.float32).reshape(-1))
    result = subprocess.run([str(binary), "misuse", str(folder / "model.kw")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    got = run_c(binary, folder, model, feeds, tmp_path, mode="memory")
    np.testing.assert_array_equal(got[0], np.asarray(want[model.output_names[0]], np.float32).reshape(-1))
    for name, (path, reason) in damaged_files(folder, tmp_path).items():
        result = subprocess.run([str(binary), "load", str(path)], capture_output=True, text=True)
        assert result.returncode == 0 and reason in result.stdout, (name, result.stdout + result.stderr)


def test_the_example_builds_strict_and_runs(emitted):
    _, folder, _ = emitted
    binary = folder / "example"
    command = [CC, *STRICT, str(folder / "main.c"), f"-I{folder}", f"-L{folder}", "-lkiln_model", "-Wl,-rpath,$ORIGIN", "-o", str(binary)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=folder)
    assert result.returncode == 0, result.stderr
    run = subprocess.run([str(binary), "model.kw"], capture_output=True, text=True, cwd=folder)
    assert run.returncode == 0 and "output 0 starts" in run.stdout, run.stdout + run.stderr


def test_what_cannot_be_a_c_library_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ArgumentError, match="bind batch"):
        emit_c(kiln.compile(small_cnn()), tmp_path / "a", {})
    with pytest.raises(ArgumentError, match="cpu target"):
        emit_c(kiln.compile(small_cnn(), target="reference"), tmp_path / "b", {"batch": 1})
    (tmp_path / "c").write_text("a file")
    with pytest.raises(ArgumentError, match="not a folder"):
        emit_c(kiln.compile(small_cnn()), tmp_path / "c", {"batch": 1})


def test_names_from_the_model_file_come_back_from_the_c_api_as_they_were(tmp_path):
    """Input names are the model file's strings: quotes, backslashes, trigraphs and non-ASCII
    bytes come back from kiln_model_input as they were."""
    name = 'a"b\\c??/d\u00e9'
    node = helper.make_node("Relu", [name], ["y"])
    graph = helper.make_graph(
        [node],
        "names",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = kiln.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    folder = tmp_path / "names"
    emit_c(model, folder)
    binary = folder / "example"
    command = [CC, *STRICT, str(folder / "main.c"), f"-I{folder}", f"-L{folder}", "-lkiln_model", "-Wl,-rpath,$ORIGIN", "-o", str(binary)]  # fmt: skip
    assert subprocess.run(command, capture_output=True, cwd=folder).returncode == 0
    run = subprocess.run([str(binary), "model.kw"], capture_output=True, cwd=folder)
    assert run.returncode == 0 and f"input 0: {name}, 2 dims".encode() in run.stdout, run.stdout


def test_kiln_compile_emit_c_writes_the_folder(tmp_path):
    from click.testing import CliRunner

    from kiln.cli import main

    onnx.save(small_cnn(), tmp_path / "cnn.onnx")
    runner = CliRunner()
    result = runner.invoke(main, ["compile", str(tmp_path / "cnn.onnx"), "--emit", "c", "-o", str(tmp_path / "out"), "--dim", "batch=3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert {"kiln.h", "libkiln_model.so", "model.kw", "main.c", "src"} <= {p.name for p in (tmp_path / "out").iterdir()}
    assert "batch=3" in result.output
    ranged = runner.invoke(main, ["compile", str(tmp_path / "cnn.onnx"), "--emit", "c", "-o", str(tmp_path / "r"), "--dim", "batch=1..4"])  # fmt: skip
    assert ranged.exit_code == 0 and "batch=1..4" in ranged.output, ranged.output
    many = runner.invoke(main, ["compile", str(tmp_path / "cnn.onnx"), "--emit", "c", "-o", str(tmp_path / "m"), "--dim", "batch=1,4"])  # fmt: skip
    assert many.exit_code == 2 and "one size" in many.output


def test_the_static_library_links_alone_and_computes_the_same(emitted, tmp_path):
    """libkiln_model.a (the API, the plan's unit, the engine): a program linked with it and
    -lpthread -lm only runs with no library of kiln's beside it, bit for bit as Python."""
    model, folder, _ = emitted
    binary = tmp_path / "static-check"
    command = [CC, *STRICT, str(CHECK), f"-I{folder}", str(folder / "libkiln_model.a"), "-lpthread", "-lm", "-o", str(binary)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    needed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    assert "kiln" not in needed, needed
    feeds = feeds_of(model)
    got = run_c(binary, folder, model, feeds, tmp_path)
    want = model.run(feeds)
    for name, array in zip(model.output_names, got):
        np.testing.assert_array_equal(array, np.asarray(want[name], np.float32).reshape(-1))


def test_a_sample_parallel_batch_runs_every_size_of_its_range(tmp_path):
    """--dim batch=1..5: the library takes any batch in the range (described as -1 with its bounds),
    running the plan of one sample per sample: bit for bit each sample's Python run; a batch outside
    the range is a status with the reason."""
    model = kiln.compile(small_cnn())
    folder = tmp_path / "batched"
    emitted = kiln.emit_c(model, folder, batch=("batch", 1, 5))  # (the public API's name for it)
    assert emitted.dims == {"batch": "1..5"}
    binary = build(folder)
    rng = np.random.default_rng(9)
    scale = np.float32([0.5])
    for batch in (1, 3, 5):
        x = rng.standard_normal((batch, 3, 6, 6)).astype(np.float32)
        (got,) = run_c(binary, folder, model, {"x": x, "scale": scale}, tmp_path, batch)
        want = np.concatenate([model.run({"x": x[i : i + 1], "scale": scale})["y"] for i in range(batch)])
        np.testing.assert_array_equal(got, want.reshape(-1))
    x = rng.standard_normal((6, 3, 6, 6)).astype(np.float32)
    x.tofile(tmp_path / "six.bin")
    scale.tofile(tmp_path / "scale.bin")
    command = [str(binary), "batch=6", "run", str(folder / "model.kw"), str(tmp_path / "six.bin"), str(tmp_path / "scale.bin"), str(tmp_path / "o.bin")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1 and "outside the model's range 1..5" in result.stderr, result.stderr
    with pytest.raises(ArgumentError, match="range of sizes"):
        emit_c(model, tmp_path / "bad", {}, ("batch", 0, 4))
    if sanitizers_work(tmp_path):  # the per-sample offsets under AddressSanitizer and UBSan
        flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-g", f"-I{folder / 'src'}"]
        sanitized = build(folder, flags, [str(folder / "src" / "capi.c")], ["-lkiln_model"])
        x = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
        (got,) = run_c(sanitized, folder, model, {"x": x, "scale": scale}, tmp_path, 4)
        want = np.concatenate([model.run({"x": x[i : i + 1], "scale": scale})["y"] for i in range(4)])
        np.testing.assert_array_equal(got, want.reshape(-1))


def test_outputs_that_are_an_input_or_a_weight_are_copied_out(tmp_path):
    """An output that is the input itself (Identity) or a weight comes out of the C call too."""
    const = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c")
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["x"], ["z"]), helper.make_node("Identity", ["c"], ["w"])]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "aliases",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "yzw"],
        [const],
    )
    model = kiln.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    folder = tmp_path / "aliases"
    kiln.emit_c(model, folder)
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    got = run_c(build(folder), folder, model, {"x": x}, tmp_path)
    want = model.run({"x": x})
    for name, array in zip(model.output_names, got):
        np.testing.assert_array_equal(array, np.asarray(want[name]).reshape(-1))
    only_copies = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "copy", graph.input, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )  # fmt: skip
    with pytest.raises(ArgumentError, match="nothing to build"):
        kiln.emit_c(
            kiln.compile(helper.make_model(only_copies, opset_imports=[helper.make_opsetid("", 17)])), tmp_path / "n"
        )


def attention_model() -> onnx.ModelProto:
    """Token ids [3, seq] through an embedding table, self-attention over the positions (a softmax
    across the length: padding needs its mask) and a product: seq pads, at run-time lengths."""
    rng = np.random.default_rng(4)
    table = numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.standard_normal((16, 7)).astype(np.float32), "weight")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["e", "et"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "e"], ["c"]),
        helper.make_node("MatMul", ["c", "weight"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3, "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, "seq", 7])],
        [table, weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_run_time_length_runs_every_length_of_its_range_bit_for_bit(tmp_path):
    """--dim seq=1..40 on a model whose seq pads with kernels taking the length at run time: one
    plan, the length described as -1 with its bounds; every length (below the floor: padded with
    zeros into the context's buffers and cut back) bit for bit Python's run; a length outside the
    range a status with the reason, and the boundary's misuse too; the padding and cutting under
    AddressSanitizer and UBSan."""
    model = kiln.compile(attention_model())
    folder = tmp_path / "lengths"
    emitted = kiln.emit_c(model, folder, length=("seq", 1, 40))
    assert emitted.dims == {"seq": "1..40"}
    plan = length_variants(model, {}, "seq", 1, 40)[0][0][0].plan  # (the library's: its tables are in its code)
    floor = plan.memory.growing.floor
    assert re.search(rf"  1, \d+, {floor}, 40, ", plan.source) and floor > 6  # (lengths 1 and 6: padded and cut)
    assert (folder / "libkiln_model.so").read_bytes() == plan.library.read_bytes(), "the Python runtime's library"
    binaries = programs(folder, tmp_path)
    binary = binaries[0]
    rng = np.random.default_rng(10)
    for length in (1, 6, 16, 17, 33, 40):
        ids = rng.integers(0, 50, (3, length)).astype(np.int64)
        want = np.asarray(model.run({"ids": ids})["y"], np.float32).reshape(-1)
        for program in binaries:
            (got,) = run_c(program, folder, model, {"ids": ids}, tmp_path, length)
            np.testing.assert_array_equal(got, want)
    for program in binaries:  # (under ASan too: a run too long for its workspace writes nothing)
        _check_short_workspaces(program, folder, model, tmp_path)
    rng.integers(0, 50, (3, 41)).astype(np.int64).tofile(tmp_path / "long.bin")
    command = [str(binary), "batch=41", "run", str(folder / "model.kw"), str(tmp_path / "long.bin"), str(tmp_path / "o.bin")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1 and "outside the model's range 1..40" in result.stderr, result.stderr
    for program in binaries:
        command = [str(program), "batch=5", "misuse", str(folder / "model.kw")]  # (length 5)
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0 and "wrong dims: status 4" in result.stdout, result.stdout + result.stderr
    with pytest.raises(ArgumentError, match="neither proven sample-parallel nor paddable"):
        kiln.emit_c(kiln.compile(embedding_model_of_length()), tmp_path / "no", length=("seq", 1, 8))
    with pytest.raises(ArgumentError, match="two ranges"):
        kiln.emit_c(model, tmp_path / "two", batch=("seq", 1, 4), length=("seq", 1, 4))


def test_a_batch_range_and_a_run_time_length_run_together_bit_for_bit(tmp_path):
    """--dim batch=1..4 --dim seq=1..24 (a BERT's two ranges): one plan of one sample at run-time
    lengths, run once per sample; every (batch, length) pair, below the floor and at the ends, bit
    for bit Python's run, normal and under AddressSanitizer and UBSan; both dims described as -1."""
    onnx_model = attention_model()
    for value in (*onnx_model.graph.input, *onnx_model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    model = kiln.compile(onnx_model)
    folder = tmp_path / "both"
    emitted = kiln.emit_c(model, folder, batch=("batch", 1, 4), length=("seq", 1, 24))
    assert emitted.dims == {"batch": "1..4", "seq": "1..24"}
    binaries = programs(folder, tmp_path)
    rng = np.random.default_rng(11)
    for samples, length in ((1, 1), (3, 5), (4, 24), (2, 17)):
        ids = rng.integers(0, 50, (samples, length)).astype(np.int64)
        want = np.asarray(model.run({"ids": ids})["y"], np.float32).reshape(-1)
        for program in binaries:
            (got,) = run_c(program, folder, model, {"ids": ids}, tmp_path, samples, length=length)
            np.testing.assert_array_equal(got, want)
    described = subprocess.run([str(folder / "check"), "batch=2", "len=3", "misuse", str(folder / "model.kw")], capture_output=True, text=True)  # fmt: skip
    assert "wrong dims: status 4" in described.stdout, described.stdout + described.stderr


def test_compiled_length_classes_run_every_length_from_one_library(tmp_path):
    """A length whose kernels do not take it at run time (here: --disable run-time-length) compiles
    padded classes: the C library holds one plan per class (their units renamed, linked into one
    library with one engine, each class's weights read from the file's arrays, shared where equal),
    and a run pads to its class and cuts back; every length of the range, with a batch range too,
    bit for bit Python's, normal and under ASan/UBSan; the static library too."""
    from kiln.driver.options import CompileOptions

    onnx_model = attention_model()
    for value in (*onnx_model.graph.input, *onnx_model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    options = CompileOptions.from_env(disabled=frozenset({"run-time-length"}))
    model = kiln.compile(onnx_model, options=options)
    folder = tmp_path / "classes"
    kiln.emit_c(model, folder, batch=("batch", 1, 3), length=("seq", 1, 40))
    assert not model.padder().samples and len(model.padder().classes) > 1, "compiled classes, not a run-time length"
    binaries = programs(folder, tmp_path)
    static = tmp_path / "static-classes"
    command = [CC, *STRICT, str(CHECK), f"-I{folder}", str(folder / "libkiln_model.a"), "-lpthread", "-lm", "-o", str(static)]  # fmt: skip
    assert subprocess.run(command, capture_output=True).returncode == 0
    binaries.append(static)
    rng = np.random.default_rng(13)
    for samples, length in ((1, 1), (2, 16), (3, 17), (1, 33), (2, 40)):
        ids = rng.integers(0, 50, (samples, length)).astype(np.int64)
        want = np.asarray(model.run({"ids": ids})["y"], np.float32).reshape(-1)
        for program in binaries:
            (got,) = run_c(program, folder, model, {"ids": ids}, tmp_path, samples, length=length)
            np.testing.assert_array_equal(got, want, err_msg=f"{program.name} at {samples}x{length}")
    result = subprocess.run([str(binaries[0]), "batch=1", "len=41", "misuse", str(folder / "model.kw")], capture_output=True, text=True)  # fmt: skip
    assert "outside the model's range 1..40" in result.stdout + result.stderr, result.stdout + result.stderr


def strided_cnn() -> onnx.ModelProto:
    """x [1, 3, h, w] through a stride-2 convolution, a Relu and a convolution: y [1, 2, (h+1)//2,
    (w+1)//2] (sizes that are no polynomial of h and w: the dims vector's route)."""
    rng = np.random.default_rng(14)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((2, 4, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "strided",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, None, None])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_image_sizes_taken_at_run_time_run_from_c_bit_for_bit(tmp_path):
    """--dim h=8..40 --dim w=8..40 on a conv net: the plan whose kernels take the sizes at run time
    through the dims vector; the library computes the vector from the input's dims (its program as
    data: (h+1)//2), lays the input out in its capacity and reads the output back at its sizes; every
    size bit for bit Python's, normal and under ASan/UBSan; a size outside the range, or an output of
    the wrong dims, a status with the reason."""
    model = kiln.compile(strided_cnn())
    folder = tmp_path / "dims"
    emitted = kiln.emit_c(model, folder, extents={"h": (8, 40), "w": (8, 40)})
    assert emitted.dims == {"h": "8..40", "w": "8..40"}
    binaries = programs(folder, tmp_path)
    rng = np.random.default_rng(15)
    for h, w in ((8, 8), (17, 23), (40, 40), (9, 31)):
        x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
        want = np.asarray(model.run({"x": x})["y"], np.float32)
        assert want.shape == (1, 2, (h + 1) // 2, (w + 1) // 2)
        for program in binaries:
            shapes = f"1x3x{h}x{w},1x2x{(h + 1) // 2}x{(w + 1) // 2}"
            (got,) = run_c(program, folder, model, {"x": x}, tmp_path, shapes=shapes)
            np.testing.assert_array_equal(got, want.reshape(-1), err_msg=f"{program.name} at {h}x{w}")
    np.zeros((1, 3, 41, 8), np.float32).tofile(tmp_path / "big.bin")
    command = [str(binaries[0]), "shapes=1x3x41x8,1x2x21x4", "run", str(folder / "model.kw"), str(tmp_path / "big.bin"), str(tmp_path / "o.bin")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1 and "outside the model's range 8..40" in result.stderr, result.stderr
    np.zeros((1, 3, 17, 23), np.float32).tofile(tmp_path / "x.bin")
    command = [str(binaries[0]), "shapes=1x3x17x23,1x2x8x12", "run", str(folder / "model.kw"), str(tmp_path / "x.bin"), str(tmp_path / "o.bin")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1 and "the model's at these inputs' dims is 9" in result.stderr, result.stderr
    example = folder / "example"  # (it sizes its output with kiln_model_output_shape: 4x4 for an 8x8 input)
    command = [CC, *STRICT, str(folder / "main.c"), f"-I{folder}", f"-L{folder}", "-lkiln_model", "-Wl,-rpath,$ORIGIN", "-o", str(example)]  # fmt: skip
    assert subprocess.run(command, capture_output=True, cwd=folder).returncode == 0
    run = subprocess.run([str(example), "model.kw"], capture_output=True, text=True, cwd=folder)
    assert run.returncode == 0 and "output 0 starts" in run.stdout, run.stdout + run.stderr


def test_forged_dims_programs_and_entries_are_refused(tmp_path):
    """A run-time dims file whose checksum is right but whose dims lie: a tensor dim naming an entry
    out of range, or an entry whose capacity is not that dim's, is refused at load; a program that
    divides by zero makes the run a status with the reason (under ASan/UBSan too), never a crash."""
    model = kiln.compile(strided_cnn())
    folder = tmp_path / "dims"
    kiln.emit_c(model, folder, extents={"h": (8, 40), "w": (8, 40)})
    binaries = programs(folder, tmp_path)
    data = bytearray((folder / "model.kw").read_bytes())
    count, words = int.from_bytes(data[8:16], "little") >> 32, int.from_bytes(data[96:104], "little")
    start = 104 + 8 * count
    original = np.frombuffer(bytes(data[start : start + 8 * words]), np.int64).copy()
    divide = next(i for i in range(len(original) - 2) if list(original[i : i + 3]) == [1, 2, 6])  # CONST 2 FLOORDIV

    def forged(index: int, value: int) -> Path:
        words_now = original.copy()
        words_now[index] = value
        content = bytearray(data)
        content[start : start + 8 * words] = words_now.tobytes()
        content[24:32] = zlib.crc32(bytes(content[104:])).to_bytes(8, "little")
        path = tmp_path / f"forged-{index}-{value}.kw"
        path.write_bytes(bytes(content))
        return path

    np.zeros((1, 3, 9, 9), np.float32).tofile(tmp_path / "x.bin")
    for program in binaries:
        for path in (forged(len(original) - 1, 7), forged(len(original) - 6, 2)):  # y's last dim; x's dim 2
            result = subprocess.run([str(program), "load", str(path)], capture_output=True, text=True)
            assert "load: status 2" in result.stdout and "damaged" in result.stdout, result.stdout + result.stderr
        command = [str(program), "shapes=1x3x9x9,1x2x5x5", "run", str(forged(divide + 1, 0)), str(tmp_path / "x.bin"), str(tmp_path / "o.bin")]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 1 and "cannot be computed" in result.stderr, result.stdout + result.stderr


def embedding_model_of_length() -> onnx.ModelProto:
    """embedding_model with its positions symbolic: each position on its own (sample-parallel along
    axis 1), so the length neither pads nor is a batch on axis 0."""
    model = embedding_model()
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[1].dim_param = "seq"
    return model


@pytest.mark.slow
def test_a_torchscript_encoders_lengths_run_from_c_with_the_offsets_written_per_call(tmp_path):
    """A TorchScript RoBERTa-like export (its flat-index offsets arange(batch) * seq a constant whose
    values follow the length: the library writes them per call) as a C library over seq 1..64 at
    batch 2: lengths below the floor, between and at the end bit for bit Python's run."""
    pytest.importorskip("torch", reason="the export needs PyTorch")
    from kiln.zoo import architectures

    path = str(architectures.export("roberta", exporter="torchscript", dynamic=True))
    model = kiln.compile(path)
    folder = tmp_path / "roberta"
    kiln.emit_c(model, folder, {"batch": 2}, length=("seq", 1, 64))
    assert length_variants(model, {"batch": 2}, "seq", 1, 64)[0][0][0].plan.memory.growing.constants, "offsets per call"
    binary = build(folder)
    for length in (3, 31, 64):
        feeds = architectures.inputs("roberta", batch=2, seq=length)
        want = model.run(feeds)
        got = run_c(binary, folder, model, feeds, tmp_path, length)
        for name, array in zip(model.output_names, got):
            np.testing.assert_array_equal(array, np.asarray(want[name], np.float32).reshape(-1))


def _check_short_workspaces(binary: Path, folder: Path, model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A workspace of kiln_model_workspace_size_at(16) runs lengths up to 16 (bit for bit), and a
    longer run on it is a status with the reason, not a write past its end."""
    ids = np.random.default_rng(12).integers(0, 50, (3, 33)).astype(np.int64)
    ids[:, :16].copy().tofile(tmp_path / "short.bin")
    ids.tofile(tmp_path / "long33.bin")
    weights, out = str(folder / "model.kw"), str(tmp_path / "o.bin")
    result = subprocess.run([str(binary), "batch=16", "ws=16", "run", weights, str(tmp_path / "short.bin"), out], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    want = np.asarray(model.run({"ids": ids[:, :16].copy()})["y"], np.float32).reshape(-1)
    np.testing.assert_array_equal(np.fromfile(out, np.float32), want)
    result = subprocess.run([str(binary), "batch=33", "ws=16", "run", weights, str(tmp_path / "long33.bin"), out], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 1 and "needs a workspace of" in result.stderr, result.stderr


def test_an_output_with_the_length_in_two_dims_is_refused_for_c(tmp_path):
    """The attention map itself as an output ([3, seq, seq]: cut along two dims) is not in C yet:
    refused, naming the output and its dims, before anything is written."""
    model = attention_model()
    model.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, [3, "seq", "seq"]))
    compiled = kiln.compile(model)
    with pytest.raises(ArgumentError, match=r"output 1 has the length in 2 dims \[1, 2\]"):
        kiln.emit_c(compiled, tmp_path / "two", length=("seq", 1, 40))
    assert not (tmp_path / "two").exists()
