"""The FIFOs between a segment's kernels, and the line buffers that read them.

Under DATAFLOW every tensor one kernel writes and one later kernel reads is an ``hls::stream``:

- **the producer** writes it in its store order when it stores the tensor in one unconditional
  ``Store`` and never reads it back (a pixel-major convolution: pixel by pixel, every channel of
  a pixel, ``order`` below); else it keeps the tensor in a local array and streams it out in
  flat order when it ends (``staged``);
- **the consumer** keeps a circular *window* of the stream, filled before each iteration of the
  loops around its pipelined loop (a *group*: an output row of a convolution) up to the position
  that group needs. The window is the largest span of positions that must be held at once, from
  the loads' indices evaluated over the loops (``window``): for a 3x3 convolution after a
  pixel-major one, K input rows of every channel — a line buffer — instead of the feature map.
  Where the loads cannot be analysed (a load outside the groups, an index of a run-time scalar,
  more than one pipelined loop reading it), the window is the whole tensor, filled at the start.

A position is where an element comes in the stream: for a producer whose store index is affine in
its loops with strides forming a mixed radix (``Order``), ``position(f) = sum(place_i *
((f / stride_i) % extent_i))``; the identity otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kiln.backends.fpga.formats import KernelDesign
from kiln.backends.fpga.schedule import Pipelined, banks, pipelined
from kiln.backends.registry import PlanFacts
from kiln.lower.kir import (
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Index,
    Kernel,
    Let,
    Load,
    Select,
    Stmt,
    Store,
    postorder,
)

MAX_POINTS = 1 << 22  # loop iterations evaluated to find a window (larger: the whole tensor)


class Unanalysable(Exception):
    pass


@dataclass(frozen=True)
class Order:
    """The stream position of each flat index: ``((stride, extent, place), ...)``; () is flat order."""

    radices: tuple[tuple[int, int, int], ...] = ()

    def positions(self, flat: np.ndarray) -> np.ndarray:
        if not self.radices:
            return flat
        return sum(place * ((flat // stride) % extent) for stride, extent, place in self.radices)  # type: ignore[return-value]

    def text(self, flat: str) -> str:
        if not self.radices:
            return flat
        terms = [f"(({flat}) / {s} % {e}) * {p}" if s > 1 else f"(({flat}) % {e}) * {p}" for s, e, p in self.radices]
        return "(" + " + ".join(terms) + ")"


@dataclass(frozen=True)
class Window:
    """How a consumer reads a stream: ``prefill`` beats when it starts; before each group, a fill
    up to ``needs[g]`` (at most ``step`` beats: what the read-ahead left missing); in each
    iteration of the pipelined ``loop``, one beat read ahead while below ``ahead[g]`` (the next
    group's need) and below ``room[g]`` (the window never overwrites a position still needed)."""

    size: int  # elements of the circular buffer
    groups: tuple[For, ...]  # the loops around the pipelined loop (fills happen in the innermost's body)
    needs: tuple[int, ...]  # positions read once group g's fill is done (per group, flattened)
    step: int  # the largest fill before a group after the first, in beats (0: none)
    prefill: int = 0  # beats read when the kernel starts (the first group's need)
    loop: For | None = None  # the pipelined loop that reads ahead
    ahead: tuple[int, ...] = ()
    room: tuple[int, ...] = ()

    def group_text(self) -> str:
        """The C expression of the current group's number (its loops flattened)."""
        text = "0"
        for loop in self.groups:
            text = f"({text}) * {loop.extent - loop.start} + ({loop.index.name} - {loop.start})"  # type: ignore[operator]
        return text


@dataclass
class Channel:
    buffer: Buffer
    producer: str  # kernel names
    consumer: str
    order: Order
    staged: bool  # the producer writes a local array, streamed out in flat order at its end
    window: Window
    lanes: int = 1  # consecutive positions one stream beat carries (a pixel's channels)

    @property
    def beat(self) -> str:
        """The C struct of a beat of ``lanes`` elements (``hls.beat``: the type of any beat)."""
        return f"k_{self.buffer.name}"


def segment_tensors(number: int, kernels: list[KernelDesign], facts: PlanFacts) -> tuple[list, list, list]:
    """A segment's tensors: (inputs it streams in, outputs it streams out, the ones between its kernels)."""
    written: set[Buffer] = set()
    inputs: list[Buffer] = []
    for kd in kernels:
        for buffer in kd.kernel.reads:
            if buffer not in written and buffer not in facts.constants and buffer not in inputs:
                inputs.append(buffer)
        written.update(kd.kernel.writes)
    produced = list(dict.fromkeys(b for kd in kernels for b in kd.kernel.writes))
    outputs = [b for b in produced if b in facts.live[number]]
    inner = [b for b in produced if b not in outputs and b not in inputs]
    return inputs, outputs, inner


def segment_streams(number: int, kernels: list[KernelDesign], facts: PlanFacts, reuse: int) -> dict[Buffer, Channel]:
    """The FIFOs between a segment's kernels (``streams``)."""
    _, _, inner = segment_tensors(number, kernels, facts)
    return channels([kd.kernel for kd in kernels], [set(kd.local) for kd in kernels], inner, reuse)


def channels(
    kernels: Sequence[Kernel], locals_of: Sequence[set[Buffer]], inner: Sequence[Buffer], reuse: int
) -> dict[Buffer, Channel]:
    """The streams of one segment: every buffer of ``inner`` written by one kernel and read by
    one later kernel (neither reading nor writing it elsewhere). ``locals_of``: per kernel, the
    tensors it computes in a local array (copied out in flat order when it ends)."""
    found: dict[Buffer, Channel] = {}
    for buffer in inner:
        writers = [i for i, k in enumerate(kernels) if buffer in k.writes or buffer in _stored_buffers(k.body)]
        readers = [i for i, k in enumerate(kernels) if buffer in _loaded_buffers(k.body) and i not in writers]
        if len(writers) != 1 or len(readers) != 1 or readers[0] < writers[0]:
            continue
        producer, consumer = kernels[writers[0]], kernels[readers[0]]
        lanes = 1
        if buffer in locals_of[writers[0]]:
            order, staged = Order(), False  # its local's copy-out streams it in flat order
            lanes = banks(producer, reuse).get(buffer, 1)  # a beat: what its banks give in a cycle
            lanes = lanes if lanes <= MAX_LANES and buffer.size % lanes == 0 else 1
        else:
            order, staged = _order(producer, buffer)
            lanes = 1 if staged else _lanes(producer, buffer, reuse)
        try:
            window = _window(consumer, buffer, order, reuse, lanes)
        except Unanalysable:
            window = Window(buffer.size, (), (buffer.size,), 0, buffer.size // lanes)
        found[buffer] = Channel(buffer, producer.name, consumer.name, order, staged, window, lanes)
    return found


def _stored_buffers(body: Sequence[Stmt]) -> set[Buffer]:
    return {s.buffer for s in _statements(body) if isinstance(s, Store)}


def _loaded_buffers(body: Sequence[Stmt]) -> set[Buffer]:
    return {n.buffer for s in _statements(body) for e in _values(s) for n in postorder(e) if isinstance(n, Load)}


def _statements(body: Sequence[Stmt]) -> list[Stmt]:
    found: list[Stmt] = []
    for stmt in body:
        found.append(stmt)
        if isinstance(stmt, (For, If)):
            found.extend(_statements(stmt.body))
    return found


def _values(stmt: Stmt) -> list[Expr]:
    if isinstance(stmt, (Let, Assign)):
        return [stmt.value]
    if isinstance(stmt, Store):
        return [stmt.index, stmt.value]
    if isinstance(stmt, If):
        return [stmt.cond]
    return []


def _order(producer: Kernel, buffer: Buffer) -> tuple[Order, bool]:
    """How ``producer`` emits ``buffer``: (its order, whether it stages the whole tensor)."""
    paths = [(path, s) for path, s in _with_loops(producer.body, ()) if isinstance(s, Store) and s.buffer is buffer]
    if len(paths) != 1 or buffer in _loaded_buffers(producer.body):
        return Order(), True
    loops, store = paths[0]
    if any(not isinstance(loop, For) for loop in loops):  # under a condition
        return Order(), True
    try:
        flat = _evaluate_over(store.index, loops)
    except Unanalysable:
        return Order(), True
    sequence = flat.reshape(-1)
    if sequence.size != buffer.size or not np.array_equal(np.sort(sequence), np.arange(buffer.size)):
        return Order(), True  # not every element exactly once
    if np.array_equal(sequence, np.arange(buffer.size)):
        return Order(), False
    extents = [loop.extent - loop.start for loop in loops]  # type: ignore[operator]
    places = [int(np.prod(extents[i + 1 :])) for i in range(len(loops))]
    strides = []
    for axis in range(len(loops)):
        at = [0] * len(loops)
        at[axis] = 1 if extents[axis] > 1 else 0
        strides.append(int(flat[tuple(at)] - flat[(0,) * len(loops)]) if extents[axis] > 1 else 0)
    radices = tuple((s, e, p) for s, e, p in zip(strides, extents, places, strict=True) if e > 1)
    order = Order(radices)
    if any(s <= 0 for s, _, _ in radices) or not np.array_equal(order.positions(sequence), np.arange(buffer.size)):
        return Order(), True
    return order, False


def _with_loops(body: Sequence[Stmt], around: tuple) -> list[tuple[tuple, Stmt]]:
    """Every statement with the loops and conditions (``If``) around it, outermost first."""
    found: list[tuple[tuple, Stmt]] = []
    for stmt in body:
        found.append((around, stmt))
        if isinstance(stmt, (For, If)):
            found.extend(_with_loops(stmt.body, (*around, stmt)))
    return found


def _evaluate_over(expr: Expr, loops: Sequence[For], mask_of: Sequence[If] = ()) -> np.ndarray:
    """``expr`` at every iteration of ``loops`` (an array, one axis per loop)."""
    total = int(np.prod([max(loop.extent - loop.start, 0) for loop in loops]))  # type: ignore[operator]
    if total > MAX_POINTS or any(not isinstance(loop.extent, int) for loop in loops):
        raise Unanalysable
    env: dict[str, np.ndarray] = {}
    for axis, loop in enumerate(loops):
        shape = [1] * len(loops)
        shape[axis] = loop.extent - loop.start  # type: ignore[operator]
        env[loop.index.name] = np.arange(loop.start, loop.extent, dtype=np.int64).reshape(shape)  # type: ignore[arg-type]
    return np.broadcast_to(_eval(expr, env), [loop.extent - loop.start for loop in loops])  # type: ignore[misc]


def _eval(e: Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, Const):
        if isinstance(e.value, float) and not float(e.value).is_integer():
            raise Unanalysable
        return np.asarray(int(e.value), dtype=np.int64)
    if isinstance(e, Index):
        if e.name not in env:
            raise Unanalysable
        return env[e.name]
    if isinstance(e, Cast):
        if e.dtype.is_float:
            raise Unanalysable
        return _eval(e.a, env)
    if isinstance(e, Select):
        return np.where(_eval(e.cond, env) != 0, _eval(e.a, env), _eval(e.b, env))
    if isinstance(e, Binary):
        a, b = _eval(e.a, env), _eval(e.b, env)
        operations = {
            "+": np.add, "-": np.subtract, "*": np.multiply, "<": np.less, "<=": np.less_equal, ">": np.greater,
            ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal, "&&": np.logical_and, "||": np.logical_or,
            "max": np.maximum, "min": np.minimum,
        }  # fmt: skip
        if e.op in operations:
            return operations[e.op](a, b).astype(np.int64)
        if e.op in ("/", "%"):
            safe = np.where(b == 0, 1, b)
            quotient = np.trunc(a / safe).astype(np.int64)  # C's division truncates toward zero
            return np.where(b == 0, 0, quotient if e.op == "/" else a - quotient * safe)
    raise Unanalysable


MAX_LANES = 256  # the widest beat a stream carries (elements)


def _lanes(producer: Kernel, buffer: Buffer, reuse: int) -> int:
    """The stores to ``buffer`` one iteration of the producer's pipelined loop makes (its beat:
    they are consecutive positions, the store order being the stream's); 1 outside pipelines."""
    ((path, _),) = [(p, s) for p, s in _with_loops(producer.body, ()) if isinstance(s, Store) and s.buffer is buffer]
    for chosen in pipelined(producer, reuse).values():
        if _within(chosen.loop, path):
            inner = list(path[next(i for i, s in enumerate(path) if s is chosen.loop) + 1 :])
            if any(isinstance(s, If) for s in inner):
                return 1
            lanes = int(np.prod([s.extent - s.start for s in inner])) if inner else 1  # type: ignore[misc]
            return lanes if lanes <= MAX_LANES and buffer.size % lanes == 0 else 1
    return 1


def _window(consumer: Kernel, buffer: Buffer, order: Order, reuse: int, lanes: int = 1) -> Window:
    loads = [
        (path, node)
        for path, stmt in _with_loops(consumer.body, ())
        for e in _values(stmt)
        for node in postorder(e)
        if isinstance(node, Load) and node.buffer is buffer
    ]
    chosen = [p for p in pipelined(consumer, reuse).values() if any(_within(p.loop, path) for path, _ in loads)]
    if len(chosen) != 1:
        raise Unanalysable
    groups = _groups(consumer.body, chosen[0])
    if groups and not all(_within(groups[-1], path) for path, _ in loads):
        raise Unanalysable  # a load outside the groups
    count = int(np.prod([g.extent - g.start for g in groups])) if groups else 1  # type: ignore[misc]
    low = np.full(count, buffer.size, dtype=np.int64)
    high = np.full(count, -1, dtype=np.int64)
    for path, node in loads:
        loops = [s for s in path if isinstance(s, For)]
        positions = order.positions(_evaluate_over(node.index, loops)).reshape(count, -1)
        valid = np.ones(positions.shape, dtype=bool)
        for condition in (s for s in path if isinstance(s, If)):
            valid &= (
                np.broadcast_to(_evaluate_over(condition.cond, loops), [lp.extent - lp.start for lp in loops]).reshape(
                    count, -1
                )
                != 0
            )  # type: ignore[misc]
        clipped = np.clip(positions, 0, buffer.size - 1)
        low = np.minimum(low, np.where(valid, clipped, buffer.size).min(axis=1))
        high = np.maximum(high, np.where(valid, clipped, -1).max(axis=1))
    # whole beats: a fill may read up to lanes - 1 positions past what its group needs
    needs = np.minimum(-(-np.maximum.accumulate(high + 1) // lanes) * lanes, buffer.size)
    later_low = np.minimum(np.minimum.accumulate(low[::-1])[::-1], needs)
    ahead = np.concatenate([needs[1:], needs[-1:]])
    # room to read the next group's need ahead, while this group's positions stay
    size = min(-(-max(int(np.max(ahead - later_low)), 1) // lanes) * lanes, buffer.size)
    room = later_low + size
    read, deficits = 0, []
    iterations = chosen[0].loop.extent - chosen[0].loop.start  # type: ignore[operator]
    for g in range(count):
        deficits.append(max(0, int(needs[g]) - read) // lanes)
        read = max(read, int(needs[g]))
        if groups:  # one beat an iteration, while below the next need and inside the window
            read += min(iterations, max(0, min(int(ahead[g]), int(room[g])) - read) // lanes) * lanes
    return Window(
        size,
        tuple(groups),
        tuple(int(n) for n in needs),
        max(deficits[1:], default=0),
        deficits[0],
        chosen[0].loop if groups else None,
        tuple(int(a) for a in ahead),
        tuple(int(r) for r in room),
    )


def _within(loop: Stmt, path: tuple) -> bool:
    return any(s is loop for s in path)


def _groups(body: Sequence[Stmt], target: Pipelined) -> list[For]:
    """The loops from the kernel's top to ``target``'s loop, only loops (no condition between)."""
    for stmt in body:
        if stmt is target.loop:
            return []
        if isinstance(stmt, For) and any(s is target.loop for _, s in _with_loops(stmt.body, ())):
            inner = _groups(stmt.body, target)
            return [stmt, *inner]
        if isinstance(stmt, If) and any(s is target.loop for _, s in _with_loops(stmt.body, ())):
            raise Unanalysable
    raise Unanalysable


def _read(channel: Channel, indent: str) -> list[str]:
    """One beat into the window at the read count."""
    b, window = channel.buffer.name, channel.window
    if channel.lanes == 1:
        return [f"{indent}w_{b}[r_{b} % {window.size}] = s_{b}.read(); ++r_{b};"]
    return [
        f"{indent}{channel.beat} beat = s_{b}.read();",
        f"{indent}for (int l = 0; l < {channel.lanes}; ++l) w_{b}[(r_{b} + l) % {window.size}] = beat.v[l];",
        f"{indent}r_{b} += {channel.lanes};",
    ]


def prefill(channel: Channel, emit) -> None:  # type: ignore[no-untyped-def]
    """The beats the first group needs, read when the kernel starts."""
    if channel.window.prefill:
        emit(f"for (int q = 0; q < {channel.window.prefill}; ++q) {{")
        emit("#pragma HLS PIPELINE II=1")
        for line in _read(channel, "  "):
            emit(line)
        emit("}")


def fill(channel: Channel, emit) -> None:  # type: ignore[no-untyped-def]
    """Before a group: what the read-ahead left missing of its need, one beat per cycle."""
    window, b = channel.window, channel.buffer.name
    if not window.step:
        return
    emit(f"{{ const int need = need_{b}[{window.group_text()}];")
    emit(f"  for (int q = 0; q < {window.step}; ++q) {{")
    emit("  #pragma HLS PIPELINE II=1")
    emit(f"    if (r_{b} < need) {{")
    for line in _read(channel, "      "):
        emit(line)
    emit("    }")
    emit("  }")
    emit("}")


def read_ahead(channel: Channel, emit) -> None:  # type: ignore[no-untyped-def]
    """In an iteration of the pipelined loop: one beat of the next group's need, if there is room."""
    b, g, lanes = channel.buffer.name, channel.window.group_text(), channel.lanes
    emit(f"if (r_{b} < ahead_{b}[{g}] && r_{b} + {lanes} <= room_{b}[{g}]) {{")
    for line in _read(channel, "  "):
        emit(line)
    emit("}")


def tables(channel: Channel) -> list[str]:
    """The window's per-group needs, read-ahead bounds and room, as ROMs."""
    b, window = channel.buffer.name, channel.window
    lines = []
    for name, values in (("need", window.needs), ("ahead", window.ahead), ("room", window.room)):
        if values and ((name == "need" and window.step) or (name != "need" and window.loop is not None)):
            lines.append(f"static const int {name}_{b}[{len(values)}] = {{{','.join(str(v) for v in values)}}};")
    return lines


def drain(channel: Channel, emit) -> None:  # type: ignore[no-untyped-def]
    """Reads what no group needed, so the producer's stream is consumed whole."""
    left = (channel.buffer.size - channel.window.needs[-1]) // channel.lanes  # the read-ahead stops there too
    if left > 0:
        emit(f"for (int q = 0; q < {left}; ++q) {{")
        emit("#pragma HLS PIPELINE II=1")
        emit(f"  s_{channel.buffer.name}.read();")
        emit("}")
