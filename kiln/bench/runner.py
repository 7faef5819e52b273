"""Runs a benchmark plan: every (model, batch, backend, scenario) in its own worker process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kiln.bench.backends import BACKENDS, backend_class
from kiln.bench.machine import fingerprint
from kiln.bench.models import BenchModel, resolve_model
from kiln.bench.worker import thread_environment
from kiln.errors import KilnError
from kiln.output_files import ensure_folder

SCENARIOS = ("single-stream", "multi-stream", "server", "offline")  # MLPerf LoadGen's (kiln.bench.loadgen)


@dataclass
class BenchConfig:
    models: list[str]
    backends: list[str]
    scenarios: list[str] = field(default_factory=lambda: ["single-stream"])
    batches: list[int] = field(default_factory=lambda: [1])
    threads: int = 2
    duration: float = 5.0
    min_iterations: int = 10
    warmup: int = 3
    soak: int = 0  # extra inferences after the timed run, for RSS growth (a leak check); 0: none
    inflight: int = 2
    rate: float | None = None
    target_latency_ms: float | None = None  # the Server scenario's latency bound (LoadGen's target)
    latency_percentile: float | None = None  # the percentile LoadGen judges (None: its defaults)
    seq: int | None = None
    variable_batch: str | None = None  # "LOW..HIGH": every query's batch drawn from it (instead of batches)
    timeout: float = 600.0
    dataset: str | None = None
    dataset_limit: int | None = None
    memory_limit_mb: int | None = None  # each worker's address space (RLIMIT_AS): past it, an "oom" row
    plugins: list[str] = field(default_factory=list)
    agreement: bool = True
    weights: dict[str, str] = field(default_factory=dict)  # zoo model -> state_dict file (``--weights``)
    cold_compile: bool = True  # kiln's timed compile with its caches empty (a study: its first point only)

    def validate(self) -> None:
        check_names(self.plugins, self.backends, self.scenarios)
        if self.threads < 1 or self.duration <= 0 or any(b < 1 for b in self.batches):
            raise KilnError("threads, duration and batch sizes must be positive")
        if self.memory_limit_mb is not None and not 64 <= self.memory_limit_mb <= 1 << 40:
            raise KilnError(f"a memory limit is 64 to {1 << 40} MB (RLIMIT_AS), not {self.memory_limit_mb}")
        for name in self.models:
            resolve_model(name, 1, self.seq)
        self.batch_range()

    def batch_range(self) -> tuple[int, int] | None:
        if self.variable_batch is None:
            return None
        from kiln.driver.sizes import parse_range

        low, high = parse_range("variable batch", self.variable_batch)
        if low < 1:
            raise KilnError(f"a variable batch starts at 1 or more, not {low}")
        return low, high


def check_names(
    plugins: list[str], backends: list[str], scenarios: list[str], offered: Callable[[], list[str]] | None = None
) -> None:
    """Import the plugins (they may register backends), then refuse unknown backends and
    scenarios, listing what is there (``offered``: the backend names to list, else every one)."""
    import importlib

    for plugin in plugins:
        importlib.import_module(plugin)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise KilnError(f"unknown backend(s) {unknown}; available: {', '.join(offered() if offered else BACKENDS)}")
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        raise KilnError(f"unknown scenario(s) {bad}; available: {', '.join(SCENARIOS)}")


Progress = Callable[[str, dict[str, Any] | None], None]


def plan(config: BenchConfig) -> list[tuple[BenchModel, str, str]]:
    jobs = []
    batch_range = config.batch_range()
    for name in config.models:
        for batch in [batch_range[0]] if batch_range else config.batches:
            model = resolve_model(name, batch, config.seq)
            model.batch_range = batch_range
            model.weights = config.weights.get(name)
            for backend in config.backends:
                for scenario in config.scenarios:
                    jobs.append((model, backend, scenario))
    return jobs


def run_bench(config: BenchConfig, workdir: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Run the plan; returns the run (machine fingerprint, config, records). Ctrl-C stops the
    current worker and returns what finished, with ``interrupted`` set."""
    config.validate()
    say = progress or (lambda message, record: None)
    run: dict[str, Any] = {
        "run_id": datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": fingerprint(),
        "config": asdict(config),
        "records": [],
        "interrupted": False,
    }
    jobs = plan(config)
    ensure_folder(workdir, "work folder", parents=True)
    references: dict[tuple[str, int], str | None] = {}
    try:
        for model in {(m.label, m.batch): m for m, _, _ in jobs}.values():
            say(f"preparing {model.label}", None)
            model.prepare(progress=lambda message: say(message, None))
        for model, backend, scenario in jobs:
            key = (model.label, model.batch)
            if config.agreement and key not in references:
                say(f"reference outputs for {model.label} (batch {model.batch})", None)
                references[key] = _reference(model, config, workdir)
            record = run_one(model, backend, scenario, config, references.get(key), workdir, say)
            run["records"].append(record)
            say(f"{backend} / {model.label} / {scenario}: {record['status']}", record)
    except KeyboardInterrupt:
        run["interrupted"] = True
        say("interrupted: stopped the running worker; reporting what finished", None)
    return run


