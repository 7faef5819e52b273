"""``kiln bench``: run, compare and list benchmark runs (the harness is ``kiln.bench``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from kiln import cli_support
from kiln.cli_support import MAX_MEMORY_MB, console, dataset_option, out, split_values, weights_option
from kiln.output_files import OutputPathError, ensure_folder


@click.group(invoke_without_command=True)
@click.option(
    "--models",
    "-m",
    multiple=True,
    help="Zoo names or .onnx paths, comma-separated or repeated. [default: resnet50,vgg19,bert-base,gpt2]",
)
@click.option(
    "--backends",
    "-b",
    multiple=True,
    help="Backends, comma-separated or repeated. [default: every known backend; missing ones are reported as such]",
)
@click.option(
    "--device",
    type=click.Choice(["all", "cpu", "cuda", "fpga"]),
    default="all",
    show_default=True,
    help="Which default backends to run: the CPU's, the CUDA device's (kiln-gpu, tensorrt, onnxruntime-cuda, "
    "torch.compile-cuda; 'unavailable: no CUDA device' on a machine without one), or both (all); fpga: kiln-fpga "
    "and hls4ml as C simulations, on the FPGA-size zoo models (jet-mlp, mnist-cnn, transformer-block) unless "
    "--models names others. --backends overrides.",
)
@click.option(
    "--scenario",
    "-s",
    "scenarios",
    multiple=True,
    help="MLPerf LoadGen scenarios: single-stream, multi-stream, server, offline; LoadGen's verdict "
    "(VALID/INVALID and why) is in the report. Or generate: decoders' time to first token, time per output "
    "token and tokens/s against the bandwidth bound, peak memory (-m: decoders, gpt2-124m by default; -b: "
    "engines: kiln, kiln-int8-weights, kiln-int4-weights, weights-accuracy, onnxruntime, transformers, llama.cpp, "
    "onnxruntime-genai, openvino-genai). [default: single-stream]",
)
@click.option("--batch", "batches", multiple=True, type=int, help="Batch size(s). [default: 1]")
@click.option(
    "--variable-batch",
    default=None,
    metavar="LOW..HIGH",
    help="Each query a batch size drawn from LOW..HIGH (a batching server's traffic; instead of --batch). kiln "
    "declares the range when it compiles; the report's compiles_during_run shows whether any size compiled.",
)
@click.option(
    "--threads", "-t", type=int, default=2, show_default=True, help="Threads every backend may use (CPU-pinned)."
)
@click.option("--duration", "-d", type=float, default=3.0, show_default=True, help="Seconds of measurement per job.")
@click.option(
    "--min-iterations", type=int, default=5, show_default=True, help="At least this many measured runs per job."
)
@click.option("--warmup", type=int, default=2, show_default=True, help="Unmeasured runs before measuring.")
@click.option(
    "--soak",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    metavar="N",
    help="After the timed run, N more inferences with RSS sampled: the growth estimate of a leak check.",
)
@click.option(
    "--inflight", type=int, default=2, show_default=True, help="Requests in flight (multi-stream, server, offline)."
)
@click.option(
    "--target-latency-ms",
    type=float,
    default=None,
    help="Server scenario: LoadGen's latency bound [default: 4x a measured run, at least 10 ms].",
)
@click.option(
    "--latency-percentile",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="The latency percentile LoadGen judges [default: LoadGen's: 0.90 single-stream, 0.99 multi-stream, server].",
)
@click.option(
    "--rate", type=float, default=None, help="Server scenario arrival rate per s [default: 70% of measured capacity]."
)
@click.option("--seq", type=int, default=None, help="Sequence length for bert-base and gpt2. [default: 128]")
@click.option(
    "--prompts",
    default="128,512",
    show_default=True,
    help="--scenario generate: prompt lengths (tokens), comma-separated.",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(2, 1 << 16),
    default=128,
    show_default=True,
    help="--scenario generate: tokens generated.",
)
@click.option(
    "--timeout", type=float, default=900.0, show_default=True, help="Seconds before a job's worker is killed."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports/bench"),
    show_default=True,
    help="Reports land in OUT/<run id>/ (and OUT/latest).",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="SQLite results database. [default: OUT/results.db]",
)
@dataset_option(
    "Labelled image folder (DIR/<class>/<image>, preprocessed as torchvision does for the model) "
    "for top-1 accuracy of classifiers, or 'digits': scikit-learn's real 8x8 digits (the held-out 450) "
    "for the digits-mlp and digits-cnn zoo models.",
)
@click.option("--dataset-limit", type=int, default=None, help="Use at most this many dataset images.")
@weights_option(
    "A zoo model's state_dict (torchvision's parameter names; read with weights_only, so it runs no "
    "code), exported in place of the random weights. Repeatable."
)
@click.option(
    "--memory-limit",
    "memory_limit_mb",
    type=click.IntRange(64, MAX_MEMORY_MB),
    default=None,
    help="Each worker's address-space limit in MB (RLIMIT_AS): a backend that needs more gets an 'oom' row "
    "and the run goes on.",
)
@click.option("--plugin", "plugins", multiple=True, help="Python module to import first (may register backends).")
@click.option("--no-agreement", is_flag=True, help="Skip comparing outputs with kiln's reference interpreter.")
@click.option(
    "--cluster",
    default=None,
    metavar="ADDRESS",
    help="Run the job matrix on a Ray cluster (ray start --head ...; 'auto' on a node of it): once per "
    "hardware class of its nodes, each job holding its node alone; the report groups by hardware.",
)
@click.option(
    "--server",
    metavar="URL",
    help="Also measure a kiln serve already running at URL (the kiln-served row: each model by its bench name, "
    "e.g. a repository REPO/resnet50/1/model.onnx for -m resnet50). Without it, -b kiln-served starts a server per model.",
)
@click.option(
    "--on",
    "selectors",
    multiple=True,
    metavar="KEY=VALUE",
    help="With --cluster: only nodes matching (repeatable, all must hold): gpu=H100, cpu=EPYC, isa=avx512f, "
    "card=xclmgmt, node=HOST, cpus=16.",
)
@click.pass_context
def bench(ctx: click.Context, **options) -> None:  # type: ignore[no-untyped-def]
    """Benchmark kiln and its peers side by side (kiln bench with no arguments: the four seed
    models, batch 1, single-stream, every backend).

    \b
    Examples:
      kiln bench
      kiln bench -m resnet50 -b onnxruntime,openvino --batch 1 --batch 8 -s offline
      kiln bench -m model.onnx -b kiln,onnxruntime --duration 10
      kiln bench compare RUN_A RUN_B
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = options
        return
    if "generate" in split_values(options["scenarios"]):
        _bench_generate(options)
        return
    from kiln.bench.runner import run_bench

    if options.get("server"):
        from kiln.bench.backends.served_backend import SERVER_ENV

        if not options["server"].startswith("http://"):
            raise click.UsageError(f"--server takes an http:// URL, got {options['server']!r}")
        os.environ[SERVER_ENV] = options["server"]  # (the job processes inherit it)
    config = _bench_config(options)
    if options.get("server") and "kiln-served" not in config.backends:
        config.backends.append("kiln-served")
    out: Path = options["out"]
    db: Path = options["db"] or out / "results.db"
    records_done = 0

    def progress(message: str, record) -> None:  # type: ignore[no-untyped-def]
        nonlocal records_done
        if record is not None:
            records_done += 1
            status = record["status"]
            colour = "green" if status == "ok" else "yellow" if status == "unavailable" else "red"
            console.print(f"[{colour}]{records_done:>3}[/] {message}", highlight=False)
        else:
            console.print(f"    {message}", highlight=False, style="dim")

    total = len(config.models) * len(config.batches) * len(config.backends) * len(config.scenarios)
    if options["cluster"]:
        run = _fleet_bench(config, options, out, db, progress)
    else:
        if options["selectors"]:
            raise click.UsageError("--on selects nodes of a --cluster")
        console.print(f"kiln bench: {total} job(s), {config.threads} thread(s), {config.duration:g} s each")
        run = run_bench(config, out / ".work", progress)
    _write_bench(run, out, db)
    if run["interrupted"]:
        sys.exit(130)
    if not any(r["status"] == "ok" for r in run["records"]):  # nothing was measured: a failure, not a run
        console.print(f"[red]no job succeeded[/] ({len(run['records'])} job(s): see the report for why)")
        sys.exit(1)


