"""kiln bench on a Ray fleet, tested on a local multi-node cluster (``ray.cluster_utils.Cluster``)
whose nodes advertise fake hardware: node classes, selectors, exclusive jobs, streaming into the
store, a node killed mid-job (retried on its class's other node, or failed with the reason when it
had none), and a report grouped by hardware."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the fleet is an optional extra (pip install -e .[fleet]; make setup)")

from kiln.bench import fleet, report, store  # noqa: E402
from kiln.bench.runner import BenchConfig  # noqa: E402

PLUGIN = "tests.bench.fake_backends"
ROOT = Path(__file__).resolve().parents[2]
H100 = {"kiln:gpu=H100": 1, "kiln:cpu=Fake_EPYC_9654": 1}
XEON = {"kiln:cpu=Fake_Xeon_8480": 1, "kiln:isa=avx2+avx512f+amx_tile": 1}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # the nodes' workers import the test plugin (and kiln) from this checkout
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), old) if p)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    members = {
        "h100-a": cluster.add_node(num_cpus=1, resources=H100),
        "h100-b": cluster.add_node(num_cpus=1, resources=H100),
        "xeon": cluster.add_node(num_cpus=1, resources=XEON),
    }
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    fleet.wait_for_nodes(ray, 4)
    yield cluster, members
    ray.shutdown()
    cluster.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def _config(tiny_onnx: str, backends: list[str]) -> BenchConfig:
    return BenchConfig(
        models=[tiny_onnx],
        backends=backends,
        duration=0.2,
        min_iterations=5,
        warmup=1,
        plugins=[PLUGIN],
        agreement=False,
    )


def test_nodes_describe_their_hardware_and_selectors_pick_them(cluster):
    address = cluster[0].address
    every = fleet.nodes(address)
    assert len(every) == 4
    gpus = fleet.nodes(address, ["gpu=H100"])
    assert len(gpus) == 2 and all(n["gpu"] == "H100" and n["cpu"] == "Fake EPYC 9654" for n in gpus)
    assert len({n["fingerprint"] for n in gpus}) == 1  # one hardware class
    (xeon,) = fleet.nodes(address, ["isa=amx_tile", "cpu=fake xeon"])
    assert xeon["flags"] == ["amx_tile", "avx2", "avx512f"] and "Xeon" in xeon["label"]
    assert fleet.nodes(address, ["gpu=A100"]) == []
    with pytest.raises(fleet.FleetError, match="bad selector"):
        fleet.nodes(address, ["colour=red"])


def test_a_fleet_run_is_grouped_by_hardware_and_streamed_into_the_store(cluster, tiny_onnx, tmp_path):
    db = tmp_path / "results.db"
    run = fleet.run_fleet(_config(tiny_onnx, ["kiln", "fake-leak"]), cluster[0].address, [], db=db)
    records = run["records"]
    assert len(records) == 2 * 3  # two jobs per hardware class: head, H100 (two nodes), Xeon
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    labels = {r["node"]["label"] for r in records}
    assert len(labels) == 3 and any("H100" in label for label in labels)
    stored = store.load_records(db, run["run_id"])  # streamed: every record is in the store
    assert sorted(r["node"]["fingerprint"] for r in stored) == sorted(r["node"]["fingerprint"] for r in records)
    groups = report.summary(run)
    assert {g["node"] for g in groups} == labels  # the report groups by hardware
    page = report.write_all(run, tmp_path / "report")["html"].read_text()
    nodes_table = page[: page.index("<h2>Summary")]  # the nodes table at the top
    assert "Fake EPYC 9654" in nodes_table and "Fake Xeon 8480" in nodes_table
    assert "<td class=l>H100</td>" in nodes_table  # the H100 class's GPUs column


def test_tuning_candidates_are_measured_on_the_targets_hardware_class(cluster, tmp_path, monkeypatch):
    """kiln compile --tune --cluster: a product's candidates measured on the H100 class's nodes."""
    import numpy as np
    from onnx import TensorProto, helper

    from kiln import tune
    from kiln.backends import parse
    from kiln.driver.options import CompileOptions
    from kiln.driver.pipeline import graph_stages
    from kiln.frontend.onnx import import_onnx
    from kiln.tune.remote import ClusterMeasurer, selectors_for

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))  # a tuning database of its own
    assert selectors_for("cpu:avx2", ["gpu=H100"]) == ["gpu=H100", "isa=avx2"]
    weight = helper.make_tensor("w", TensorProto.FLOAT, [96, 80], np.ones(96 * 80, np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 80])],
        initializer=[weight],
    )
    imported = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    optimized = graph_stages(imported, {}, parse("cpu:avx2"), CompileOptions.from_env(level=2))
    measurer = ClusterMeasurer(cluster[0].address, "cpu:avx2", ["gpu=H100"])
    assert len(measurer.nodes) == 2 and "H100" in measurer.label
    outcomes = tune.tune(optimized, 60.0, target="cpu:avx2", measurer=measurer, runs=3)
    assert len(outcomes) == 1 and outcomes[0].measured >= 2
    h100 = {n["node_id"] for n in measurer.nodes}
    assert measurer.measured_on and set(measurer.measured_on) <= h100
    assert len(measurer.measured_on) == 1  # every candidate of one kernel on one node


def test_kiln_compile_tunes_on_the_cluster_and_bench_lists_its_nodes(cluster, tiny_onnx, tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from kiln.cli import main

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    address = cluster[0].address
    args = ["compile", tiny_onnx, "-o", str(tmp_path / "m.kiln"), "--target", "cpu:avx2", "--tune", "40s"]
    result = runner.invoke(main, [*args, "--cluster", address, "--on", "gpu=H100"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "measuring on 2 node(s) of" in result.output and "H100" in result.output
    assert "tuned 2 kernel(s)" in result.output and (tmp_path / "m.kiln").exists()
    missing = runner.invoke(main, [*args, "--cluster", address, "--on", "gpu=A100"])
    assert missing.exit_code != 0 and "no live node" in missing.output
    nodes = runner.invoke(main, ["bench", "nodes", "--cluster", address, "--on", "gpu=H100", "--json"])
    assert nodes.exit_code == 0 and len(json.loads(nodes.output)) == 2


def _kill_later(cluster, node, delay: float) -> threading.Thread:
    def kill() -> None:
        time.sleep(delay)
        cluster.remove_node(node, allow_graceful=False)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def test_a_node_killed_mid_job_is_retried_on_its_class_or_reported(cluster, tiny_onnx, tmp_path):
    address, members = cluster[0].address, cluster[1]
    # H100 class: two nodes busy with one slow job each; one dies: its job runs again on the other
    killer = _kill_later(cluster[0], members["h100-a"], 2.0)
    run = fleet.run_fleet(_config(tiny_onnx, ["fake-slow", "fake-sluggish"]), address, ["gpu=H100"])
    killer.join()
    records = run["records"]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    assert max(r["attempts"] for r in records) == 2  # the lost job, run again
    assert {r["node"]["node_id"] for r in records if r["attempts"] == 2} != {members["h100-a"].unique_id}
    # Xeon class: its only node dies mid-job: that job and the class's others fail with the reason
    killer = _kill_later(cluster[0], members["xeon"], 2.0)
    run = fleet.run_fleet(_config(tiny_onnx, ["fake-slow", "kiln"]), address, ["cpu=fake xeon"])
    killer.join()
    records = run["records"]
    assert len(records) == 2 and all(r["status"] == "failed" for r in records), [
        (r["backend"], r["status"], r.get("error"), r["attempts"]) for r in records
    ]
    assert all("lost mid-job" in r["error"] and "no other node of its class" in r["error"] for r in records)
    paths = report.write_all(run, tmp_path / "report-b")  # the report is still written
    assert "lost mid-job" in paths["html"].read_text()
