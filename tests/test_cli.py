import itertools
import json
import re

import onnx
from click.testing import CliRunner
from onnx import helper

from kiln.cli import main
from tests.helpers import FLOAT, make_model


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help_lists_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("conformance", "zoo", "show"):
        assert command in result.output


def test_conformance_filter_json_and_baseline(tmp_path):
    out = tmp_path / "report.json"
    result = invoke("conformance", "--filter", "^test_(relu|abs)$", "-o", str(out), "-j", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["summary"]["total"] == 2 and report["summary"]["passed"] == 2
    assert {c["name"] for c in report["cases"]} == {"test_relu", "test_abs"}
    high = tmp_path / "baseline.json"
    high.write_text(json.dumps({"reference": {"node": {"passed": 3}}}))
    result = invoke("conformance", "--filter", "^test_(relu|abs)$", "-j", "1", "--baseline", str(high))
    assert result.exit_code == 1


def test_conformance_unknown_suite_and_empty_filter():
    assert invoke("conformance", "--suite", "nope").exit_code == 2
    result = invoke("conformance", "--filter", "^no_such_case$")
    assert result.exit_code == 1 and "no cases match" in result.output


def test_show_prints_ir(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(
        make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, ["n", 2])], [("y", FLOAT, None)]), path
    )
    result = invoke("show", str(path))
    assert result.exit_code == 0
    assert "%y: f32[n,2] = Relu(%x)" in result.output


def test_bad_model_file_is_one_clear_error(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model at all")
    process = subprocess.run([sys.executable, "-m", "kiln.cli", "show", str(path)], capture_output=True, text=True)
    assert process.returncode == 2
    assert "broken.onnx: not a valid ONNX model" in process.stderr
    assert "Traceback" not in process.stderr


def test_zoo_list_and_unknown_model():
    result = invoke("zoo", "list")
    assert result.exit_code == 0 and "resnet50" in result.output and "gpt2" in result.output
    result = invoke("zoo", "check", "alexnet")
    assert result.exit_code == 2 and "unknown model(s) ['alexnet']" in result.output


def test_compile_then_run(tmp_path):
    import numpy as np

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, ["n", 4])], [("y", FLOAT, None)])
    onnx.save(model, tmp_path / "m.onnx")
    artifact = tmp_path / "m.kiln"
    result = invoke("compile", str(tmp_path / "m.onnx"), "-o", str(artifact), "--dim", "n=2,3")
    assert result.exit_code == 0, result.output
    assert "0 host fallback(s)" in result.output and artifact.exists()
    assert "compiled ahead for 2 bindings: {'n': 2}; {'n': 3}" in result.output
    import json
    import zipfile

    with zipfile.ZipFile(artifact) as archive:
        assert json.loads(archive.read("meta.json"))["variants"] == [{"n": 2}, {"n": 3}]
    x = np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke(
        "run",
        str(artifact),
        "--input",
        f"x={tmp_path / 'x.npy'}",
        "--output",
        str(tmp_path / "out.npz"),
        "--threads",
        "1",
    )
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], np.maximum(x, 0))


def test_explain_prints_the_kernel_ir_and_the_fusions_it_refused(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Exp", ["r"], ["e"], name="exp"),
        helper.make_node("Add", ["e", "r"], ["y"], name="add"),
    ]
    onnx.save(make_model(nodes, [("x", FLOAT, [8])], [("y", FLOAT, None), ("r", FLOAT, None)]), tmp_path / "m.onnx")
    result = invoke("explain", str(tmp_path / "m.onnx"), "--print-after", "lower")
    assert result.exit_code == 0, result.output
    assert "# after lower" in result.output
    assert "kernel k1 (pointwise) reads b1: f32[8] writes b0: f32[8]" in result.output
    assert "fusion refused" in result.output and "%r has 3 readers" in result.output
    result = CliRunner().invoke(main, ["explain", str(tmp_path / "m.onnx"), "--print-after", "codegen"])
    assert result.exit_code == 2 and "plan-memory" in result.output  # the stages are listed


def test_explain_shows_kernels_and_memory_plan(tmp_path):
    model = make_model(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
        [("x", FLOAT, [2, 4])],
        [("y", FLOAT, None)],
    )
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("explain", str(tmp_path / "m.onnx"), "--print-after", "fuse")
    assert result.exit_code == 0, result.output
    assert "# after fuse" in result.output and "kiln::Fused" in result.output
    assert "memory plan" in result.output and "generated source" in result.output


