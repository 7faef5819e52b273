"""Lowering: graph nodes -> kernels over buffers.

``Lowerer.lower(node)`` returns the node's kernels, or raises ``CannotLower`` with a reason: the
node then runs as a host fallback (its reference implementation), which ``kiln explain`` and the
conformance report list. Reshape-like ops become aliases (the output shares its input's buffer)
and cost nothing at run time.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.sized import SizedInt
from kiln.ir.types import DType, TensorType
from kiln.lower.kir import (
    STATUS_NAME,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    Index,
    Kernel,
    Load,
    Scalar,
    Schedule,
    Select,
    Stmt,
    Store,
    Unary,
    affine,
    i64,
)
from kiln.lower.pointwise import ANY_NUMERIC, BF16, COMPARE, FLOAT_OPS, HALF, LOGIC, NATIVE, NATIVE_FLOATS
from kiln.lower.target import Target
from kiln.memory import aligned_copy, one_copy
from kiln.ops.registry import has_trait, ops_with
from kiln.passes.cache_in_place import CACHE_APPEND, layouts_of

ALIASES = ops_with("alias")  # no kernel: the output is the input's data


class CannotLower(Exception):
    """This node has no native lowering (yet); the message says why."""


def kernel_key(op: str, attrs: dict[str, Any], shapes: list[tuple[int, ...] | None], constant: list[bool]) -> str:
    """What a kernel's speed depends on: op, attributes, operand shapes and which are weights."""
    plain = {
        k: (list(v) if isinstance(v, (list, tuple)) else v)
        for k, v in sorted(attrs.items())
        if isinstance(v, (int, float, str, list, tuple))
    }
    text = json.dumps([op, plain, [list(s) if s is not None else None for s in shapes], constant], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _empty(value: Value) -> bool:
    """A static tensor with a zero-size dim."""
    return isinstance(value.type, TensorType) and value.type.is_static and 0 in tuple(value.type.shape or ())


def strides(shape: tuple[int, ...]) -> list[int]:
    result, step = [], 1
    for dim in reversed(shape):
        result.append(step)
        step *= dim
    return result[::-1]


def _hint(hint: str) -> str:
    """A loop index's or scalar's name stem: letters only, so ``stem_N`` can never be a buffer's
    name (``b3``, ``w5``, ``acc0_2``, ``status``), which the C emitter's templating relies on (a
    scalar ``b3`` beside buffer ``b3`` was one C name for two things)."""
    return "".join(ch for ch in hint if ch.isalpha()) or "s"


class Lowerer:
    """Lowers a graph's nodes, one at a time, into kernels for ``target``. ``table`` maps an op
    (``kiln::Op`` for kiln's own) to its lowering (``kiln.lower.families.lowerings()``);
    ``choose(key)`` returns the schedule for a tunable node's ``kernel_key`` and where it came
    from (``tuned``, ``cached`` or ``default``): the driver's, from the tuner and its database."""

    def __init__(
        self,
        graph: Graph,
        target: Target,
        table: Mapping[str, Lowering],
        choose: Callable[[str], tuple[dict, str]] | None = None,
        disabled: frozenset[str] = frozenset(),
        precision: str = "fp32",
        quantization: Any = None,
        copy_packed: bool = True,
    ) -> None:
        self.graph = graph
        # False: packed weights stay as ``make`` returns them (a compile read for its sizes only)
        self.copy_packed = copy_packed
        self.precision = precision  # of the matrix products and convolutions: fp32 | bf16 | int8
        # int8: activation ranges by value name, and the nodes kept in fp32 (CompileOptions.quantization)
        self.ranges: dict[str, tuple[float, float]] = {}
        self.keep_fp32: frozenset[str] = frozenset()
        if quantization is not None:
            self.ranges = {name: (lo, hi) for name, lo, hi in quantization.ranges}
            self.keep_fp32 = quantization.keep
        # int8 activations an int8 product stores quantized for the int8 products that read them
        # (kiln.lower.gemm_lowering: ``Requantize``), by value
        self.quantized: dict[Value, Any] = {}
        self._consumers: dict[Value, list[Node]] | None = None
        self.target = target  # what the kernels are for (vector width, tile, cores, engines)
        self.table = table
        self.choose = choose or (lambda key: ({}, "default"))
        self.disabled = disabled  # algorithms turned off (``winograd``): CompileOptions.disabled
        # divisors of the floor divisions a lowering's sizes take (beyond the model's strides): a
        # loop over groups of pixels runs ``width // group`` times; sizes taken at run time are
        # fitted with them (``kiln.driver.spatial``)
        self.divisors: set[int] = set()
        self.buffers: dict[Value, Buffer] = {}
        self.aliases: dict[Value, Value] = {}
        self.outputs = set(graph.outputs)
        self.status = Buffer(STATUS_NAME, DType.INT32, 1)
        self.kernel_count = 0
        self._names = 0
        from kiln.passes.rewrite import consumers_count

        self.readers = consumers_count(graph)
        self.fixed = set(graph.inputs) | set(graph.constants) | self.outputs
        self.in_place: set[Value] = set()
        self._sharers: dict[Value, int] = {}  # root -> values sharing its buffer through a reshape
        # A graph output that is a reshape of a kernel's result: the kernel writes the output's
        # memory directly (no copy at the end).
        producers = graph.producers()
        for node in graph.nodes:
            if node.op in ALIASES and node.op != "Dropout" and node.outputs[0] in self.outputs and node.inputs:
                source = node.inputs[0]
                maker = producers.get(source) if source is not None else None
                if (
                    maker is not None
                    and maker.op not in ALIASES
                    and source not in self.fixed
                    and self.readers.get(source, 0) == 1
                ):
                    self.alias(source, node.outputs[0])
        # values laid out in a box at the origin of a larger shape (a KV cache at its capacity, updated
        # in place: kiln.passes.cache_in_place), the present in its past's buffer
        self.layouts = layouts_of(graph)
        for node in graph.nodes:
            if node.domain == "kiln" and node.op == CACHE_APPEND and node.inputs[0] is not None:
                self.alias(node.outputs[0], node.inputs[0])
        self.scratch: list[Buffer] = []  # per-kernel working memory, planned in the arena like intermediates
        self.packed: dict[Buffer, np.ndarray] = {}  # weights re-laid out for the kernels that read them
        self._packed_keys: dict[tuple[object, ...], Buffer] = {}

    def choice(self, node: Node) -> tuple[dict, str]:
        """The schedule for a tunable node and where it came from: ``tuned`` (given to this
        compile), ``cached`` (the tuning database) or ``default``."""
        shapes = [None if v is None else self.shape(v) for v in node.inputs]
        key = kernel_key(
            node.op, dict(node.attrs), shapes, [v is not None and v in self.graph.constants for v in node.inputs]
        )
        return self.choose(key)

    def consumers(self) -> dict[Value, list[Node]]:
        """The nodes reading each value (computed once: the graph does not change while lowering)."""
        if self._consumers is None:
            self._consumers = self.graph.consumers()
        return self._consumers

    def scratch_buffer(self, dtype: DType, size: int, hint: str = "s") -> Buffer:
        buffer = Buffer(f"{hint}{len(self.scratch)}_{self.kernel_count}", dtype, size)
        self.scratch.append(buffer)
        return buffer

    def packed_constant(self, key: tuple[object, ...], make: Callable[[], np.ndarray]) -> Buffer:
        """A constant buffer holding ``make()`` (a weight packed into the layout a kernel wants),
        made once per ``key`` however many kernels read it."""
        buffer = self._packed_keys.get(key)
        if buffer is None:
            array = make()
            if self.copy_packed:  # the engine loads packed panels with aligned loads; another class's copy if equal
                array = one_copy(aligned_copy(array))
            buffer = Buffer(f"w{len(self.packed)}", DType.from_numpy(array.dtype), int(array.size))
            self.packed[buffer] = array
            self._packed_keys[key] = buffer
        return buffer

    def reuse_input(self, out: Value, candidates: list[Value | None]) -> None:
        """Let ``out`` take over the buffer of an input this kernel reads last (in place). Only for
        kernels that read each input element at the output element's own index before writing it."""
        if out in self.buffers or out in self.fixed:
            return
        for value in candidates:
            if value is None or value in self.fixed or self.readers.get(value, 0) != 1 or value.type != out.type:
                continue
            root = self.root(value)
            # storage shared through a reshape may have other readers; a chain of in-place
            # results may not (each link died when the next was computed)
            sharers = self._sharers.get(root, 0)
            if root in self.fixed or sharers or (value in self.aliases and value not in self.in_place):
                continue
            self.alias(out, value, in_place=True)
            return

    def alias(self, value: Value, storage: Value, in_place: bool = False) -> None:
        """``value`` lives in ``storage``'s buffer: a reshape's view (other readers may share it)
        or an elementwise result written over its last-read input (``in_place``)."""
        if value in self.aliases and value not in self.in_place:
            self._sharers[self.root(value)] -= 1
        self.aliases[value] = storage
        if in_place:
            self.in_place.add(value)
        else:
            self.in_place.discard(value)
            root = self.root(value)
            self._sharers[root] = self._sharers.get(root, 0) + 1

    def shared(self, value: Value) -> bool:
        """Whether another value lives in ``value``'s buffer (a reshape's view of it)."""
        return self._sharers.get(value, 0) > 0

    # -- values ------------------------------------------------------------------------------

    def root(self, value: Value) -> Value:
        """The value whose buffer ``value`` lives in (itself unless aliased). Chains are compressed
        as they are walked: a chain of n in-place results costs O(n), not O(n^2)."""
        chain = []
        while value in self.aliases:
            chain.append(value)
            value = self.aliases[value]
        for link in chain[:-1]:
            self.aliases[link] = value
        return value

    def buffer(self, value: Value) -> Buffer:
        value = self.root(value)
        if value not in self.buffers:
            self.buffers[value] = Buffer(f"b{len(self.buffers)}", value.type.dtype, math.prod(self.layout(value)))  # type: ignore[union-attr]
        return self.buffers[value]

    def layout(self, value: Value) -> tuple[int, ...]:
        """The shape ``value`` is laid out at: its own, or the one it is a box at the origin of."""
        return self.layouts.get(value) or self.shape(value)

    def shape(self, value: Value) -> tuple[int, ...]:
        return tuple(d if isinstance(d, SizedInt) else int(d) for d in value.type.shape)  # type: ignore[union-attr]

    def constant(self, value: Value | None) -> np.ndarray | None:
        return None if value is None else self.graph.constants.get(value)

    def index(self, hint: str = "i") -> Index:
        self._names += 1
        return Index(f"{_hint(hint)}_{self._names}")

    def scalar(self, dtype: DType, hint: str = "s") -> Scalar:
        self._names += 1
        return Scalar(f"{_hint(hint)}_{self._names}", dtype)

    def kernel(
        self,
        node: Node,
        kind: str,
        body: list[Stmt],
        reads: list[Value | None],
        writes: list[Value],
        schedule: Schedule,
    ) -> Kernel:
        self.kernel_count += 1
        return Kernel(
            f"k{self.kernel_count}",
            kind,
            body,
            [self.buffer(v) for v in reads if v is not None],
            [self.buffer(v) for v in writes],
            [node.label],
            schedule,
        )

    # -- entry ---------------------------------------------------------------------------------

    def lower(self, node: Node) -> list[Kernel]:
        outputs = [v for v in node.outputs if v is not None]
        if outputs and all(_empty(v) for v in outputs):
            return []  # every result has a zero-size dim (a batch of 0): nothing to compute
        if has_trait(node.op, node.domain, "contracting") and any(
            _empty(v) for v in node.inputs if v is not None and v not in self.graph.constants
        ):
            # a product over an empty reduction dim, attention over no keys: the engine and the
            # attention driver assume non-empty operands (loop nests need nothing: they run 0 times)
            raise CannotLower("reads an empty tensor into a non-empty result")
        if node.domain == "kiln" and f"kiln::{node.op}" in self.table:
            return self.table[f"kiln::{node.op}"](self, node)
        if node.domain:
            raise CannotLower(f"domain {node.domain!r} has no native lowerings")
        for value in [*node.inputs, *node.outputs]:
            if value is None:
                continue
            if not isinstance(value.type, TensorType) or not value.type.is_static:  # (Fused checked by fuse)
                raise CannotLower(f"%{value.name} has no static tensor shape ({value.type})")
            if value.type.dtype not in NATIVE:
                raise CannotLower(f"dtype {value.type.dtype.short} has no native lowering")
        if node.op in ALIASES:
            return self._alias(node)
        lowering = self.table.get(node.op)
        if lowering is None:
            raise CannotLower(f"op {node.op} has no native lowering yet")
        return lowering(self, node)

    def _alias(self, node: Node) -> list[Kernel]:
        if node.op == "Dropout":
            training = (
                self.constant(node.inputs[2])
                if len(node.inputs) > 2 and node.inputs[2] is not None
                else np.array(False)
            )
            if training is None or bool(np.any(training)):
                raise CannotLower("Dropout in training mode is random")
            if len(node.outputs) > 1:  # inference: the data passes through, the mask is all true
                source, out, mask = node.inputs[0], node.outputs[0], node.outputs[1]
                assert source is not None
                fill = self.buffer(mask)
                body, indices = nest(self, (fill.size,), lambda i: [Store(fill, i[0], Const(True, DType.BOOL))])
                return [
                    copy_kernel(self, node, source, out),
                    self.kernel(
                        node, "pointwise", body, [], [mask], default_schedule(self.target, (fill.size,), indices)
                    ),
                ]
        source, out = node.inputs[0], node.outputs[0]
        assert source is not None
        if out in self.outputs and self.root(source) is not out:
            return [copy_kernel(self, node, source, out)]  # graph outputs own their memory
        if out in self.outputs:
            return []  # the producer already wrote the output's memory
        self.alias(out, source)
        return []


# -- helpers every lowering uses ---------------------------------------------------------------------


def nest(
    lw: Lowerer, shape: tuple[int, ...], body: Callable[[list[Index]], list[Stmt]], hint: str = "i"
) -> tuple[list[Stmt], list[Index]]:
    """Loops over ``shape`` (outermost first) around ``body(indices)``."""
    indices = [lw.index(hint) for _ in shape]
    stmts = body(indices)
    for index, extent in reversed(list(zip(indices, shape))):
        stmts = [For(index, extent, stmts)]
    return stmts, indices


def broadcast_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...], indices: list[Index]) -> Expr:
    """Flat index into an input broadcast (NumPy rules) to ``out_shape``."""
    in_strides = strides(in_shape)
    offset = len(out_shape) - len(in_shape)
    terms = []
    for axis, size in enumerate(in_shape):
        if size != 1:
            terms.append((indices[axis + offset], in_strides[axis]))
    return affine(terms)  # type: ignore[arg-type]


