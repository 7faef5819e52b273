"""The gpu target on a real GPU, in one command: correctness, latency against PyTorch, compile times.

    python benchmarks/gpu_check.py --out DIR            # on a machine with an NVIDIA GPU (target gpu)
    python benchmarks/gpu_check.py --out DIR --dry-run  # anywhere: gpu:interpret, small models (CI runs it)

What it does, each step bounded by what is left of ``--budget`` seconds (a step that does not fit is
reported "skipped: budget", never dropped silently):

1. **environment**: GPU, driver, CUDA, Triton, PyTorch, kiln; how kiln was imported.
2. **conformance**: a subset of the ONNX node cases on the target, one case per kernel family kiln
   renders (elementwise, reductions, products, convolutions, pooling, normalization, softmax,
   attention, gathers, resizes), each case in a worker process (``kiln.conformance``).
3. **models**: each zoo model (exported here with the installed PyTorch) compiled for the target and
   run against onnxruntime on the CPU at batch 1, fp32 (PyTorch's TF32 off); compile and first-call
   seconds; on a mismatch, ``kiln.diff`` names the first tensor that diverges. Models compile
   concurrently, one process each (correctness does not care; no timing is taken here).
4. **latency**: per model and batch, each engine in a process of its own, one at a time: kiln (from
   and to host arrays, with its upload / kernels / download split), PyTorch eager and
   ``torch.compile`` (inductor default; ``reduce-overhead``: CUDA graphs; ``max-autotune-no-cudagraphs``
   with ``--autotune``), on tensors already on the device and from host to host. Medians and p90
   over ``--duration`` seconds; ratios kiln / best torch.compile mode.

Results: ``DIR/gpu_check.json`` and ``DIR/gpu_check.md``, rewritten after every step, so a run cut
short keeps what it measured. Every row names the command that reproduces it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# one case per kernel family the gpu renderer has (a regex on the ONNX node case names)
CONFORMANCE = (
    r"^test_(add|mul|div|sub|relu|sigmoid|tanh|erf|exp|log|sqrt|pow|where|clip|gelu_default_1|"
    r"leakyrelu|hardswish|cast_FLOAT_to_FLOAT16|reduce_sum_default_axes_keepdims_random|reduce_mean_keepdims_random|"
    r"reduce_max_keepdims_random|argmax_default_axis_random|softmax_axis_1|logsoftmax_axis_1|"
    r"layer_normalization_3d_axis1_epsilon|batchnorm_epsilon|instancenorm_example|matmul_2d|matmul_3d|matmul_4d|"
    r"gemm_default_single_elem_vector_bias|gemm_all_attributes|conv_with_strides_padding|conv_with_autopad_same|"
    r"convtranspose|basic_conv_with_padding|maxpool_2d_pads|averagepool_2d_pads|globalaveragepool|"
    r"attention_4d|attention_3d|gather_0|gather_1|gather_elements_0|gathernd_example_float32|scatter_elements_with_axis|"
    r"resize_upsample_scales_linear|resize_downsample_scales_cubic|resize_upsample_sizes_nearest|transpose_all_permutations_0|"
    r"concat_3d_axis_1|slice|split_equal_parts_1d_opset18|expand_dim_changed|tile|pad|cumsum_1d|topk|einsum_batch_matmul|"
    r"depthtospace_example|lrn|hardmax_axis_1|mean_example|max_example)$"
)
DRY_CONFORMANCE = r"^test_(relu|add|matmul_2d|softmax_axis_1|conv_with_strides_padding|gather_0|maxpool_2d_pads)$"

MODELS = ("resnet50", "vgg19", "mobilenet_v2", "bert-base", "gpt2")
DRY_MODELS = ("mnist-cnn", "transformer-block")
TOLERANCE = 1e-4  # relative L2 against onnxruntime (fp32, TF32 off)


# -- the worker side: one job per process ------------------------------------------------------------


def _torch_setup(device: str) -> Any:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 against fp32: TF32 is a precision of its own
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if device == "cpu":
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    return torch


def _first_divergence(path: str, target: str, feeds: dict[str, Any]) -> str:
    """``kiln diff`` on ``target``: the first tensor beyond tolerance and the node that made it."""
    from kiln.cli_support import import_bound
    from kiln.diff import diff
    from kiln.passes import specialize

    graph, binding = import_bound(path, tuple(f"{k}={v}" for k, v in _dims_of(path, feeds).items()))
    report = diff(specialize(graph, binding), feeds, tolerance=TOLERANCE, target=target)
    first = report.first_divergence
    if first is None:
        return "kiln diff: no intermediate tensor diverges (the difference is in the outputs' assembly)"
    return f"first divergence: {first.name} (rel L2 {first.relative_l2:.2e}) produced by {first.node}"


def _dims_of(path: str, feeds: dict[str, Any]) -> dict[str, int]:
    import onnx

    dims: dict[str, int] = {}
    for value in onnx.load(path, load_external_data=False).graph.input:
        if value.name not in feeds:
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param:
                dims[dim.dim_param] = int(feeds[value.name].shape[axis])
    return dims


def job_check(model: str, target: str) -> dict[str, Any]:
    """Compile ``model`` for ``target``, run it at batch 1 and compare with onnxruntime (CPU)."""
    import kiln
    from kiln import zoo
    from kiln.zoo.check import relative_l2 as _relative_l2
    from kiln.zoo.check import run_onnxruntime

    device = "cpu" if target.endswith("interpret") else "cuda"
    _torch_setup(device)
    started = time.perf_counter()
    path = str(zoo.onnx_path(model))
    exported = time.perf_counter() - started
    feeds = zoo.example_inputs(model)
    want = run_onnxruntime(path, feeds, threads=min(8, os.cpu_count() or 1))
    started = time.perf_counter()
    compiled = kiln.compile(path, target=target)
    compile_s = time.perf_counter() - started
    started = time.perf_counter()
    got = list(compiled.run(feeds).values())
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    again = list(compiled.run(feeds).values())
    second_s = time.perf_counter() - started
    third = list(compiled.run(feeds).values())
    # the first run uses the rendered blocks, later ones the tuner's choice (another summation
    # order): both must match; from the second run on, runs repeat to the bit
    errors = [_relative_l2(g, w) for g, w in zip(got + again, want + want)]
    repeat = max(_relative_l2(a, g) for a, g in zip(third, again))
    result = {
        "model": model,
        "target": target,
        "export_s": exported,
        "compile_s": compile_s,
        "first_run_s": first_s,
        "second_run_s": second_s,
        "rel_l2": max(errors),
        "repeat_rel_l2": repeat,
        "ok": max(errors) <= TOLERANCE and repeat == 0.0,
        "native": getattr(compiled, "is_native", None),
    }
    if not result["ok"]:
        try:
            result["divergence"] = _first_divergence(path, target, feeds)
        except Exception as err:
            result["divergence"] = f"kiln diff failed: {type(err).__name__}: {err}"
    return result


def _timed(call: Any, duration: float, sync: Any, minimum: int = 10) -> dict[str, float]:
    """Median and p90 (ms) of ``call`` over ``duration`` seconds, after 3 warm-ups."""
    if duration <= 0:  # a warm-up job: one call fills the caches
        minimum = 1
    for _ in range(3 if minimum > 1 else 0):
        call()
    sync()
    times: list[float] = []
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline or len(times) < minimum:
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "median_ms": 1e3 * statistics.median(times),
        "p90_ms": 1e3 * times[min(len(times) - 1, int(0.9 * len(times)))],
        "runs": len(times),
        "calls": len(times) + (3 if minimum > 1 else 0),
    }


def _steady(before: dict[str, Any] | None, after: dict[str, Any] | None, calls: int) -> dict[str, Any] | None:
    """Per-call transfer and kernel times over the ``calls`` between two readings (the averages
    since load include the first run, which compiles and tunes every kernel)."""
    if not before or not after or calls <= 0:
        return after
    split = {f"{k}_ms": 1e3 * (after[f"{k}_s"] - before[f"{k}_s"]) / calls for k in ("upload", "compute", "download")}
    return {**after, **split, "runs": calls}


def job_time(model: str, batch: int, engine: str, target: str, duration: float) -> dict[str, Any]:
    """One engine's latency on ``model`` at ``batch``, in this process."""
    import numpy as np

    from kiln import zoo

    device = "cpu" if target.endswith("interpret") else "cuda"
    torch = _torch_setup(device)
    feeds = zoo.example_inputs(model, batch=batch)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result: dict[str, Any] = {"model": model, "batch": batch, "engine": engine, "device": device}
    started = time.perf_counter()
    if engine.startswith("kiln"):
        if engine == "kiln-nographs":
            os.environ["KILN_GPU_GRAPHS"] = "0"
        if engine == "kiln-untuned":
            os.environ["KILN_GPU_TUNE"] = "0"
        import kiln
        from kiln.backends.gpu import transfer_times

        compiled = kiln.compile(str(zoo.onnx_path(model)), target=target)
        compiled.run(feeds)
        result["first_call_s"] = time.perf_counter() - started
        runners = [r for executable in compiled.executables() for r in executable.runners]
        for _ in range(3):  # warm (a CUDA graph is captured after the first run)
            compiled.run(feeds)
        before = transfer_times(runners)
        result["host"] = _timed(lambda: compiled.run(feeds), duration, sync)
        after = transfer_times(runners)
        result["split"] = _steady(before, after, result["host"]["calls"])
        result["tuning"] = (after or {}).get("tuning")
        return result
    module = zoo.get(model).build(zoo.options_for(model, batch=batch)).eval().to(device)
    tensors = [torch.from_numpy(np.ascontiguousarray(v)).to(device) for v in feeds.values()]
    if engine != "eager":
        import torch._dynamo

        torch._dynamo.reset()
        mode = None if engine == "inductor" else engine.removeprefix("inductor-")
        module = torch.compile(module, mode=mode)

    def on_device() -> Any:
        with torch.inference_mode():
            return module(*tensors)

    def host_to_host() -> Any:
        with torch.inference_mode():
            out = module(*[torch.from_numpy(v).to(device) for v in feeds.values()])
            return out.cpu().numpy() if hasattr(out, "cpu") else out

    on_device()
    sync()
    result["first_call_s"] = time.perf_counter() - started
    result["device_resident"] = _timed(on_device, duration, sync)
    result["host"] = _timed(host_to_host, duration, sync)
    return result


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        if spec["job"] == "check":
            return job_check(spec["model"], spec["target"])
        return job_time(spec["model"], spec["batch"], spec["engine"], spec["target"], spec["duration"])
    except Exception as err:
        return {**spec, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=8)[-3000:]}


