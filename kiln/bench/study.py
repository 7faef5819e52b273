"""``kiln study``: a grid of bench jobs over the run-time parameters a user chooses (threads,
batch, precision, scenario and requests in flight), one normal bench job per point (its own
process, MLPerf LoadGen), stored in the results database as each finishes.

A study's identity is its fixed settings and the machine: run the same command again and the
points already stored are not run again (an interrupted study resumes; a grid extended by a batch
size runs only the new points). An out-of-memory or timed-out point ends that backend's sweep
over larger batches: the points it skips are rows saying so, and the study goes on.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kiln.bench import store
from kiln.bench.backends import BACKENDS
from kiln.bench.machine import fingerprint
from kiln.bench.models import file_digest, resolve_model
from kiln.bench.runner import BenchConfig, check_names, run_one, run_worker
from kiln.errors import KilnError
from kiln.output_files import ensure_folder
from kiln.zoo import MODELS

PRECISIONS = ("fp32", "bf16", "int8")
# statuses that end a backend's sweep over larger batches (a larger batch needs more, not less)
ENDS_SWEEP = ("oom", "timeout")
# statuses not run again on resume unless asked (--retry-failed): a deterministic failure repeats
FAILED = ("error", "crash", "timeout", "oom", "skipped")


class StudyError(KilnError):
    """A study that cannot be run as asked (an unknown backend, precision or scenario...)."""


@dataclass
class StudyConfig:
    models: list[str]
    backends: list[str]  # base names (kiln, onnxruntime, openvino...): precision picks the variant
    precisions: list[str] = field(default_factory=lambda: ["fp32"])
    threads: list[int] = field(default_factory=lambda: [1])
    batches: list[int] = field(default_factory=lambda: [1])
    scenarios: list[str] = field(default_factory=lambda: ["single-stream"])
    inflight: list[int] = field(default_factory=lambda: [2])  # multi-stream, server, offline
    duration: float = 1.0
    min_iterations: int = 3
    warmup: int = 1
    seq: int | None = None
    timeout: float = 900.0
    memory_limit_mb: int | None = None
    latency_bound_ms: float = 100.0  # a tail latency past it is a breaking point
    dataset: str | None = None
    dataset_limit: int | None = None
    weights: dict[str, str] = field(default_factory=dict)  # zoo model -> a state_dict file
    agreement: bool = True
    breakdown: bool = True  # kiln's own time by kernel kind, arena and weights, per model and variant
    plugins: list[str] = field(default_factory=list)

    def validate(self) -> None:
        check_names(self.plugins, self.backends, self.scenarios, offered=base_backends)
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad:
            raise StudyError(f"unknown precision(s) {bad}; available: {', '.join(PRECISIONS)}")
        if min(self.threads) < 1 or min(self.batches) < 1 or min(self.inflight) < 1 or self.duration <= 0:
            raise StudyError("threads, batch sizes, requests in flight and duration must be positive")
        for name in self.models:
            resolve_model(name, 1, self.seq)

    def fixed(self) -> dict[str, Any]:
        """What makes two points comparable: everything but the grid's axes."""
        axes = {"models", "backends", "precisions", "threads", "batches", "scenarios", "inflight", "plugins"}
        axes |= {"timeout", "breakdown", "latency_bound_ms"}  # how long to wait, what to add, how to judge
        return {k: v for k, v in asdict(self).items() if k not in axes}


def base_backends() -> list[str]:
    """The backends a study names: registered names that are not another's precision variant."""
    return [name for name in BACKENDS if not any(name.endswith(f"-{p}") for p in PRECISIONS if p != "fp32")]


def variant(backend: str, precision: str) -> str | None:
    """The bench backend running ``backend`` at ``precision`` (kiln + int8: kiln-int8), or None."""
    if precision == "fp32":
        return backend
    name = f"{backend}-{precision}"
    return name if name in BACKENDS else None


