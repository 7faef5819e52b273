"""What this CPU offers for reduced precision, and the OS permission AMX needs.

``cpu_flags()``: the kernel's CPU flags (/proc/cpuinfo), read once. ``precision_paths()``: for bf16
and int8, the hardware paths this CPU has, best first (AMX tiles, AVX-512 dot products, AVX-VNNI,
plain AVX2 / AVX-512 arithmetic). ``request_amx()``: Linux hands AMX tile data to a process only
after it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); without that, the first
tile instruction kills the process with SIGILL. The answer (granted, or why not) is cached, so
kernels choose their AMX or fallback path once per process.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping
from functools import lru_cache

from kiln.backends.cpu.target import Caches
from kiln.errors import KilnError

# (path name, the /proc/cpuinfo flags it needs), best first
PATHS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "bf16": (
        ("amx-bf16", ("amx_tile", "amx_bf16")),
        ("avx512-bf16", ("avx512_bf16",)),
    ),
    "int8": (
        ("amx-int8", ("amx_tile", "amx_int8")),
        ("avx512-vnni", ("avx512_vnni",)),
        ("avx-vnni", ("avx_vnni",)),
        ("avx2", ("avx2",)),
    ),
}

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_GET_XCOMP_PERM = 0x1022
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


# the /proc/cpuinfo flags that name instruction-set extensions a compiler may emit for compute
# code (what -march=native turns on); the others (hypervisor, rdrand, constant_tsc...) never matter
ISA_FLAG_PREFIXES = (
    "sse", "ssse3", "avx", "amx", "fma", "f16c", "bmi", "popcnt", "movbe", "abm", "lzcnt",
    "gfni", "vaes", "vpclmulqdq", "adx", "xop", "asimd", "sve", "fp16", "bf16", "i8mm",
)  # fmt: skip


def isa_features(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The instruction-set extensions among ``flags`` (default: this CPU's), sorted."""
    flags = cpu_flags() if flags is None else flags
    return tuple(sorted(f for f in flags if f.startswith(ISA_FLAG_PREFIXES)))


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as the kernel reports them (empty where /proc/cpuinfo is absent)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def precision_paths(flags: frozenset[str] | None = None) -> dict[str, list[str]]:
    """{"bf16": [...], "int8": [...]}: the hardware paths ``flags`` (default: this CPU) offer,
    best first; an empty list means that precision would have to be emulated."""
    flags = cpu_flags() if flags is None else flags
    return {
        precision: [name for name, needs in paths if all(flag in flags for flag in needs)]
        for precision, paths in PATHS.items()
    }


@lru_cache(maxsize=1)
def request_amx() -> tuple[bool, str]:
    """(True, "") when this process may use AMX tiles (asked once), else (False, why not)."""
    if "amx_tile" not in cpu_flags():
        return False, "this CPU has no AMX (no amx_tile flag)"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (
            False,
            f"AMX permission is requested through Linux x86-64's arch_prctl (this is {platform.system()} {platform.machine()})",
        )
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        errno = ctypes.get_errno()
        return False, f"the kernel refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: errno {errno})"
    granted = ctypes.c_uint64(0)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(granted)) != 0:
        return False, f"arch_prctl ARCH_GET_XCOMP_PERM failed (errno {ctypes.get_errno()})"
    if not granted.value & (1 << _XFEATURE_XTILEDATA):
        return False, "the kernel did not grant AMX tile data"
    return True, ""


BF16_PATHS = {"amx": 2, "avx512": 1, "portable": 0}  # gemm_bf16.c's kiln_set_bf16 modes


