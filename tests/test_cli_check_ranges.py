"""``kiln check MODEL --dim NAME=LOW..HIGH``: the program kiln.compile makes for the ranges, run at
their ends and middles against the reference (issue 49: ``--strict`` used to check a program
specialized at every dim = 1, passing models that then failed at every size and failing models
that ran)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import helper

from kiln import cli_check_ranges
from kiln.cli import main
from tests.helpers import FLOAT, make_model


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def parallel(tmp_path):
    """batch is sample-parallel: every size in the range runs on its size classes."""
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
        [("x", FLOAT, ["batch", 16])],
        [("y", FLOAT, None)],
        {"w": np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)},
    )
    path = tmp_path / "parallel.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


@pytest.fixture
def mixing(tmp_path):
    """A Reshape to [n, batch] mixes samples and lengths: every new size compiles."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Concat", ["n1", "b1"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "t"], ["y"]),
    ]
    constants = {"one": np.array(1, np.int64), "zero": np.array(0, np.int64), "axes": np.array([0], np.int64)}
    model = make_model(nodes, [("x", FLOAT, ["batch", "n"])], [("y", FLOAT, None)], constants)
    path = tmp_path / "mixing.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_a_sample_parallel_range_runs_every_checked_size_natively_with_no_compile(parallel, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    result = invoke("check", parallel, "--dim", "batch=1..9", "--strict", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["ranges"]
    assert [row["dims"] for row in report["bindings"]] == [{"batch": 1}, {"batch": 5}, {"batch": 9}]
    for row in report["bindings"]:
        assert row["verdict"] == "ok" and row["compiled"] == 0 and row["native"], row
        assert row["rel_l2"] <= 1e-5


def test_a_range_that_compiles_per_size_passes_but_fails_strict_naming_each_size(mixing, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    result = invoke("check", mixing, "--dim", "batch=1..4", "--dim", "n=2..6", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["ranges"]["bindings"]
    assert len(rows) == 7 and {row["verdict"] for row in rows} <= {"ok", "per-size compile"}
    assert any(row["verdict"] == "per-size compile" and row["compiled"] >= 1 for row in rows)
    assert all(row["rel_l2"] == 0.0 for row in rows)  # a reshape: bit for bit
    strict = invoke("check", mixing, "--dim", "batch=1..4", "--dim", "n=2..6", "--strict")
    assert strict.exit_code == 1 and "per-size compile" in strict.output


def test_a_wrong_answer_or_a_failing_size_fails_the_check(parallel, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cli_check_ranges, "relative_l2", lambda got, want: 0.5)
    result = invoke("check", parallel, "--dim", "batch=1..4", "--json")
    assert result.exit_code == 1
    assert {row["verdict"] for row in json.loads(result.stdout)["ranges"]["bindings"]} == {"mismatch"}
    assert cli_check_ranges.verdict({"error": "ExecutionError: boom", "rel_l2": 0.0}) == "error"
    assert cli_check_ranges.exit_code({"bindings": [{"verdict": "not native"}]}, strict=False) == 0
    assert cli_check_ranges.exit_code({"bindings": [{"verdict": "not native"}]}, strict=True) == 1


def test_questions_the_model_cannot_answer_exit_2(mixing):
    def run(*args):  # the installed entry point: its exit codes
        return subprocess.run([sys.executable, "-m", "kiln", "check", mixing, *args], capture_output=True, text=True)

    missing = run("--dim", "batch=1..4")  # n has no size
    assert missing.returncode == 2 and "no size for dim(s) n" in missing.stderr
    unknown = run("--dim", "nope=1..4", "--dim", "batch=1..2", "--dim", "n=1..2")
    assert unknown.returncode == 2 and "nope" in unknown.stderr


def test_bindings_cover_each_ranges_ends_and_middle():
    found = cli_check_ranges.bindings({"b": (1, 8), "s": (0, 64)}, {"h": 3})
    assert found[:3] == [{"h": 3, "b": 1, "s": 0}, {"h": 3, "b": 4, "s": 32}, {"h": 3, "b": 8, "s": 64}]
    assert {"h": 3, "b": 1, "s": 32} in found and {"h": 3, "b": 4, "s": 0} in found and len(found) == 7
    assert cli_check_ranges.relative_l2({"y": np.array([1, 2])}, {"y": np.array([1, 3])}) == float("inf")


def test_a_size_the_model_itself_cannot_run_is_told_apart_from_a_kiln_error(tmp_path, monkeypatch):
    """[batch, 3] reshaped to [2, -1]: batch 1 has no such shape, in kiln's reference as in kiln."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    model = make_model(
        [helper.make_node("Reshape", ["x", "t"], ["y"])],
        [("x", FLOAT, ["batch", 3])],
        [("y", FLOAT, None)],
        {"t": np.array([2, -1], np.int64)},
    )
    path = tmp_path / "pairs.onnx"
    path.write_bytes(model.SerializeToString())
    result = invoke("check", str(path), "--dim", "batch=2..4", "--json")
    assert result.exit_code == 1
    verdicts = {row["dims"]["batch"]: row["verdict"] for row in json.loads(result.stdout)["ranges"]["bindings"]}
    assert verdicts == {2: "ok", 3: "fails in the reference too", 4: "per-size compile"}
    # the range's low end itself cannot compile: kiln.compile at these ranges fails, and says where
    failed = json.loads(invoke("check", str(path), "--dim", "batch=1..4", "--json").stdout)["ranges"]
    assert "compiling for batch=1" in failed["compile_error"] and failed["bindings"] == []
