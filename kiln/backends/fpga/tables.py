"""Function ROMs: how the fpga target computes exp, tanh, sqrt, erf... in fixed point.

A ``Table`` covers a domain ``[lo, lo + size * step]`` with ``step`` a power of two, so the bin
of an input is its mantissa's distance from ``lo`` shifted right: no divider. Its ``size + 1``
entries are the function at the bins' edges, rounded into the table's format; an input between
two edges reads both and interpolates linearly (one multiplier: the error falls from the slope
times a bin to the curvature times a bin squared), its fraction of the bin kept to
``FRACTION_BITS`` bits. The domain is the
input's proved range cut to the function's window (``WINDOWS``): outside it the input is clamped
to the nearest entry (exp of a softmax's shifted scores, at most 0, needs no more than
[-16, 8); tanh is +-1 beyond +-8 to the table's precision).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kiln.backends.fpga.fixed import TABLE_SIZE, Format, Interval, quantize, sized
from kiln.lower.kir import Binary, Const, Expr, Unary

TABLE_WIDTH = 18  # bits of an entry (a BRAM_18K's native width; hls4ml's table_t is 18 bits too)
FRACTION_BITS = 24  # of an input's position within its bin, for the interpolation's product


FUNCTIONS: dict[str, Callable[[float], float]] = {
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "tanh": math.tanh,
    "erf": math.erf,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "asinh": math.asinh,
    "acosh": math.acosh,
    "atanh": math.atanh,
}

# where each function's table may lie (its input is clamped there)
WINDOWS: dict[str, tuple[float, float]] = {
    "exp": (-16.0, 8.0),
    "log": (2.0**-12, 2.0**16),
    "sqrt": (0.0, 2.0**16),
    "tanh": (-8.0, 8.0),
    "erf": (-4.0, 4.0),
    "sin": (-64.0, 64.0),
    "cos": (-64.0, 64.0),
    "tan": (-1.5, 1.5),
    "asin": (-1.0, 1.0),
    "acos": (-1.0, 1.0),
    "atan": (-64.0, 64.0),
    "sinh": (-16.0, 16.0),
    "cosh": (-16.0, 16.0),
    "asinh": (-64.0, 64.0),
    "acosh": (1.0, 64.0),
    "atanh": (-0.999, 0.999),
}


POWER = "pow:"  # a power with a constant exponent c, named "pow:<c>" (``rewrite``)
POWER_WINDOW = (-(2.0**16), 2.0**16)


def is_function(op: str) -> bool:
    """Whether ``op`` is computed from a ROM."""
    return op in FUNCTIONS or op.startswith(POWER)


def function_name(node: Expr) -> str | None:
    """The ROM function a kernel-IR node computes (a unary function but the square root, whose
    core is exact; a power with a constant exponent), or None."""
    if isinstance(node, Unary) and is_function(node.op) and node.op != "sqrt":
        return node.op
    if isinstance(node, Binary) and node.op == "pow" and isinstance(node.b, Const):
        return f"{POWER}{float(node.b.value)!r}"
    return None


def function_of(op: str) -> tuple[Callable[[float], float], tuple[float, float]]:
    """The function ``op`` names and the window its table may cover."""
    if op.startswith(POWER):
        exponent = float(op[len(POWER) :])
        low = POWER_WINDOW[0] if exponent.is_integer() else 0.0  # a fractional power of a negative: none
        return (lambda x: x**exponent), (low, POWER_WINDOW[1])
    return FUNCTIONS[op], WINDOWS[op]


@dataclass(frozen=True)
class Table:
    """``function`` over inputs of ``source``: entry i (0..size) is f(lo + i * step) in ``out``;
    an input of mantissa m (clamped to the domain) interpolates entries i and i + 1 of its bin
    (``lookup``; ``shift`` >= 0: mantissa units per bin, as a power of two)."""

    function: str
    source: Format
    start: int  # lo as a mantissa of ``source``
    shift: int
    size: int
    out: Format
    values: tuple[int, ...]

    def lookup(self, m: int) -> int:
        """The output mantissa for input mantissa ``m`` (what ``kiln_interp`` computes in C)."""
        position = min(max(m - self.start, 0), self.size << self.shift)
        i = min(position >> self.shift, self.size - 1)
        within = position - (i << self.shift)
        drop = max(self.shift - FRACTION_BITS, 0)
        within, shift = within >> drop, self.shift - drop
        product = (self.values[i + 1] - self.values[i]) * within
        return self.values[i] + ((product + (1 << (shift - 1))) >> shift if shift > 0 else product)

    @property
    def bits(self) -> int:
        return (self.size + 1) * self.out.width


def build(function: str, source: Format, reach: Interval) -> Table:
    """The table of ``function`` for inputs of ``source`` whose proved range is ``reach``."""
    f, (lo_window, hi_window) = function_of(function)
    lo = max(reach.lo, lo_window, source.interval.lo)
    hi = min(reach.hi, hi_window, source.interval.hi)
    if hi <= lo:  # a range outside the window (or one value): one bin at the nearest edge
        lo = min(max(reach.lo, lo_window), hi_window)
        hi = lo + source.step
    # the domain's width a power of two at least hi - lo, the start on the input's grid
    fraction = source.fraction
    start = math.floor(lo * 2.0**fraction)
    span_bits = max(math.ceil(math.log2(max(hi - start * 2.0**-fraction, source.step))), -fraction)
    size_bits = max(0, min(int(math.log2(TABLE_SIZE)), span_bits + fraction))  # no finer than the input
    shift = span_bits + fraction - size_bits  # mantissa units per bin, as a power of two (>= 0)
    size = 1 << size_bits
    step = 2.0 ** (shift - fraction)
    samples = [_sample(f, start * 2.0**-fraction + i * step, lo_window, hi_window) for i in range(size + 1)]
    finite = [s for s in samples if math.isfinite(s)] or [0.0]
    out = sized(Interval(min(finite), max(finite)), TABLE_WIDTH)
    return Table(function, source, start, shift, size, out, tuple(quantize(s, out) for s in samples))


def _sample(f: Callable[[float], float], x: float, lo: float, hi: float) -> float:
    x = min(max(x, lo), hi)
    try:
        return f(x)
    except (ValueError, OverflowError, ZeroDivisionError):
        return math.nan