def test_explain_says_a_matrix_product_runs_in_the_engine_not_serially(tmp_path):
    import numpy as np

    weights = {"w": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)}
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Exp", ["m"], ["y"])],
        [("x", FLOAT, [64, 64])],
        [("y", FLOAT, None)],
        weights,
    )
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("explain", str(tmp_path / "m.onnx"))
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "MatMul" in line and "(segment" in line)
    assert "engine (parallel inside)" in row and "serial" not in row, row


def test_explain_prints_what_every_pipeline_stage_produced(tmp_path):
    from kiln.driver.pipeline import STAGES as PIPELINE

    STAGES = ("import", *PIPELINE)  # the frontend's, then the pipeline table's
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [("x", FLOAT, ["n", 4])],
        [("y", FLOAT, None)],
        {"w": __import__("numpy").ones((4, 3), "float32")},
    )
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("explain", str(tmp_path / "m.onnx"), "--dim", "n=5", "--print-after", "all")
    assert result.exit_code == 0, result.output
    text = result.output
    positions = [text.index(f"# after {stage}\n") for stage in STAGES]  # each once, in pipeline order
    assert positions == sorted(positions)
    section = {stage: text[start:end] for stage, start, end in zip(STAGES, positions, [*positions[1:], len(text)])}
    assert "f32[n,4]" in section["import"] and "f32[5,4]" in section["specialize"]
    assert "kiln::Fused" in section["passes"]  # the epilogue fused into the product
    assert "kernel k1 (matmul+epilogue)" in section["lower"]
    assert "arena" in section["plan-memory"]
    assert "kiln_segment_0" in section["render"] and "int kiln_run(" in section["render"]
    assert ".so" in section["build"]
    # the engine's blocks and the caches they came from
    assert re.search(r"caches L1d \d+ KiB.*default blocks kc \d+, A block \d+ KiB", text), text[-3000:]
    assert "1 segment runner(s) loaded" in section["load"]
    assert "# after fuse" in text  # single passes by name too
    assert re.search(r"layout: NCHW kept: .*no convolution has a channels-last kernel", text)


def test_explain_prints_the_layout_decision(tmp_path):
    import numpy as np

    from tests.passes.test_layout import _channels_last_depthwise

    model, _ = _channels_last_depthwise(16, 8, 3, 1, [1, 1, 1, 1], 1, "Relu")
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("explain", str(tmp_path / "m.onnx"), "--no-kernels", "--json")
    assert result.exit_code == 0, result.output
    layout = json.loads(result.stdout)["layout"]
    assert layout["channels_last"] and layout["depthwise"] == 1, layout
    assert layout["conversions_after"] == 0 < layout["conversions_before"], layout
    # a 3x3 window too saves the conversion (read and write) of its input and output, 2x8x9x16 floats each
    assert np.isfinite(layout["conversions_before"]) and layout["saved"] == 2 * (2 * 4 * 2 * 8 * 9 * 16)


def test_compile_with_tuning_and_profile(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    weights = {"w": np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)}
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [("x", FLOAT, [32, 16])],
        [("y", FLOAT, None)],
        weights,
    )
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.kiln"), "--tune", "2m")
    assert result.exit_code == 0, result.output
    assert "tuned 1 kernel(s), 0 from the tuning database" in result.output
    again = invoke("compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.kiln"), "--tune", "2m")
    assert "tuned 0 kernel(s), 1 from the tuning database" in again.output
    assert invoke("compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "x.kiln"), "--tune", "soon").exit_code == 2
    profile = invoke("explain", str(tmp_path / "m.onnx"), "--no-kernels", "--profile", "--runs", "3")
    assert profile.exit_code == 0, profile.output
    assert "GFLOP/s" in profile.output and "% peak" in profile.output and "by kind" in profile.output
    # the schedule column says where the engine's blocking came from (the table may wrap words; the
    # tuner may well have kept the default)
    assert "engine" in profile.output and any(w in profile.output for w in ("tuned", "cached", "default"))


def test_check_lists_every_unsupported_construct_with_node_names(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok_relu"),
        helper.make_node("NoSuchOp", ["a"], ["b"], name="mystery"),
        helper.make_node("AlsoMissing", ["b"], ["y"], name="second_mystery"),
    ]
    onnx.save(make_model(nodes, [("x", FLOAT, ["batch", 4])], [("y", FLOAT, None)]), tmp_path / "bad.onnx")
    result = invoke("check", str(tmp_path / "bad.onnx"))
    assert result.exit_code == 1
    assert "2 unsupported construct(s)" in result.output
    assert "mystery" in result.output and "second_mystery" in result.output


def test_check_reports_specialized_dims_and_fallbacks(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first_reader"),
        helper.make_node("Bernoulli", ["a"], ["y"], name="coin"),
    ]
    onnx.save(make_model(nodes, [("x", FLOAT, ["batch", 4])], [("y", FLOAT, None)]), tmp_path / "m.onnx")
    result = invoke("check", str(tmp_path / "m.onnx"))
    assert result.exit_code == 0, result.output
    assert "dim 'batch'" in result.output and "first_reader" in result.output
    assert "host fallback" in result.output and "coin" in result.output
    assert invoke("check", str(tmp_path / "m.onnx"), "--strict").exit_code == 1
    clean = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2, 4])], [("y", FLOAT, None)])
    onnx.save(clean, tmp_path / "clean.onnx")
    result = invoke("check", str(tmp_path / "clean.onnx"), "--strict")
    assert result.exit_code == 0 and "compiles natively" in result.output