def default_schedule(
    target: Target, shape: tuple[int, ...], indices: list[Index], dtype: DType = DType.FLOAT32
) -> Schedule:
    """The target's schedule for a loop nest nothing tuned (``Target.default_schedule``)."""
    return target.default_schedule(shape, indices, dtype)


def copy_kernel(lw: Lowerer, node: Node, source: Value, out: Value) -> Kernel:
    src, dst = lw.buffer(source), lw.buffer(out)
    body, indices = nest(lw, (dst.size,), lambda i: [Store(dst, i[0], Load(src, i[0]))])
    return lw.kernel(node, "copy", body, [source], [out], default_schedule(lw.target, (dst.size,), indices))


def _x86_float_to_int(first: DType, out_dtype: DType) -> Callable[[list[Expr]], Expr]:
    """A float -> int32/int64 cast as x86 (and NumPy there) does it: truncated toward zero, and
    NaN, infinities and values out of the type's range the integer indefinite (its minimum),
    never C's undefined behaviour (relative-position buckets cast log(0) = -inf)."""
    bits = 63 if out_dtype is DType.INT64 else 31
    high, low = Const(float(2**bits), first), Const(-float(2**bits), first)
    least = Const(-(2**bits), out_dtype)

    def cast(a: list[Expr]) -> Expr:
        outside = Binary("||", Binary("!=", a[0], a[0]), Binary("||", Binary(">=", a[0], high), Binary("<", a[0], low)))
        return Select(outside, least, Cast(out_dtype, a[0]))

    return cast