def _base_record(model: BenchModel, backend: str, scenario: str, config: BenchConfig) -> dict[str, Any]:
    return {
        "backend": backend,
        "model": model.label,
        "batch": model.batch,
        **({"batch_range": list(model.batch_range)} if model.batch_range else {}),
        "scenario": scenario,
        "threads": config.threads,
    }


def run_one(
    model: BenchModel,
    backend: str,
    scenario: str,
    config: BenchConfig,
    reference: str | None,
    workdir: Path,
    say: Progress,
) -> dict[str, Any]:
    record = _base_record(model, backend, scenario, config)
    try:
        instance = backend_class(backend)(config.threads)
        reason = instance.availability()
    except Exception as err:  # a broken peer is its row, never the end of the run
        return {**record, "status": "unavailable", "error": f"availability check failed: {type(err).__name__}: {err}"}
    if reason is None and instance.needs_torch_module and not model.is_zoo:
        reason = "needs a torch module; an ONNX file given by path has none"
    if reason:
        return {**record, "status": "unavailable", "error": reason}
    say(f"running {backend} / {model.label} (batch {model.batch}) / {scenario}", None)
    job = {
        "kind": "bench",
        "backend": backend,
        "model": asdict(model),
        "scenario": scenario,
        "threads": config.threads,
        "duration": config.duration,
        "min_iterations": config.min_iterations,
        "warmup": config.warmup,
        "soak": config.soak,
        "target_latency_ms": config.target_latency_ms,
        "latency_percentile": config.latency_percentile,
        "inflight": config.inflight,
        "rate": config.rate,
        "reference": reference,
        "dataset": config.dataset,
        "dataset_limit": config.dataset_limit,
        "plugins": config.plugins,
        "memory_limit_mb": config.memory_limit_mb,
        "cold_compile": config.cold_compile,
    }
    return {**record, **run_worker(job, config.threads, config.timeout, workdir)}


def reference_outputs(model: BenchModel, config: BenchConfig, workdir: Path) -> dict[str, Any] | None:
    """The reference outputs as arrays (shipped to a fleet's nodes), or None when they failed."""
    import numpy as np

    path = _reference(model, config, workdir)
    if path is None:
        return None
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def _reference(model: BenchModel, config: BenchConfig, workdir: Path) -> str | None:
    """kiln's reference interpreter's outputs for the model's inputs, saved once as .npz."""
    path = workdir / f"reference-{model.label}-b{model.batch}.npz"
    job = {"kind": "reference", "model": asdict(model), "output": str(path), "plugins": config.plugins}
    result = run_worker(job, config.threads, config.timeout, workdir)
    return str(path) if result.get("status") == "ok" and path.exists() else None


# what a native library prints when an allocation fails (the worker's own MemoryError is its record)
OUT_OF_MEMORY = (
    "MemoryError",
    "bad_alloc",
    "Cannot allocate memory",
    "out of memory",
    "failed to map segment",
    "Memory allocation",  # OpenBLAS
)


def run_worker(job: dict[str, Any], threads: int, timeout: float, workdir: Path) -> dict[str, Any]:
    """Run ``job`` in a fresh process; a crash, hang or garbage output becomes the record's status."""
    handle, job_path = tempfile.mkstemp(suffix=".job.json", dir=workdir)
    with os.fdopen(handle, "w") as stream:
        json.dump(job, stream)
    result_path = job_path.replace(".job.json", ".result.json")
    # the job's temporary files (a backend's artifact: a 0.5 GB .kiln or .ort.onnx) go to a folder
    # of its own, removed however the worker ended (a crash or a kill runs no cleanup of its own)
    scratch = tempfile.mkdtemp(prefix="job-", dir=workdir)
    environment = {**os.environ, **thread_environment(threads), "TMPDIR": scratch}
    command = [sys.executable, "-m", "kiln.bench.worker", job_path, result_path]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"status": "timeout", "error": f"no result after {timeout:.0f} s; the worker was killed"}
    except KeyboardInterrupt:
        process.kill()
        process.communicate()
        raise
    finally:
        os.unlink(job_path)
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - started
    if not os.path.exists(result_path):
        tail = " | ".join((stderr or "").strip().splitlines()[-3:])
        limit = job.get("memory_limit_mb")
        if limit and any(sign in (stderr or "") for sign in OUT_OF_MEMORY):
            return {"status": "oom", "error": f"out of memory under the worker's {limit} MB limit (RLIMIT_AS): {tail}"}
        return {
            "status": "crash",
            "error": f"worker exited with code {process.returncode} and no result; stderr: {tail}",
        }
    with open(result_path) as stream:
        result = json.load(stream)
    os.unlink(result_path)
    result["worker_seconds"] = wall
    return result
