"""``kiln study``: the grid, its identity and resume, the OOM that ends a sweep, the analysis
(knees, breaking points, scaling, best configurations, Pareto front) and the report."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from kiln.bench import analysis, store
from kiln.bench import study as studies
from kiln.bench.study_report import write_study_html
from kiln.cli import main

PLUGIN = "tests.bench.fake_backends"


def _config(model: str, **changes) -> studies.StudyConfig:
    settings = {
        "models": [model],
        "backends": ["kiln"],
        "threads": [1],
        "batches": [1, 2, 4],
        "duration": 0.2,
        "min_iterations": 2,
        "agreement": False,
        "breakdown": False,
        "plugins": [PLUGIN],
    }
    settings.update(changes)
    return studies.StudyConfig(**settings)


# -- the grid ----------------------------------------------------------------------------------------


def test_points_run_per_variant_and_threads_with_batch_upward():
    config = _config("m.onnx", backends=["kiln", "torch"], precisions=["fp32", "int8"], threads=[2, 1], batches=[4, 1])
    grid = studies.points(config)
    assert len(grid) == 2 * 2 * 2 * 2
    assert [(p.backend, p.precision, p.threads, p.batch) for p in grid[:4]] == [
        ("kiln", "fp32", 2, 1),
        ("kiln", "fp32", 2, 4),
        ("kiln", "fp32", 1, 1),
        ("kiln", "fp32", 1, 4),
    ]
    assert studies.variant("kiln", "int8") == "kiln-int8"
    assert studies.variant("onnxruntime", "int8") == "onnxruntime-int8"
    assert studies.variant("torch", "int8") is None  # no such variant: its points say so
    assert "kiln-int8" not in studies.base_backends() and "kiln" in studies.base_backends()


def test_a_study_is_named_by_its_settings_and_machine_not_its_grid():
    machine = {"cpu": "x", "flags": ["avx2"], "usable_cpus": 2}
    first = studies.study_id(_config("a.onnx"), machine)
    assert studies.study_id(_config("a.onnx", batches=[1, 2, 4, 8], backends=["onnxruntime"]), machine) == first
    assert studies.study_id(_config("a.onnx", duration=2.0), machine) != first  # not comparable
    assert studies.study_id(_config("a.onnx"), {**machine, "cpu": "y"}) != first  # another machine


def test_given_weights_are_known_by_their_contents(tmp_path):
    machine = {"cpu": "x"}
    (tmp_path / "a.pth").write_bytes(b"same")
    (tmp_path / "b.pth").write_bytes(b"same")
    (tmp_path / "c.pth").write_bytes(b"other")
    ids = {
        name: studies.study_id(_config("resnet50", weights={"resnet50": str(tmp_path / name)}), machine)
        for name in ("a.pth", "b.pth", "c.pth")
    }
    assert ids["a.pth"] == ids["b.pth"] != ids["c.pth"]


def test_the_report_sets_top1_of_given_weights_beside_the_published_figure():
    from kiln.bench.study_report import _weights_section

    record = _record(8, 100.0, accuracy={"top1": 0.7612, "images": 5000, "classes": 1000})
    record |= {"model": "resnet50", "model_given": "resnet50"}
    page = _weights_section([record], {"weights": {"resnet50": "/w/r50.pth"}})
    assert "76.12% (5000 images)" in page and "IMAGENET1K_V1 76.13%" in page and "-0.01 pt" in page
    assert "no point measured top-1" in _weights_section([_record(1, 5.0)], {"weights": {"resnet50": "/w"}})


def test_reproduce_names_the_one_bench_job():
    point = studies.Point("resnet50", "kiln", "int8", 8, 2, "offline", 4)
    command = studies.reproduce(point, _config("resnet50", memory_limit_mb=2000))
    assert command.startswith("kiln bench -m resnet50 -b kiln-int8 --batch 8 --threads 2 -s offline --inflight 4")
    assert "--memory-limit 2000" in command


# -- the analysis on figures made up to have known answers --------------------------------------------


def _record(batch, p50, threads=1, backend="kiln", precision="fp32", p99=None, status="ok", **extra):
    return {
        "model": "m",
        "backend": backend if precision == "fp32" else f"{backend}-{precision}",
        "base_backend": backend,
        "precision": precision,
        "batch": batch,
        "threads": threads,
        "scenario": "single-stream",
        "status": status,
        "latency_ms": {"p50": p50, "p99": p99, "max": p50 * 1.1} if status == "ok" else {},
        "throughput": 1e3 * batch / p50 if status == "ok" else None,
        "peak_rss_mb": 100.0 + batch,
        **extra,
    }


def test_knee_is_where_throughput_stops_growing_and_a_straight_line_has_none():
    assert analysis.knee([1, 2, 4, 8, 16, 32], [10, 19, 34, 38, 39, 39.5]) == 4
    assert analysis.knee([1, 2, 4, 8], [1, 2, 3, 4]) is None  # as fast at the end as at the start
    assert analysis.knee([1, 2], [1, 5]) is None  # two points have no knee


def test_breaking_point_per_sample_latency_tail_bound_and_oom():
    # per-sample latency 10, 6, 4, 3.875: batch 8 improves 3.1% on batch 4, not more than 5%
    records = [_record(1, 10.0), _record(2, 12.0), _record(4, 16.0), _record(8, 31.0)]
    (curve,) = analysis.curves(records, latency_bound_ms=1000)
    assert curve.breaking["batch"] == 8 and "per-sample latency 3% better from batch 4" in curve.breaking["reason"]
    assert set(curve.breaking["events"]) == {"plateau"}
    (curve,) = analysis.curves(records, latency_bound_ms=15)  # batch 4's max (17.6 ms) crosses 15 ms first
    assert (curve.breaking["batch"], curve.breaking["reason"]) == (4, "max 17.6 ms > the 15 ms bound")
    assert curve.breaking["events"]["plateau"]["batch"] == 8  # each event kept
    scaling = [_record(1, 10.0), _record(2, 12.0), _record(4, 0, status="oom")]
    (curve,) = analysis.curves(scaling, latency_bound_ms=1000)
    assert (curve.breaking["batch"], curve.breaking["reason"]) == (4, "out of memory")


def test_thread_knee_and_throughput_per_watt():
    records = [_record(1, 40.0, threads=1), _record(1, 21.0, threads=2), _record(1, 12.0, threads=4)]
    records += [_record(1, 11.5, threads=8)]  # 25, 48, 83, 87 samples/s: flat past 4 threads
    assert {r["knee_threads"] for r in analysis.scaling(records)} == {4}
    lean = _record(4, 20.0, backend="onnxruntime", energy={"joules_per_inference": 0.5})  # 8 samples per joule
    hungry = _record(8, 30.0, energy={"joules_per_inference": 2.0})  # 4 samples per joule
    best = {(r["variant"], r["objective"]): r["record"] for r in analysis.best([lean, hungry])}
    assert analysis.samples_per_joule(best[("onnxruntime fp32", "throughput per watt")]) == 8.0
    (win,) = [w for w in analysis.winners([lean, hungry]) if w["objective"] == "throughput per watt"]
    assert win["ranked"][0]["variant"] == "onnxruntime fp32"
    assert analysis.margin(win["ranked"][0]["record"], win["ranked"][1]["record"], "throughput per watt") == 2.0


def test_speedup_best_configuration_and_pareto_front():
    records = [
        _record(1, 10.0, threads=1),
        _record(1, 6.0, threads=2),
        _record(8, 40.0, threads=2),  # 200 samples/s
        _record(1, 8.0, threads=2, backend="onnxruntime"),
        _record(8, 32.0, threads=2, backend="onnxruntime"),  # 250 samples/s
    ]
    (_, row2) = [r for r in analysis.scaling(records) if r["variant"] == "kiln fp32"]
    assert (row2["threads"], round(row2["speedup"], 3), round(row2["efficiency"], 3)) == (2, 1.667, 0.833)
    best = {(r["variant"], r["objective"]): r["record"] for r in analysis.best(records)}
    assert best[("kiln fp32", "latency")]["latency_ms"]["p50"] == 6.0
    assert best[("onnxruntime fp32", "throughput")]["batch"] == 8
    assert best[("kiln fp32", "throughput per watt")] is None  # no energy measured
    wins = {w["objective"]: w["ranked"] for w in analysis.winners(records)}
    assert wins["latency"][0]["variant"] == "kiln fp32"
    assert analysis.margin(wins["latency"][0]["record"], wins["latency"][1]["record"], "latency") == pytest.approx(
        8 / 6
    )
    assert wins["throughput"][0]["variant"] == "onnxruntime fp32"
    front = analysis.pareto(records)
    # onnxruntime at batch 1 (8 ms, 125/s) is beaten by kiln at batch 1 (6 ms, 167/s) on both
    assert [(r["backend"], r["batch"], r["latency_ms"]["p50"]) for r in front] == [
        ("kiln", 1, 6.0),
        ("onnxruntime", 8, 32.0),
    ]


# -- end to end ---------------------------------------------------------------------------------------


def test_an_interrupted_study_resumes_without_running_stored_points(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    db = tmp_path / "results.db"
    config = _config(tiny_onnx)
    found = studies.open_study(config, tmp_path, db)
    finished = []

    def interrupt_after_one(message, record):
        if record is not None:
            finished.append(record)
            raise KeyboardInterrupt  # Ctrl-C while the next point would start

    run = studies.run_study(found, interrupt_after_one)
    assert run["interrupted"] and len(finished) == 1 and finished[0]["status"] == "ok"
    assert len(store.load_records(db, found.id)) == 1  # stored as it finished

    again = studies.open_study(config, tmp_path, db)
    assert again.id == found.id and [p.batch for p in again.remaining()] == [2, 4]
    ran = []
    run = studies.run_study(again, lambda message, record: record is not None and ran.append(record["batch"]))
    assert ran == [2, 4] and not run["interrupted"]
    assert [r["batch"] for r in run["records"]] == [1, 2, 4] and all(r["status"] == "ok" for r in run["records"])
    assert run["records"][1]["compile_warm"] is True  # one cold compile per model and backend

    extended = studies.open_study(_config(tiny_onnx, batches=[1, 2, 4, 8]), tmp_path, db)
    assert [p.batch for p in extended.remaining()] == [8]  # a grown grid runs only its new point
    path = tmp_path / "report.html"
    write_study_html(run, path, "kiln study ...")
    page = path.read_text()
    assert "Answers" in page and "best throughput" in page and "kiln bench -m" in page


@pytest.mark.skipif(sys.platform != "linux", reason="the memory limit is RLIMIT_AS (Linux)")
def test_an_out_of_memory_point_ends_that_backends_sweep_and_the_study_goes_on(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    arguments = ["study", "-m", tiny_onnx, "-b", "fake-hungry", "--threads", "1,2", "--batch", "1,2,4"]
    arguments += ["--memory-limit", "3000", "--plugin", PLUGIN, "--out", str(tmp_path), "--no-breakdown"]
    arguments += ["--no-agreement", "--duration", "0.2", "--min-iterations", "2", "--json"]
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    records = json.loads((tmp_path / answer["study"] / "results.json").read_text())["records"]
    rows = {(r["threads"], r["batch"]): r for r in records}
    assert rows[(1, 1)]["status"] == "ok"
    assert rows[(1, 2)]["status"] == "oom" and "3000 MB" in rows[(1, 2)]["error"]
    for where in ((1, 4), (2, 2), (2, 4)):  # the larger batches, at every thread count
        assert rows[where]["status"] == "skipped" and "sweep ended (oom at batch 2)" in rows[where]["error"]
    assert rows[(2, 1)]["status"] == "ok"  # the study went on below the batch that ran out
    curves = {c["curve"]: c["breaking_point"] for c in answer["curves"]}
    one, two = curves["fake-hungry fp32, 1 thread(s)"], curves["fake-hungry fp32, 2 thread(s)"]
    assert (one["batch"], one["reason"]) == (2, "out of memory")
    assert (two["batch"], two["reason"]) == (2, "this backend's sweep ended (oom at batch 2)")
    assert "out of memory" in (tmp_path / answer["study"] / "report.html").read_text()


def test_kilns_breakdown_of_one_inference(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    found = studies.open_study(_config(tiny_onnx, batches=[2], breakdown=True), tmp_path, tmp_path / "r.db")
    run = studies.run_study(found, lambda message, record: None)
    (row,) = run["breakdowns"]
    assert row["status"] == "breakdown:ok", row
    assert row["ms_by_kind"]["matmul"] > 0 and row["arena_mb"] > 0
    raw = (16 * 32 + 32 * 10) * 4 / 1e6  # the weights as kiln's kernels read them: packed, maybe padded
    assert raw <= row["weights_mb"] < 4 * raw


def test_a_study_where_nothing_ran_exits_1_with_its_report(tiny_onnx, tmp_path):
    arguments = ["study", "-m", tiny_onnx, "-b", "fake-error", "--threads", "1", "--batch", "1", "--plugin", PLUGIN]
    result = CliRunner().invoke(main, [*arguments, "--out", str(tmp_path), "--no-agreement", "--no-breakdown"])
    assert result.exit_code == 1, result.output
    assert "no point of the study ran" in result.output
    (report,) = tmp_path.glob("study-*/report.html")
    assert "this backend cannot compile anything" in report.read_text()


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--precision", "fp8"], "unknown precision(s) ['fp8']"),
        (["-b", "nope"], "unknown backend(s) ['nope']"),
        (["--batch", "0"], "batch sizes must be 1 or more"),
        (["--weights", "resnet50"], "give MODEL=FILE"),
        (["--weights", "resnet50=/no/such/file.pth"], "weights file /no/such/file.pth"),
    ],
)
def test_a_mistake_is_a_named_error(tmp_path, arguments, message):
    result = CliRunner().invoke(main, ["study", "-m", "resnet50", "--out", str(tmp_path), *arguments])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_link_planted_in_the_studys_folder_is_never_followed(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "precious.txt"
    victim.write_text("keep me")
    config = _config(tiny_onnx, batches=[1], agreement=True)
    found = studies.open_study(config, tmp_path / "out", tmp_path / "r.db")
    (found.folder / "references").mkdir()
    from kiln.bench.models import file_digest

    label = f"tiny-{file_digest(tiny_onnx)[:8]}"  # a user's file is named by its contents' digest too
    planted = found.folder / "references" / f"reference-{label}-b1.npz"
    planted.symlink_to(victim)
    with pytest.raises(studies.StudyError, match="not a file kiln wrote"):
        studies.run_study(found, lambda message, record: None)
    planted.unlink()
    (found.folder / "report.html").symlink_to(victim)  # the report replaces a link, never writes through it
    run = studies.run_study(found, lambda message, record: None)
    write_study_html(run, found.folder / "report.html", "kiln study ...")
    assert victim.read_text() == "keep me" and not (found.folder / "report.html").is_symlink()
    linked = tmp_path / "linked"
    (tmp_path / "elsewhere").mkdir()
    linked.mkdir()
    (linked / found.id).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(studies.StudyError, match="not a folder kiln made"):
        studies.open_study(config, linked, tmp_path / "r2.db")
