"""Tile sizes chosen on the device: every product, convolution and attention launch of a plan
tried with a few block shapes and warp counts on the GPU that runs it, the fastest kept, and the
choice remembered per GPU model (a JSON file in kiln's cache, keyed by the kernel's text, its
blocks, grid and the Triton version), so only the first load on a GPU measures.

The candidates of a launch are compiled together in threads (Triton's ``AsyncCompileMode``:
its MLIR passes and ptxas run outside the GIL), then each runs on the plan's own buffers after the
plan's first run: its buffers are saved first and put back after every try, so the run's results
are what the caller gets. A candidate that fails to compile or launch, or whose output differs
from the rendered blocks' beyond fp32 rounding (relative L2 1e-5, the same NaNs), is skipped;
the rendered blocks stay the fallback. ``KILN_GPU_TUNE=0`` turns it off; ``force`` also tunes
in Triton's interpreter (tests: its timings mean nothing, the bookkeeping is what is checked).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiln.backends.gpu.render import Launch, p2

# (blocks, warps, stages) per kernel family; the rendered blocks are always tried too
FAMILIES: dict[str, list[tuple[dict[str, int], int, int]]] = {
    "gemm": [
        ({"BM": 128, "BN": 128}, 8, 3),
        ({"BM": 128, "BN": 64}, 4, 4),
        ({"BM": 64, "BN": 128}, 4, 4),
        ({"BM": 64, "BN": 64}, 4, 4),
        ({"BM": 32, "BN": 64}, 4, 4),
        ({"BM": 64, "BN": 32}, 4, 4),
        ({"BM": 32, "BN": 32}, 2, 4),
    ],
    "attention": [
        ({"BQ": 128}, 8, 2),
        ({"BQ": 64}, 4, 2),
        ({"BQ": 32}, 4, 2),
        ({"BQ": 16}, 4, 2),
    ],
}
FAMILY = {"matmul": "gemm", "conv": "gemm", "attention": "attention"}
TOLERANCE = 1e-5  # relative L2 between a candidate's outputs and the rendered blocks'
Entry = tuple[Any, Launch, list[Any]]  # (Triton function, launch, its argument tensors)
Launcher = Callable[[Any, Launch, list[Any]], None]


def mode() -> str:
    """'on' (CUDA devices), 'off' or 'force' (also the interpreter), from ``KILN_GPU_TUNE``."""
    value = os.environ.get("KILN_GPU_TUNE", "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    return "force" if value == "force" else "on"


@dataclass(frozen=True)
class Config:
    constants: tuple[tuple[str, int], ...]
    num_warps: int
    num_stages: int

    @classmethod
    def of(cls, launch: Launch) -> Config:
        return cls(tuple(sorted(launch.constants.items())), launch.num_warps, launch.num_stages)

    def applied(self, launch: Launch) -> Launch:
        constants = dict(self.constants)
        return replace(
            launch,
            constants=constants,
            grid=launch.grid_for(constants),
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )

    def label(self) -> str:
        blocks = "x".join(str(v) for k, v in self.constants if k in ("BM", "BN", "BQ"))
        return f"{blocks} w{self.num_warps} s{self.num_stages}"


def candidates(launch: Launch) -> list[Config]:
    """The launch's own blocks first, then its family's, each block cut to what it tiles (the next
    power of two, at least 16: tl.dot's least)."""
    own = Config.of(launch)
    found = [own]
    extents = dict(launch.tiles)
    for blocks, warps, stages in FAMILIES.get(FAMILY.get(launch.kind, ""), []):
        if set(blocks) != set(extents):
            continue
        fitted = {k: min(v, max(16, p2(extents[k]))) for k, v in blocks.items()}
        config = Config(tuple(sorted({**launch.constants, **fitted}.items())), warps, stages)
        if config not in found:
            found.append(config)
    return found if launch.tiles else [own]


@dataclass
class Report:
    """What tuning did in one process: per launch, the rendered blocks' and the chosen blocks' ms."""

    seconds: float = 0.0
    compile_seconds: float = 0.0
    tuned: int = 0  # distinct launches (kernel, blocks, grid) measured here
    cached: int = 0  # launches whose choice came from the cache
    changed: int = 0  # of those, now running other blocks than the rendered ones
    failed: int = 0  # candidates that did not compile, launch or agree
    rendered_ms: float = 0.0  # sum over measured launches: the rendered blocks
    chosen_ms: float = 0.0  # ... and the chosen ones
    choices: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "compile_seconds": round(self.compile_seconds, 3),
            "tuned": self.tuned,
            "cached": self.cached,
            "changed": self.changed,
            "failed": self.failed,
            "rendered_ms": round(self.rendered_ms, 4),
            "chosen_ms": round(self.chosen_ms, 4),
        }


