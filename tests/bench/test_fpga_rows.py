"""The FPGA rows of kiln bench (``--device fpga``): kiln's fpga target and hls4ml, both C
simulations, each row labelled "(csim)"; kiln's row carries its estimates on the part, and a model
that does not fit the part is a row saying what it would need."""

from __future__ import annotations

import shutil

import pytest

from kiln.backends.fpga import ap_types
from kiln.bench.backends import BACKENDS, FPGA_BACKENDS
from kiln.bench.backends.base import module_exists
from kiln.bench.report import terminal_table
from kiln.bench.runner import run_bench
from kiln.cli_bench import _bench_config
from kiln.zoo import FPGA_MODELS
from tests.bench.test_gpu_rows import options

pytestmark = pytest.mark.skipif(
    not ap_types() or shutil.which("g++") is None,
    reason="the fpga rows' C simulations need g++ and the ap_types headers (pip install hls4ml)",
)


def test_device_fpga_picks_the_fpga_rows_and_models():
    assert set(FPGA_BACKENDS) == {"kiln-fpga", "hls4ml"} <= set(BACKENDS)
    config = _bench_config(options(device="fpga"))
    assert config.backends == list(FPGA_BACKENDS) and config.models == list(FPGA_MODELS)
    assert _bench_config(options(device="fpga", models=("resnet50",))).models == ["resnet50"]  # explicit wins
    assert not set(FPGA_BACKENDS) & set(_bench_config(options()).backends)  # not in the default run


@pytest.fixture
def fpga_run(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config = _bench_config(options(device="fpga", models=("jet-mlp",), duration=0.3, no_agreement=False, timeout=600.0))
    return run_bench(config, tmp_path / "work")


def test_the_jet_mlp_runs_as_c_simulations_with_estimates_and_accuracy(fpga_run):
    rows = {r["backend"]: r for r in fpga_run["records"]}
    kiln_row = rows["kiln-fpga"]
    assert kiln_row["status"] == "ok", kiln_row.get("error")
    assert kiln_row["simulated"] == "csim" and "C simulation" in kiln_row["config"]["executes"]
    found = kiln_row["fpga_estimates"]
    assert found["kind"].startswith("estimate") and found["part"].startswith("xcu250")
    assert 0 < found["latency_cycles"] < 2000 and 0 < found["resources"]["dsp"] <= found["available"]["dsp"]
    assert kiln_row["agreement"]["rel_l2"] < 2e-2 and kiln_row["agreement"]["top1_agreement"] == 1.0
    text = "\n".join(str(c) for c in terminal_table(fpga_run).columns[1]._cells)
    assert "kiln-fpga (csim)" in text
    if not module_exists("hls4ml") or not module_exists("qonnx"):
        pytest.skip("hls4ml is not installed (the fpga extra): its row is 'not installed'")
    peer = rows["hls4ml"]
    assert peer["status"] == "ok", peer.get("error")
    assert peer["simulated"] == "csim" and "fpga_estimates" not in peer
    # the target: no worse than hls4ml at equal total bits (16) on the MLP
    assert kiln_row["agreement"]["rel_l2"] <= peer["agreement"]["rel_l2"]


def test_a_model_too_large_for_the_part_is_a_row_saying_what_it_needs(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config = _bench_config(
        options(device="fpga", models=("transformer-block",), backends=("kiln-fpga",), duration=0.3, timeout=600.0)
    )
    (row,) = run_bench(config, tmp_path / "work")["records"]
    assert row["status"] == "unavailable"
    assert "does not fit" in row["error"] and "DSP" in row["error"] and "reuse" in row["error"]
