"""benchmarks/gpu_check.py, the check a session lent a GPU runs first (issue 53), in its dry run:
the same steps on gpu:interpret with a small model, so the script cannot rot between device
sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the gpu target needs Triton (kiln's gpu extra)")
pytest.importorskip("torch", reason="torch (the 'zoo' extra) builds the zoo model and is the eager row")
pytest.importorskip("onnxruntime", reason="the models are checked against onnxruntime")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_dry_run_checks_times_and_writes_its_report(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_check.py"),
        "--dry-run",
        "--out",
        str(tmp_path),
        "--models",
        "mnist-cnn",
        "--latency-models",
        "mnist-cnn",
        "--cases",
        "^test_(relu|maxpool_2d_pads)$",
        "--batches",
        "1",
        "--duration",
        "0.1",
        "--engines",
        "kiln,kiln-nographs,kiln-untuned,eager",
        "--budget",
        "400",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["target"] == "gpu:interpret" and results["environment"]["torch"]
    steps = results["steps"]
    assert not [k for k in steps if k.endswith("_error")], steps
    conformance = steps["conformance"]
    assert conformance["total"] == 2 and conformance["passed"] == 2, conformance["failures"]
    (model,) = steps["models"]
    assert "error" not in model, model
    assert model["ok"] and model["rel_l2"] < 1e-4 and model["repeat_rel_l2"] == 0.0
    rows = {row["engine"]: row for row in steps["latency"]}
    assert set(rows) == {"kiln", "kiln-nographs", "kiln-untuned", "eager"}, rows
    for row in rows.values():
        assert "error" not in row, row
        assert row["host"]["median_ms"] > 0 and row["host"]["p90_ms"] >= row["host"]["median_ms"]
    assert rows["kiln"]["split"]["compute_ms"] > 0 and rows["kiln"]["split"]["cuda_graphs"].startswith("none")
    assert rows["kiln-nographs"]["split"]["cuda_graphs"].startswith("off")
    tuning = rows["kiln"]["tuning"]  # the dry run forces the tuner on in the interpreter
    assert tuning["tuned"] + tuning["cached"] >= 1 and tuning["chosen_ms"] <= tuning["rendered_ms"], tuning
    assert rows["kiln-untuned"]["tuning"] == "off"
    page = (tmp_path / "gpu_check.md").read_text()
    assert "| mnist-cnn | 1 | kiln |" in page and "2 / 2 pass" in page and "| mnist-cnn | " in page
