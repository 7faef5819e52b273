import json
import sqlite3

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from kiln.bench import report, store
from kiln.bench.runner import BenchConfig, run_bench
from kiln.cli import main
from tests.helpers import FLOAT, make_model

PLUGIN = "tests.bench.fake_backends"


@pytest.fixture(scope="module")
def run(tiny_onnx, tmp_path_factory):
    pytest.importorskip("onnxruntime", reason="onnxruntime (the 'peers' extra) is one of the compared backends")
    config = BenchConfig(
        models=[tiny_onnx],
        backends=["kiln", "onnxruntime", "torch", "fake-crash", "fake-hang", "fake-leak", "fake-error", "fake-missing"],
        duration=1.0,
        min_iterations=300,
        warmup=1,
        timeout=20,
        plugins=[PLUGIN],
    )
    return run_bench(config, tmp_path_factory.mktemp("work"))


def _record(run, backend):
    return next(r for r in run["records"] if r["backend"] == backend)


def test_every_job_is_a_row_whatever_happened(run):
    status = {r["backend"]: r["status"] for r in run["records"]}
    assert status == {
        "kiln": "ok",
        "onnxruntime": "ok",
        "torch": "unavailable",
        "fake-crash": "crash",
        "fake-hang": "timeout",
        "fake-leak": "ok",
        "fake-error": "error",
        "fake-missing": "unavailable",
    }
    assert "exited with code 7" in _record(run, "fake-crash")["error"]
    assert "ValueError: this backend cannot compile anything" in _record(run, "fake-error")["error"]
    assert "imaginary-package" in _record(run, "fake-missing")["error"]
    assert "torch module" in _record(run, "torch")["error"]


def test_metrics_of_a_good_run(run):
    record = _record(run, "onnxruntime")
    assert record["compile_s"] > 0 and record["load_s"] > 0 and record["first_run_ms"] > 0
    assert record["latency_ms"]["n"] >= 300 and record["latency_ms"]["p50"] <= record["latency_ms"]["p99"]
    assert record["peak_rss_mb"] > 10
    assert record["agreement"]["rel_l2"] < 1e-5  # against kiln's reference interpreter
    assert record["config"]["threads"] == 2 and record["inflight"] == 1
    assert record["cpus"]  # pinned
    assert "unavailable" in record["energy"] or "joules_per_inference" in record["energy"]
    assert abs(_record(run, "kiln")["rss_growth_mb_per_1k"]) < 1.0


def test_a_leaking_backend_is_flagged(run):
    growth = _record(run, "fake-leak")["rss_growth_mb_per_1k"]
    assert growth == pytest.approx(1000, rel=0.2)  # 1 MB per inference
    assert any("fake-leak" in line and "leak suspected" in line for line in report.notes(run))


