"""The fpga target's fixed-point reference: a design's kernels run in Python integers.

Every float is a mantissa in its format (``kiln.backends.fpga.formats``), every operation follows
``kiln.backends.fpga.fixed``'s rules, so the C simulation of the generated HLS C++ must agree with
it bit for bit (the tests compare them kernel kind by kernel kind). Element by element: meant for
test-sized shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.backends.fpga.fixed import Format, align, divide, quantize, round_to, store, to_float, wrap
from kiln.backends.fpga.formats import Design, KernelDesign, float_operands, is_float
from kiln.lower.kir import (
    COMPARISONS,
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Index,
    Let,
    Load,
    Scalar,
    Select,
    Stmt,
    Store,
    Unary,
    dtypes_of,
    postorder,
)
from kiln.lower.kir_interpreter import BINARY

Value = tuple[int, int]  # (mantissa, fraction bits) of a float; (integer, 0) of an integer


def quantized(values: np.ndarray, fmt: Format) -> np.ndarray:
    """Float values stored into ``fmt`` (as the C simulation's input conversion does)."""
    flat = np.asarray(values, np.float64).reshape(-1)
    return np.array([quantize(float(v), fmt) for v in flat], dtype=object)


def floats(mantissas: np.ndarray, fmt: Format) -> np.ndarray:
    return np.array([to_float(int(m), fmt) for m in mantissas], np.float64).astype(np.float32)


def run_design(design: Design, memory: dict[Buffer, np.ndarray]) -> None:
    """Run every kernel of ``design`` over ``memory`` (float buffers hold mantissas)."""
    for kernel in design.kernels:
        run_kernel(kernel, design.formats, memory)


def run_kernel(kd: KernelDesign, formats: dict[Buffer, Format], memory: dict[Buffer, np.ndarray]) -> None:
    state = _State(kd, formats, memory)
    for buffer in kd.local:
        base = memory.get(buffer)
        state.local[buffer] = (
            np.array([_exact(int(m), formats[buffer], kd.local[buffer]) for m in base], dtype=object)
            if buffer in kd.copy_in and base is not None
            else np.zeros(buffer.size, dtype=object)
        )
    state.block(kd.kernel.body)
    for buffer, values in state.local.items():  # rounded into the tensor once, as the kernel ends
        fmt = kd.local[buffer]
        memory[buffer] = np.array([store(int(m), fmt.fraction, formats[buffer]) for m in values], dtype=object)


def _exact(m: int, source: Format, target: Format) -> int:
    return wrap(align(m, source.fraction, target.fraction), target)


class _State:
    def __init__(self, kd: KernelDesign, formats: dict[Buffer, Format], memory: dict[Buffer, np.ndarray]) -> None:
        self.kd = kd
        self.formats = formats
        self.memory = memory
        self.local: dict[Buffer, np.ndarray] = {}
        self.scalars: dict[str, int] = {}
        self.indices: dict[str, int] = {}

    def block(self, body: Sequence[Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (Let, Assign)):
                value = self.evaluate(stmt.value)
                fmt = self.kd.scalars.get(stmt.scalar.name)
                self.scalars[stmt.scalar.name] = value[0] if fmt is None else wrap(align(*value, fmt.fraction), fmt)
            elif isinstance(stmt, Store):
                self.store(stmt)
            elif isinstance(stmt, If):
                if self.evaluate(stmt.cond)[0]:
                    self.block(stmt.body)
            elif isinstance(stmt, For):
                for i in range(int(stmt.start), int(stmt.extent)):  # type: ignore[arg-type]
                    self.indices[stmt.index.name] = i
                    self.block(stmt.body)

    def store(self, stmt: Store) -> None:
        index = self.evaluate(stmt.index)[0]
        m, fraction = self.evaluate(stmt.value)
        buffer = stmt.buffer
        if not 0 <= index < buffer.size:
            raise IndexError(f"kernel {self.kd.kernel.name} stores {buffer.name}[{index}] of {buffer.size}")
        if buffer in self.local:
            fmt = self.kd.local[buffer]
            self.local[buffer][index] = wrap(align(m, fraction, fmt.fraction), fmt)
        elif is_float(buffer):
            self.memory[buffer][index] = store(m, fraction, self.formats[buffer])
        else:
            self.memory[buffer][index] = _integer(m, buffer.dtype.numpy)

    def evaluate(self, e: Expr) -> Value:
        types = dtypes_of(e)
        values: dict[int, Value] = {}
        for node in postorder(e):
            values[id(node)] = self.node(node, types, values)
        return values[id(e)]

    def node(self, node: Expr, types: dict[int, Any], values: dict[int, Value]) -> Value:
        dtype = types[id(node)]
        fmt = self.kd.nodes.get(id(node))
        if isinstance(node, Const):
            return (quantize(float(node.value), fmt), fmt.fraction) if fmt else (int(node.value), 0)
        if isinstance(node, Index):
            return self.indices[node.name], 0
        if isinstance(node, Scalar):
            scalar = self.kd.scalars.get(node.name)
            return self.scalars[node.name], scalar.fraction if scalar else 0
        if isinstance(node, Load):
            index = values[id(node.index)][0]
            if not 0 <= index < node.buffer.size:
                raise IndexError(
                    f"kernel {self.kd.kernel.name} loads {node.buffer.name}[{index}] of {node.buffer.size}"
                )
            if node.buffer in self.local:
                return int(self.local[node.buffer][index]), self.kd.local[node.buffer].fraction
            source = self.formats.get(node.buffer)
            return int(self.memory[node.buffer][index]), source.fraction if source and is_float(node.buffer) else 0
        args = [values[id(o)] for o in float_operands(node)]
        if fmt is None:  # an integer (or boolean) result
            if isinstance(node, Select):
                return (args[0] if values[id(node.cond)][0] else args[1])[0], 0
            return self.integer(node, args, dtype), 0
        return self.fixed(node, args, fmt, values)

    def fixed(self, node: Expr, args: list[Value], fmt: Format, values: dict[int, Value]) -> Value:
        def exact(m: int, fraction: int) -> Value:
            return wrap(align(m, fraction, fmt.fraction), fmt), fmt.fraction

        if id(node) in self.kd.tables:  # a ROM function of the first operand (a unary, a constant power)
            table = self.kd.tables[id(node)]
            return table.lookup(args[0][0]), table.out.fraction
        if isinstance(node, Select):
            cond = values[id(node.cond)][0]
            return exact(*(args[0] if cond else args[1]))
        if isinstance(node, Cast):
            return exact(*args[0])
        if isinstance(node, Binary):
            (a, fa), (b, fb) = args
            if node.op == "*":
                return exact(a * b, fa + fb)
            if node.op == "/":
                return divide(a, fa, b, fb, fmt), fmt.fraction
            f = max(fa, fb)
            a, b = align(a, fa, f), align(b, fb, f)
            result = {"+": a + b, "-": a - b, "max": max(a, b), "min": min(a, b)}[node.op]
            return exact(result, f)
        assert isinstance(node, Unary)
        (a, fa) = args[0]
        if node.op == "-":
            return exact(-a, fa)
        if node.op == "abs":
            return exact(abs(a), fa)
        if node.op in ("floor", "ceil", "round_even"):
            return exact(_to_integer(node.op, a, fa), 0)
        if node.op == "sqrt":
            return exact(square_root(a, fa, fmt.fraction), fmt.fraction)
        raise AssertionError(f"no fixed-point form of {node.op!r} (the design admitted it)")

    def integer(self, node: Expr, args: list[Value], dtype: Any) -> int:
        if isinstance(node, Binary):
            (a, fa), (b, fb) = args
            if node.op in COMPARISONS and (fa or fb or _is_fixed(self.kd, node)):
                f = max(fa, fb)
                a, b = align(a, fa, f), align(b, fb, f)
            return _integer(BINARY[node.op](a, b), dtype.numpy)
        if isinstance(node, Unary):
            return (
                int(not args[0][0])
                if node.op == "!"
                else _integer(-args[0][0] if node.op == "-" else abs(args[0][0]), dtype.numpy)
            )
        return _integer(args[0][0], dtype.numpy)  # an integer Cast


def _is_fixed(kd: KernelDesign, node: Binary) -> bool:
    return id(node.a) in kd.nodes or id(node.b) in kd.nodes


def square_root(m: int, source: int, fraction: int) -> int:
    """floor(sqrt(value)) on a grid of ``fraction`` bits (a negative value gives 0)."""
    if m <= 0:
        return 0
    shift = 2 * fraction - source
    return math.isqrt(m << shift if shift >= 0 else m >> -shift)


def _to_integer(op: str, m: int, fraction: int) -> int:
    if fraction <= 0:
        return m << -fraction
    if op == "floor":
        return m >> fraction
    if op == "ceil":
        return -((-m) >> fraction)
    half = round_to(m, fraction, 0)  # nearest, ties up; then ties to even
    if (m & ((1 << fraction) - 1)) == 1 << (fraction - 1) and half % 2:
        half -= 1
    return half


def _integer(value: int, numpy_type: Any) -> int:
    """C's conversion into an integer type (wraps), a bool to 0/1."""
    if numpy_type == np.bool_:
        return int(bool(value))
    info = np.iinfo(numpy_type)
    return value if info.min <= value <= info.max else wrap(value, Format(info.bits, info.bits, info.min < 0))