def study_id(config: StudyConfig, machine: dict[str, Any]) -> str:
    """The study's name in the database: a digest of its fixed settings and of the machine."""
    hardware = {k: machine.get(k) for k in ("cpu", "family_model", "flags", "usable_cpus", "memory_gb")}
    settings = config.fixed()
    if settings.get("weights"):  # a weights file by its contents, not where it lies
        from kiln.zoo.weights import digest

        settings["weights"] = {model: digest(path) for model, path in settings["weights"].items()}
    # a user's model file by its contents too: the same name with other contents is another study
    files = {m: file_digest(m) for m in config.models if m not in MODELS and Path(m).is_file()}
    if files:
        settings["model_files"] = files
    text = json.dumps({"settings": settings, "machine": hardware}, sort_keys=True, default=str)
    return "study-" + hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Point:
    model: str  # as given (zoo name or path)
    backend: str  # the base backend
    precision: str
    batch: int
    threads: int
    scenario: str
    inflight: int

    @property
    def variant(self) -> str | None:
        return variant(self.backend, self.precision)


def points(config: StudyConfig) -> list[Point]:
    """The grid, in the order it runs: per model and backend variant, threads, then batch upward
    (so a sweep meets its breaking point before the larger batches it makes pointless)."""
    grid = []
    for model in config.models:
        for backend in config.backends:
            for precision in config.precisions:
                for threads in config.threads:
                    for scenario in config.scenarios:
                        for inflight in [1] if scenario == "single-stream" else config.inflight:
                            for batch in sorted(config.batches):
                                grid.append(Point(model, backend, precision, batch, threads, scenario, inflight))
    return grid


def point_key(record: dict[str, Any]) -> tuple:
    """A stored record's grid coordinates (what resume compares)."""
    inflight = 1 if record["scenario"] == "single-stream" else record.get("inflight_requested", record.get("inflight"))
    return (
        record.get("model_given", record["model"]),
        record.get("base_backend", record["backend"]),
        record.get("precision", "fp32"),
        record["batch"],
        record["threads"],
        record["scenario"],
        inflight,
    )


def coordinates(point: Point) -> tuple:
    return (point.model, point.backend, point.precision, point.batch, point.threads, point.scenario, point.inflight)


def reproduce(point: Point, config: StudyConfig) -> str:
    """The ``kiln bench`` command that measures this point again, alone."""
    parts = [
        "kiln bench",
        f"-m {point.model}",
        f"-b {point.variant or point.backend}",
        f"--batch {point.batch}",
        f"--threads {point.threads}",
        f"-s {point.scenario}",
    ]
    if point.scenario != "single-stream":
        parts.append(f"--inflight {point.inflight}")
    parts.append(f"--duration {config.duration:g} --min-iterations {config.min_iterations} --warmup {config.warmup}")
    if config.seq is not None:
        parts.append(f"--seq {config.seq}")
    if config.memory_limit_mb:
        parts.append(f"--memory-limit {config.memory_limit_mb}")
    if config.dataset:
        parts.append(f"--dataset {config.dataset}")
    for model, path in config.weights.items():
        if model == point.model:
            parts.append(f"--weights {model}={path}")
    return " ".join(parts)


def command(config: StudyConfig) -> str:
    """The ``kiln study`` command that runs (or resumes) this study: every setting spelled out."""
    parts = [
        "kiln study",
        f"-m {','.join(config.models)}",
        f"-b {','.join(config.backends)}",
        f"--threads {','.join(map(str, config.threads))}",
        f"--batch {','.join(map(str, config.batches))}",
        f"--precision {','.join(config.precisions)}",
    ]
    if config.scenarios != ["single-stream"]:
        parts.append(f"-s {','.join(config.scenarios)} --inflight {','.join(map(str, config.inflight))}")
    parts.append(f"--duration {config.duration:g} --min-iterations {config.min_iterations} --warmup {config.warmup}")
    optional = {
        "--seq": config.seq,
        "--memory-limit": config.memory_limit_mb,
        "--dataset": config.dataset,
        "--dataset-limit": config.dataset_limit,
    }
    parts.extend(f"{flag} {value}" for flag, value in optional.items() if value is not None)
    if config.latency_bound_ms != 100.0:
        parts.append(f"--latency-bound-ms {config.latency_bound_ms:g}")
    parts.extend(f"--weights {model}={path}" for model, path in config.weights.items())
    parts.extend(f"--plugin {plugin}" for plugin in config.plugins)
    return " ".join(parts)


