"""A NumPy interpreter of the kernel IR: lowering tested without a C compiler.

``run_kernel(kernel, buffers)`` executes a kernel's loop nest element by element over flat NumPy
arrays with C's semantics (integer division and remainder truncate toward zero, comparisons give
0/1, casts to integers truncate), every load and store bounds-checked: an index outside its buffer
is a ``KernelIndexError`` naming the buffer, the index and the kernel. Engine calls (matrix
products, Winograd transforms, attention) run as their specification says, in NumPy, with every
operand's extent checked against its buffer (``kir_engines``), and their epilogues through this
interpreter. It is slow (Python per element) and meant for test-sized shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.ir.types import DType
from kiln.lower import kir_engines as engines
from kiln.lower.kir import (
    ENGINE_CALLS,
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
    Scalar,
    Select,
    Stmt,
    Store,
    Unary,
    operands,
    postorder,
)

DEEP = 200  # expressions nested deeper are evaluated iteratively (a closure per level would recurse)


class NotInterpretable(Exception):
    """The kernel calls a C driver the interpreter does not model."""


class KernelIndexError(IndexError):
    """A load or store outside its buffer."""


def _erf(x: Any) -> Any:
    return type(x)(math.erf(float(x))) if isinstance(x, np.floating) else math.erf(x)


# Unary functions by their kernel-IR name (kir.UNARY_OPS)
FUNCTIONS: dict[str, Callable[[Any], Any]] = {
    "-": lambda x: -x,
    "!": lambda x: int(not x),
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "erf": _erf,
    "floor": np.floor,
    "ceil": np.ceil,
    "round_even": np.rint,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "bf16_to_f32": np.float32,
}


def _c_divide(a: Any, b: Any) -> Any:
    """The kernel IR's integer quotient: toward zero; by zero 0 (as NumPy gives)."""
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        if b == 0:
            return 0
        quotient = abs(int(a)) // abs(int(b))
        return quotient if (a < 0) == (b < 0) else -quotient
    return a / b


def _c_remainder(a: Any, b: Any) -> Any:
    """The kernel IR's integer remainder: the dividend's sign; by zero 0."""
    if b == 0:
        return 0
    return int(a) - _c_divide(int(a), int(b)) * int(b)


BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _c_divide,
    "%": _c_remainder,
    "<": lambda a, b: int(a < b),
    "<=": lambda a, b: int(a <= b),
    ">": lambda a, b: int(a > b),
    ">=": lambda a, b: int(a >= b),
    "==": lambda a, b: int(a == b),
    "!=": lambda a, b: int(a != b),
    "&&": lambda a, b: int(bool(a) and bool(b)),
    "||": lambda a, b: int(bool(a) or bool(b)),
    "&": lambda a, b: a & b,
    "|": lambda a, b: a | b,
    "^": lambda a, b: a ^ b,
    "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b,
    "pow": lambda a, b: np.power(a, b),
    "fmod": lambda a, b: np.fmod(a, b),
    "max": lambda a, b: np.maximum(a, b),  # a NaN in either operand is the result
    "min": lambda a, b: np.minimum(a, b),
}


def _cast(dtype: DType, value: Any) -> Any:
    """C's conversion: floats round to the type, integers truncate and wrap modulo 2^bits."""
    if dtype is DType.BOOL:
        return np.uint8(bool(value))
    if dtype.is_float:
        return dtype.numpy.type(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"cast of {value} to {dtype.short} is undefined in C")
        value = math.trunc(float(value))
    bits = 8 * dtype.numpy.itemsize
    wrapped = int(value) & ((1 << bits) - 1)
    if dtype.numpy.kind == "i" and wrapped >= 1 << (bits - 1):
        wrapped -= 1 << bits
    return dtype.numpy.type(wrapped)


Evaluator = Callable[[dict[str, Any], dict[int, Any]], Any]


