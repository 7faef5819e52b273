"""Memory planning: every intermediate buffer gets an offset in one arena.

Liveness runs over the execution order (kernels and host fallbacks alike): a buffer lives from
the first step that writes it to the last step that reads it. Buffers whose lifetimes do not
overlap share memory; placement is greedy, largest first, at the lowest aligned offset that fits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kiln.lower.kir import Buffer

ALIGNMENT = 64  # bytes: a cache line, and enough for any SIMD load


@dataclass
class MemoryPlan:
    offsets: dict[Buffer, int]
    lifetimes: dict[Buffer, tuple[int, int]]
    arena_bytes: int
    naive_bytes: int
    # the matrix-multiply engine's packing buffers, outside the arena (see ``engine_scratch``):
    # at most ``scratch_shared`` bytes plus ``scratch_per_thread`` for each thread
    scratch_shared: int = 0
    scratch_per_thread: int = 0

    def scratch_bytes(self, threads: int | None = None) -> int:
        return self.scratch_shared + (threads or engine_threads()) * self.scratch_per_thread

    def describe(self) -> str:
        saved = 1 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0
        text = f"arena {self.arena_bytes / 1e6:.2f} MB for {len(self.offsets)} buffers (naive sum {self.naive_bytes / 1e6:.2f} MB, {saved:.0%} saved)"
        if self.scratch_per_thread:
            threads = engine_threads()
            text += f"; engine packing scratch up to {self.scratch_bytes(threads) / 1e6:.2f} MB ({threads} thread{'s' if threads > 1 else ''})"
        return text


def engine_threads() -> int:
    """The threads an OpenMP region gets by default: OMP_NUM_THREADS, else the usable CPUs (a fact
    of the process that runs the code, not of the target it was built for)."""
    setting = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if setting.isdigit() and int(setting) > 0:
        return int(setting)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _align(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan_memory(steps: Sequence[tuple[Sequence[Buffer], Sequence[Buffer]]], temps: set[Buffer]) -> MemoryPlan:
    """``steps`` are (reads, writes) in execution order; ``temps`` the buffers to place."""
    first: dict[Buffer, int] = {}
    last: dict[Buffer, int] = {}
    for position, (reads, writes) in enumerate(steps):
        for buffer in writes:
            if buffer in temps:
                first.setdefault(buffer, position)
                last[buffer] = max(last.get(buffer, position), position)
        for buffer in reads:
            if buffer in temps:
                first.setdefault(buffer, position)
                last[buffer] = position
    lifetimes = {b: (first[b], last[b]) for b in first}
    placed: list[tuple[int, int, Buffer]] = []  # (offset, end, buffer)
    offsets: dict[Buffer, int] = {}
    for buffer in sorted(lifetimes, key=lambda b: (-b.nbytes, b.name)):
        start, end = lifetimes[buffer]
        size = _align(max(buffer.nbytes, 1))
        busy = sorted(
            (o, e) for o, e, other in placed if not (lifetimes[other][1] < start or lifetimes[other][0] > end)
        )
        offset = 0
        for low, high in busy:
            if offset + size <= low:
                break
            offset = max(offset, high)
        offsets[buffer] = offset
        placed.append((offset, offset + size, buffer))
    arena = max((end for _, end, _ in placed), default=0)
    naive = sum(_align(max(b.nbytes, 1)) for b in lifetimes)
    return MemoryPlan(offsets, lifetimes, arena, naive)