def test_reports_are_written(run, tmp_path):
    paths = report.write_all(run, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["machine"]["cpu"] and data["machine"]["packages"]["onnx"] != "not installed"
    assert len(data["records"]) == 8
    header = paths["csv"].read_text().splitlines()[0]
    assert "latency_ms.p50" in header and "backend" in header
    html = paths["html"].read_text()
    assert "data:image/png;base64," in html and "fake-crash" in html
    table = report.terminal_table(run)
    assert table.row_count == 6  # the two unavailable backends are one note line each, not rows
    assert sum(line.startswith("unavailable: ") for line in report.notes(run)) == 2


def test_store_and_compare(run, tmp_path):
    db = tmp_path / "results.db"
    run = json.loads(json.dumps(run))
    for record in run["records"]:
        if record["status"] == "ok":
            record["latency_ms"]["cv"] = 0.01  # a quiet machine: a 2x change is beyond the noise band
    store.save_run(db, run)
    slower = json.loads(json.dumps(run))
    slower["run_id"] = "later"
    for record in slower["records"]:
        if record["status"] == "ok":
            record["latency_ms"]["p50"] *= 2
    store.save_run(db, slower)
    assert [row[0] for row in store.list_runs(db)] == sorted([run["run_id"], "later"], key=lambda r: r != run["run_id"])
    rows = store.compare(store.load_records(db, run["run_id"]), store.load_records(db, "later"))
    assert rows and all(row["verdict"] == "slower" and row["change"] == pytest.approx(1.0) for row in rows)
    same = store.compare(store.load_records(db, run["run_id"]), store.load_records(db, run["run_id"]))
    assert all(row["verdict"] == "within noise" for row in same)
    with pytest.raises(Exception, match="no run 'nope'"):
        store.load_records(db, "nope")


def test_corrupt_database_is_reported_not_overwritten(run, tmp_path):
    db = tmp_path / "results.db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(store.CorruptDatabase, match="unreadable.*not modified"):
        store.save_run(db, run)
    assert db.read_bytes() == b"this is not sqlite" * 100
    sqlite3.connect(tmp_path / "fresh.db").close()


def test_interrupt_keeps_finished_records(tiny_onnx, tmp_path):
    config = BenchConfig(models=[tiny_onnx], backends=["kiln", "kiln"], duration=0.1, min_iterations=1, agreement=False)
    seen = []

    def progress(message, record):
        if record is not None:
            seen.append(record)
            raise KeyboardInterrupt

    result = run_bench(config, tmp_path, progress)
    assert result["interrupted"] is True
    assert len(result["records"]) == 1 and result["records"][0]["status"] == "ok"


def test_accuracy_on_an_image_folder(tmp_path):
    from PIL import Image

    from kiln.bench.dataset import accuracy
    from kiln.bench.models import BenchModel

    colours = {"blue": (0, 0, 255), "green": (0, 255, 0), "red": (255, 0, 0)}
    for name, rgb in colours.items():
        (tmp_path / "data" / name).mkdir(parents=True)
        for index in range(3):
            Image.new("RGB", (12, 12), rgb).save(tmp_path / "data" / name / f"{index}.png")
    # Mean colour per channel, reordered to the sorted class order (blue, green, red).
    permutation = np.array([[0, 0, 1], [0, 1, 0], [1, 0, 0]], np.float32)
    model = make_model(
        [
            helper.make_node("GlobalAveragePool", ["x"], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("MatMul", ["f", "perm"], ["y"]),
        ],
        [("x", FLOAT, ["batch", 3, 8, 8])],
        [("y", FLOAT, None)],
        {"perm": permutation},
    )
    path = tmp_path / "colour.onnx"
    onnx.save(model, path)
    import kiln

    compiled = kiln.compile(str(path))
    result = accuracy(
        lambda feeds: list(compiled.run(feeds).values()),
        str(tmp_path / "data"),
        BenchModel("colour", 1, path=str(path)),
    )
    assert result == {"top1": 1.0, "images": 9, "classes": 3}
    seen = []

    def last_is_red(feeds):  # batch 4 over 9 images: the ninth (red) padded with copies of itself
        seen.append(feeds["x"].shape[0])
        out = np.asarray(compiled.run(feeds)["y"])
        return [out if len(seen) < 3 else np.tile(np.float32([[0, 0, 1]]), (4, 1))]

    batched = accuracy(last_is_red, str(tmp_path / "data"), BenchModel("colour", 4, path=str(path)))
    assert seen == [4, 4, 4] and batched == {"top1": 1.0, "images": 9, "classes": 3}  # every image, once
    with pytest.raises(Exception, match="expected one sub-folder per class"):
        accuracy(None, str(tmp_path / "data" / "red"), BenchModel("colour", 1, path=str(path)))


def test_cli_names_valid_choices(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["bench", "-b", "warp-drive", "--out", str(tmp_path)])
    assert (
        result.exit_code != 0
        and "unknown backend(s) ['warp-drive']; available: kiln, kiln-avx2, kiln-bf16, kiln-int8, kiln-reference, kiln-served, kiln-c, "
        "onnxruntime, onnxruntime-int8, onnxruntime-served, openvino, openvino-bf16, openvino-int8"
        in str(result.exception)
    )
    result = runner.invoke(main, ["bench", "-m", "resnet9000", "--out", str(tmp_path)])
    assert "unknown model 'resnet9000'; available: resnet50" in str(result.exception)
    result = runner.invoke(main, ["bench", "-s", "batchy", "--out", str(tmp_path)])
    assert "unknown scenario(s) ['batchy']" in str(result.exception)


def test_cli_end_to_end_writes_reports(tiny_onnx, tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime (the 'peers' extra) is one of the compared backends")
    runner = CliRunner()
    args = [
        "bench",
        "-m",
        tiny_onnx,
        "-b",
        "kiln,onnxruntime",
        "-s",
        "single-stream,offline",
        "--batch",
        "1",
        "--batch",
        "4",
        "-d",
        "0.2",
        "--out",
        str(tmp_path),
    ]
    result = runner.invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    latest = tmp_path / "latest"
    data = json.loads((latest / "results.json").read_text())
    assert len(data["records"]) == 8 and all(r["status"] == "ok" for r in data["records"])
    offline = [r for r in data["records"] if r["scenario"] == "offline"]
    assert all(r["inflight"] == 2 and r["throughput"] > 0 for r in offline)
    html = (latest / "report.html").read_text()
    assert html.count("<img") == 5  # the summary, latency, CDF, throughput vs batch, compile time
    listing = runner.invoke(main, ["bench", "--out", str(tmp_path), "runs"])
    assert data["run_id"] in listing.output
    compare = runner.invoke(main, ["bench", "--out", str(tmp_path), "compare", data["run_id"], data["run_id"]])
    assert compare.exit_code == 0 and "within noise" in compare.output
    runs = json.loads(runner.invoke(main, ["bench", "--out", str(tmp_path), "runs", "--json"]).output)
    assert data["run_id"] in [r["run_id"] for r in runs]
    rows = runner.invoke(main, ["bench", "--out", str(tmp_path), "compare", data["run_id"], data["run_id"], "--json"])
    assert rows.exit_code == 0 and all(r["verdict"] == "within noise" for r in json.loads(rows.output))


def test_report_renders_in_a_browser(run, tmp_path):
    from benchmarks.render_report import find_browser, render

    if find_browser() is None:
        pytest.skip("no headless Chromium here (apt-get install chromium) to render the report")
    from PIL import Image

    paths = report.write_all(run, tmp_path)
    png = tmp_path / "report.png"
    render(paths["html"], png, width=1400, height=1800)
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("L"), dtype=np.float32)
    assert image.size == (1400, 1800)
    assert pixels.std() > 10  # text, table and plots, not a blank page
    assert (pixels < 128).mean() > 0.01


def test_a_model_one_backend_cannot_load_is_that_backends_row(tmp_path):
    # onnx 1.23 writes IR version 14 by default; a backend that refuses it is a row with its reason
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "ir14",
        [helper.make_tensor_value_info("x", FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert model.ir_version >= 11
    path = tmp_path / "ir14.onnx"
    onnx.save(model, path)
    config = BenchConfig(
        models=[str(path)],
        backends=["kiln", "fake-refuses-ir14"],
        duration=0.1,
        min_iterations=1,
        agreement=False,
        plugins=[PLUGIN],
    )
    records = {r["backend"]: r for r in run_bench(config, tmp_path / "work")["records"]}
    assert records["kiln"]["status"] == "ok"
    assert records["fake-refuses-ir14"]["status"] == "error"
    assert "IR version" in records["fake-refuses-ir14"]["error"]


def test_missing_or_broken_peers_are_rows_not_crashes(tiny_onnx, tmp_path):
    config = BenchConfig(
        models=[tiny_onnx],
        backends=["fake-missing-subpackage", "fake-broken-check", "iree", "tvm"],
        plugins=[PLUGIN],
        agreement=False,
    )
    records = {r["backend"]: r for r in run_bench(config, tmp_path)["records"]}
    assert records["fake-missing-subpackage"]["status"] == "unavailable"
    assert "no_such_package.compiler" in records["fake-missing-subpackage"]["error"]
    assert records["fake-broken-check"]["status"] == "unavailable"
    assert "driver query exploded" in records["fake-broken-check"]["error"]
    assert records["iree"]["status"] in ("unavailable", "ok", "error")


@pytest.mark.parametrize("backend", ["tvm", "iree"])
def test_heavy_peers_run_when_installed(tiny_onnx, tmp_path, backend):
    from kiln.bench.backends import backend_class

    reason = backend_class(backend)(2).availability()
    if reason:
        pytest.skip(f"{backend} is an optional extra (make peers-heavy): {reason}")
    config = BenchConfig(models=[tiny_onnx], backends=[backend], duration=0.2, min_iterations=3)
    (record,) = run_bench(config, tmp_path)["records"]
    assert record["status"] == "ok", record.get("error")
    assert record["agreement"]["rel_l2"] < 1e-5 and record["compile_s"] > 0


def test_a_kiln_job_leaves_the_temporary_directory_as_it_was(tiny_onnx, tmp_path, monkeypatch):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))  # the job's worker process writes its temporaries here
    config = BenchConfig(models=[tiny_onnx], backends=["kiln"], duration=0.2, min_iterations=3)
    (record,) = run_bench(config, tmp_path / "work")["records"]
    assert record["status"] == "ok", record
    assert list(temporary.iterdir()) == []


def test_bench_fails_when_no_job_succeeds(tiny_onnx, tmp_path):
    args = ["bench", "-m", tiny_onnx, "-b", "fake-error,fake-crash", "-d", "0.1", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--plugin", PLUGIN], catch_exceptions=False)
    assert result.exit_code == 1 and "no job succeeded" in result.output, result.output
    assert (tmp_path / "latest" / "results.json").exists()  # the report is still written


def test_kilns_compile_time_is_cold_with_its_cached_time_beside_it(tiny_onnx, tmp_path):
    config = BenchConfig(models=[tiny_onnx], backends=["kiln"], duration=0.2, min_iterations=3)
    (record,) = run_bench(config, tmp_path)["records"]
    assert record["status"] == "ok", record
    assert record["compile_s"] == record["compile_cold_s"] > 0 and record["compile_cached_s"] > 0
    assert isinstance(record["plan_cache_hit"], bool)
    assert "cached compile s" in [name for name, _ in report.COLUMNS]


def test_the_kiln_c_row_runs_the_c_library_and_times_it_without_python(tiny_onnx, tmp_path):
    """kiln-c: the model as its C library (queries through its C API), agreeing with the reference,
    and a C driver's timing of the library beside the row (the report says what Python adds)."""
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the C library cannot be built here")
    config = BenchConfig(models=[tiny_onnx], backends=["kiln-c"], duration=0.2, min_iterations=3)
    run = run_bench(config, tmp_path)
    (record,) = run["records"]
    assert record["status"] == "ok", record
    native = record["native_latency_ms"]
    assert 0 < native["p50"] <= native["p90"] and native["calls"] >= 30 and native["python_p50"] > 0
    assert any(line.startswith("kiln-c / ") and "no Python in the loop" in line for line in report.notes(run))
    assert not list(tmp_path.glob("kiln-c-*"))  # (its folder is made elsewhere and removed with its session)


def test_soak_estimates_rss_growth_from_a_long_run(tiny_onnx, tmp_path):
    short = BenchConfig(models=[tiny_onnx], backends=["kiln"], duration=1e-6, min_iterations=3)
    (record,) = run_bench(short, tmp_path / "short")["records"]
    assert record["rss_growth_mb_per_1k"] is None and record["rss_growth_note"].startswith("run too short")
    soaked = BenchConfig(models=[tiny_onnx], backends=["kiln"], duration=0.05, min_iterations=3, soak=2000)
    (record,) = run_bench(soaked, tmp_path / "soak")["records"]
    low, high = record["rss_growth_ci95"]
    assert record["soak_inferences"] == 2000 and low <= record["rss_growth_mb_per_1k"] <= high
    assert abs(record["rss_growth_mb_per_1k"]) < 1.0  # kiln does not leak


def test_kiln_backends_name_their_target_and_say_when_this_cpu_cannot_run_it():
    from kiln.backends.cpu import runnable_isas
    from kiln.bench.backends import backend_class

    avx2 = backend_class("kiln-avx2")(threads=1)
    assert avx2.config()["target"] == "cpu:avx2" and avx2.native
    if "avx2" in runnable_isas():
        assert avx2.availability() is None
    else:
        assert "cannot run on this machine" in avx2.availability()
    foreign = backend_class("kiln")(threads=1)
    foreign.target = "cpu:neon" if "neon" not in runnable_isas() else "cpu:avx512"
    if foreign.target.split(":")[1] not in runnable_isas():
        assert "cannot run on this machine" in foreign.availability()
    assert not backend_class("kiln-reference")(threads=1).native


def test_a_jobs_temporary_files_are_removed_however_it_ends(tiny_onnx, tmp_path):
    """Backends write their artifacts to temporary files (a .kiln, an .ort.onnx: 0.5 GB for VGG);
    each job gets a folder of its own, removed after the worker ends, crashed or not."""
    import glob
    import tempfile

    before = set(glob.glob(f"{tempfile.gettempdir()}/*.kiln")) | set(glob.glob(f"{tempfile.gettempdir()}/*.ort.onnx"))
    config = BenchConfig(
        models=[tiny_onnx], backends=["kiln", "onnxruntime", "fake-crash"], duration=0.1, min_iterations=2,
        agreement=False, plugins=[PLUGIN],
    )  # fmt: skip
    records = run_bench(config, tmp_path)["records"]
    assert [r["status"] for r in records][:1] == ["ok"] and records[2]["status"] == "crash"
    assert not list(tmp_path.glob("job-*")), list(tmp_path.iterdir())
    after = set(glob.glob(f"{tempfile.gettempdir()}/*.kiln")) | set(glob.glob(f"{tempfile.gettempdir()}/*.ort.onnx"))
    assert after <= before, sorted(after - before)


def test_the_server_rate_is_measured_over_a_real_window_of_concurrent_runs():
    """Two requests in flight, each 20 ms (sleeping: they overlap): 20 ms per request per thread.
    (The window once started before the median that sized it was measured: ~0 s, a rate no
    backend could serve, and every Server row INVALID with latencies of minutes.)"""
    import time

    from kiln.bench.worker import _expected_seconds

    seconds = _expected_seconds(lambda feeds: time.sleep(0.02), [{}], 2)
    assert 0.018 <= seconds <= 0.04, seconds


def test_a_variable_batch_server_run_compiles_nothing_while_it_runs(tiny_onnx, tmp_path):
    """--variable-batch 1..16: queries of several batch sizes; kiln declared the range when it
    compiled (the MLP's batch is sample-parallel), so the run adds no compiled variant."""
    pytest.importorskip("mlperf_loadgen", reason="LoadGen (mlcommons-loadgen) issues the Server scenario")
    from kiln.bench.worker import variable_batches

    config = BenchConfig(
        models=[tiny_onnx],
        backends=["kiln"],
        scenarios=["server"],
        variable_batch="1..16",
        duration=0.5,
        min_iterations=20,
        warmup=1,
        timeout=120,
    )
    record = run_bench(config, tmp_path / "work")["records"][0]
    assert record["status"] == "ok", record.get("error")
    assert record["batch_range"] == [1, 16] and record["compiles_during_run"] == 0
    assert record["agreement"]["rel_l2"] < 1e-5
    sizes = variable_batches(1, 16)
    assert min(sizes) == 1 and max(sizes) == 16 and len(set(sizes)) > 2
    with pytest.raises(Exception, match="not a range"):
        BenchConfig(models=[tiny_onnx], backends=["kiln"], variable_batch="16").validate()