def test_diff_compares_every_surviving_tensor_and_bisects(tmp_path, monkeypatch):
    import numpy as np

    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "b": rng.standard_normal(8).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        # (a LeakyRelu: a plain Relu after a bias is finished inside the engine's micro-kernel, in C,
        # where the injected pointwise bug below would not reach)
        helper.make_node("LeakyRelu", ["c"], ["r"], name="relu", alpha=0.01),
        helper.make_node("ReduceMean", ["r"], ["y"], keepdims=0, name="mean"),
    ]
    onnx.save(make_model(nodes, [("x", FLOAT, [1, 4, 8, 8])], [("y", FLOAT, None)], weights), tmp_path / "m.onnx")
    result = invoke("diff", str(tmp_path / "m.onnx"), "--all")
    assert result.exit_code == 0, result.output
    assert "no tensor diverges" in result.output and re.search(
        r"\b2\s+tensors", result.output
    )  # the fused group's output, y
    result = invoke("diff", str(tmp_path / "m.onnx"), "--disable", "fuse", "--all")
    assert result.exit_code == 0 and re.search(r"\b3\s+tensors", result.output)  # unfused: the Conv's own output too

    from kiln.diff import diff, feeds_for
    from kiln.frontend.onnx import import_onnx

    graph = import_onnx(str(tmp_path / "m.onnx"))
    report = diff(graph, feeds_for(graph, None))
    fused = next(t for t in report.tensors if t.name == "r")
    assert "conv (Conv)" in fused.node and "relu (LeakyRelu)" in fused.node  # mapped back to its source nodes
    # a broken Relu lowering (x * 1.5 where positive) makes the fused tensor diverge: exit 1, naming it
    # (not a zero tolerance: whether the conv rounds exactly as NumPy does depends on the CPU)
    from kiln.lower import pointwise

    relu = pointwise.FLOAT_OPS["LeakyRelu"]
    monkeypatch.setitem(
        pointwise.FLOAT_OPS, "LeakyRelu", lambda a, k, t: pointwise.Binary("*", relu(a, k, t), pointwise.c(1.5, t))
    )
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    result = invoke("diff", str(tmp_path / "m.onnx"))
    assert result.exit_code == 1 and "first divergence" in result.output and "relu" in result.output


def test_diff_finds_an_injected_miscompile(monkeypatch):
    import numpy as np

    from kiln.diff import diff
    from kiln.frontend.onnx import import_onnx
    from kiln.lower import pointwise

    model = make_model(
        [helper.make_node("Exp", ["x"], ["e"], name="exp"), helper.make_node("Mul", ["e", "e"], ["y"], name="square")],
        [("x", FLOAT, [64])],
        [("y", FLOAT, None)],
    )
    # break the Exp lowering on purpose (exp(x) * 1.01): diff must blame the group holding Exp
    original = pointwise.FLOAT_OPS["Exp"]
    monkeypatch.setitem(
        pointwise.FLOAT_OPS, "Exp", lambda a, k, t: pointwise.Binary("*", original(a, k, t), pointwise.c(1.01, t))
    )
    graph = import_onnx(model)
    report = diff(graph, {"x": np.linspace(-1, 1, 64, dtype=np.float32)}, disable={"fuse"})
    first = report.first_divergence
    assert first is not None and first.name == "e" and "exp" in first.node


