"""``kiln study``: a grid of bench jobs over threads x batch x precision x scenario, resumable,
and its report (``kiln.bench.study``, ``kiln.bench.analysis``, ``kiln.bench.study_report``)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from kiln.cli_support import MAX_MEMORY_MB, console, dataset_option, out, split_values, weights_option


def _ints(name: str):  # type: ignore[no-untyped-def]
    def parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[int] | None:
        items = split_values(values)
        if not items:
            return None
        try:
            numbers = [int(item) for item in items]
        except ValueError:
            raise click.BadParameter(f"{', '.join(items)}: give whole numbers, e.g. 1,2,4") from None
        if min(numbers) < 1:
            raise click.BadParameter(f"{name} must be 1 or more")
        return sorted(set(numbers))

    return parse


DEFAULT_OUT = Path("reports/study")


@click.command("study")
@click.option(
    "--models", "-m", multiple=True, help="Zoo names or .onnx paths, comma-separated. [default: resnet50,bert-base]"
)
@click.option(
    "--backends",
    "-b",
    multiple=True,
    help="Backends by base name (kiln, onnxruntime, openvino, torch...); --precision picks each one's variant "
    "(kiln + int8 = kiln-int8). [default: kiln,onnxruntime,openvino]",
)
@click.option(
    "--threads", "-t", multiple=True, callback=_ints("threads"), help="Thread counts. [default: 1 and every usable CPU]"
)
@click.option(
    "--batch", "batches", multiple=True, callback=_ints("batch sizes"), help="Batch sizes. [default: 1,2,4,8,16,32]"
)
@click.option("--precision", "precisions", multiple=True, help="fp32, bf16, int8 (comma-separated). [default: fp32]")
@click.option(
    "--scenario", "-s", "scenarios", multiple=True, help="LoadGen scenarios (comma-separated). [default: single-stream]"
)
@click.option(
    "--inflight",
    multiple=True,
    callback=_ints("requests in flight"),
    help="Requests in flight for multi-stream, server and offline. [default: 2]",
)
@click.option(
    "--duration",
    "-d",
    type=click.FloatRange(0, min_open=True),
    default=1.0,
    show_default=True,
    help="Seconds of measurement per point.",
)
@click.option(
    "--min-iterations",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="At least this many measured runs per point.",
)
@click.option(
    "--warmup", type=click.IntRange(0), default=1, show_default=True, help="Unmeasured runs before measuring."
)
@click.option(
    "--seq", type=click.IntRange(1), default=None, help="Sequence length for bert-base and gpt2. [default: 128]"
)
@click.option(
    "--timeout",
    type=click.FloatRange(1),
    default=900.0,
    show_default=True,
    help="Seconds before a point's worker is killed (a timeout ends that backend's sweep).",
)
@click.option(
    "--memory-limit",
    "memory_limit_mb",
    type=click.IntRange(64, MAX_MEMORY_MB),
    default=None,
    help="Each worker's address space in MB (RLIMIT_AS): an out-of-memory point ends that backend's sweep.",
)
@click.option(
    "--latency-bound-ms",
    type=click.FloatRange(0, min_open=True),
    default=100.0,
    show_default=True,
    help="A tail latency (p99, or the maximum below 100 samples) past it is a breaking point.",
)
@dataset_option("Labelled image folder or 'digits' (as kiln bench --dataset): top-1 per point.")
@click.option("--dataset-limit", type=click.IntRange(1), default=None, help="Use at most this many dataset images.")
@weights_option(
    "A zoo model's state_dict (torchvision's names); with --dataset the report compares top-1 with the "
    "published figure. Repeatable."
)
@click.option("--no-agreement", is_flag=True, help="Skip comparing outputs with kiln's reference interpreter.")
@click.option(
    "--no-breakdown",
    is_flag=True,
    help="Skip kiln's per-kernel-kind breakdown (one profiled inference per kiln variant).",
)
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Run again the stored points that failed (error, crash, timeout, oom, skipped).",
)
@click.option("--report-only", is_flag=True, help="Write the report from the stored points; run nothing.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Reports land in OUT/<study id>/ (and OUT/latest).",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="SQLite results database. [default: OUT/results.db]",
)
@click.option("--plugin", "plugins", multiple=True, help="Python module to import first (may register backends).")
@click.option("--json", "as_json", is_flag=True, help="Print the answers and best configurations as JSON on stdout.")
def study(**options: Any) -> None:
    """Sweep run-time parameters (threads x batch x precision x scenario) for models and backends:
    each point a normal kiln bench job (its own process, MLPerf LoadGen), stored as it finishes;
    then a report of scaling curves, knees, breaking points, best configurations and the Pareto
    front. Run the same command again to resume an interrupted study (stored points are not run
    again) or to add points to it.

    \b
    Examples:
      kiln study -m resnet50,bert-base -b kiln,onnxruntime,openvino --threads 1,2 \\
          --batch 1,2,4,8,16,32 --precision fp32,int8
      kiln study -m digits-cnn -b kiln,onnxruntime --dataset digits --batch 1,8,64
      kiln study -m resnet50 -b kiln --batch 1,64,256 --memory-limit 2000
    """
    from kiln.bench import study as studies
    from kiln.errors import KilnError

    try:  # everything here is what the user asked: a mistake is a usage error (exit 2)
        config = _config(options)
        found = studies.open_study(config, options["out"], options["db"] or options["out"] / "results.db")
    except KilnError as err:
        raise click.UsageError(str(err)) from None
    if options["report_only"] and not found.done:
        raise click.UsageError(f"--report-only: no point of this study ({found.id}) is stored in the database yet")
    _run_and_report(found, options)


def _config(options: dict[str, Any]):  # type: ignore[no-untyped-def]
    from kiln.bench import study as studies

    return studies.StudyConfig(
        models=split_values(options["models"]) or ["resnet50", "bert-base"],
        backends=split_values(options["backends"]) or ["kiln", "onnxruntime", "openvino"],
        precisions=split_values(options["precisions"]) or ["fp32"],
        threads=options["threads"] or _default_threads(),
        batches=options["batches"] or [1, 2, 4, 8, 16, 32],
        scenarios=split_values(options["scenarios"]) or ["single-stream"],
        inflight=options["inflight"] or [2],
        duration=options["duration"],
        min_iterations=options["min_iterations"],
        warmup=options["warmup"],
        seq=options["seq"],
        timeout=options["timeout"],
        memory_limit_mb=options["memory_limit_mb"],
        latency_bound_ms=options["latency_bound_ms"],
        dataset=options["dataset"],
        dataset_limit=options["dataset_limit"],
        weights=options["weights"],
        agreement=not options["no_agreement"],
        breakdown=not options["no_breakdown"],
        plugins=list(options["plugins"]),
    )


def _run_and_report(found, options: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    from kiln.bench.study_report import write_study_html

    out_dir: Path = options["out"]
    db: Path = options["db"] or out_dir / "results.db"
    from kiln.bench.study import command as study_command

    command = study_command(found.config) + (f" --out {shlex.quote(str(out_dir))}" if out_dir != DEFAULT_OUT else "")
    if options["report_only"]:
        run = found.stored()
    else:
        run = _run_with_progress(found, options["retry_failed"])
    from kiln.integrity import write_atomically

    path = found.folder / "report.html"
    write_study_html(run, path, command)  # written beside, then renamed: a link planted there is replaced, not followed
    write_atomically(found.folder / "results.json", json.dumps(run, indent=1, default=str).encode())
    latest = out_dir / "latest"
    if latest.is_symlink() or not latest.exists():
        latest.unlink(missing_ok=True)
        latest.symlink_to(found.id)
    _print_answers(run, options["as_json"])
    console.print(f"study {found.id}: {len(run['records'])} point(s) stored in {db}")
    console.print(f"report: {path}")
    if run.get("interrupted"):
        console.print("[yellow]interrupted[/]: run the same command to resume")
        sys.exit(130)
    if not any(r["status"] == "ok" for r in run["records"]):  # nothing measured: a failure, not a study
        console.print("[red]no point of the study ran[/]: the report lists why")
        sys.exit(1)


def _default_threads() -> list[int]:
    import os

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return sorted({1, usable})


def _run_with_progress(found, retry_failed: bool) -> dict:  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kiln.bench import study as studies

    left = len(found.remaining(retry_failed))
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}"),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("study", total=left, eta="")

        def progress(message: str, record) -> None:  # type: ignore[no-untyped-def]
            if record is None:
                bar.console.print(f"    {message}", style="dim", highlight=False)
                return
            status = record["status"]
            colour = "green" if status == "ok" else "yellow" if status in ("unavailable", "skipped") else "red"
            eta = record.get("eta_s")
            remaining = f"ETA {_duration(eta)}" if eta else ""
            bar.advance(task)
            bar.update(task, eta=remaining)
            done = int(bar.tasks[0].completed)
            bar.console.print(f"[{colour}]{done:>4}/{left}[/] {message}  [dim]{remaining}[/]", highlight=False)

        return studies.run_study(found, progress, retry_failed)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def _print_answers(run: dict, as_json: bool) -> None:
    from rich.table import Table

    from kiln.bench import analysis

    records = [r for r in run["records"] if r["scenario"] != "breakdown"]
    best = analysis.best(records)
    if as_json:
        rows = [
            {
                "model": row["model"],
                "backend": row["variant"],
                "objective": row["objective"],
                "best": None
                if row["record"] is None
                else {
                    k: row["record"].get(k)
                    for k in ("batch", "threads", "scenario", "throughput", "peak_rss_mb", "reproduce", "latency_ms")
                },
            }
            for row in best
        ]
        curves = [
            {"model": c.model, "curve": c.name, "knee": c.knee, "breaking_point": c.breaking}
            for c in analysis.curves(records, float(run["config"]["study"]["latency_bound_ms"]))
        ]
        click.echo(json.dumps({"study": run["run_id"], "best": rows, "curves": curves}, indent=1, default=str))
        return
    table = Table(title=f"kiln study {run['run_id']}: best configuration per backend")
    for column in ("model", "backend", "objective", "batch", "threads", "figure", "peak MB"):
        table.add_column(column)
    for row in best:
        record = row["record"]
        if record is None:
            continue
        figure = analysis.figure_text(record, row["objective"])
        table.add_row(
            row["model"],
            row["variant"],
            row["objective"],
            str(record["batch"]),
            str(record["threads"]),
            figure,
            f"{record.get('peak_rss_mb', 0):.0f}",
        )
    out.print(table)