def scalarize_for(node: Node, dtypes: list[DType], float_to_int: str = "") -> Callable[[list[Expr]], Expr]:
    """The scalar expression of an elementwise node, for its input dtypes (``float_to_int``: the
    target's rule for casts of NaN and out-of-range floats, ``Target.float_to_int``)."""
    op, attrs = node.op, dict(node.attrs)
    first = dtypes[0]
    out_dtype = node.outputs[0].type.dtype  # type: ignore[union-attr]
    if op in COMPARE:
        return lambda a: Binary(COMPARE[op], a[0], a[1])
    if op in LOGIC:
        return lambda a: Binary(LOGIC[op], a[0], a[1])
    if op == "Not":
        return lambda a: Unary("!", a[0])
    if op == "Where":
        return lambda a: Select(a[0], a[1], a[2])
    if op == "IsNaN" and first in NATIVE_FLOATS:
        return lambda a: Binary("!=", a[0], a[0])
    if op == "IsInf" and first in NATIVE_FLOATS:
        positive, negative = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
        inf = Const(math.inf, first)
        minus = Const(-math.inf, first)
        return lambda a: Binary(
            "||",
            Binary("&&", Const(bool(positive), DType.BOOL), Binary("==", a[0], inf)),
            Binary("&&", Const(bool(negative), DType.BOOL), Binary("==", a[0], minus)),
        )
    if op in ("Cast", "CastLike", "Expand"):
        if out_dtype is DType.BOOL and first is not DType.BOOL:
            return lambda a: Binary("!=", a[0], Const(0, first))
        if out_dtype in (
            DType.INT32,
            DType.INT64,
            DType.INT8,
            DType.UINT8,
            DType.INT16,
            DType.UINT16,
            DType.UINT32,
            DType.UINT64,
        ) and first in (*NATIVE_FLOATS, HALF, BF16):
            if float_to_int == "x86" and out_dtype in (DType.INT32, DType.INT64) and first in NATIVE_FLOATS:
                return _x86_float_to_int(first, out_dtype)
            raise CannotLower("float -> integer casts of NaN/out-of-range values differ between C and NumPy")
        return lambda a: Cast(out_dtype, a[0])
    if op == "Clip":

        def clip(a: list[Expr]) -> Expr:
            result = a[0]
            if len(a) > 1 and a[1] is not None:
                result = FLOAT_OPS["Max"]([result, a[1]], {}, first)
            if len(a) > 2 and a[2] is not None:
                result = FLOAT_OPS["Min"]([result, a[2]], {}, first)
            return result

        return clip
    if op == "Mod":
        return _mod(first, bool(attrs.get("fmod", 0)))
    if op == "BitShift":
        if first not in (DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64):
            raise CannotLower("BitShift is defined for unsigned integers (signed ones run on the reference)")
        bits = first.numpy.itemsize * 8
        shift = "<<" if attrs.get("direction") == "LEFT" else ">>"
        # NumPy gives 0 for shifts past the width; in C they are undefined
        return lambda a: Select(
            Binary(">=", a[1], Const(bits, first)), Const(0, first), Cast(first, Binary(shift, a[0], a[1]))
        )
    table = FLOAT_OPS if first in NATIVE_FLOATS else ANY_NUMERIC
    scalarize = table.get(op)
    if scalarize is None:
        raise CannotLower(f"{op} on {first.short} has no native lowering")
    return lambda a: scalarize(a, attrs, first)


