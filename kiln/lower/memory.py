"""Memory planning: every intermediate buffer gets an offset in one arena.

Liveness runs over the execution order (kernels and host fallbacks alike): a buffer lives from
the first step that writes it to the last step that reads it. Buffers whose lifetimes do not
overlap share memory; placement is greedy, largest first, at the lowest aligned offset that fits.

A plan whose kernels take a length at run time (``kiln.driver.extents``) also has a
``GrowingLayout``: each buffer's bytes as a polynomial of the length, and the arena's offsets as
formulas of them, evaluated per length. Two buffers whose lifetimes overlap keep the order they
have at the capacity (the lower one ends before the higher one starts), so the layout at any
length is as disjoint as the capacity's, and packed: a short run touches a short arena.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    growing: GrowingLayout | None = None  # offsets and arena as formulas of a run-time length

    def scratch_bytes(self, threads: int | None = None) -> int:
        return self.scratch_shared + (threads or engine_threads()) * self.scratch_per_thread

    def describe(self) -> str:
        saved = 1 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0
        text = f"arena {self.arena_bytes / 1e6:.2f} MB for {len(self.offsets)} buffers (naive sum {self.naive_bytes / 1e6:.2f} MB, {saved:.0%} saved)"
        if self.growing is not None:
            low = self.growing.floor
            text += f"; at length {low} (the least lowered) {self.growing.at(low)[1] / 1e6:.2f} MB"
        if self.scratch_per_thread:
            threads = engine_threads()
            text += f"; engine packing scratch up to {self.scratch_bytes(threads) / 1e6:.2f} MB ({threads} thread{'s' if threads > 1 else ''})"
        return text


@dataclass(frozen=True)
class GrowingLayout:
    """The arena of a plan whose kernels take a length at run time, as formulas of that length
    (``kiln_len``, read from ``valid``'s value, at least ``floor``). ``order`` are the arena's
    buffers by their offset at the capacity; ``sizes[i]`` is ``order[i]``'s bytes as
    ``(c0, c1, c2)``, ``c0 + c1 * n + c2 * n * n``; ``below[i]`` the positions of the buffers that
    live at the same time as ``order[i]`` and lie below it at the capacity (only those no other
    one of them already lies above): ``order[i]`` starts where the last of them ends.
    ``constants``: the integer constants of one size whose values change with the length (an
    exporter's flat-index offsets, arange(batch) * seq), each element ``c0 + c1 n + c2 n^2``: the
    runtime writes them for the length it runs at (``values``) and the kernels read those."""

    valid: Buffer
    floor: int
    capacity: int
    order: tuple[Buffer, ...]
    sizes: tuple[tuple[int, int, int], ...]
    below: tuple[tuple[int, ...], ...]
    constants: tuple[tuple[Buffer, tuple[tuple[int, int, int], ...]], ...] = ()

    def values(self, length: int) -> list[np.ndarray]:
        """The run-time constants at ``length`` (in ``constants``' order, each its buffer's dtype)."""
        n = self.bound(length)
        return [
            np.array([c0 + c1 * n + c2 * n * n for c0, c1, c2 in terms], dtype=buffer.dtype.numpy)
            for buffer, terms in self.constants
        ]

    def bound(self, length: int) -> int:
        """The length the kernels run at for a call at ``length`` (the layout's key)."""
        return min(max(length, self.floor), self.capacity)

    def at(self, length: int) -> tuple[list[int], int]:
        """The offsets (in ``order``) and the arena's bytes for a run at ``length``."""
        n = self.bound(length)
        offsets: list[int] = []
        ends: list[int] = []
        for (c0, c1, c2), below in zip(self.sizes, self.below):
            offset = max((ends[j] for j in below), default=0)
            offsets.append(offset)
            ends.append(offset + _align(max(c0 + c1 * n + c2 * n * n, 1)))
        return offsets, max(ends, default=0)


def grows(c0: int, c1: int, c2: int, floor: int, capacity: int) -> bool:
    """Whether ``c0 + c1 n + c2 n^2`` never shrinks as n goes from ``floor`` to ``capacity`` (a
    polynomial of degree <= 2 does not when its step does not, at both ends)."""
    return min(c1 + c2 * (2 * floor + 1), c1 + c2 * (2 * capacity - 1)) >= 0


def growing_layout(
    plan: MemoryPlan, sizes: dict[Buffer, tuple[int, int, int]], valid: Buffer, floor: int, capacity: int
) -> GrowingLayout:
    """``plan`` (at the capacity) with its buffers' sizes as ``sizes`` (a buffer not named there
    keeps its capacity size at every length). Each size must be at most the capacity's and grow
    with the length on [floor, capacity] (ValueError otherwise): the layout at a length is then
    never larger than at the capacity, and never larger than ``plan``'s arena."""
    order = sorted(plan.offsets, key=lambda b: (plan.offsets[b], b.name))
    coefficients = []
    for buffer in order:
        c0, c1, c2 = sizes.get(buffer, (buffer.nbytes, 0, 0))
        if c0 + c1 * capacity + c2 * capacity * capacity != buffer.nbytes or not grows(c0, c1, c2, floor, capacity):
            raise ValueError(
                f"buffer {buffer.name}: {c0} + {c1}n + {c2}n^2 bytes is not its size at {capacity}, or shrinks"
            )
        coefficients.append((c0, c1, c2))
    # pairs of buffers alive at the same time, from the lifetimes sorted by their start
    spans = sorted(range(len(order)), key=lambda i: plan.lifetimes[order[i]])
    under: list[list[int]] = [[] for _ in order]
    for k, i in enumerate(spans):
        end = plan.lifetimes[order[i]][1]
        for j in spans[k + 1 :]:
            if plan.lifetimes[order[j]][0] > end:
                break
            low, high = min(i, j), max(i, j)  # by offset: the lower one ends before the other starts
            under[high].append(low)
    below: list[tuple[int, ...]] = []
    lower: list[int] = []  # per buffer, a bit per buffer it must end after (below it, transitively)
    for i in range(len(order)):
        covered = 0
        for j in under[i]:
            covered |= lower[j]
        below.append(tuple(sorted(j for j in under[i] if not covered >> j & 1)))  # (each pair met once)
        lower.append(covered | sum(1 << j for j in under[i]))
    return GrowingLayout(valid, floor, capacity, tuple(order), tuple(coefficients), tuple(below))


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
