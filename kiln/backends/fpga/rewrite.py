"""Kernel-IR rewrites the fixed-point design needs before it types a kernel: a power with a
constant exponent becomes what fixed point computes exactly or has a core for.

- ``x ** n`` for a whole n in [0, ``MAX_POWER``]: a chain of products (square and multiply);
- ``x ** 0.5``: a square root; ``x ** -1``: a quotient; ``x ** -0.5``: one over a square root.

Any other constant exponent c stays a power: a function of x, a ROM over x's proved range
(``tables.function_name``). The design, the renderer and the fixed-point reference all read the rewritten kernel, so they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from kiln.lower.kir import (
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Let,
    Load,
    Stmt,
    Store,
    Unary,
    map_expr,
)

MAX_POWER = 8


def canonical(kernel: Kernel, constants: Mapping[Buffer, np.ndarray]) -> Kernel:
    """``kernel`` with its constant powers rewritten (the same kernel when it has none); an
    exponent read from a one-element constant (an initializer) counts as a constant."""

    def power(node: Expr) -> Expr:
        if isinstance(node, Binary) and node.op == "pow":
            exponent = node.b
            while isinstance(exponent, Cast):  # a constant converted to the base's type
                exponent = exponent.a
            if isinstance(exponent, Load):
                values = constants.get(exponent.buffer)
                if values is not None and values.size == 1 and values.dtype.kind == "f":
                    exponent = Const(float(values.reshape(-1)[0]), exponent.buffer.dtype)
            if isinstance(exponent, Const):
                node = Binary("pow", node.a, Const(float(exponent.value), exponent.dtype))
        return _power(node)

    body = _block(kernel.body, power)
    return kernel if body is None else replace(kernel, body=body)


def _block(body: Sequence[Stmt], power: Callable[[Expr], Expr]) -> list[Stmt] | None:
    changed, out = False, []
    for stmt in body:
        new = _stmt(stmt, power)
        changed |= new is not stmt
        out.append(new)
    return out if changed else None


def _stmt(stmt: Stmt, power: Callable[[Expr], Expr]) -> Stmt:
    if isinstance(stmt, (For, If)):
        inner = _block(stmt.body, power)
        cond = map_expr(stmt.cond, power) if isinstance(stmt, If) else None
        if inner is None and (cond is None or cond is stmt.cond):
            return stmt
        if isinstance(stmt, If):
            return replace(stmt, cond=cond, body=inner if inner is not None else stmt.body)
        return replace(stmt, body=inner)
    if isinstance(stmt, (Let, Assign)):
        value = map_expr(stmt.value, power)
        return stmt if value is stmt.value else replace(stmt, value=value)
    if isinstance(stmt, Store):
        value = map_expr(stmt.value, power)
        return stmt if value is stmt.value else replace(stmt, value=value)
    return stmt


def _power(node: Expr) -> Expr:
    if not (isinstance(node, Binary) and node.op == "pow" and isinstance(node.b, Const)):
        return node
    exponent = float(node.b.value)
    base = node.a
    if exponent == 0.5:
        return Unary("sqrt", base)
    if exponent == -1.0:
        return Binary("/", Const(1.0, node.b.dtype), base)
    if exponent == -0.5:
        return Binary("/", Const(1.0, node.b.dtype), Unary("sqrt", base))
    if exponent.is_integer() and 0 <= exponent <= MAX_POWER:
        return _product(base, int(exponent), node.b.dtype)
    return node  # any other constant exponent: a function of the base, a ROM (tables.function_name)


def _product(base: Expr, n: int, dtype) -> Expr:  # type: ignore[no-untyped-def]
    """``base ** n`` by squaring and multiplying (``n`` >= 0)."""
    if n == 0:
        return Const(1.0, dtype)
    result: Expr | None = None
    square = base
    while n:
        if n & 1:
            result = square if result is None else Binary("*", result, square)
        n >>= 1
        if n:
            square = Binary("*", square, square)
    assert result is not None
    return result