Progress = Callable[[str, dict[str, Any] | None], None]


@dataclass
class Study:
    """A study's state while it runs: what is stored, what is left, how long the points took."""

    config: StudyConfig
    db: Path
    folder: Path
    run: dict[str, Any]
    done: dict[tuple, dict[str, Any]]
    seconds: list[tuple[Point, float]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.run["run_id"])

    def stored(self) -> dict[str, Any]:
        """The study's run with every stored point of its grid (and kiln's breakdowns)."""
        grid = [coordinates(p) for p in points(self.config)]
        self.run["records"] = [self.done[key] for key in grid if key in self.done]
        self.run["breakdowns"] = _load_breakdowns(self)
        return self.run

    def remaining(self, retry_failed: bool = False) -> list[Point]:
        return [p for p in points(self.config) if not self._finished(p, retry_failed)]

    def _finished(self, point: Point, retry_failed: bool) -> bool:
        stored = self.done.get(coordinates(point))
        if stored is None or stored["status"] == "unavailable":  # a peer installed since: checked again
            return False
        return not (retry_failed and stored["status"] in FAILED)

    def eta(self, left: list[Point]) -> float | None:
        """Seconds the points left should take: per model, a least-squares fit of a point's
        seconds against its batch over the points finished in this session (a batch-32 point
        takes longer than a batch-1 one); None before any finished."""
        if not self.seconds:
            return None
        overall = sum(s for _, s in self.seconds) / len(self.seconds)
        fits = {}
        for model in {p.model for p in left}:
            samples = [(p.batch / p.threads, s) for p, s in self.seconds if p.model == model]
            fits[model] = _line(samples) if samples else (overall, 0.0)
        return sum(max(1.0, fits[p.model][0] + fits[p.model][1] * p.batch / p.threads) for p in left)