class Choices:
    """Chosen configs per launch key, read from and written back to one JSON file per GPU model."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.table: dict[str, dict[str, Any]] = {}
        if path is not None:
            self.table = _read_table(path)

    def get(self, key: str) -> Config | None:
        entry = self.table.get(key)
        try:
            constants = tuple((str(k), int(v)) for k, v in entry["constants"])  # type: ignore[index]
            return Config(constants, int(entry["num_warps"]), int(entry["num_stages"]))  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return None

    def put(self, key: str, config: Config, ms: dict[str, float]) -> None:
        self.table[key] = {
            "constants": [list(c) for c in config.constants],
            "num_warps": config.num_warps,
            "num_stages": config.num_stages,
            "ms": ms,
        }

    def save(self) -> None:
        if self.path is None:
            return
        from kiln.integrity import write_atomically

        with contextlib.suppress(OSError):
            write_atomically(self.path, json.dumps(self.table, indent=1, sort_keys=True).encode())


def _read_table(path: Path) -> dict[str, dict[str, Any]]:
    """The file's table, or an empty one where it is missing, not a regular file or not this JSON."""
    from kiln.integrity import open_regular

    if path.is_symlink():
        return {}
    try:
        with open_regular(path, "tuning file") as handle:
            data = json.loads(handle.read(1 << 24).decode())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def choices_file(device: str) -> Path | None:
    """Where this GPU model's choices live (None: no usable cache, nothing remembered)."""
    from kiln.integrity import CacheUnavailable, cache_folder

    slug = "".join(c if c.isalnum() else "-" for c in device).strip("-")[:80] or "device"
    try:
        return cache_folder("gpu") / f"tuned-{slug}.json"
    except CacheUnavailable:
        return None


def launch_key(function: Any, launch: Launch, device: str) -> str:
    """A launch's identity for the cache: the kernel's text, its rendered blocks, tiles and grid,
    the device and the Triton version."""
    import triton

    text = getattr(function, "src", "") or launch.function
    parts = (text, sorted(launch.constants.items()), launch.tiles, launch.grid, launch.num_warps, device)
    return hashlib.sha256(repr((parts, triton.__version__)).encode()).hexdigest()[:32]


def _async_mode() -> Any:
    import triton

    found = getattr(triton, "AsyncCompileMode", None)
    if found is None:
        with contextlib.suppress(ImportError):
            from triton.runtime._async_compile import AsyncCompileMode as found  # Triton 3.4/3.5
    return found


def precompile(work: Sequence[Entry]) -> float:
    """Every (function, launch, arguments) compiled, in threads where this Triton can; seconds
    spent. Failures are left for the launch that needs the kernel to report."""
    started = time.perf_counter()
    mode_class = _async_mode()
    if mode_class is None or not work:
        return 0.0
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(32, os.cpu_count() or 1))) as pool:
        with contextlib.suppress(Exception):
            with mode_class(pool):
                for function, launch, args in work:
                    with contextlib.suppress(Exception):
                        function.warmup(
                            *args,
                            grid=launch.grid,
                            **launch.constants,
                            num_warps=launch.num_warps,
                            num_stages=launch.num_stages,
                        )
    return time.perf_counter() - started


@contextlib.contextmanager
def preserved(tensors: Sequence[Any]) -> Iterator[Callable[[], None]]:
    """Yields ``restore``: puts back what ``tensors`` held on entry (done on exit too)."""
    saved = [t.clone() for t in tensors]

    def restore() -> None:
        for tensor, copy in zip(tensors, saved):
            tensor.copy_(copy)

    try:
        yield restore
    finally:
        restore()


def agree(got: Sequence[Any], want: Sequence[Any]) -> bool:
    """Outputs equal up to fp32 rounding: the same NaNs, relative L2 within TOLERANCE."""
    import torch

    for a, b in zip(got, want):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return False
            continue
        nan = torch.isnan(b)
        if not torch.equal(torch.isnan(a), nan):
            return False
        a64, b64 = torch.where(nan, 0, a).double(), torch.where(nan, 0, b).double()
        finite = torch.isfinite(b64)
        if not torch.equal(torch.isfinite(a64), finite) or not torch.equal(a64[~finite], b64[~finite]):
            return False
        scale = float(torch.linalg.vector_norm(b64[finite]))
        if float(torch.linalg.vector_norm(a64[finite] - b64[finite])) > TOLERANCE * max(scale, 1e-30):
            return False
    return True


