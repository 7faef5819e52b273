"""The machine fingerprint stored with every run: CPU, flags, cores, governor, package versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

FLAGS_OF_INTEREST = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "sve",
)
PACKAGES = (
    "kiln-compiler",
    "numpy",
    "onnx",
    "onnxruntime",
    "openvino",
    "torch",
    "transformers",
    "apache-tvm",
    "iree-base-runtime",
    "jax",
)


def fingerprint() -> dict[str, Any]:
    cpuinfo = _read("/proc/cpuinfo")

    def field(name: str) -> str:  # the first processor's value of a /proc/cpuinfo key
        for line in cpuinfo.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
        return ""

    model = field("model name") or platform.processor()
    flags = set((field("flags") or field("Features")).split())  # x86, Arm
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").strip() or "unavailable (no cpufreq)"
    memory = next(
        (line.split()[1] for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal")), None
    )
    return {
        "cpu": model,
        "vendor": field("vendor_id") or platform.machine(),
        "family_model": f"family {field('cpu family') or '?'} model {field('model') or '?'}",
        "flags": sorted(f for f in FLAGS_OF_INTEREST if f in flags),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "governor": governor,
        "memory_gb": round(int(memory) / 1024 / 1024, 1) if memory else None,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
    }


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