def _line(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of y against x; a constant when x does not vary."""
    n = len(samples)
    mean_x = sum(x for x, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    spread = sum((x - mean_x) ** 2 for x, _ in samples)
    if spread == 0:
        return mean_y, 0.0
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in samples) / spread)
    return mean_y - slope * mean_x, slope


def open_study(config: StudyConfig, out: Path, db: Path) -> Study:
    """The study of this configuration on this machine: new, or the stored one to resume."""
    config.validate()
    machine = fingerprint()
    identity = study_id(config, machine)
    done: dict[tuple, dict[str, Any]] = {}
    created = datetime.now(UTC).isoformat(timespec="seconds")
    if db.exists():
        known = {run_id: when for run_id, when, _ in store.list_runs(db)}
        if identity in known:
            created = known[identity]
            for record in store.load_records(db, identity):
                done[point_key(record)] = record  # the last record of a point wins (a retried one)
    run = {
        "run_id": identity,
        "created": created,
        "machine": machine,
        "config": {"study": asdict(config)},
        "records": [],
        "interrupted": False,
    }
    folder = out / identity
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise StudyError(f"{folder} is not a folder kiln made (kiln follows no link in its own folders): remove it")
    ensure_folder(folder, "study folder", parents=True)
    ensure_folder(db.parent, "results database's folder", parents=True)
    store.start_run(db, run)
    return Study(config, db, folder, run, done)


def bench_config(point: Point, config: StudyConfig) -> BenchConfig:
    return BenchConfig(
        models=[point.model],
        backends=[point.variant or point.backend],
        scenarios=[point.scenario],
        batches=[point.batch],
        threads=point.threads,
        duration=config.duration,
        min_iterations=config.min_iterations,
        warmup=config.warmup,
        inflight=point.inflight,
        seq=config.seq,
        timeout=config.timeout,
        dataset=config.dataset,
        dataset_limit=config.dataset_limit,
        memory_limit_mb=config.memory_limit_mb,
        plugins=config.plugins,
        agreement=config.agreement,
        weights=dict(config.weights),
    )


def run_study(study: Study, progress: Progress, retry_failed: bool = False) -> dict[str, Any]:
    """Run the points not stored yet, storing each as it finishes; Ctrl-C stops the running
    worker and returns (every finished point is already stored). Returns the study's run with
    every point of its grid."""
    left = study.remaining(retry_failed)
    total = len(points(study.config))
    progress(f"{study.id}: {total} point(s), {total - len(left)} stored, {len(left)} to run", None)
    ended: dict[tuple, tuple[int, str]] = {}  # a sweep -> the batch that ended it, and how
    for key, stored in study.done.items():  # sweeps a stored point ended stay ended on resume
        if stored["status"] in ENDS_SWEEP and not retry_failed:
            _end(ended, Point(*key), stored["status"])
    compiled: set[tuple] = {(p[0], p[1], p[2]) for p, r in study.done.items() if r["status"] == "ok"}
    try:
        for number, point in enumerate(left):
            started = time.perf_counter()
            record = _run_point(study, point, ended, compiled, progress)
            record = _annotate(record, point, study.config)
            store.add_records(study.db, study.id, [record])
            study.done[coordinates(point)] = record
            if record["status"] in ENDS_SWEEP:
                _end(ended, point, record["status"])
            if record["status"] not in ("unavailable", "skipped"):
                study.seconds.append((point, time.perf_counter() - started))
            eta = study.eta(left[number + 1 :])
            record["eta_s"] = eta
            progress(_describe(point, record), record)
        if study.config.breakdown:
            _breakdowns(study, progress)
    except KeyboardInterrupt:
        study.run["interrupted"] = True
        progress("interrupted: every finished point is stored; the same command resumes", None)
    return study.stored()


def _end(ended: dict[tuple, tuple[int, str]], point: Point, status: str) -> None:
    if point.batch < ended.get(_sweep(point), (1 << 62, ""))[0]:
        ended[_sweep(point)] = (point.batch, f"{status} at batch {point.batch}")


def _sweep(point: Point) -> tuple:
    """A backend's sweep over batches (at every thread count): past the batch that ran out of
    memory or time, its larger batches would too."""
    return (point.model, point.backend, point.precision, point.scenario, point.inflight)


def _run_point(study: Study, point: Point, ended: dict, compiled: set, progress: Progress) -> dict[str, Any]:
    config = study.config
    model = resolve_model(point.model, point.batch, config.seq)
    base = {"backend": point.variant or point.backend, "model": model.label, "batch": point.batch}
    base |= {"scenario": point.scenario, "threads": point.threads}
    if point.variant is None:
        return {**base, "status": "unavailable", "error": f"{point.backend} has no {point.precision} variant"}
    end = ended.get(_sweep(point))
    if end is not None and point.batch >= end[0]:  # a larger batch needs more memory and time, not less
        return {**base, "status": "skipped", "error": f"not run: this backend's sweep ended ({end[1]})"}
    bench = bench_config(point, config)
    model.weights = config.weights.get(point.model)
    model.prepare(progress=lambda message: progress(message, None))
    reference = _reference(study, model, bench) if config.agreement else None
    # one cold compile per model and backend variant (kiln's caches empty, as on a new machine);
    # the other points compile with the caches as they are, and their rows say so
    first = (point.model, point.backend, point.precision) not in compiled
    bench.cold_compile = first
    progress(f"running {_describe(point)}", None)
    work = ensure_folder(study.folder / ".work", "work folder")
    record = run_one(model, bench.backends[0], point.scenario, bench, reference, work, progress)
    if record["status"] == "ok":
        compiled.add((point.model, point.backend, point.precision))
    return record


def _reference(study: Study, model: Any, bench: BenchConfig) -> str | None:
    """kiln's reference outputs for the model at this batch, computed once per study."""
    folder = ensure_folder(study.folder / "references", "references folder")
    path = folder / f"reference-{model.label}-b{model.batch}.npz"
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise StudyError(f"{path} is not a file kiln wrote (a link, or not a regular file): remove it")
    if path.is_file():
        return str(path)
    job = {"kind": "reference", "model": asdict(model), "output": str(path), "plugins": bench.plugins}
    result = run_worker(job, 1, bench.timeout, folder)
    return str(path) if result.get("status") == "ok" and path.is_file() else None


def _annotate(record: dict[str, Any], point: Point, config: StudyConfig) -> dict[str, Any]:
    return {
        **record,
        "base_backend": point.backend,
        "precision": point.precision,
        "model_given": point.model,
        "inflight_requested": point.inflight,
        "reproduce": reproduce(point, config),
    }


def _describe(point: Point, record: dict[str, Any] | None = None) -> str:
    where = f"{point.model} / {point.variant or point.backend + '-' + point.precision} / batch {point.batch}"
    where += f" / {point.threads} thread(s) / {point.scenario}"
    if point.scenario != "single-stream":
        where += f" x{point.inflight}"
    if record is None:
        return where
    text = f"{where}: {record['status']}"
    if record["status"] == "ok":
        p50 = record.get("latency_ms", {}).get("p50")
        text += f" (p50 {p50:.2f} ms, {record.get('throughput', 0):.1f}/s)" if p50 else ""
    elif record.get("error"):
        text += f" ({' '.join(str(record['error']).split())[:100]})"
    return text


# -- kiln's own breakdown: time per kernel kind (copies are its layout conversions), arena, weights ---


def _breakdowns(study: Study, progress: Progress) -> None:
    """Per model and kiln variant, one profiled inference at the grid's smallest and largest batch
    (the largest thread count): stored as the study's breakdown rows (kind "breakdown")."""
    config = study.config
    stored = {(b["model_given"], b["backend"], b["batch"]) for b in _load_breakdowns(study)}
    threads = max(config.threads)
    for model_name in config.models:
        for backend in config.backends:
            if not backend.startswith("kiln") or backend in ("kiln-reference", "kiln-fpga", "kiln-gpu"):
                continue
            for precision in config.precisions:
                name = variant(backend, precision)
                for batch in sorted({min(config.batches), max(config.batches)}):
                    if name is None or (model_name, name, batch) in stored:
                        continue
                    if not _sweep_reached(study, model_name, backend, precision, batch):
                        continue
                    model = resolve_model(model_name, batch, config.seq)
                    model.weights = config.weights.get(model_name)
                    progress(f"kiln's breakdown: {model.label} / {name} / batch {batch}", None)
                    job = {"kind": "breakdown", "backend": name, "model": asdict(model), "plugins": config.plugins}
                    job["memory_limit_mb"] = config.memory_limit_mb
                    result = run_worker(job, threads, config.timeout, study.folder)
                    row = {**result, "model_given": model_name, "backend": name, "model": model.label}
                    row |= {"batch": batch, "threads": threads, "scenario": "breakdown", "precision": precision}
                    store.add_records(study.db, study.id, [{**row, "status": "breakdown:" + result["status"]}])


def _sweep_reached(study: Study, model: str, backend: str, precision: str, batch: int) -> bool:
    """Whether some point of this model and variant at this batch ran (an OOM before it: no)."""
    return any(
        key[0] == model and key[1] == backend and key[2] == precision and key[3] == batch and r["status"] == "ok"
        for key, r in study.done.items()
    )


def _load_breakdowns(study: Study) -> list[dict[str, Any]]:
    if not study.db.exists():
        return []
    rows = [r for r in store.load_records(study.db, study.id) if r["scenario"] == "breakdown"]
    latest = {(r["model_given"], r["backend"], r["batch"]): r for r in rows}
    return list(latest.values())
