"""The target registry: every target kiln compiles for is a ``Backend`` registered here.

A backend provides, for the shared pipeline (``kiln.driver.pipeline``):
- ``describe(variant)``: the ``Target`` record lowering reads (ISA, vector width, cores, engines)
  for a name such as ``cpu`` or ``cpu:avx2``; a ``TargetError`` when unknown or not runnable here;
- ``variants()``: the names it accepts, for ``--help`` and error messages;
- ``keeps(node)``: its legalization policy, what ``decompose`` leaves whole (default: what the
  shared lowering table has a rule for) and ``widens_half`` (compute float16 in float32);
- ``render(segments, table, options, target)``: source text for the lowered kernels ('' if none);
- ``build(source, target, options)``: that source built into the files ``load`` opens (a tuple:
  none, one or many; the plan cache and artifacts keep them all) — ``options`` are ``BuildOptions``;
- ``load(plan, target, parallelism)``: one runner per native segment, ``runner(table, views, status)``;
- ``scratch(kernels, target)``: the engines' working memory outside the arena (for reports);
- ``identity(target, debug)``: what besides the source decides its build (compiler, flags), for caches.
A new target subclasses ``Backend`` and calls ``register``; nothing shared changes (tests register
one of their own: ``tests/targets/kir_backend.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import ArgumentError
from kiln.ir.graph import Node
from kiln.lower.engine import WEIGHT_FORMATS
from kiln.lower.families import lowerable
from kiln.lower.kir import Buffer, Kernel
from kiln.lower.target import Target, TargetError

# runner(pointer table, buffer -> array view, status array): runs one native segment
SegmentRunner = Callable[[Any, dict[Buffer, np.ndarray], np.ndarray], None]

# a host callback for an entry: host(gap) runs the fallbacks before segment ``gap``; nonzero = failed
HOST_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)


@dataclass
class Loaded:
    """What a backend's ``load`` opened: one runner per native segment, and, where its code has
    it, ``api``: kiln's C API over the plan (``kiln.backends.cpu.native_api.NativeApi``), whose
    ``kiln_context_run`` runs every segment in order from one native call (host steps called back
    between them). The runtime runs through ``api`` when it exists: a call's cost is then one
    foreign call, whatever the kernel and segment counts."""

    segments: list[SegmentRunner]
    api: Any = None


MAX_THREADS = 4096  # participants in a parallel loop: more than any machine kiln runs on has cores
MAX_SPIN = 1 << 30  # pause instructions before a waiting thread sleeps (seconds of spinning)


@dataclass(frozen=True)
class BuildOptions:
    """What of a compile's options a backend's ``render`` and ``build`` read (the driver's
    ``CompileOptions.build``)."""

    level: int = 2  # -O level, 0..3
    debug: bool = False  # checked indices, sanitizers
    profile: bool = False  # per-kernel timers in the generated code


@dataclass(frozen=True)
class Threading:
    """How a loaded model's parallel loops run (a run-time setting: ``kiln.compile`` and
    ``kiln.load`` take it, artifacts do not record it)."""

    threads: int = 0  # participants per parallel loop, the calling thread included (0: the CPUs this process may use)
    spin: int = 2000  # pause iterations a waiting thread spins before it sleeps (0: sleep at once)

    @classmethod
    def of(cls, threads: int = 0, spin: int | None = None) -> Threading:
        """From ``kiln.compile``/``kiln.load``'s arguments (``spin=None``: the default)."""
        return cls(threads) if spin is None else cls(threads, spin)

    def __post_init__(self) -> None:
        if type(self.threads) is not int or self.threads < 0 or self.threads > MAX_THREADS:
            raise ArgumentError(f"threads must be an integer in 0..{MAX_THREADS} (0: every CPU), got {self.threads!r}")
        if type(self.spin) is not int or self.spin < 0 or self.spin > MAX_SPIN:
            raise ArgumentError(f"spin must be an integer in 0..{MAX_SPIN} (pause instructions), got {self.spin!r}")


@dataclass
class Section:
    """A part of ``kiln explain``'s report a target contributes: a table (``columns``, ``rows`` of
    text cells) and notes; ``data`` is what ``--json`` shows under ``key``."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str]
    data: Any


@dataclass
class PlanFacts:
    """What a backend that sets ``reads_plan`` gets with ``render`` besides the kernels: the
    constants' values, the model's input and output buffers, the tensors' names, the buffers each
    segment must hand on (read by a later step, or a model output) and the calibrated range of
    every tensor by buffer (``CompileOptions.quantization``)."""

    constants: dict[Buffer, np.ndarray]
    inputs: list[Buffer]
    outputs: list[Buffer]
    names: dict[Buffer, str]
    live: list[set[Buffer]]
    ranges: dict[Buffer, tuple[float, float]]


@dataclass
class Placement:
    """Where a plan's buffers live, for a backend that sets ``reads_placement``: the memory plan
    (``kiln.lower.memory.MemoryPlan``), the inputs', outputs' and weights' buffers."""

    memory: Any
    inputs: list[Buffer]
    outputs: list[Buffer]
    constants: list[Buffer]


