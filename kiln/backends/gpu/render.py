"""Kernel IR -> Triton: the ``gpu`` target's renderer (expressions, statements, loop nests; the
engine calls' kernels are ``engines.py``, the module that holds them all ``module.py``).

Every kernel becomes one or more ``@triton.jit`` functions and a launch each, in one Python module
(its text is the target's "source"; ``LAUNCHES`` at its end says, per segment, which function runs
on which grid with which buffers and block sizes):

* a loop nest: its outermost loops that ``lanes.lane_depth`` proves independent become lanes
  (``BLOCK`` iterations per program, ``tl.arange``), everything inside runs in order per lane with
  lane-shaped values; conditionals become masks (a load under a false condition or an unused select
  branch is masked off, so no lane reads out of bounds), loads and stores are masked by the lanes
  that exist. A nest with nothing provably independent runs in one sequential program.
* a matrix product or convolution (``GemmSpec``): a tiled ``tl.dot`` kernel whose operands are read
  through their layouts (row-major, the CPU engine's packed panels, or a convolution's input as an
  implicit GEMM: im2col addresses computed in the kernel, padding masked), with the fused
  epilogue applied to the accumulator tile before its one store.
* attention (``AttentionSpec``): one flash-attention kernel, online softmax over key blocks, the
  scale/mask chain applied to each score tile in registers; scores are never written to memory.

Integer division and remainder follow C (truncation), as the kernel IR says; float math goes to
Triton's ``tl`` functions and, where it has none, to libdevice (the interpreter gets NumPy ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.backends.gpu.lanes import accesses, lane_depth, perfect_nest, vector_loop
from kiln.backends.gpu.render_expr import (  # re-exported: the renderer's one name for them
    COMBINE as COMBINE,
)
from kiln.backends.gpu.render_expr import (
    LANES_MAX as LANES_MAX,
)
from kiln.backends.gpu.render_expr import (
    LIBDEVICE as LIBDEVICE,
)
from kiln.backends.gpu.render_expr import (
    POINTER_TYPES as POINTER_TYPES,
)
from kiln.backends.gpu.render_expr import (
    REDUCE as REDUCE,
)
from kiln.backends.gpu.render_expr import (
    TILE_MAX as TILE_MAX,
)
from kiln.backends.gpu.render_expr import (
    TL_FUNCTIONS as TL_FUNCTIONS,
)
from kiln.backends.gpu.render_expr import (
    TL_TYPES as TL_TYPES,
)
from kiln.backends.gpu.render_expr import (
    VECTOR_MAX as VECTOR_MAX,
)
from kiln.backends.gpu.render_expr import (
    CannotRender as CannotRender,
)
from kiln.backends.gpu.render_expr import (
    Context as Context,
)
from kiln.backends.gpu.render_expr import (
    Expressions as Expressions,
)
from kiln.backends.gpu.render_expr import (
    Val as Val,
)
from kiln.backends.gpu.render_expr import (
    both as both,
)
from kiln.backends.gpu.render_expr import (
    convert as convert,
)
from kiln.backends.gpu.render_expr import (
    literal_text as literal_text,
)
from kiln.backends.gpu.render_expr import (
    p2 as p2,
)
from kiln.backends.gpu.render_expr import (
    tensor as tensor,
)
from kiln.backends.gpu.render_expr import (
    wrap as wrap,
)
from kiln.ir.types import DType
from kiln.lower.kir import (
    Assign,
    Binary,
    Buffer,
    Expr,
    For,
    If,
    Kernel,
    Let,
    Stmt,
    Store,
)


@dataclass
class Launch:
    """One kernel launch: ``function`` on ``grid`` with the buffers in ``slots`` (pointer-table
    slots) and its compile-time block sizes."""

    function: str
    kernel: str
    grid: tuple[int, ...]
    slots: tuple[int, ...]
    constants: dict[str, int]
    num_warps: int
    num_stages: int
    kind: str  # lanes | sequential | matmul | conv | attention
    signature: dict[str, str] = field(default_factory=dict)
    # the grid's tiled axes, in order: (block constant, extent) -- grid[i] = ceil(extent / constants[name]);
    # what a tuner may change (``tuning``); empty for a launch whose blocks are fixed
    tiles: tuple[tuple[str, int], ...] = ()

    def grid_for(self, constants: dict[str, int]) -> tuple[int, ...]:
        """The grid of this launch with other block sizes (the untiled axes as they were)."""
        tiled = tuple(-(-extent // constants[name]) for name, extent in self.tiles)
        return tiled + tuple(self.grid[len(tiled) :])

    def as_tuple(self) -> tuple:
        return (
            self.function,
            self.kernel,
            self.grid,
            self.slots,
            self.constants,
            self.num_warps,
            self.num_stages,
            self.kind,
            self.signature,
            self.tiles,
        )

    @classmethod
    def of(cls, fields: Sequence) -> Launch:
        return cls(*fields)


class Statements:
    """Kernel-IR statements as the body of a Triton function, predicated by masks.

    Memory written by one statement and read by a later one of the same program need not be read
    by the thread that wrote it: Triton lays each tensor out over the program's threads by its own
    shape and access pattern (a [BLOCK, 1] lane value and a [BLOCK, 64] vector step, or a vector
    loop starting one element later, put the same element in different threads), and orders no
    global-memory access between threads. So a statement that loads a buffer written since the
    last barrier gets one first (``tl.debug_barrier()``: bar.sync, after which the block's writes
    are visible to all its threads), and so does the end of a sequential loop whose body reads
    what it writes (the next iteration's reads). Triton's interpreter runs whole tensors in order
    and never showed this: only a GPU does."""

    def __init__(self, ctx: Context, enclosing: Sequence[str] = ()) -> None:
        self.ctx = ctx
        self.exprs = Expressions(ctx)
        self.enclosing = list(enclosing)  # indices of the loops around (lanes included)
        self.written: set[Buffer] = set()  # stored since the last barrier

    def block(self, body: Sequence[Stmt], pred: str | None, base: str | None) -> None:
        ctx = self.ctx
        start = len(ctx.lines)
        for stmt in body:
            self.ordered(stmt, pred, base)
        if len(ctx.lines) == start:
            ctx.emit("pass")

    def ordered(self, stmt: Stmt, pred: str | None, base: str | None) -> None:
        """``stmt`` after a barrier if it reads memory written since the last one."""
        loads, stores = accesses([stmt])
        if loads & self.written:
            self.barrier()
        self.statement(stmt, pred, base)
        self.written |= stores - set(self.ctx.intercept)

    def barrier(self) -> None:
        self.ctx.emit("tl.debug_barrier()")
        self.written.clear()

    def broadcast(self, v: Val, dtype: DType) -> str:
        v = convert(v, dtype)
        if v.literal:
            return f"tl.full({self.ctx.shape}, {v.text}, {TL_TYPES[dtype]})"
        if self.ctx.shape == "[]":
            return f"({v.text}).to({TL_TYPES[dtype]})"
        return f"tl.broadcast_to(({v.text}).to({TL_TYPES[dtype]}), {self.ctx.shape})"

    def statement(self, stmt: Stmt, pred: str | None, base: str | None) -> None:
        ctx = self.ctx
        if isinstance(stmt, For) and not ctx.vector:
            reductions = vector_loop(stmt, frozenset(self.enclosing))
            if reductions is not None:
                self.vector_loop(stmt, reductions, pred)
                return
        if isinstance(stmt, For):
            bounds = []
            for bound in (stmt.start, stmt.extent):
                if isinstance(bound, int):
                    bounds.append((str(bound), True))
                else:
                    v = self.exprs.value(bound, pred)
                    bounds.append((v.text, v.literal))
            counter = ctx.fresh("i")
            if all(constant for _, constant in bounds):
                ctx.emit(f"for {counter} in range({bounds[0][0]}, {bounds[1][0]}):")
            else:
                ctx.emit(f"for {counter} in tl.range({bounds[0][0]}, {bounds[1][0]}):")
            outer = ctx.indent
            ctx.indent += "    "
            name = ctx.index(stmt.index.name)
            ctx.emit(f"{name} = {counter} + _zero")
            saved = ctx.env.get(stmt.index.name)
            ctx.env[stmt.index.name] = name
            self.enclosing.append(stmt.index.name)
            self.block(stmt.body, pred, base)
            loads, stores = accesses(stmt.body)
            if loads & stores - set(ctx.intercept):  # the next iteration reads what this one wrote
                self.barrier()
            self.enclosing.pop()
            ctx.indent = outer
            if saved is None:
                ctx.env.pop(stmt.index.name, None)
            else:
                ctx.env[stmt.index.name] = saved
        elif isinstance(stmt, If):
            cond = convert(self.exprs.value(stmt.cond, pred), DType.BOOL)
            if cond.literal:
                if cond.value:
                    self.block(stmt.body, pred, base)
                return
            name = ctx.fresh("p")
            ctx.emit(f"{name} = {cond.text}" if pred is None else f"{name} = {both(pred, cond.text)}")
            self.block(stmt.body, name, base)
        elif isinstance(stmt, Let):
            v = self.exprs.value(stmt.value, pred)
            ctx.scalars[stmt.scalar.name] = stmt.scalar.dtype
            ctx.emit(f"{ctx.scalar(stmt.scalar.name)} = {self.broadcast(v, stmt.scalar.dtype)}")
        elif isinstance(stmt, Assign):
            v = self.exprs.value(stmt.value, pred)
            name = ctx.scalar(stmt.scalar.name)
            if pred is None or pred == base:
                ctx.emit(f"{name} = {self.broadcast(v, stmt.scalar.dtype)}")
            else:
                ctx.emit(f"{name} = tl.where({pred}, {convert(v, stmt.scalar.dtype).text}, {name})")
        elif isinstance(stmt, Store):
            value = convert(self.exprs.value(stmt.value, pred), stmt.buffer.dtype)
            if stmt.buffer in ctx.intercept:
                ctx.emit(f"{ctx.intercept[stmt.buffer]} = {tensor(value)}")
                return
            index = self.exprs.value(stmt.index, pred)
            offset = index if index.literal else convert(index, DType.INT64)
            pointer = ctx.pointer(stmt.buffer)
            address = f"{pointer} + ({offset.text} + {ctx.zero})" if ctx.zero else f"{pointer} + {offset.text}"
            mask = "" if pred is None else f", mask={pred}"
            ctx.emit(f"tl.store({address}, {value.text}{mask})")
        else:
            raise CannotRender(
                f"the gpu target renders engine calls only at a kernel's top level, not {type(stmt).__name__}"
            )

    def vector_loop(self, loop: For, reductions: dict[str, str], pred: str | None) -> None:
        """A loop whose iterations are independent (``lanes.vector_loop``) as steps of a vector of
        up to VECTOR_MAX iterations: a tile axis beside the lanes; its folds into outside scalars
        become tree reductions (``tl.reduce``) of each step's vector."""
        ctx = self.ctx
        start, extent = int(loop.start), int(loop.extent)  # type: ignore[arg-type]
        width = min(VECTOR_MAX, p2(extent - start))
        ctx.widest = max(ctx.widest, width)
        counter = ctx.fresh("v")
        ctx.emit(f"for {counter} in range({start}, {extent}, {width}):")
        outer_indent, outer_shape, outer_zero = ctx.indent, ctx.shape, ctx.zero
        ctx.indent += "    "
        arange = f"tl.arange(0, {width}).to(tl.int64)"
        name = ctx.index(loop.index.name)
        ctx.emit(f"{name} = {counter} + _zero + {arange}{'[None, :]' if ctx.lanes else ''}")
        ctx.shape = f"[BLOCK, {width}]" if ctx.lanes else f"[{width}]"
        ctx.zero = ctx.fresh("zv")
        ctx.emit(f"{ctx.zero} = tl.full({ctx.shape}, 0, tl.int64)")
        inside = ctx.fresh("p")
        bound = f"({name} < {extent})"
        ctx.emit(f"{inside} = {bound}" if pred is None else f"{inside} = {both(pred, bound)}")
        saved = ctx.env.get(loop.index.name)
        ctx.env[loop.index.name] = name
        ctx.vector = True
        axis = 1 if ctx.lanes else 0
        for stmt in loop.body:
            if isinstance(stmt, Assign) and stmt.scalar.name in reductions:
                kind = reductions[stmt.scalar.name]
                dtype = stmt.scalar.dtype
                operand = _reduced_operand(stmt)
                v = convert(self.exprs.value(operand, inside), dtype)
                identity = _identity(kind, dtype)
                folded = ctx.fresh("r")
                values = ctx.fresh("x")
                ctx.emit(f"{values} = tl.where({inside}, {v.text}, {identity}).to({TL_TYPES[dtype]})")
                ctx.emit(f"{folded} = tl.reduce({values}, {axis}, {REDUCE[kind]})")
                if kind in ("max", "min") and dtype.is_float:
                    ctx.emit(
                        f"{folded} = tl.where(tl.reduce(({values} != {values}).to(tl.int32), {axis}, "
                        f'tl.standard._sum_combine) > 0, float("nan"), {folded})'
                    )
                target = ctx.scalar(stmt.scalar.name)
                ctx.emit(f"{target} = {COMBINE[kind]}({target}, {folded}{'[:, None]' if ctx.lanes else ''})")
            else:
                self.ordered(stmt, inside, inside)
        ctx.vector = False
        ctx.indent, ctx.shape, ctx.zero = outer_indent, outer_shape, outer_zero
        if saved is None:
            ctx.env.pop(loop.index.name, None)
        else:
            ctx.env[loop.index.name] = saved


def _reduced_operand(stmt: Assign) -> Expr:
    """``e`` of a reduction ``s = s op e``."""
    value = stmt.value
    assert isinstance(value, Binary)
    return value.b if value.a == stmt.scalar else value.a


def _identity(kind: str, dtype: DType) -> str:
    if kind == "+":
        return literal_text(0, dtype)
    if kind == "*":
        return literal_text(1, dtype)
    if dtype.is_float:
        return 'float("-inf")' if kind == "max" else 'float("inf")'
    info = np.iinfo(dtype.numpy) if dtype is not DType.BOOL else None
    if info is None:
        return "False" if kind == "max" else "True"
    return str(info.min if kind == "max" else info.max)


# -- kernels ----------------------------------------------------------------------------------------------


def _signature(ctx: Context, constants: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    params = list(ctx.pointers.values())
    signature = {ctx.pointers[b]: POINTER_TYPES[b.dtype] for b in ctx.pointers}
    for name in constants:
        signature[name] = "constexpr"
    return params, signature


def function_text(name: str, ctx: Context, constants: Sequence[str], head: list[str]) -> tuple[str, dict[str, str]]:
    params, signature = _signature(ctx, constants)
    args = ", ".join([*params, *(f"{c}: tl.constexpr" for c in constants)])
    text = "\n".join(["", "", "@triton.jit", f"def {name}({args}):", *head, *ctx.lines])
    return text, signature


def _flags(table: dict[Buffer, int]) -> frozenset[Buffer]:
    return frozenset(b for b, slot in table.items() if slot == 0)


def render_nest(name: str, kernel: Kernel, stmt: For | list[Stmt], table: dict[Buffer, int]) -> tuple[str, Launch]:
    """A loop nest (or a kernel body of other statements: sequential) as one Triton function."""
    depth = lane_depth(stmt, _flags(table)) if isinstance(stmt, For) else 0
    if depth:
        assert isinstance(stmt, For)
        nest, _ = perfect_nest(stmt)
        lanes = nest[:depth]
        extents = [int(loop.extent) for loop in lanes]  # type: ignore[arg-type]
        total = int(np.prod(extents))
        ctx = Context("[BLOCK, 1]", "_z")
        head = [
            "    _zero = tl.full([], 0, tl.int64)",
            "    _lin = (tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64))[:, None]",
            f"    _lanes = _lin < {total}",
            "    _z = tl.full([BLOCK, 1], 0, tl.int64)",
        ]
        stride = total
        for position, (loop, extent) in enumerate(zip(lanes, extents)):
            stride //= extent
            text = "_lin" if stride == 1 else f"(_lin // {stride})"
            if position:
                text = f"{text} % {extent}"
            head.append(f"    {ctx.index(loop.index.name)} = {text}")
            ctx.env[loop.index.name] = ctx.index(loop.index.name)
        Statements(ctx, [loop.index.name for loop in lanes]).block(lanes[-1].body, "_lanes", "_lanes")
        # lanes per program: a tile of lanes x the widest vector loop stays within TILE_MAX elements
        block = min(LANES_MAX, p2(total), max(1, TILE_MAX // max(1, ctx.widest)))
        source, signature = function_text(name, ctx, ["BLOCK"], head)
        grid = (-(-total // block),)
        warps = 4 if block * max(1, ctx.widest) <= 512 else 8
        launch = Launch(name, kernel.name, grid, (), {"BLOCK": block}, warps, 1, "lanes", signature)
    else:
        ctx = Context("[]", None)
        head = ["    _zero = tl.full([], 0, tl.int64)"]
        Statements(ctx).block([stmt] if isinstance(stmt, For) else stmt, None, None)
        source, signature = function_text(name, ctx, ["BLOCK"], head)
        launch = Launch(name, kernel.name, (1,), (), {"BLOCK": 1}, 1, 1, "sequential", signature)
    launch.slots = tuple(table[b] for b in ctx.pointers)
    return source, launch