def test_targets_lists_every_registered_target_and_whether_it_runs_here():
    import json

    from kiln.backends import names

    result = invoke("targets", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["target"]: row for row in json.loads(result.output)}
    assert list(rows) == names()  # the registry's, plugins included (the tests' kir)
    assert rows["cpu"]["runs_here"] and set(rows["cpu"]["engines"]) == {"attention", "gemm", "winograd"}
    assert rows["kir:loops"]["engines"] == [] and rows["reference"]["compiles"] is False
    assert any(not row["runs_here"] and "cannot run on this machine" in row["reason"] for row in rows.values())


def test_python_dash_m_kiln_is_the_command_and_help_starts_with_compile_run_bench():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "kiln", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    listed = result.stdout.split("Commands:")[1].splitlines()
    commands = [line.split()[0] for line in listed if line.startswith("  ") and not line.startswith("   ")]
    assert commands[:3] == ["compile", "run", "bench"] and "zoo" in commands
    version = subprocess.run([sys.executable, "-m", "kiln", "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and "0.1.0" in version.stdout


def test_listing_commands_speak_json(tmp_path):
    import json

    zoo_rows = json.loads(invoke("zoo", "list", "--json").output)
    assert {"name": "resnet50", "default": True}.items() <= zoo_rows[0].items()
    onnx.save(
        make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, ["n", 4])], [("y", FLOAT, None)]),
        tmp_path / "m.onnx",
    )
    found = json.loads(invoke("check", str(tmp_path / "m.onnx"), "--json").output)
    assert found["native"] and found["dims"]["n"]["first_read_by"] and found["unsupported"] == []
    explained = json.loads(invoke("explain", str(tmp_path / "m.onnx"), "--json").output)
    assert [s["stage"] for s in explained["stages"]][:3] == ["import", "specialize", "fold"]
    assert explained["plan"]["native"] and explained["ops"]["Relu"] == [1, 1]


def test_quiet_and_verbose_set_what_kiln_logs():
    import logging

    invoke("-q", "targets", "--json")
    assert logging.getLogger("kiln").level == logging.ERROR
    invoke("-v", "targets", "--json")
    assert logging.getLogger("kiln").level == logging.INFO
    invoke("targets", "--json")
    assert logging.getLogger("kiln").level == logging.WARNING


def test_piped_tables_are_not_wrapped_at_80_columns():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "kiln", "targets"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert any(len(line) > 100 for line in result.stdout.splitlines()) or all(
        "cannot run on this machine (its CPU offers" in line for line in result.stdout.splitlines() if "no:" in line
    )