def _bench_generate(options: dict) -> None:
    """``--scenario generate``: the decoders' generation table (``kiln.bench.generation``), each
    (model, engine) in a process of its own; OUT/generate-<time>/ gets the rows (JSON lines) and
    the table (report.md)."""
    import time

    from kiln.bench import generation

    if split_values(options["scenarios"]) != ["generate"]:
        raise click.UsageError("--scenario generate runs alone (its models are decoders, its rows engines)")
    try:
        prompts = [int(n) for n in options["prompts"].split(",")]
    except ValueError:
        raise click.BadParameter(
            f"{options['prompts']!r}: prompt lengths, e.g. 128,512", param_hint="--prompts"
        ) from None
    if not prompts or min(prompts) < 1:
        raise click.BadParameter("prompt lengths of at least 1 token", param_hint="--prompts")
    if any(b < 1 for b in options["batches"]):
        raise click.BadParameter("batches of at least 1 prompt", param_hint="--batch")
    models = split_values(options["models"]) or list(generation.DEFAULT_MODELS)
    from kiln.zoo import decoders

    unknown = [m for m in models if m not in decoders.DECODERS]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not decoders kiln builds (known: {', '.join(decoders.DECODERS)})", param_hint="-m")  # fmt: skip
    engines = split_values(options["backends"]) or list(generation.ENGINES)
    unknown = [e for e in engines if e not in generation.ENGINES]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not generation engines (known: {', '.join(generation.ENGINES)})", param_hint="-b")  # fmt: skip
    folder = options["out"] / time.strftime("generate-%Y%m%d-%H%M%S")
    try:
        ensure_folder(folder, parents=True)
    except OutputPathError as err:
        raise click.UsageError(str(err)) from None
    console.print(
        f"kiln bench --scenario generate: {len(models) * len(engines)} job(s), {options['threads']} thread(s)"
    )
    rows = []
    for batch in options["batches"] or (1,):  # (--batch 1 --batch 4: each batch's table in turn)
        rows += generation.run_generation(models, engines, prompts, options["new_tokens"], options["threads"], options["timeout"],
                                          say=lambda line: console.print(escape(line), highlight=False), batch=batch)  # fmt: skip
    with open(folder / "generate.jsonl", "w") as handle:
        for row in rows:
            handle.write(json.dumps(row, default=str) + "\n")
    from kiln.bench.machine import fingerprint

    found = fingerprint()
    machine = f"{found['cpu']} ({found['family_model']}; {', '.join(found['flags'])}), {found['usable_cpus']} usable CPUs, {options['threads']} thread(s)"  # fmt: skip
    (folder / "report.md").write_text(f"# kiln bench --scenario generate\n\n{machine}\n\n" + generation.markdown(rows))
    console.print(f"wrote {folder / 'report.md'} and {folder / 'generate.jsonl'}")
    if not any(not r.get("error") for r in rows):
        console.print("[red]no job succeeded[/]")
        sys.exit(1)