# -- the driver side ---------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = time.monotonic() + args.budget
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.target = "gpu:interpret" if args.dry_run else "gpu"
        self.results: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join(shlex.quote(a) for a in ["python", "benchmarks/gpu_check.py", *sys.argv[1:]]),
            "target": self.target,
            "dry_run": args.dry_run,
            "steps": {},
        }
        scratch = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="kiln-gpu-check-"))
        self.env = dict(os.environ)
        self.env.setdefault("KILN_CACHE_DIR", str(scratch / "kiln-cache"))
        self.env.setdefault("TRITON_CACHE_DIR", str(scratch / "triton-cache"))
        self.env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(scratch / "inductor-cache"))
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.env["PYTHONUNBUFFERED"] = "1"
        if args.dry_run:  # the interpreter's times mean nothing, but the tuner's bookkeeping runs
            self.env.setdefault("KILN_GPU_TUNE", "force")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{self.args.budget - self.left():6.1f} s] {text}", flush=True)

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "gpu_check.md").write_text(markdown(self.results))

    def spawn(self, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        """``spec`` run by a fresh interpreter of this script (its own CUDA context and caches)."""
        if timeout < 5:
            return {**spec, "error": "skipped: budget"}
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
        try:
            done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {**spec, "error": f"timed out after {timeout:.0f} s"}
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        return {**spec, "error": f"worker exit {done.returncode}: {done.stderr[-2000:]}"}

    # -- steps

    def environment(self) -> None:
        info: dict[str, Any] = {"python": sys.version.split()[0], "machine": platform.machine()}
        try:
            import kiln

            info["kiln"] = f"{kiln.__version__} from {Path(kiln.__file__).parent}"
        except ImportError as err:
            info["kiln"] = f"not importable: {err}"
        for name in ("torch", "triton", "numpy", "onnx", "onnxruntime"):
            try:
                info[name] = __import__(name).__version__
            except Exception as err:
                info[name] = f"not installed ({type(err).__name__})"
        try:
            import torch

            info["cuda"] = torch.version.cuda
            if torch.cuda.is_available():
                props = torch.cuda.get_device_properties(0)
                info["gpu"] = f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB"
                info["capability"] = "sm_{}{}".format(*torch.cuda.get_device_capability(0))
        except Exception as err:
            info["cuda"] = f"unavailable ({type(err).__name__})"
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            info["nvidia_smi"] = f"not available ({type(err).__name__})"
        info["cpus"] = os.cpu_count()
        self.results["environment"] = info
        self.say(json.dumps(info))

    def conformance(self) -> None:
        from kiln.conformance.runner import load_cases, run_conformance

        pattern = self.args.cases or (DRY_CONFORMANCE if self.args.dry_run else CONFORMANCE)
        cases = load_cases(("node",), pattern)
        budget = min(self.args.conformance_budget, self.left() - 60)
        step: dict[str, Any] = {"cases": len(cases), "pattern": pattern}
        self.results["steps"]["conformance"] = step
        if budget < 10:
            step["error"] = "skipped: budget"
            return
        # a few workers: the model checks and the warm-ups compile beside them (on 16 cores, 12
        # workers left three model checks timing out at 170 s, 2026-11-27)
        jobs = max(1, min(6, (os.cpu_count() or 2) // 3)) if not self.args.dry_run else 2
        os.environ.update({k: v for k, v in self.env.items() if k.endswith("CACHE_DIR")})
        started = time.monotonic()
        report = run_conformance(cases, target=self.target, jobs=jobs, timeout=min(90.0, budget))
        step.update(
            {
                "seconds": time.monotonic() - started,
                "passed": report.passed,
                "total": report.total,
                "native": report.native,
                "failures": [
                    {"case": r.name, "status": r.status, "ops": r.ops, "message": r.message[:600]}
                    for r in report.results
                    if r.status != "pass"
                ],
            }
        )
        self.say(f"conformance: {report.passed}/{report.total} pass ({report.native} native)")

    def model_names(self) -> list[str]:
        return self.args.models.split(",") if self.args.models else list(DRY_MODELS if self.args.dry_run else MODELS)

    def latency_jobs(self) -> list[dict[str, Any]]:
        names = self.model_names()
        timed = self.args.latency_models.split(",") if self.args.latency_models else names[:1] + names[3:4]
        engines = self.args.engines.split(",")
        if self.args.dry_run and not self.args.inductor:
            engines = [e for e in engines if not e.startswith("inductor")]
        if self.args.autotune:
            engines.append("inductor-max-autotune-no-cudagraphs")
        batches = (
            [int(b) for b in self.args.batches.split(",")]
            if self.args.batches
            else [1, 2]
            if self.args.dry_run
            else [1, 32]
        )
        jobs = [
            {"job": "time", "model": m, "batch": b, "engine": e, "target": self.target, "duration": self.args.duration}
            for m in timed
            for b in batches
            for e in engines
        ]
        # kiln against torch everywhere first; kiln's ablations (untuned, no graphs) after, where budget is left
        return sorted(jobs, key=lambda j: j["engine"] in ("kiln-untuned", "kiln-nographs"))

    def models(self) -> None:
        """Each model checked in a process of its own, all at once; meanwhile every latency job that
        compiles (torch.compile, kiln at another batch) runs once, untimed, to fill the caches the
        timed runs then find (inductor's FX graph and Triton caches, kiln's plan cache)."""
        rows: list[dict[str, Any]] = []
        warm: list[dict[str, Any]] = []
        self.results["steps"]["models"] = rows
        self.results["steps"]["warm_up"] = warm
        budget = min(self.args.models_budget, self.left() - 60)
        checks = [{"job": "check", "model": m, "target": self.target} for m in self.model_names()]
        warmups = [
            {**j, "duration": 0.0}
            for j in self.latency_jobs()
            if j["engine"] in ("kiln", "inductor", "inductor-reduce-overhead")
            and not (j["engine"] == "kiln" and j["batch"] == 1)
        ]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(checks) + len(warmups)) as pool:
            checked = pool.map(lambda s: self.spawn(s, budget), checks)
            warmed = pool.map(lambda s: self.spawn(s, budget), warmups)
            for row in checked:
                rows.append(row)
                self.say(f"model {row['model']}: {_short(row)}")
            for row in warmed:
                warm.append({k: row.get(k) for k in ("model", "batch", "engine", "first_call_s", "error")})
                self.say(f"warm-up {row['model']} b{row['batch']} {row['engine']}: {_short(row)}")

    def checks(self) -> None:
        """The conformance subset and the model checks side by side (different processes)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            conformance = pool.submit(self.conformance)
            self.models()
            conformance.result()

    def latency(self) -> None:
        rows: list[dict[str, Any]] = []
        self.results["steps"]["latency"] = rows
        for spec in self.latency_jobs():
            row = self.spawn(spec, min(self.args.job_timeout, self.left() - 5))
            rows.append(row)
            self.say(f"latency {spec['model']} b{spec['batch']} {spec['engine']}: {_short(row)}")
            self.save()

    def main(self) -> int:
        self.environment()
        self.save()
        for step in self.args.steps.split(","):
            started = time.monotonic()
            try:
                getattr(self, step)()
            except Exception as err:
                self.results["steps"].setdefault(step, {})
                self.results["steps"][f"{step}_error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
                self.say(f"step {step} failed: {err}")
            self.results.setdefault("step_seconds", {})[step] = time.monotonic() - started
            self.save()
        self.say(f"results in {self.out}")
        print((self.out / "gpu_check.md").read_text(), flush=True)
        return 0


def _short(row: dict[str, Any]) -> str:
    if "error" in row:
        return "ERROR " + row["error"].splitlines()[0][:300]
    if "rel_l2" in row:
        return f"rel L2 {row['rel_l2']:.2e} compile {row['compile_s']:.1f} s first {row['first_run_s']:.2f} s"
    host = row.get("host", {})
    return f"median {host.get('median_ms', float('nan')):.3f} ms p90 {host.get('p90_ms', float('nan')):.3f} ms"


def markdown(results: dict[str, Any]) -> str:
    """The results as a page people read."""
    env = results.get("environment", {})
    lines = [
        f"# gpu check, {results['date']} ({'dry run: ' if results['dry_run'] else ''}target `{results['target']}`)",
        "",
        f"Command: `{results['command']}`",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in env.items()],
        "",
    ]
    steps = results["steps"]
    conformance = steps.get("conformance")
    if conformance:
        lines += ["## ONNX node cases", ""]
        if "passed" in conformance:
            lines.append(
                f"{conformance['passed']} / {conformance['total']} pass ({conformance['native']} with no host "
                f"fallback) in {conformance['seconds']:.0f} s; pattern `{conformance['pattern']}`"
            )
            for failure in conformance["failures"]:
                message = failure["message"].splitlines()[0][:200] if failure["message"] else ""
                lines.append(f"- `{failure['case']}` {failure['status']}: {message}")
        else:
            lines.append(conformance.get("error", "not run"))
        lines.append("")
    if steps.get("models"):
        lines += [
            "## Zoo models against onnxruntime (CPU), batch 1, fp32",
            "",
            "| model | rel L2 | ok | compile s | first run s | second run s | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in steps["models"]:
            if "error" in row:
                lines.append(f"| {row['model']} | | ERROR | | | | {row['error'].splitlines()[0][:200]} |")
                continue
            lines.append(
                f"| {row['model']} | {row['rel_l2']:.2e} | {'yes' if row['ok'] else '**no**'} | {row['compile_s']:.1f} "
                f"| {row['first_run_s']:.2f} | {row['second_run_s'] * 1e3:.1f} ms | {row.get('divergence', '')} |"
            )
        lines.append("")
    if steps.get("warm_up"):
        lines += ["Untimed warm-ups beside the checks (first calls under contention, caches cold):", ""]
        for row in steps["warm_up"]:
            what = row["error"] if row.get("error") else f"first call {row['first_call_s']:.1f} s"
            lines.append(f"- {row['model']} batch {row['batch']} {row['engine']}: {what}")
        lines.append("")
    if steps.get("latency"):
        lines += latency_table(steps["latency"])
    for key, value in steps.items():
        if key.endswith("_error"):
            lines += [f"## {key}", "", "```", str(value)[-3000:], "```", ""]
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def latency_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Latency (ms; median / p90)",
        "",
        "host: from host arrays to host arrays (kiln's `run`); device: inputs and outputs on the device.",
        "",
        "| model | batch | engine | host median | host p90 | device median | device p90 | first call s | kiln split (up / kernels / down ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    best: dict[tuple[str, int], float] = {}
    for row in rows:
        if "error" in row:
            lines.append(
                f"| {row['model']} | {row['batch']} | {row['engine']} | ERROR: {row['error'][:160]} | | | | | |"
            )
            continue
        host, device = row.get("host", {}), row.get("device_resident", {})
        split = row.get("split") or {}
        split_text = (
            f"{split['upload_ms']:.3f} / {split['compute_ms']:.3f} / {split['download_ms']:.3f}"
            f" (graphs: {split.get('cuda_graphs', '?')}; tuning: {_tuning_text(row.get('tuning'))})"
            if split
            else ""
        )
        lines.append(
            f"| {row['model']} | {row['batch']} | {row['engine']} | {host.get('median_ms', 0):.3f} | "
            f"{host.get('p90_ms', 0):.3f} | {_ms(device.get('median_ms'))} | {_ms(device.get('p90_ms'))} | "
            f"{row.get('first_call_s', 0):.1f} | {split_text} |"
        )
        if row["engine"].startswith("inductor"):
            key = (row["model"], row["batch"])
            best[key] = min(best.get(key, float("inf")), host["median_ms"])
    ratios = []
    for row in rows:
        key = (row["model"], row["batch"])
        if row["engine"] == "kiln" and "host" in row and key in best:
            ratios.append(
                f"- {key[0]} batch {key[1]}: kiln / best torch.compile (host to host) = {row['host']['median_ms'] / best[key]:.2f}"
            )
    return [*lines, "", *ratios, ""]


def _tuning_text(tuning: Any) -> str:
    from kiln.backends.gpu.explain import tuning_note

    return tuning_note(tuning)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check", help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--dry-run", action="store_true", help="gpu:interpret and small models (no GPU needed)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check")
    parser.add_argument(
        "--steps",
        default="checks,latency",
        help="comma-separated steps: checks (conformance + models), latency; or conformance, models alone",
    )
    parser.add_argument("--models", default="", help="comma-separated zoo models (default: the five seed models)")
    parser.add_argument("--latency-models", default="", help="models timed (default: resnet50,bert-base)")
    parser.add_argument("--cases", default="", help="regex of ONNX node cases (default: one per kernel family)")
    parser.add_argument("--batches", default="", help="comma-separated batch sizes timed (default: 1,32; dry run 1,2)")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of timed calls per engine")
    parser.add_argument("--conformance-budget", type=float, default=100.0)
    parser.add_argument("--models-budget", type=float, default=240.0)
    parser.add_argument("--job-timeout", type=float, default=120.0, help="seconds per latency job")
    parser.add_argument(
        "--engines",
        default="kiln,eager,inductor,inductor-reduce-overhead,kiln-untuned",
        help="comma-separated engines timed: kiln, kiln-untuned (KILN_GPU_TUNE=0), kiln-nographs "
        "(KILN_GPU_GRAPHS=0), eager, inductor, inductor-reduce-overhead",
    )
    parser.add_argument(
        "--cache", default="", help="folder for kiln's, Triton's and inductor's caches (kept: a second run reuses them)"
    )
    parser.add_argument("--inductor", action="store_true", help="time torch.compile in a dry run too")
    parser.add_argument("--autotune", action="store_true", help="add inductor's max-autotune-no-cudagraphs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, str(ROOT))  # kiln from this checkout when it is not installed
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker)), default=str), flush=True)
        return 0
    if args.dry_run:
        args.duration = min(args.duration, 0.3)
    return Run(args).main()


if __name__ == "__main__":
    sys.exit(main())