class _Machine:
    def __init__(self, kernel: Kernel, buffers: dict[Buffer, np.ndarray]) -> None:
        self.kernel = kernel
        self.buffers = buffers
        self.compiled: dict[int, tuple[Expr, Evaluator]] = {}  # by the root's identity (the root kept)

    def value(self, root: Expr, env: dict[str, Any]) -> Any:
        """``root``'s value: the expression made once into nested closures (a Python call per
        node, not a dispatch; a node several users share is evaluated once per value asked), the
        same C semantics as ``eval``, which deep expressions still use."""
        entry = self.compiled.get(id(root))
        if entry is None:
            entry = self.compiled[id(root)] = (root, _closures(self, root))
        return entry[1](env, {})

    def run(self, body: Sequence[Stmt], env: dict[str, Any]) -> None:
        for stmt in body:
            if isinstance(stmt, For):
                start = stmt.start if isinstance(stmt.start, int) else int(self.value(stmt.start, env))
                stop = stmt.extent if isinstance(stmt.extent, int) else int(self.value(stmt.extent, env))
                for value in range(start, stop):
                    env[stmt.index.name] = value
                    self.run(stmt.body, env)
            elif isinstance(stmt, If):
                if self.value(stmt.cond, env):
                    self.run(stmt.body, env)
            elif isinstance(stmt, (Let, Assign)):
                env[stmt.scalar.name] = _cast(stmt.scalar.dtype, self.value(stmt.value, env))
            elif isinstance(stmt, Store):
                array = self.array(stmt.buffer)
                index = self.position(stmt.buffer, self.value(stmt.index, env))
                value = self.value(stmt.value, env)
                array[index] = _cast(stmt.buffer.dtype, value)
            elif isinstance(stmt, ENGINE_CALLS):
                engines.run(self, stmt)
            else:
                raise TypeError(f"not a kernel-IR statement: {stmt!r}")

    def fail(self, message: str) -> None:
        raise KernelIndexError(f"kernel {self.kernel.name}: {message}")

    def array(self, buffer: Buffer) -> np.ndarray:
        array = self.buffers.get(buffer)
        if array is None:
            raise KernelIndexError(f"kernel {self.kernel.name}: buffer {buffer.name} was not given")
        return array

    def position(self, buffer: Buffer, index: Any) -> int:
        index = int(index)
        if not 0 <= index < buffer.size:
            raise KernelIndexError(f"kernel {self.kernel.name}: index {index} outside {buffer.name}[0, {buffer.size})")
        return index

    def eval(self, root: Expr, env: dict[str, Any]) -> Any:
        """``root``'s value, evaluated as C does: a select evaluates only the branch it takes, the
        right side of && and || only when it decides (a load on the path not taken may be out of
        range: it must not run). Iterative: fused chains nest thousands deep."""
        values: dict[int, Any] = {}
        stack: list[Expr] = [root]
        while stack:
            node = stack[-1]
            if id(node) in values:
                stack.pop()
                continue
            if isinstance(node, Select):
                if id(node.cond) not in values:
                    stack.append(node.cond)
                    continue
                branch = node.a if values[id(node.cond)] else node.b
                if id(branch) not in values:
                    stack.append(branch)
                    continue
                values[id(node)] = values[id(branch)]
            elif isinstance(node, Binary) and node.op in ("&&", "||"):
                if id(node.a) not in values:
                    stack.append(node.a)
                    continue
                first = bool(values[id(node.a)])
                if first == (node.op == "||"):  # decided by the left side
                    values[id(node)] = int(first)
                else:
                    if id(node.b) not in values:
                        stack.append(node.b)
                        continue
                    values[id(node)] = int(bool(values[id(node.b)]))
            else:
                missing = [child for child in operands(node) if id(child) not in values]
                if missing:
                    stack.extend(missing)
                    continue
                values[id(node)] = self.node(node, values, env)
            stack.pop()
        return values[id(root)]

    def node(self, e: Expr, values: dict[int, Any], env: dict[str, Any]) -> Any:
        if isinstance(e, Const):
            return e.dtype.numpy.type(e.value) if e.dtype.is_float else int(e.value)
        if isinstance(e, (Index, Scalar)):
            return env[e.name]
        if isinstance(e, Load):
            index = values[id(e.index)]
            value = self.array(e.buffer)[self.position(e.buffer, index)]
            return value.item() if e.buffer.dtype.numpy.kind in "iub" else value
        if isinstance(e, Binary):
            return BINARY[e.op](values[id(e.a)], values[id(e.b)])
        if isinstance(e, Unary):
            function = FUNCTIONS.get(e.op)
            if function is None:
                raise NotInterpretable(f"kernel {self.kernel.name}: no interpreter for function {e.op}")
            return function(values[id(e.a)])
        if isinstance(e, Select):
            return values[id(e.a)] if values[id(e.cond)] else values[id(e.b)]
        if isinstance(e, Cast):
            return _cast(e.dtype, values[id(e.a)])
        raise TypeError(f"not a kernel-IR expression: {e!r}")