def _bench_config(options: dict):  # type: ignore[no-untyped-def]
    from kiln import zoo as models
    from kiln.bench.backends import DEFAULT_BACKENDS, FPGA_BACKENDS, GPU_BACKENDS
    from kiln.bench.runner import BenchConfig

    device = options.get("device", "all")
    defaults = {
        "cpu": [b for b in DEFAULT_BACKENDS if b not in GPU_BACKENDS],
        "cuda": list(GPU_BACKENDS),
        "all": list(dict.fromkeys([*DEFAULT_BACKENDS, *GPU_BACKENDS])),
        "fpga": list(FPGA_BACKENDS),
    }[device]
    default_models = models.FPGA_MODELS if device == "fpga" else models.DEFAULT_MODELS
    return BenchConfig(
        models=split_values(options["models"]) or list(default_models),
        backends=split_values(options["backends"]) or defaults,
        scenarios=split_values(options["scenarios"]) or ["single-stream"],
        batches=list(options["batches"]) or [1],
        threads=options["threads"],
        duration=options["duration"],
        min_iterations=options["min_iterations"],
        warmup=options["warmup"],
        soak=options["soak"],
        inflight=options["inflight"],
        rate=options["rate"],
        target_latency_ms=options.get("target_latency_ms"),
        latency_percentile=options.get("latency_percentile"),
        seq=options["seq"],
        variable_batch=options.get("variable_batch"),
        timeout=options["timeout"],
        dataset=options["dataset"],
        dataset_limit=options["dataset_limit"],
        memory_limit_mb=options.get("memory_limit_mb"),
        weights=options.get("weights") or {},
        plugins=list(options["plugins"]),
        agreement=not options["no_agreement"],
    )


def _fleet_bench(config, options, out: Path, db: Path, progress):  # type: ignore[no-untyped-def]
    from kiln.bench import fleet
    from kiln.bench.runner import reference_outputs

    reason = fleet.unavailable()
    if reason:
        raise click.ClickException(reason)
    workdir = ensure_folder(out / ".work", "work folder", parents=True)
    console.print(f"kiln bench on the Ray cluster at {options['cluster']}: {config.threads} thread(s) per job")
    try:
        return fleet.run_fleet(
            config,
            options["cluster"],
            list(options["selectors"]),
            db=db,
            progress=progress,
            references=lambda model: reference_outputs(model, config, workdir),
        )
    except fleet.FleetError as err:
        raise click.ClickException(str(err)) from None


