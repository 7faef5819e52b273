"""Fixed-point formats and their arithmetic, exactly as the generated HLS C++ computes them.

A ``Format`` is Vivado/Vitis ``ap_fixed<W, I>`` (``ap_ufixed`` when unsigned): a value is an
integer mantissa ``m`` times ``2**-F`` with ``F = W - I`` fraction bits (``I`` may be negative or
above ``W``). kiln's fixed-point semantics, shared by the renderer (``kiln.backends.fpga.hls``)
and the NumPy reference (``kiln.backends.fpga.reference``), are:

- ``+ - * max min select`` are exact (ap_fixed's full-precision result types); a node's format is
  then the exact one, its integer bits proved from the operands' ranges (``Interval``), so it can
  never overflow. Where the exact fraction would pass ``MAX_WIDTH`` bits, the node truncates its
  fraction (``AP_TRN``: toward minus infinity) to fit;
- a store into a tensor's buffer rounds to nearest, ties toward plus infinity (``AP_RND``), and
  saturates (``AP_SAT``): the buffer's format comes from calibration, so a value outside it is
  clipped, never wrapped;
- division truncates the quotient toward zero (integers' division of the aligned mantissas; by
  zero: the format's extreme of the dividend's sign);
- every other function (exp, tanh, sqrt, erf...) is a ROM of ``TABLE_SIZE`` entries over a domain
  of ``2**e`` (``Table``): the input is clamped to the domain and indexed by its leading bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_WIDTH = 48  # bits of any intermediate (wider exact results truncate their fraction)
TABLE_SIZE = 1024  # entries of a function's ROM (hls4ml's default table size)


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float

    def __add__(self, other: Interval) -> Interval:
        return Interval(self.lo + other.lo, self.hi + other.hi)

    def __sub__(self, other: Interval) -> Interval:
        return Interval(self.lo - other.hi, self.hi - other.lo)

    def __mul__(self, other: Interval) -> Interval:
        corners = [a * b for a in (self.lo, self.hi) for b in (other.lo, other.hi)]
        corners = [0.0 if math.isnan(c) else c for c in corners]
        return Interval(min(corners), max(corners))

    def __or__(self, other: Interval) -> Interval:
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def __neg__(self) -> Interval:
        return Interval(-self.hi, -self.lo)

    def within(self, other: Interval) -> bool:
        return other.lo <= self.lo and self.hi <= other.hi

    @property
    def magnitude(self) -> float:
        return max(abs(self.lo), abs(self.hi))


def integer_bits(interval: Interval, signed: bool) -> int:
    """The fewest integer bits (the sign included) holding every value of ``interval``."""
    top = max(interval.hi, -interval.lo if signed else 0.0, 0.0)
    if top == 0 and interval.lo >= 0:
        return 1 if signed else 0
    bits = math.floor(math.log2(top)) + 1 if top > 0 else 0  # 2**(bits-1) <= top < 2**bits
    if signed:
        # a negative bound of exactly -2**k fits in k+1 bits; a positive top needs bits + 1
        needed = bits + 1
        if interval.lo < 0 and -interval.lo > 2 ** (needed - 1):
            needed += 1
        return max(needed, 1)
    return max(bits, 0)


@dataclass(frozen=True)
class Format:
    """``ap_fixed<width, integer>`` (``ap_ufixed`` when not ``signed``)."""

    width: int
    integer: int
    signed: bool = True

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"a fixed-point format needs a width of at least 1 bit, got {self.width}")

    @property
    def fraction(self) -> int:
        return self.width - self.integer

    @property
    def lowest(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def highest(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1

    @property
    def interval(self) -> Interval:
        return Interval(self.lowest * 2.0**-self.fraction, self.highest * 2.0**-self.fraction)

    @property
    def step(self) -> float:
        return 2.0**-self.fraction

    def c_type(self, rounding: bool = False) -> str:
        """The C++ type; ``rounding``: the buffers' AP_RND, AP_SAT (else AP_TRN, AP_WRAP)."""
        name = "ap_fixed" if self.signed else "ap_ufixed"
        modes = ", AP_RND, AP_SAT" if rounding else ""
        return f"{name}<{self.width}, {self.integer}{modes}>"

    def text(self) -> str:
        return f"{'' if self.signed else 'u'}fixed<{self.width},{self.integer}>"


