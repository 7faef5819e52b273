"""The fpga target's schedule: which loop of a kernel is pipelined, from the layer's reuse factor.

hls4ml's notion: with reuse factor R, each multiplier is used R times, so a layer of M
multiplications has M / R of them and starts a new input every R cycles. On a kernel-IR loop nest
this is the loop to ``#pragma HLS PIPELINE II=1`` (every loop inside it fully unrolled): the
outermost loop whose iterations, counted with the loops around it, reach R, as long as one of its
iterations unrolls to at most ``MAX_UNROLL`` statement instances (Vitis refuses far larger
unrolls); an innermost loop is always a candidate. The loops around a pipelined loop run in
sequence. Its *effective* reuse is its iteration count: ``pipelined`` records both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kiln.lower.kir import Assign, Buffer, For, If, Kernel, Let, Load, Stmt, Store, postorder

MAX_UNROLL = 4096  # statement instances in one pipelined iteration
# kernels that gather many inputs into each output (hls4ml's dense, softmax, normalizations): a
# small one is one pipelined function; an elementwise kernel keeps a pipelined loop (an element a
# cycle, as a stream brings them)
WHOLE_KINDS = ("matmul", "reduction", "normalize")


@dataclass(frozen=True)
class Pipelined:
    loop: For
    iterations: int  # of the pipelined loop, counted with the loops around it (the reuse)
    unrolled: int  # statement instances in one iteration
    interval: int = 1  # cycles between iterations (II): its operators shared this many ways


def trips(loop: For) -> int:
    assert isinstance(loop.extent, int) and isinstance(loop.start, int)
    return max(loop.extent - loop.start, 0)


def work(body: Sequence[Stmt]) -> int:
    """Statement instances ``body`` executes (every loop's trips, both sides of every if)."""
    total = 0
    for stmt in body:
        if isinstance(stmt, For):
            total += trips(stmt) * work(stmt.body)
        elif isinstance(stmt, If):
            total += work(stmt.body)
        else:
            total += 1
    return total


def has_loops(body: Sequence[Stmt]) -> bool:
    return any(isinstance(s, For) or (isinstance(s, If) and has_loops(s.body)) for s in body)


def pipelined(kernel: Kernel, reuse: int) -> dict[int, Pipelined]:
    """The loops to pipeline in ``kernel`` (by ``id``), for reuse factor ``reuse``.

    A loop the kernel's schedule marks (``Schedule.pipeline``: a pixel loop, interval 0 meaning
    the target's) is pipelined at an interval of ``reuse`` cycles, its operators shared
    ``reuse`` ways (hls4ml's convolution: one output pixel per R cycles), when one iteration
    unrolls to at most ``MAX_UNROLL``; every other loop by the rule above."""
    chosen: dict[int, Pipelined] = {}
    if whole(kernel, reuse):
        return chosen
    marked = kernel.schedule.pipeline

    def visit(body: Sequence[Stmt], around: int) -> None:
        for stmt in body:
            if isinstance(stmt, If):
                visit(stmt.body, around)
            elif isinstance(stmt, For):
                count = around * trips(stmt)
                inner = work(stmt.body)
                if stmt.index.name in marked and inner <= MAX_UNROLL:
                    chosen[id(stmt)] = Pipelined(stmt, count, inner, marked[stmt.index.name] or reuse)
                elif marked and any(name in marked for name in _names(stmt.body)):
                    visit(stmt.body, count)
                elif not has_loops(stmt.body) or (count >= reuse and inner <= MAX_UNROLL):
                    chosen[id(stmt)] = Pipelined(stmt, count, inner)
                else:
                    visit(stmt.body, count)

    visit(kernel.body, 1)
    return chosen


def _names(body: Sequence[Stmt]) -> set[str]:
    found: set[str] = set()
    for stmt in body:
        if isinstance(stmt, For):
            found.add(stmt.index.name)
            found |= _names(stmt.body)
        elif isinstance(stmt, If):
            found |= _names(stmt.body)
    return found


def whole(kernel: Kernel, reuse: int) -> int | None:
    """The interval of a kernel pipelined as a whole function (``#pragma HLS PIPELINE II=`` at its
    top, every loop in it unrolled: hls4ml's dense layer at reuse R accepts an input every R
    cycles), when it is one of ``WHOLE_KINDS``, all of it unrolls to at most ``MAX_UNROLL``
    statement instances and it marks no pixel loop; None otherwise."""
    if kernel.kind.split("+")[0] not in WHOLE_KINDS or kernel.schedule.pipeline or work(kernel.body) > MAX_UNROLL:
        return None
    return reuse if has_loops(kernel.body) else None


def banks(kernel: Kernel, reuse: int) -> dict[Buffer, int]:
    """The arrays a pipelined iteration of ``kernel`` reads or writes more than once, by buffer:
    how many of its accesses one iteration makes (its unrolled copies), at most its size. Each is
    ``ARRAY_PARTITION``-ed into that many banks (complete at its size) so the iteration's accesses
    go in one cycle."""
    found: dict[Buffer, int] = {}
    bodies = [kernel.body] if whole(kernel, reuse) else [p.loop.body for p in pipelined(kernel, reuse).values()]
    for body in bodies:
        for stmt, times in instances(body):
            values = [stmt.value] if isinstance(stmt, (Let, Assign, Store)) else []
            touched = [n.buffer for e in values for n in postorder(e) if isinstance(n, Load)]
            touched += [stmt.buffer] if isinstance(stmt, Store) else []
            for buffer in touched:
                found[buffer] = min(max(found.get(buffer, 1), times), buffer.size)
    return {b: n for b, n in found.items() if n > 1}


def instances(body: Sequence[Stmt], times: int = 1) -> Iterator[tuple[Stmt, int]]:
    """Every statement of ``body`` that is not a loop or condition, with the times one pass of
    ``body`` runs it unrolled (its loops' trips; both sides of every condition)."""
    for stmt in body:
        if isinstance(stmt, For):
            yield from instances(stmt.body, times * trips(stmt))
        elif isinstance(stmt, If):
            yield from instances(stmt.body, times)
        else:
            yield stmt, times