def test_compile_int8_with_calibration_data_prints_the_accuracy_and_the_artifact_runs(tmp_path):
    import numpy as np

    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [("x", FLOAT, [4, 16])],
        [("y", FLOAT, None)],
        {"w": w},
    )
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((10, 4, 16)).astype(np.float32))
    artifact = tmp_path / "m.kiln"
    args = ["compile", str(tmp_path / "m.onnx"), "-o", str(artifact), "--precision", "int8"]
    result = invoke(*args, "--calibrate", str(tmp_path / "calib.npz"), "--calibration-method", "percentile")
    assert result.exit_code == 0, result.output
    assert ", int8)" in result.output  # compiled for cpu (isa, int8)
    assert "accuracy: int8 vs fp32 on 2 evaluation sample(s): rel. L2" in result.output
    assert "1/1 layers int8 (percentile calibration)" in result.output
    x = rng.standard_normal((4, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke("run", str(artifact), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o.npz"))
    assert result.exit_code == 0, result.output
    got, want = np.load(tmp_path / "o.npz")["y"], np.maximum(x @ w, 0)
    assert 0 < np.linalg.norm(got - want) / np.linalg.norm(want) < 0.05  # quantized, and close
    bad = CliRunner().invoke(main, [*args, "--calibrate", str(tmp_path / "nothing.txt")])
    assert bad.exit_code == 2 and "expected an .npz file or a folder of images" in bad.output  # a user mistake


def test_explain_shows_each_kernels_precision(tmp_path):
    import numpy as np

    rng = np.random.default_rng(4)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])],
        [("x", FLOAT, [4, 16])],
        [("y", FLOAT, None)],
        {"w": rng.standard_normal((16, 8)).astype(np.float32)},
    )
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("explain", str(tmp_path / "m.onnx"), "--precision", "int8", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["precision"] == "int8"
    kernels = [step for step in report["plan"]["steps"] if "kernel" in step]
    assert sorted(step["precision"] for step in kernels) == ["fp32", "int8"]  # the softmax stays fp32
    # the hardware path the int8 product takes here: the one the loader sets for this CPU
    from kiln.backends import parse
    from kiln.backends.cpu import features

    cpu = parse("cpu")
    want = features.int8_path(cpu.isa, cpu.native)[1]
    int8_step = next(step for step in kernels if step["precision"] == "int8")
    assert int8_step["precision_path"] in (want, f"{want}-int8"), int8_step
    assert next(step for step in kernels if step["precision"] == "fp32")["precision_path"] is None
    table = invoke("explain", str(tmp_path / "m.onnx"), "--precision", "int8")
    plan_table = table.output.split("execution plan")[1]  # (rich wraps cells: the words, not their line)
    assert "matmul" in plan_table and "int8" in plan_table and int8_step["precision_path"] in plan_table


def test_shared_options_mean_one_thing_on_every_command(tmp_path):
    """-o is the output file and --json a switch printing JSON on stdout, on every command that
    has them; -q leaves stdout to the results a script asked for (JSON) and errors."""
    import re

    from kiln.cli_bench import bench
    from kiln.cli_check import check, diff_command
    from kiln.cli_compile import compile_command
    from kiln.cli_inspect import explain

    commands = {"compile": compile_command, "bench": bench, "explain": explain, "check": check, "diff": diff_command}
    commands.update({name: main.commands[name] for name in ("run", "conformance", "targets")})
    for name, command in commands.items():
        for option in command.params:
            if "--json" in getattr(option, "opts", []):
                assert option.is_flag, f"kiln {name} --json is not a switch"
            if "-o" in getattr(option, "opts", []) or "--output" in getattr(option, "opts", []):
                assert set(option.opts) == {"-o", "--output"}, f"kiln {name}: {option.opts}"
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2, 3])], [("y", FLOAT, None)])
    onnx.save(model, tmp_path / "m.onnx")
    quiet = invoke("-q", "compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.kiln"))
    assert quiet.exit_code == 0 and quiet.stdout == "", quiet.stdout  # errors only
    ran = invoke("run", str(tmp_path / "m.kiln"), "-o", str(tmp_path / "y.npz"))
    assert ran.exit_code == 0 and (tmp_path / "y.npz").is_file()
    listed = invoke("-q", "conformance", "--filter", "^test_relu$", "--json", "-j", "1")
    assert listed.exit_code == 0 and json.loads(listed.stdout)["summary"]["passed"] == 1
    targets = invoke("targets", "--json")
    assert {row["target"] for row in json.loads(targets.stdout)} >= {"cpu", "reference"}
    assert re.search(r"--target TEXT\s+The target to compile for", invoke("explain", "--help").output)


def test_explain_trace_writes_a_perfetto_trace_of_the_kernels(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    weights = {"w": np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)}
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Sigmoid", ["m"], ["y"])],
        [("x", FLOAT, [32, 16])],
        [("y", FLOAT, None)],
        weights,
    )
    onnx.save(model, tmp_path / "m.onnx")
    trace = tmp_path / "t.json"
    result = invoke("explain", str(tmp_path / "m.onnx"), "--no-kernels", "--trace", str(trace), "--runs", "2")
    assert result.exit_code == 0, result.output
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    kernels = [e for e in slices if e["cat"] != "host"]
    assert kernels and all(e["dur"] >= 0 and e["pid"] == 1 for e in slices)
    # end to end in execution order: each starts where the one before it ended
    assert all(abs(b["ts"] - (a["ts"] + a["dur"])) < 1e-6 for a, b in itertools.pairwise(slices))
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)


def test_serve_takes_ranges_and_refuses_a_dim_that_is_no_range(tmp_path):
    """``kiln serve --dim seq=1..128``: a declared range for .onnx models compiled at load; a
    bound size (no range) is a usage error, exit 2, before anything loads."""
    assert "NAME=LOW..HIGH" in invoke("serve", "--help").output
    result = CliRunner().invoke(main, ["serve", str(tmp_path), "--dim", "seq=16"])
    assert result.exit_code == 2 and "NAME=LOW..HIGH" in result.output