def exact(interval: Interval, fraction: int) -> Format:
    """The format holding every value of ``interval`` on a grid of ``2**-fraction``, fraction cut
    to ``MAX_WIDTH`` bits."""
    signed = interval.lo < 0
    integer = integer_bits(interval, signed)
    fraction = min(fraction, MAX_WIDTH - integer)
    return Format(max(integer + fraction, 1), integer, signed)


def sized(interval: Interval, width: int, signed: bool | None = None) -> Format:
    """A ``width``-bit format whose integer bits hold ``interval`` (a buffer's: calibrated)."""
    signed = interval.lo < 0 if signed is None else signed
    integer = integer_bits(interval, signed)
    return Format(max(width, 1), integer, signed)


# -- mantissa arithmetic (Python integers: any width) --------------------------------------------------


def align(m: int, source: int, target: int) -> int:
    """Mantissa ``m`` with ``source`` fraction bits on a grid of ``target`` fraction bits,
    truncated toward minus infinity when bits are dropped (AP_TRN)."""
    return m << (target - source) if target >= source else m >> (source - target)


def round_to(m: int, source: int, target: int) -> int:
    """As ``align``, rounding to nearest with ties toward plus infinity (AP_RND)."""
    if target >= source:
        return m << (target - source)
    shift = source - target
    return (m + (1 << (shift - 1))) >> shift


def saturate(m: int, fmt: Format) -> int:
    return min(max(m, fmt.lowest), fmt.highest)


def wrap(m: int, fmt: Format) -> int:
    """Two's complement wrap into ``fmt`` (AP_WRAP; kiln's proved formats never need it)."""
    span = 1 << fmt.width
    m &= span - 1
    return m - span if fmt.signed and m > fmt.highest else m


def store(m: int, fraction: int, fmt: Format) -> int:
    """A value (mantissa, fraction bits) stored into a buffer of ``fmt``: AP_RND, AP_SAT."""
    return saturate(round_to(m, fraction, fmt.fraction), fmt)


def quantize(value: float, fmt: Format) -> int:
    """The mantissa of a float stored into ``fmt`` (AP_RND, AP_SAT); NaN is 0."""
    if math.isnan(value):
        return 0
    if math.isinf(value):
        return fmt.highest if value > 0 else fmt.lowest
    scaled = math.floor(value * 2.0**fmt.fraction + 0.5)
    return saturate(scaled, fmt)


def to_float(m: int, fmt: Format) -> float:
    return m * 2.0**-fmt.fraction


def divide(a: int, fa: int, b: int, fb: int, fmt: Format) -> int:
    """``a / b`` (mantissas with ``fa``, ``fb`` fraction bits) into ``fmt``: the quotient of the
    aligned mantissas truncated toward zero; by zero the extreme of the dividend's sign."""
    if b == 0:
        return 0 if a == 0 else (fmt.highest if (a > 0) else fmt.lowest)
    shift = fmt.fraction + fb - fa
    numerator = a << shift if shift >= 0 else a
    denominator = b if shift >= 0 else b << -shift
    quotient = abs(numerator) // abs(denominator)
    return saturate(quotient if (numerator < 0) == (denominator < 0) else -quotient, fmt)


INFINITY_MARGIN = 16.0  # an infinity's stand-in: this many times the finite values' magnitude


def with_infinities(lo: float, hi: float, signs: set[int]) -> tuple[float, float]:
    """A range that holds a stand-in for each infinity the tensor had: fixed point has none, so
    -inf (a mask) saturates to a value far enough below every finite one that exp of it, shifted
    by a softmax's maximum, is 0."""
    standin = INFINITY_MARGIN * max(abs(lo), abs(hi), 1.0)
    return (min(lo, -standin) if -1 in signs else lo), (max(hi, standin) if 1 in signs else hi)


def mantissa_type(fmt: Format | int) -> str:
    """The plain C integer a ROM of ``fmt`` (or of that many bits) stores its mantissas in (an
    initializer of class type, ap_fixed's, compiles into a static constructor that g++ takes
    minutes over)."""
    width = fmt if isinstance(fmt, int) else fmt.width
    return next((t for bits, t in ((8, "signed char"), (16, "short"), (32, "int")) if width <= bits), "long long")
