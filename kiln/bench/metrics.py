"""Measurement helpers: latency statistics, memory (peak RSS and growth), energy counters."""

from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

NOISY_CV = 0.10  # coefficient of variation above which a result is flagged as noisy
# samples a percentile needs before it is reported (p99 of 20 samples is the maximum, not a p99)
PERCENTILE_SAMPLES = {"p50": 1, "p90": 10, "p99": 100}
MIN_GROWTH_INFERENCES = 200  # RSS growth is estimated only from runs at least this long...
MIN_GROWTH_SAMPLES = 10  # ...with at least this many RSS samples


def latency_stats(seconds: list[float]) -> dict[str, Any]:
    """Percentiles, mean, std, 95% CI of the mean and coefficient of variation, in milliseconds."""
    values = np.asarray(seconds, dtype=np.float64) * 1e3
    if values.size == 0:
        return {"n": 0}
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    half_width = 1.96 * std / math.sqrt(values.size) if values.size > 1 else 0.0
    cv = std / mean if mean > 0 else 0.0
    # a percentile the sample count cannot support is None, and ``too_few`` says which and why
    percentiles = {
        name: float(np.percentile(values, int(name[1:]))) if values.size >= need else None
        for name, need in PERCENTILE_SAMPLES.items()
    }
    too_few = {
        name: f"{values.size} samples < {need}" for name, need in PERCENTILE_SAMPLES.items() if values.size < need
    }
    return {
        "n": int(values.size),
        **percentiles,
        "too_few": too_few,
        "mean": mean,
        "std": std,
        "ci95": [mean - half_width, mean + half_width],
        "cv": cv,
        "min": float(values.min()),
        "max": float(values.max()),
        "noisy": cv > NOISY_CV,
        # every percentile 0..100, for latency CDF plots
        "percentiles": [float(v) for v in np.percentile(values, np.arange(101))],
    }


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is the best we have
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's own peak resident set: VmHWM, which belongs to the address space exec made
    (getrusage's ru_maxrss is carried across fork and exec on Linux: a worker started by a large
    process would report at least that process's peak)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # elsewhere: the best there is
    return peak if os.uname().sysname == "Darwin" else peak * 1024


def release_freed_memory() -> None:
    """Give memory the process freed back to the OS (garbage collected, then glibc's malloc_trim):
    what a compile freed no longer counts in the next phase's RSS, as in a separate process."""
    from kiln.memory import return_freed

    return_freed(collect=True)


def reset_peak() -> bool:
    """Start a new peak (Linux: ``5`` written to /proc/self/clear_refs resets VmHWM to the current
    RSS); False where the peak cannot be reset (it then keeps counting from the start)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def growth_per_thousand(samples: list[tuple[int, int]]) -> float | None:
    """Least-squares slope of RSS (bytes) over inference count, as MB per 1000 inferences (None
    when the run is too short to estimate it: see ``growth_estimate``)."""
    return growth_estimate(samples)["mb_per_1k"]


def growth_estimate(samples: list[tuple[int, int]]) -> dict[str, Any]:
    """RSS growth from (inference count, RSS bytes) samples: the slope in MB per 1000 inferences
    with its 95% confidence interval, or None and why when the run is too short."""
    counts = np.array([s[0] for s in samples], dtype=np.float64)
    sizes = np.array([s[1] for s in samples], dtype=np.float64)
    inferences = int(counts.max()) if counts.size else 0
    if inferences < MIN_GROWTH_INFERENCES or len(samples) < MIN_GROWTH_SAMPLES or np.ptp(counts) == 0:
        return {
            "mb_per_1k": None,
            "ci95": None,
            "note": f"run too short: {inferences} inferences, {len(samples)} samples "
            f"(needs {MIN_GROWTH_INFERENCES} and {MIN_GROWTH_SAMPLES}; kiln bench --soak N for a leak check)",
        }
    (slope, _), residuals, *_ = np.polyfit(counts, sizes, 1, full=True)
    dof = len(samples) - 2
    variance = float(residuals[0]) / dof if residuals.size and dof > 0 else 0.0
    spread = float(((counts - counts.mean()) ** 2).sum())
    error = math.sqrt(variance / spread) if spread > 0 else 0.0
    scale = 1000 / 1e6
    return {
        "mb_per_1k": float(slope * scale),
        "ci95": [float((slope - 1.96 * error) * scale), float((slope + 1.96 * error) * scale)],
        "note": "",
    }


@dataclass
class EnergyMeter:
    """Cumulative energy counters: RAPL through powercap on CPUs (``energy_uj``)."""

    files: list[Path]
    reason: str = ""

    @classmethod
    def detect(cls, device: str = "cpu") -> EnergyMeter | NvmlEnergyMeter:
        if device == "cuda":
            return NvmlEnergyMeter.detect()
        return cls.detect_rapl()

    @classmethod
    def detect_rapl(cls) -> EnergyMeter:
        root = Path(os.environ.get("KILN_POWERCAP_ROOT", "/sys/class/powercap"))
        if not root.is_dir():
            return cls([], f"no powercap counters ({root} does not exist; RAPL is not exposed here)")
        zones = sorted(p / "energy_uj" for p in root.glob("*rapl*:*") if p.name.count(":") == 1)
        readable = []
        for path in zones:
            try:
                int(path.read_text())
                readable.append(path)
            except (OSError, ValueError):
                continue
        if not readable:
            return cls([], f"no readable RAPL package counters under {root} (missing, or permission denied)")
        return cls(readable)

    @property
    def available(self) -> bool:
        return bool(self.files)

    def read_joules(self) -> float:
        return sum(int(p.read_text()) for p in self.files) / 1e6

    def idle_watts(self, seconds: float = 1.0) -> float:
        start, begin = self.read_joules(), time.perf_counter()
        time.sleep(seconds)
        return max(self.read_joules() - start, 0.0) / (time.perf_counter() - begin)


class NvmlEnergyMeter:
    """GPU board energy from NVML's total-energy counter (millijoules since driver load)."""

    def __init__(self, handle: Any = None, reason: str = "") -> None:
        self.handle = handle
        self.reason = reason

    @classmethod
    def detect(cls) -> NvmlEnergyMeter:
        try:
            import pynvml
        except ImportError:
            return cls(None, "pynvml is not installed (pip install nvidia-ml-py)")
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception as err:  # NVML's own error types vary by driver
            return cls(None, f"NVML energy counter unavailable: {err}")
        return cls(handle)

    @property
    def available(self) -> bool:
        return self.handle is not None

    def read_joules(self) -> float:
        import pynvml

        return pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3

    def idle_watts(self, seconds: float = 1.0) -> float:
        start, begin = self.read_joules(), time.perf_counter()
        time.sleep(seconds)
        return max(self.read_joules() - start, 0.0) / (time.perf_counter() - begin)


def energy_per_inference(joules: float, seconds: float, idle_watts: float, inferences: int) -> float:
    """Energy attributable to inference: the window's energy minus the idle baseline, per inference."""
    return max(joules - idle_watts * seconds, 0.0) / max(inferences, 1)


def agreement(outputs: list[np.ndarray], reference: list[np.ndarray], classifier: bool) -> dict[str, Any]:
    """How close a backend's outputs are to kiln's reference interpreter."""
    if len(outputs) != len(reference):
        return {"error": f"{len(outputs)} outputs vs {len(reference)} in the reference"}
    from kiln.zoo.check import relative_l2

    max_abs, worst_rel = 0.0, 0.0
    for got, expected in zip(outputs, reference):
        got64, expected64 = np.asarray(got, np.float64), np.asarray(expected, np.float64)
        if got64.shape != expected64.shape:
            return {"error": f"shape {list(got64.shape)} vs {list(expected64.shape)} in the reference"}
        max_abs = max(max_abs, float(np.max(np.abs(got64 - expected64))) if got64.size else 0.0)
        worst_rel = max(worst_rel, relative_l2(got64, expected64))
    result: dict[str, Any] = {"max_abs": max_abs, "rel_l2": worst_rel}
    if classifier:
        got_top = np.argmax(np.asarray(outputs[0]).reshape(-1, outputs[0].shape[-1]), axis=-1)
        ref_top = np.argmax(np.asarray(reference[0]).reshape(-1, reference[0].shape[-1]), axis=-1)
        result["top1_agreement"] = float(np.mean(got_top == ref_top))
    return result