def cuda_clock(launch_one: Launcher) -> Callable[[Entry], float]:
    """Milliseconds per launch of an entry on the GPU: a CUDA graph of repeated launches replayed
    (as the plan runs: no Python between kernels), the best of three replays."""
    import torch

    def clock(entry: Entry) -> float:
        function, launch, args = entry
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch_one(function, launch, args)
        end.record()
        end.synchronize()
        repeats = max(1, min(25, int(2.0 / max(start.elapsed_time(end), 1e-3))))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(repeats):
                launch_one(function, launch, args)
        best = float("inf")
        for _ in range(3):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / repeats)
        return best

    return clock


def host_clock(launch_one: Launcher) -> Callable[[Entry], float]:
    """Milliseconds per launch, by the host's clock (the interpreter: nothing to learn from it)."""

    def clock(entry: Entry) -> float:
        started = time.perf_counter()
        launch_one(*entry)
        return 1e3 * (time.perf_counter() - started)

    return clock


def choose(
    entry: Entry,
    configs: Sequence[Config],
    launch_one: Launcher,
    sync: Callable[[], None],
    clock: Callable[[Entry], float],
    report: Report,
) -> tuple[Config, dict[str, float]]:
    """The fastest of ``configs`` (the first is the rendered one) on the entry's own buffers, which
    hold what they held before when it returns; and every agreeing candidate's ms."""
    function, launch, args = entry
    timings: dict[Config, float] = {}
    with preserved(args) as restore:
        launch_one(function, launch, args)
        sync()
        want = [a.clone() for a in args]
        for config in configs:
            trial = (function, config.applied(launch), args)
            restore()
            try:
                launch_one(*trial)
                sync()
                if not agree(args, want):
                    raise ValueError("outputs differ from the rendered blocks'")
                timings[config] = clock(trial)
                sync()
            except Exception:  # out of shared memory, no compile, a disagreement: not a choice
                report.failed += 1
                sync_quietly(sync)
    rendered = timings.get(configs[0])
    if rendered is None:  # the rendered blocks themselves would not time: keep them
        return configs[0], {}
    best = min(timings, key=timings.__getitem__)
    if timings[best] > 0.97 * rendered:  # within noise of the rendered blocks: keep them
        best = configs[0]
    report.rendered_ms += rendered
    report.chosen_ms += timings[best]
    return best, {c.label(): round(ms, 5) for c, ms in timings.items()}


def sync_quietly(sync: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):
        sync()


class Tuner:
    """One loaded plan's tuning: cached choices applied and candidates compiled before its first
    run (``prepare``), the rest measured after it (``tune``)."""

    def __init__(self, device: str, launch_one: Launcher, sync: Callable[[], None], cuda: bool) -> None:
        self.device = device
        self.launch_one = launch_one
        self.sync = sync
        self.clock = cuda_clock(launch_one) if cuda else host_clock(launch_one)
        self.choices = Choices(choices_file(device))
        self.report = Report()
        # key -> (candidates, positions of the entries with that key: a repeated layer is tuned once)
        self.pending: dict[str, tuple[list[Config], list[int]]] = {}

    def prepare(self, entries: list[Entry]) -> list[Entry]:
        """Entries with cached choices applied; everything the first run and ``tune`` launch compiled."""
        started = time.perf_counter()
        ready: list[Entry] = []
        work: list[Entry] = []
        for position, (function, launch, args) in enumerate(entries):
            configs = candidates(launch)
            if len(configs) > 1:
                key = launch_key(function, launch, self.device)
                cached = self.choices.get(key)
                if cached in configs:
                    self.report.cached += 1
                    self.report.changed += cached != configs[0]
                    launch = cached.applied(launch)  # type: ignore[union-attr]
                elif key in self.pending:
                    self.pending[key][1].append(position)
                else:
                    self.pending[key] = (configs, [position])
                    work.extend((function, c.applied(launch), args) for c in configs[1:])
            ready.append((function, launch, args))
        self.report.compile_seconds += precompile(ready + work)
        self.report.seconds += time.perf_counter() - started
        return ready

    def tune(self, entries: list[Entry]) -> list[Entry]:
        """Entries with the measured choices (after a run, so their buffers hold real values)."""
        started = time.perf_counter()
        result = list(entries)
        for key, (configs, positions) in self.pending.items():
            best, timings = choose(entries[positions[0]], configs, self.launch_one, self.sync, self.clock, self.report)
            self.report.tuned += 1
            if timings:
                self.choices.put(key, best, timings)
            if best != configs[0]:
                self.report.changed += 1
                for position in positions:
                    function, launch, args = entries[position]
                    result[position] = (function, best.applied(launch), args)
                self.report.choices[entries[positions[0]][1].function] = best.label()
        self.pending.clear()
        self.choices.save()
        self.report.seconds += time.perf_counter() - started
        return result