def _closures(machine: _Machine, root: Expr) -> Evaluator:
    """One closure per distinct node of ``root``, operands first; a shared node remembers its value
    for the evaluation in progress (``memo``). Selects and && / || run only the operand they take."""
    order = postorder(root)
    depth: dict[int, int] = {}
    users: dict[int, int] = {}
    for node in order:
        kids = operands(node)
        depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
        for kid in kids:
            users[id(kid)] = users.get(id(kid), 0) + 1
    if depth[id(root)] > DEEP:
        return lambda env, memo: machine.eval(root, env)
    made: dict[int, Evaluator] = {}
    for node in order:
        function = _closure(machine, node, [made[id(k)] for k in operands(node)])
        made[id(node)] = _remembered(id(node), function) if users.get(id(node), 0) > 1 else function
    return made[id(root)]


def _remembered(key: int, function: Evaluator) -> Evaluator:
    def shared(env: dict[str, Any], memo: dict[int, Any]) -> Any:
        if key in memo:
            return memo[key]
        value = memo[key] = function(env, memo)
        return value

    return shared


def _closure(machine: _Machine, e: Expr, kids: list[Evaluator]) -> Evaluator:
    if isinstance(e, Const):
        constant = e.dtype.numpy.type(e.value) if e.dtype.is_float else int(e.value)
        return lambda env, memo: constant
    if isinstance(e, (Index, Scalar)):
        name = e.name
        return lambda env, memo: env[name]
    if isinstance(e, Load):
        (index,) = kids
        buffer, integral = e.buffer, e.buffer.dtype.numpy.kind in "iub"

        def load(env: dict[str, Any], memo: dict[int, Any]) -> Any:
            value = machine.array(buffer)[machine.position(buffer, index(env, memo))]
            return value.item() if integral else value

        return load
    if isinstance(e, Binary):
        a, b = kids
        if e.op == "&&":
            return lambda env, memo: int(bool(a(env, memo)) and bool(b(env, memo)))
        if e.op == "||":
            return lambda env, memo: int(bool(a(env, memo)) or bool(b(env, memo)))
        function = BINARY[e.op]
        return lambda env, memo: function(a(env, memo), b(env, memo))
    if isinstance(e, Unary):
        (a,) = kids
        unary = FUNCTIONS.get(e.op)
        if unary is None:
            message = f"kernel {machine.kernel.name}: no interpreter for function {e.op}"

            def missing(env: dict[str, Any], memo: dict[int, Any]) -> Any:
                raise NotInterpretable(message)

            return missing
        return lambda env, memo: unary(a(env, memo))
    if isinstance(e, Select):
        cond, a, b = kids
        return lambda env, memo: a(env, memo) if cond(env, memo) else b(env, memo)
    if isinstance(e, Cast):
        (a,) = kids
        dtype = e.dtype
        return lambda env, memo: _cast(dtype, a(env, memo))
    raise TypeError(f"not a kernel-IR expression: {e!r}")


def run_kernel(kernel: Kernel, buffers: dict[Buffer, np.ndarray]) -> None:
    """Execute ``kernel`` over ``buffers`` (flat arrays, one per buffer it touches), in place."""
    with np.errstate(all="ignore"):  # C does not trap either (inf, NaN flow through)
        _Machine(kernel, buffers).run(kernel.body, {})