def bf16_path(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(mode, name) of the bf16 micro-kernel this process runs (``kiln_set_bf16``): AMX-BF16 when
    the CPU has it and the OS granted it, else AVX512_BF16 dot products, else portable C (correct,
    slow). ``$KILN_BF16_PATH`` (amx | avx512 | portable) asks for a path, one this machine has:
    the tests and benchmarks compare the paths on one machine."""
    env = os.environ if env is None else env
    paths = precision_paths()["bf16"]
    available = ["portable"]
    if "avx512-bf16" in paths:
        available.insert(0, "avx512")
    if "amx-bf16" in paths and request_amx()[0]:
        available.insert(0, "amx")
    return _chosen("KILN_BF16_PATH", BF16_PATHS, available, env, "this machine runs only")


def _chosen(
    variable: str, modes: dict[str, int], available: list[str], env: Mapping[str, str], only: str
) -> tuple[int, str]:
    """(mode, name): the path ``$variable`` asks for (KilnError unless ``available`` has it), else
    the best available (first)."""
    wanted = env.get(variable, "").strip().lower()
    if not wanted:
        return modes[available[0]], available[0]
    if wanted not in modes:
        raise KilnError(f"{variable}={wanted!r}: the paths are {', '.join(modes)}")
    if wanted not in available:
        raise KilnError(f"{variable}={wanted}: {only} {', '.join(available)}")
    return modes[wanted], wanted


INT8_PATHS = {"amx": 4, "avx512-vnni": 3, "avx-vnni": 2, "avx2": 1, "portable": 0}  # gemm_int8.c's modes


def int8_path(isa: str = "avx512", native: bool = True, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(mode, name) of the int8 micro-kernel (``kiln_set_int8``) for code of a target of ``isa``:
    AMX-INT8 when the CPU has it and the OS granted it, else AVX512-VNNI, AVX-VNNI, AVX2
    (VPMADDUBSW), portable C. The ``cpu:avx2`` target's code takes the AVX2 path even on a CPU
    with more (it stands for AVX2-only machines). ``$KILN_INT8_PATH`` asks for a path this machine has."""
    env = os.environ if env is None else env
    paths = precision_paths()["int8"]
    available = ["portable"]
    if isa in ("avx512", "avx2") and "avx2" in paths:
        available.insert(0, "avx2")
    if isa == "avx512" or (native and isa == "avx2"):
        if "avx-vnni" in paths:
            available.insert(0, "avx-vnni")
        if "avx512-vnni" in paths:
            available.insert(0, "avx512-vnni")
        if "amx-int8" in paths and request_amx()[0]:
            available.insert(0, "amx")
    return _chosen("KILN_INT8_PATH", INT8_PATHS, available, env, f"code for {isa} runs here only")


def precision_path_names(isa: str, native: bool) -> dict[str, str]:
    """{"bf16": ..., "int8": ...}: the hardware path each reduced precision's products take in code
    of a cpu target of ``isa`` loaded in this process (what the loader sets through kiln_set_bf16
    and kiln_set_int8): ``kiln explain`` prints it beside each kernel's precision."""
    bf16 = bf16_path()[1]
    int8 = int8_path(isa, native)[1]
    return {"bf16": "amx-bf16" if bf16 == "amx" else ("avx512-bf16" if bf16 == "avx512" else bf16),
            "int8": "amx-int8" if int8 == "amx" else int8}  # fmt: skip


def int8_levels(isa: str, native: bool) -> int:
    """The largest quantized activation (255, or 127) the int8 code of a target may use: 7-bit
    activations wherever the code may run on AVX2's VPMADDUBSW (its pairs of u8 x s8 products
    saturate 16 bits beyond 7 bits); 8 bits where it is built for this CPU and the CPU has VNNI."""
    flags = cpu_flags()
    vnni = "avx512_vnni" in flags or "avx_vnni" in flags or "amx_int8" in flags
    return 255 if native and isa in ("avx512", "avx2") and vnni else 127


@lru_cache(maxsize=1)
def caches() -> Caches:
    """This CPU's data caches (L1d and L2 per core, L3 shared) from sysfs; 0 where the OS does
    not say (a container without /sys, another OS)."""
    sizes = {}
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return Caches()
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            with open(f"{root}/{entry}/level") as handle:
                level = handle.read().strip()
            with open(f"{root}/{entry}/type") as handle:
                kind = handle.read().strip()
            with open(f"{root}/{entry}/size") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes[{"1": "l1d", "2": "l2", "3": "l3"}.get(level, "")] = int(digits) * scale
    sizes.pop("", None)
    return Caches(**sizes)