def _mod(dtype: DType, c_style: bool) -> Callable[[list[Expr]], Expr]:
    """ONNX Mod: fmod=1 keeps the dividend's sign (C's fmod / %); fmod=0 the divisor's (Python's %).
    Integer division by zero gives 0, as NumPy does, instead of trapping."""
    floating = dtype in NATIVE_FLOATS

    def mod(a: list[Expr]) -> Expr:
        x, y = a
        remainder: Expr = Binary("fmod", x, y) if floating else Binary("%", x, y)
        if not c_style:
            wrong_sign = Binary(
                "&&",
                Binary("!=", remainder, Const(0, dtype)),
                Binary("!=", Binary("<", remainder, Const(0, dtype)), Binary("<", y, Const(0, dtype))),
            )
            remainder = Select(wrong_sign, Binary("+", remainder, y), remainder)
        return remainder if floating else Select(Binary("==", y, Const(0, dtype)), Const(0, dtype), remainder)

    return mod


def lower_pointwise(lw: Lowerer, node: Node) -> list[Kernel]:
    out = node.outputs[0]
    shape = lw.shape(out)
    if node.op == "Expand":
        inputs: list[Value | None] = [node.inputs[0]]
    elif node.op == "CastLike":
        inputs = [node.inputs[0]]
    else:
        inputs = list(node.inputs)
    # half precision: computed in float32 (loads widened, the result rounded once on store)
    widen = {HALF: DType.FLOAT32, BF16: DType.FLOAT32}
    dtypes = [v.type.dtype for v in inputs if v is not None]  # type: ignore[union-attr]
    scalarize = scalarize_for(node, [widen.get(d, d) for d in dtypes], lw.target.float_to_int)
    out_dtype = out.type.dtype  # type: ignore[union-attr]
    flat = all(v is None or lw.shape(v) == shape or math.prod(lw.shape(v)) == 1 for v in inputs)
    if flat:
        lw.reuse_input(out, [v for v in inputs if v is not None and lw.shape(v) == shape])
    dst = lw.buffer(out)
    # a float scalar constant is an immediate (as in fused chains): no load per element
    immediates = {v: immediate for v in inputs if v is not None and (immediate := scalar_immediate(lw, v)) is not None}

    def body(indices: list[Index]) -> list[Stmt]:
        loaded: list[Expr] = []
        for value in inputs:
            if value is None:
                loaded.append(None)  # type: ignore[arg-type]
                continue
            if value in immediates:
                loaded.append(immediates[value])
                continue
            buffer = lw.buffer(value)
            if buffer.size == 1:
                load: Expr = Load(buffer, i64(0))
            elif flat:
                load = Load(buffer, indices[0])
            else:
                load = Load(buffer, broadcast_index(lw.shape(value), shape, indices))
            if buffer.dtype is HALF:
                load = Cast(DType.FLOAT32, load)
            elif buffer.dtype is BF16:
                load = Unary("bf16_to_f32", load)
            loaded.append(load)
        target = indices[0] if flat else affine(list(zip(indices, strides(shape))))  # type: ignore[arg-type]
        value = scalarize(loaded)
        if out_dtype in (HALF, BF16) and not (isinstance(value, Cast) and value.dtype is out_dtype):
            value = Cast(out_dtype, value)  # round to half precision once (never twice: bf16 is raw bits)
        return [Store(dst, target, value)]

    loop_shape = (dst.size,) if flat else shape
    stmts, indices = nest(lw, loop_shape, body)
    read = [v for v in inputs if v not in immediates]
    return [lw.kernel(node, "pointwise", stmts, read, [out], default_schedule(lw.target, loop_shape, indices))]


def scalar_immediate(lw: Lowerer, value: Value) -> Const | None:
    """A float scalar constant as an immediate (a scale, a Clip bound, a mean's divisor)."""
    known = lw.constant(value)
    if known is None or known.size != 1 or known.dtype not in (np.float32, np.float64):
        return None
    return Const(float(known.reshape(-1)[0]), DType.from_numpy(known.dtype))


Lowering = Callable[[Lowerer, Node], list[Kernel]]
LOWERINGS: dict[str, Lowering] = {}  # the pointwise family (the others: kiln.lower.families)
for _op in (
    *FLOAT_OPS,
    *COMPARE,
    *LOGIC,
    "Not",
    "Where",
    "IsNaN",
    "IsInf",
    "Cast",
    "CastLike",
    "Clip",
    "Expand",
    "Mod",
    "BitShift",
):
    LOWERINGS[_op] = lower_pointwise
