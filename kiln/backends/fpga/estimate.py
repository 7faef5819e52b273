"""Latency and resource ESTIMATES of an fpga design (no vendor tool runs here: these are
analytical, from the formulas below, and labelled as estimates wherever they are shown).

Per kernel, from its loop nest and the schedule (``schedule.pipelined``):

- a kernel that unrolls whole to at most 4,096 statements is one pipelined function (II = the
  reuse factor, hls4ml's dense layer): its latency is one iteration's depth plus its stream
  beats in and out, its interval the reuse factor or its beats, whichever is larger;
- latency: a pipelined loop of N iterations (counted with the sequential loops around it) takes
  (N - 1) * II + depth cycles (II = 1, or the reuse factor for a pixel loop, whose operators
  are then shared II ways); depth = 3 for a DSP multiply + ceil(log2(adds + 1)) for the
  unrolled adder tree + 5 per ROM lookup (two reads, the interpolation's multiply-add) + 48 per division + 24 per square root (Vitis'
  sequential cores); a loop left sequential costs its trips times its body plus one cycle per
  trip; each local's copy in or out one cycle per bank's worth of elements. The top function
  moves the model's inputs and outputs an element a cycle: they add to the latency and bound
  the interval. Under DATAFLOW kernels overlap: the model's interval (II) is its slowest
  kernel's, its latency their sum (an upper bound: streamed kernels start before their
  producer ends);
- DSP48: each multiply instance of a pipelined iteration (unrolled copies included) whose
  operands are both wider than 10 bits takes ceil(Wa / 27) * ceil(Wb / 18) DSPs (hls4ml's rule:
  narrower products are LUTs, Wa * Wb / 2 of them); a multiply outside pipelined loops one
  instance;
- BRAM_18K: an array of W-bit elements partitioned into p banks (``schedule.banks``: the
  accesses one pipelined iteration makes to it, at most its size) takes p * ceil(W * ceil(size / p) / 18432) blocks when a bank holds
  more than 1,024 bits; smaller banks and complete partitions are registers (FF) or LUT ROMs;
- LUT: W per adder and comparator and W per select, per instance, and 200 per kernel (control);
  FF: the widths of every temporary of a pipelined iteration, per instance, and registers above.

Streams (``streams``): a tensor a kernel stores in its stream's order takes no memory, a
consumer's window its size; each fill costs its step plus one cycle per group.

Weights in DDR (``interface=m_axi``, ``axi``) take no on-chip memory; a pipelined loop reading
them runs at an interval of at least the AXI beats (512 bits each) one iteration's words take,
plus ``axi.DDR_LATENCY`` cycles per kernel for the first burst.

``check_fits`` compares the totals with the part (``target.PARTS``) and names the largest user of
a resource that does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from kiln.backends.fpga import axi
from kiln.backends.fpga.formats import Design, KernelDesign
from kiln.backends.fpga.schedule import banks, instances, pipelined, trips, whole
from kiln.backends.fpga.target import FpgaTarget
from kiln.backends.registry import PlanFacts
from kiln.errors import KilnError
from kiln.lower.kir import Assign, Binary, Buffer, Expr, For, If, Let, Load, Select, Stmt, Store, Unary, postorder

BRAM_BITS = 18432
SMALL_ARRAY_BITS = 1024
DSP_MIN_WIDTH = 10
RESOURCES = ("dsp", "bram_18k", "lut", "ff")


class DoesNotFit(KilnError):
    """The design needs more of a resource than the part has (names the layer and resource)."""


@dataclass
class Usage:
    cycles: int = 0
    dsp: int = 0
    bram_18k: int = 0
    lut: int = 0
    ff: int = 0
    reuse: int = 1  # the effective reuse of its pipelined loops (the largest)
    interval: int = 0  # cycles between inputs (0: its cycles; a whole-function pipeline: its II)

    def add(self, other: Usage) -> None:
        for name in RESOURCES:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Estimate:
    kernels: list[tuple[KernelDesign, Usage]] = field(default_factory=list)
    total: Usage = field(default_factory=Usage)
    interval: int = 0  # cycles between inputs under DATAFLOW (the slowest kernel)
    latency: int = 0  # cycles for one input (the kernels' sum)
    clock_mhz: float = 200.0

    @property
    def latency_us(self) -> float:
        return self.latency / self.clock_mhz

    @property
    def throughput(self) -> float:
        """Inferences per second at the clock, one every ``interval`` cycles."""
        return self.clock_mhz * 1e6 / max(self.interval, 1)


def estimate(design: Design, facts: PlanFacts, target: FpgaTarget) -> Estimate:
    found = Estimate(clock_mhz=target.clock_mhz)
    ddr = axi.in_ddr(design, facts, target)
    for kd in design.kernels:
        usage = _kernel(kd, design, facts, target.reuse, ddr)
        found.kernels.append((kd, usage))
        found.total.add(usage)
        found.latency += usage.cycles
        found.interval = max(found.interval, usage.interval or usage.cycles)
    # the top moves its inputs and outputs an element a cycle (AXI-Stream, or an m_axi burst)
    inputs = [b.size for b in facts.inputs if any(b in kd.kernel.reads for kd in design.kernels)]
    outputs = [b.size for b in facts.outputs]
    found.latency += max(inputs, default=0) + max(outputs, default=0)
    found.interval = max(found.interval, *inputs, *outputs)
    found.total.cycles = found.latency
    return found


def check_fits(found: Estimate, target: FpgaTarget, names: dict[str, str]) -> None:
    part = target.resources
    for resource, limit in (("dsp", part.dsp), ("bram_18k", part.bram_18k), ("lut", part.lut), ("ff", part.ff)):
        needed = getattr(found.total, resource)
        if needed > limit:
            kd, usage = max(found.kernels, key=lambda item: getattr(item[1], resource))
            label = names.get(kd.kernel.name, kd.kernel.name)
            needs = ", ".join(
                f"{name.upper()} {getattr(found.total, name):,}/{getattr(part, name):,}" for name in RESOURCES
            )
            raise DoesNotFit(
                f"the design does not fit {part.device} ({part.board}): it needs {needed:,} {resource.upper()} "
                f"of {limit:,} (estimate); the largest user is {label} with {getattr(usage, resource):,}. "
                f"It would need {needs}; latency {found.latency:,} cycles. "
                f"Raise the reuse factor (fpga:vitis,reuse=N), lower the bits, or choose a larger part"
            )


def _kernel(kd: KernelDesign, design: Design, facts: PlanFacts, reuse: int, ddr: set[Buffer]) -> Usage:
    usage = Usage(lut=200)
    chosen = pipelined(kd.kernel, reuse)
    usage.reuse = max((p.iterations for p in chosen.values()), default=1)
    unroll = banks(kd.kernel, reuse)
    reads = {b: design.formats[b].width for b in kd.kernel.reads if b in ddr}
    name = kd.kernel.name
    sinks = {b: c for b, c in design.streams.items() if c.producer == name}
    sources = {b: c for b, c in design.streams.items() if c.consumer == name}
    # stores straight into a stream: one beat (``lanes`` of them) per cycle
    writes = {b: c.lanes for b, c in sinks.items() if not c.staged and b not in kd.local}
    # a local's copy into a stream or a staged tensor's: a beat a cycle
    out_beats = sum(b.size // sinks[b].lanes for b in kd.local if b in sinks)
    out_beats += sum(b.size for b, c in sinks.items() if c.staged)
    in_beats = 0
    for channel in sources.values():  # the prefill, each group's top-up fill and the drain, a beat a cycle
        window = channel.window
        in_beats += window.prefill + (len(window.needs) * (window.step + 1) if window.step else 0)
        in_beats += (channel.buffer.size - window.needs[-1]) // channel.lanes
    interval = whole(kd.kernel, reuse)
    if interval:  # one pipelined function: operators shared II ways, a new input every II cycles
        own = Usage(lut=0)
        depth = _iteration(kd, kd.kernel.body, own)
        # shared II ways: the operators and their pipeline registers
        usage.dsp, usage.lut = math.ceil(own.dsp / interval), 200 + math.ceil(own.lut / interval)
        usage.ff = math.ceil(own.ff / interval)
        usage.reuse = interval
        usage.interval = max(interval, in_beats, out_beats, *_beats(kd.kernel.body, reads, writes))
        # each shared operator takes its II inputs in turn before the result is out
        usage.cycles = depth + interval - 1 + in_beats + out_beats + (axi.DDR_LATENCY if reads else 0)
    else:
        usage.cycles = _cycles(kd, kd.kernel.body, chosen, usage, 1, (reads, writes)) + in_beats + out_beats
        usage.cycles += axi.DDR_LATENCY if reads else 0
        # a local's copy in or out of an array moves one element per bank per cycle (hls.copy)
        usage.cycles += sum(math.ceil(b.size / unroll.get(b, 1)) for b in kd.local if b not in sinks)
        usage.cycles += sum(math.ceil(b.size / unroll.get(b, 1)) for b in kd.copy_in)
    # a tensor streamed out as it is stored is no array; a window holds what its groups need
    arrays = [
        (b, design.formats.get(b), b.size)
        for b in kd.kernel.writes
        if b not in sinks or sinks[b].staged or b in kd.local
    ]
    arrays += [(b, design.formats.get(b), c.window.size) for b, c in sources.items()]
    arrays += [(b, f, b.size) for b, f in kd.local.items()]
    arrays += [(b, design.formats.get(b), b.size) for b in kd.kernel.reads if b in facts.constants and b not in ddr]
    for buffer, fmt, size in arrays:
        width = fmt.width if fmt is not None else buffer.dtype.numpy.itemsize * 8
        _memory(usage, width, size, unroll.get(buffer, 1))
    for table in kd.tables.values():
        _memory(usage, table.out.width, table.size + 1, 1)
    return usage


def _memory(usage: Usage, width: int, size: int, banks: int) -> None:
    banks = max(1, min(banks, size))
    per_bank = width * math.ceil(size / banks)
    if per_bank <= SMALL_ARRAY_BITS:
        usage.ff += width * size
        usage.lut += width * size // 64  # LUT-RAM/ROM addressing
    else:
        usage.bram_18k += banks * math.ceil(per_bank / BRAM_BITS)


def _cycles(kd: KernelDesign, body: Sequence[Stmt], chosen: dict, usage: Usage, around: int, io: tuple) -> int:
    """Cycles of ``body``; ``io``: the weights read from DDR (their widths), whose words a
    pipelined iteration needs in AXI beats, and the streams it stores into (their lanes), a beat
    a cycle: its interval is at least either."""
    total = 0
    for stmt in body:
        if isinstance(stmt, For):
            if id(stmt) in chosen:
                interval = max(chosen[id(stmt)].interval, *_beats(stmt.body, *io))
                own = Usage(lut=0)
                depth = _iteration(kd, stmt.body, own)
                # an interval of II cycles shares each operator II ways (Vitis' resource sharing)
                usage.dsp += math.ceil(own.dsp / interval)
                usage.lut += math.ceil(own.lut / interval)
                usage.ff += own.ff
                total += (around * trips(stmt) - 1) * interval + depth if around * trips(stmt) else 0
            else:
                inner = _cycles(kd, stmt.body, chosen, usage, 1, io)
                total += trips(stmt) * (inner + 1)
        elif isinstance(stmt, If):
            total += _cycles(kd, stmt.body, chosen, usage, around, io)
        else:
            total += 1
            _operators(kd, _values(stmt), usage, 1)
    return total


def _beats(body: Sequence[Stmt], ddr: dict, streams: dict) -> tuple[int, int]:
    """(AXI beats of the DDR words, stream beats of the stores) one iteration of ``body``
    (unrolled) takes."""
    bits, stored = 0, 0.0
    for stmt, times in instances(body):
        for e in _values(stmt):
            bits += times * sum(ddr[n.buffer] for n in postorder(e) if isinstance(n, Load) and n.buffer in ddr)
        if isinstance(stmt, Store) and stmt.buffer in streams:
            stored += times / streams[stmt.buffer]  # a beat carries lanes stores
    return max(1, axi.beats(bits, 1)), max(1, math.ceil(stored))


def _iteration(kd: KernelDesign, body: Sequence[Stmt], usage: Usage) -> int:
    """Depth of one pipelined iteration; its operators counted with every unrolled copy."""
    multiplies = adds = lookups = divisions = roots = 0
    for stmt, times in instances(body):
        counts = _operators(kd, _values(stmt), usage, times)
        multiplies, adds = multiplies + counts[0], adds + counts[1]
        lookups, divisions, roots = lookups + counts[2], divisions + counts[3], roots + counts[4]
    chain = 3 if multiplies else 0
    return (
        1 + chain + math.ceil(math.log2(adds + 1)) + 5 * min(lookups, 1) + 48 * min(divisions, 1) + 24 * min(roots, 1)
    )


def _operators(kd: KernelDesign, values: list[Expr], usage: Usage, times: int) -> tuple[int, int, int, int, int]:
    multiplies = adds = lookups = divisions = roots = 0
    for e in values:
        for node in postorder(e):
            fmt = kd.nodes.get(id(node))
            if fmt is None:
                continue
            if id(node) in kd.tables:  # a ROM function: two reads and the interpolation's product
                lookups += times
                usage.dsp += times  # 18 x 24 bits: one DSP48
            elif isinstance(node, Binary) and node.op == "*":
                a, b = kd.nodes.get(id(node.a)), kd.nodes.get(id(node.b))
                wa, wb = sorted((a.width if a else 32, b.width if b else 32), reverse=True)
                if wb > DSP_MIN_WIDTH:
                    usage.dsp += times * math.ceil(wa / 27) * math.ceil(wb / 18)
                else:
                    usage.lut += times * wa * wb // 2
                multiplies += times
            elif isinstance(node, Binary) and node.op == "/":
                divisions += 1
                usage.lut += times * fmt.width * 8
            elif isinstance(node, (Binary, Select)):
                adds += times
                usage.lut += times * fmt.width
            elif isinstance(node, Unary) and node.op == "sqrt":
                roots += 1
                usage.lut += times * fmt.width * 4
            usage.ff += times * fmt.width
    return multiplies, adds, lookups, divisions, roots


def _values(stmt: Stmt) -> list[Expr]:
    return [stmt.value] if isinstance(stmt, (Let, Assign, Store)) else []