def _write_bench(run: dict, out: Path, db: Path) -> None:
    from kiln.bench import report, store

    run_dir = out / run["run_id"]
    paths = report.write_all(run, run_dir)
    latest = out / "latest"
    if latest.is_symlink() or not latest.exists():
        latest.unlink(missing_ok=True)
        latest.symlink_to(run["run_id"])
    cli_support.out.print(report.terminal_table(run))
    for line in report.notes(run):
        console.print(f"[yellow]note:[/] {line}", highlight=False)
    try:
        if not run.get("streamed"):  # a fleet run stored each record as it arrived
            store.save_run(db, run)
        console.print(f"stored as run {run['run_id']} in {db}")
    except (store.CorruptDatabase, store.DatabaseLocked, OutputPathError) as err:
        console.print(f"[red]warning:[/] {escape(str(err))}; results are in {run_dir}", highlight=False)
    for kind, path in paths.items():
        console.print(f"{kind}: {path}")


@bench.command("compare")
@click.argument("before")
@click.argument("after")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.pass_context
def bench_compare(ctx: click.Context, before: str, after: str, as_json: bool) -> None:
    """Changes between two stored runs, flagging those beyond the noise band. Exits 1 when a
    metric got worse beyond its band (a regression)."""
    from kiln.bench import store

    options = ctx.obj or {}
    db: Path = options.get("db") or (options.get("out") or Path("reports/bench")) / "results.db"
    if not db.exists():
        raise click.ClickException(f"no results database at {db}")
    rows = store.compare(store.load_records(db, before), store.load_records(db, after))
    regressions = [row for row in rows if row["verdict"] == "slower"]
    if as_json:
        click.echo(json.dumps(rows, indent=1, default=str))
        if regressions:
            sys.exit(1)
        return
    table = Table(title=f"{before} -> {after}")
    for column in (
        "model",
        "backend",
        "batch",
        "scenario",
        "metric",
        "before",
        "after",
        "change",
        "noise band",
        "verdict",
    ):
        table.add_column(column)
    for row in rows:
        colour = {"faster": "green", "slower": "red"}.get(row["verdict"], "white")
        table.add_row(
            row["model"],
            row["backend"],
            str(row["batch"]),
            row["scenario"],
            row["metric"],
            f"{row['before']:.2f}",
            f"{row['after']:.2f}",
            f"{row['change']:+.1%}",
            f"±{row['noise_band']:.0%}",
            f"[{colour}]{row['verdict']}[/]",
        )
    out.print(table)
    if not rows:
        console.print("no comparable records (different models/backends, or failed runs)")
    if regressions:
        console.print(f"[red]{len(regressions)} regression(s) beyond the noise band[/]")
        sys.exit(1)


@bench.command("runs")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_context
def bench_runs(ctx: click.Context, as_json: bool) -> None:
    """List the runs stored in the results database."""
    from kiln.bench import store

    options = ctx.obj or {}
    db: Path = options.get("db") or (options.get("out") or Path("reports/bench")) / "results.db"
    if not db.exists():
        raise click.ClickException(f"no results database at {db}")
    runs = store.list_runs(db)
    if as_json:
        click.echo(json.dumps([{"run_id": r, "created": c, "records": n} for r, c, n in runs], indent=1))
        return
    for run_id, created, count in runs:
        out.print(f"{run_id}  {created}  {count} record(s)")


@bench.command("advertise")
def bench_advertise() -> None:
    """Print the Ray resources that describe this machine to kiln's fleet (CPU, ISA, GPUs, cards),
    for `ray start --address HEAD --resources=...` on this node."""
    from kiln.bench import fleet

    click.echo(f"ray start --address HEAD:6379 {fleet.advertise_flags()}")


@bench.command("nodes")
@click.option("--cluster", required=True, metavar="ADDRESS", help="The Ray cluster's address.")
@click.option("--on", "selectors", multiple=True, metavar="KEY=VALUE", help="Only nodes matching (gpu=H100...).")
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as JSON.")
def bench_nodes(cluster: str, selectors: tuple[str, ...], as_json: bool) -> None:
    """The live nodes of a Ray cluster as kiln's fleet sees them: hardware class, CPU, ISA, GPUs."""
    from rich.table import Table

    from kiln.bench import fleet

    reason = fleet.unavailable()
    if reason:
        raise click.ClickException(reason)
    try:
        found = fleet.nodes(cluster, selectors)
    except fleet.FleetError as err:
        raise click.ClickException(str(err)) from None
    if as_json:
        click.echo(json.dumps(found, indent=1))
        return
    table = Table(title=f"{len(found)} node(s) at {cluster}")
    for column in ("hardware class", "host", "CPUs", "ISA", "GPUs", "cards", "fingerprint"):
        table.add_column(column)
    for node in found:
        table.add_row(
            node["label"], node["hostname"], str(node["cpus"]), ", ".join(node["flags"]), node.get("gpu") or "-",
            node.get("card") or "-", node["fingerprint"],
        )  # fmt: skip
    cli_support.out.print(table)