class Backend:
    """One target family. Subclasses set ``name`` and override what differs."""

    name = ""
    compiles = True  # False: the graph runs on the reference interpreter (``reference``)
    kernel_timers = False  # its generated code can time each kernel (``BuildOptions.profile``)
    widens_half = True  # float16/bfloat16 arithmetic computed in float32
    reads_plan = False  # render gets ``facts=PlanFacts`` (the fpga target's ROMs and formats need values)
    # render gets ``placement``: the memory plan, the inputs', outputs' and weights' buffers (the
    # cpu target writes them into its code as the C API's tables)
    reads_placement = False
    # the sizes a sample-parallel dim compiles at when nobody said (others run as chunks of them): a
    # CPU's cores are busy from 8 samples on; a GPU wants the whole batch in one launch of each kernel
    batch_classes: tuple[int, ...] = (1, 8)

    def describe(self, variant: str) -> Target:
        raise NotImplementedError

    def variants(self) -> list[str]:
        return [self.name]

    def keeps(self, node: Node) -> bool:
        return lowerable(node)

    def render(
        self, segments: Sequence[Sequence[Kernel]], table: dict[Buffer, int], options: BuildOptions, target: Target
    ) -> str:
        return ""

    def build(self, source: str, target: Target, options: BuildOptions) -> tuple[Path, ...]:
        """The files ``load`` opens (none, one or many: artifacts and the plan cache keep them all)."""
        return ()

    def load(self, plan: Any, target: Target, parallelism: Threading) -> Loaded:
        raise NotImplementedError

    def scratch(self, kernels: Sequence[Kernel], target: Target) -> tuple[int, int]:
        """Working memory the target's engines keep outside the arena, as (bytes kept by the
        calling thread, bytes kept by every thread): reported with the memory plan."""
        return 0, 0

    def identity(self, target: Target, debug: bool = False) -> tuple[str, ...]:
        return ()

    def artifact_code_runs(self, meta: dict[str, Any]) -> str:
        """Why an artifact's prebuilt code (described by ``artifact_meta``) cannot run on this
        machine, or "" when it can."""
        return ""

    def artifact_meta(self, target: Target) -> dict[str, Any]:
        """What a ``.kiln`` artifact records to reopen code built for ``target`` elsewhere."""
        return {}

    def reopen(self, spec: str, meta: dict[str, Any]) -> Target:
        """The target to run an artifact built for ``spec`` (with ``artifact_meta``) on this
        machine; TargetError when its code cannot run here."""
        return self.describe(spec.partition(":")[2])

    def available(self) -> str:
        """'' when this machine can build and run the target, else why not."""
        return ""

    def runnable(self, target: Target) -> str:
        """'' when code compiled for ``target`` runs on this machine, else why not (a target may
        compile where it cannot run: ``gpu`` on a machine without a CUDA device)."""
        return self.available()

    def ahead_arches(self) -> tuple[str, ...]:
        """Architectures ``kiln explain --arch`` can compile this target's kernels ahead for,
        without the hardware (none: the option does not apply)."""
        return ()

    def explain(self, plan: Any, arches: tuple[str, ...], progress: Callable[[str], Any]) -> list[Section]:
        """What ``kiln explain`` shows of ``plan`` beyond the shared report (``progress(text)``
        is a context manager around slow work)."""
        return []

    def run_profile(self, executable: Any, target: Target) -> Section:
        """After ``kiln explain --profile``'s runs of ``executable`` on a target without kernel
        timers: the target's own account of them (gpu: host <-> device transfers)."""
        return Section("profile", "profile", [], [], [f"{target.name} keeps no account of its runs"], {})

    def precisions(self, target: Target) -> dict[str, str]:
        """Each arithmetic precision of matrix products and convolutions (``fp32``, ``bf16``, ``int8``, ``int8-weights``)
        mapped to '' when ``target`` computes in it here, else why not."""
        only = f"the {target.name} target computes in fp32 only"
        return {"fp32": "", "bf16": only, "int8": only, **dict.fromkeys(WEIGHT_FORMATS, only)}


_BACKENDS: dict[str, Backend] = {}


def register(backend: Backend, replace: bool = False) -> Backend:
    """Make ``backend`` a target kiln can compile for (``kiln.compile(..., target=backend.name)``)."""
    if not backend.name or ":" in backend.name:
        raise ValueError(f"a backend's name is a word without ':', got {backend.name!r}")
    if backend.name in _BACKENDS and not replace and _BACKENDS[backend.name] is not backend:
        raise ValueError(f"target {backend.name!r} is registered already")
    _BACKENDS[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    _BACKENDS.pop(name, None)


def backend(name: str) -> Backend:
    """The registered backend ``name`` (the part of a target name before ':')."""
    found = _BACKENDS.get(name.partition(":")[0])
    if found is None:
        raise TargetError(f"unknown target {name!r}; available targets: {', '.join(names())}")
    return found


def names() -> list[str]:
    """Every target name the registry accepts (each backend's variants)."""
    return [variant for b in _BACKENDS.values() for variant in b.variants()]


def parse(spec: str) -> Target:
    """The ``Target`` a name stands for (``cpu``, ``cpu:avx2``...); TargetError when unknown or
    when this machine cannot run it."""
    if not isinstance(spec, str):
        raise TargetError(f"a target is named by a string (such as 'cpu'), got {type(spec).__name__}")
    found = backend(spec)
    if not found.compiles:
        raise TargetError(f"target {spec!r} does not compile (it runs the reference interpreter)")
    return found.describe(spec.partition(":")[2])


def library_runner(function: Any) -> SegmentRunner:
    """A segment compiled to a C-ABI function ``int f(void **table)`` (the status is in the table)."""

    def run(table: Any, views: dict[Buffer, np.ndarray], status: np.ndarray) -> None:
        function(ctypes.cast(table, ctypes.c_void_p))

    return run
