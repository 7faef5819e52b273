"""One benchmark job in its own process: ``python -m kiln.bench.worker JOB.json RESULT.json``.

The parent sets the thread-count environment before this process starts, so every library sees
it at import; this process also pins itself to the requested number of CPUs.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import sys
import time
import traceback
from typing import Any

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TVM_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def thread_environment(threads: int) -> dict[str, str]:
    return {name: str(threads) for name in THREAD_VARIABLES}


def pin_cpus(threads: int) -> list[int]:
    try:
        allowed = sorted(os.sched_getaffinity(0))
        chosen = allowed[:threads] if threads <= len(allowed) else allowed
        os.sched_setaffinity(0, chosen)
        return chosen
    except (AttributeError, OSError):
        return []


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from kiln.bench import scenarios
    from kiln.bench.backends import Unavailable, backend_class
    from kiln.bench.metrics import agreement, peak_rss_bytes, release_freed_memory, reset_peak, rss_bytes
    from kiln.bench.models import BenchModel

    for plugin in job.get("plugins", []):
        importlib.import_module(plugin)
    record: dict[str, Any] = {"cpus": pin_cpus(job["threads"])}
    model = BenchModel(**job["model"])
    backend = backend_class(job["backend"])(job["threads"])
    backend.cold_compile = job.get("cold_compile", True)
    reason = backend.availability()
    if reason:
        return {**record, "status": "unavailable", "error": reason}
    record["backend_version"] = backend.version()
    record["config"] = backend.config()
    if getattr(backend, "simulated", None):  # a simulation's timings are not a device's: the row says so
        record["simulated"] = backend.simulated
    feeds = model.inputs(seed=0)
    str(model.onnx_path)  # a zoo model's file located (exported by the parent) before anything is timed
    imported_before = set(sys.modules)
    phases = reset_peak()  # each phase's own peak: what compiling takes, then what loading and running take
    try:
        start = time.perf_counter()
        backend.compile(model, feeds)
        record["compile_s"] = time.perf_counter() - start
        if phases:
            compiled_peak = peak_rss_bytes()
            record["peak_compile_mb"] = compiled_peak / 1e6
            release_freed_memory()
            reset_peak()
            record["rss_before_load_mb"] = rss_bytes() / 1e6
        figures = backend.compile_figures()
        record.update(figures)
        record["compile_s"] = figures.get("compile_cold_s", record["compile_s"])  # cold, as every peer's
        if not backend.cold_compile and "compile_cached_s" in figures:
            record["compile_warm"] = True  # a study's later point: the caches as they were
        start = time.perf_counter()
        session = backend.load()
        record["load_s"] = time.perf_counter() - start
        start = time.perf_counter()
        outputs = session.run(feeds)
        record["first_run_ms"] = (time.perf_counter() - start) * 1e3
        # what the measured regions imported besides the backend's own package: a library a
        # backend pulls in (its runtime) belongs to it; torch in kiln's compile would not
        record["imported_while_measured"] = measured_imports(imported_before)
    except Unavailable as err:
        return {**record, "status": "unavailable", "error": str(err)}
    if job.get("reference"):
        with np.load(job["reference"]) as data:
            reference = [data[f"output{i}"] for i in range(len(data.files))]
        record["agreement"] = agreement(outputs, reference, model.is_classifier)
    warmup = job.get("warmup", 3)
    warm = scenarios.warm_up(session.run, feeds, warmup)
    record.update(_loadgen_scenario(job, model, backend, session, feeds, warm))
    record.update(backend.run_figures())
    if job.get("soak"):  # RSS growth from a long, untimed run (the timed one is often too short)
        record.update(scenarios.soak(session.run, feeds, int(job["soak"])))
    if job.get("dataset") and model.is_classifier:
        from kiln.bench.dataset import accuracy

        record["accuracy"] = accuracy(session.run, job["dataset"], model, job.get("dataset_limit"))
    session.close()
    if phases:
        record["peak_run_mb"] = peak_rss_bytes() / 1e6  # load, first run, the scenario
        record["peak_rss_mb"] = max(compiled_peak, peak_rss_bytes()) / 1e6
    else:
        record["peak_rss_mb"] = peak_rss_bytes() / 1e6
    record["status"] = "ok"
    return record


def measured_imports(before: set[str]) -> list[str]:
    """Top-level packages first imported since ``before`` (kiln's own modules aside)."""
    return sorted({name.split(".")[0] for name in set(sys.modules) - before} - {"kiln"})


SAMPLE_INPUTS = 4  # distinct inputs in LoadGen's query sample library (seed 0 is the agreement's)


def _loadgen_scenario(
    job: dict[str, Any], model: Any, backend: Any, session: Any, feeds: Any, warm: list[float]
) -> dict[str, Any]:
    """The job's scenario issued by MLPerf LoadGen; single-stream also meters energy. ``warm``:
    the warm-up runs' seconds, LoadGen's expected latency for one stream of one size."""
    from kiln.bench import loadgen, scenarios
    from kiln.bench.metrics import EnergyMeter

    reason = loadgen.unavailable()
    if reason:
        raise RuntimeError(reason)
    scenario = job["scenario"]
    inflight = 1 if scenario == "single-stream" else job["inflight"]
    samples = [feeds] + [model.inputs(seed=seed) for seed in range(1, SAMPLE_INPUTS)]
    batch = model.batch
    if model.batch_range is not None:  # a batching server's traffic: each query its own batch size
        sizes = variable_batches(*model.batch_range)
        samples = [model.inputs(seed=seed, batch=size) for seed, size in enumerate(sizes)]
        batch = sum(sizes) / len(sizes)  # items per query, on average (LoadGen picks samples evenly)
    compiled_before = backend.compiled_count()
    meter = EnergyMeter.detect(backend.device) if scenario == "single-stream" else None
    idle = meter.idle_watts(0.5) if meter is not None and meter.available else 0.0
    joules = meter.read_joules() if meter is not None and meter.available else 0.0
    result = loadgen.run_scenario(
        session.run,
        samples,
        scenario,
        job["duration"],
        job["min_iterations"],
        inflight=inflight,
        batch=batch,
        expected_latency_s=sorted(warm)[len(warm) // 2]
        if warm and inflight <= 1 and model.batch_range is None
        else _expected_seconds(session.run, samples if model.batch_range else [feeds], inflight),
        rate=job.get("rate"),
        target_latency_ms=job.get("target_latency_ms"),
        percentile=job.get("latency_percentile"),
    )
    result.update(scenarios.growth(result.pop("rss_samples")))
    result["inflight"] = inflight
    compiled_after = backend.compiled_count()
    if compiled_before is not None and compiled_after is not None:
        result["compiles_during_run"] = compiled_after - compiled_before
    if meter is not None:
        if meter.available:
            from kiln.bench.metrics import energy_per_inference

            spent = meter.read_joules() - joules
            result["energy"] = {
                "joules_per_inference": energy_per_inference(spent, result["seconds"], idle, result["iterations"]),
                "idle_watts": idle,
            }
        else:
            result["energy"] = {"unavailable": meter.reason}
    return result


VARIABLE_SAMPLES = 8  # distinct query sizes of a variable-batch run


def variable_batches(low: int, high: int) -> list[int]:
    """The query sizes of a variable-batch run: both ends and sizes between, seeded."""
    import numpy as np

    rng = np.random.default_rng(0)
    middle = rng.integers(low, high + 1, size=VARIABLE_SAMPLES - 2).tolist() if high > low else []
    return [low, high, *middle][:VARIABLE_SAMPLES] if high > low else [low]


def run_reference(job: dict[str, Any]) -> dict[str, Any]:
    """Outputs of kiln's reference interpreter on the job's model inputs, saved as .npz."""
    import numpy as np

    import kiln
    from kiln.bench.models import BenchModel

    for plugin in job.get("plugins", []):
        importlib.import_module(plugin)
    model = BenchModel(**job["model"])
    outputs = kiln.compile(str(model.onnx_path), target="reference").run(model.inputs(seed=0))
    from kiln.output_files import write_output_file

    buffer = io.BytesIO()
    np.savez(buffer, **{f"output{i}": np.asarray(v) for i, v in enumerate(outputs.values())})
    write_output_file(job["output"], buffer.getvalue(), "reference outputs")  # a planted link is refused
    return {"status": "ok"}


def run_breakdown(job: dict[str, Any]) -> dict[str, Any]:
    """kiln's own account of one inference (``kiln explain --profile``'s per-kernel timers, as
    its Chrome trace): milliseconds per kernel kind (``copy`` kernels are the layout conversions
    and concatenations the plan kept), the host's share, the arena and the weights."""
    import subprocess
    import tempfile

    from kiln.bench.backends import backend_class
    from kiln.bench.models import BenchModel

    model = BenchModel(**job["model"])
    backend = backend_class(job["backend"])(1)
    target, precision = getattr(backend, "target", None), getattr(backend, "precision", "fp32")
    if target is None:
        return {"status": "unavailable", "error": f"{job['backend']} is not a kiln target"}
    trace = os.path.join(tempfile.mkdtemp(prefix="breakdown-"), "trace.json")
    command = [sys.executable, "-m", "kiln", "explain", str(model.onnx_path), "--dim", f"batch={model.batch}"]
    command += ["--target", target, "--precision", precision, "--runs", "5", "--trace", trace]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0 or not os.path.exists(trace):
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return {"status": "error", "error": f"kiln explain --profile exited with {done.returncode}: {tail}"}
    with open(trace) as handle:
        found = json.load(handle)
    kinds: dict[str, float] = {}
    for event in found["traceEvents"]:
        if event.get("ph") == "X":
            kinds[event["cat"]] = kinds.get(event["cat"], 0.0) + event["dur"] / 1e3
    other = found.get("otherData", {})
    return {
        "status": "ok",
        "ms_by_kind": kinds,
        "run_ms": other.get("run_ms"),
        "arena_mb": other.get("arena_bytes", 0) / 1e6,
        "weights_mb": other.get("weight_bytes", 0) / 1e6,
        "target": target,
        "precision": precision,
    }


def _expected_seconds(run: Any, samples: list[Any], inflight: int) -> float:
    """Seconds per request per thread as the scenario will see it: a median run alone, or with
    ``inflight`` threads at once, their measured throughput (two requests on two cores do not run
    twice as fast when each already uses both: a Server rate from the single-run time would
    overload them). Requests cycle through ``samples`` (a variable batch: each its own size)."""
    if inflight <= 1:
        return _median_seconds(run, samples)
    import itertools
    import threading

    count = [0]
    lock = threading.Lock()
    window = max(0.5, 3 * _median_seconds(run, samples, 3))  # measured before the clock starts
    cycle = itertools.cycle(samples)
    stop = time.perf_counter() + window

    def serve() -> None:
        while time.perf_counter() < stop:
            with lock:
                feeds = next(cycle)
            run(feeds)
            with lock:
                count[0] += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=serve) for _ in range(inflight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    return inflight * elapsed / max(count[0], 1)


def _median_seconds(run: Any, samples: list[Any], count: int = 5) -> float:
    times = []
    for number in range(max(count, len(samples))):
        start = time.perf_counter()
        run(samples[number % len(samples)])
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> int:
    job_path, result_path = sys.argv[1], sys.argv[2]
    with open(job_path) as handle:
        job = json.load(handle)
    limit = job.get("memory_limit_mb")
    try:
        if limit:  # a memory limit (a synthetic OOM, or a machine's budget): past it, allocations fail
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (int(limit) << 20, int(limit) << 20))
        kinds = {"reference": run_reference, "breakdown": run_breakdown}
        record = kinds.get(job.get("kind", ""), run_job)(job)
    except MemoryError as err:
        record = {"status": "oom", "error": f"out of memory under the worker's {limit} MB limit (RLIMIT_AS): {err}"}
    except Exception as err:
        record = {
            "status": "error",
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(limit=8),
        }
    from kiln.output_files import write_output_file

    write_output_file(result_path, json.dumps(record, default=_jsonable), "job result")
    return 0


def _jsonable(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialize {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main())
