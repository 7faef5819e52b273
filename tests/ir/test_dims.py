"""kiln.ir.dims: sizes as canonical quasi-affine expressions (issue 49's symbolic dims)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kiln.ir import dims as d
from kiln.ir.types import parse_type


def value(expr: d.Expr, binding: dict[str, int]) -> int:
    result = d.substitute(expr, binding)
    assert result.is_constant, f"{expr} not bound by {binding}"
    return result.constant


def random_expr(rng: np.random.Generator, depth: int = 3) -> tuple[d.Expr, object]:
    """An expression and the same computation as a Python function of (h, w, b)."""
    if depth == 0 or rng.random() < 0.25:
        pick = int(rng.integers(0, 4))
        if pick == 3:
            k = int(rng.integers(0, 9))
            return d.const(k), lambda h, w, b, k=k: k
        name = "hwb"[pick]
        return d.sym(name), lambda h, w, b, i=pick: (h, w, b)[i]
    a, fa = random_expr(rng, depth - 1)
    op = int(rng.integers(0, 7))
    if op in (0, 1, 2):
        b_, fb = random_expr(rng, depth - 1)
        if op == 0:
            return d.add(a, b_), lambda h, w, b: fa(h, w, b) + fb(h, w, b)
        if op == 1:
            return d.sub(a, b_), lambda h, w, b: fa(h, w, b) - fb(h, w, b)
        return d.mul(a, b_), lambda h, w, b: fa(h, w, b) * fb(h, w, b)
    k = int(rng.integers(1, 6))
    if op == 3:
        return d.floordiv(a, k), lambda h, w, b: fa(h, w, b) // k
    if op == 4:
        return d.mod(a, k), lambda h, w, b: fa(h, w, b) % k
    b_, fb = random_expr(rng, depth - 1)
    if op == 5:
        return d.extreme(True, a, b_), lambda h, w, b: min(fa(h, w, b), fb(h, w, b))
    return d.extreme(False, a, b_), lambda h, w, b: max(fa(h, w, b), fb(h, w, b))


def test_every_canonical_form_computes_what_was_written_and_reads_back_as_itself():
    """Random expressions of +, -, *, //, %, min, max: the canonical form (after every
    simplification the constructors make) evaluates to Python's arithmetic at every binding,
    its bounds contain every value, and its text parses back to the same expression."""
    rng = np.random.default_rng(7)
    bindings = [dict(zip("hwb", v)) for v in itertools.product((0, 1, 2, 3, 7, 12, 31), (0, 5, 16), (1, 4))]
    for _ in range(400):
        expr, reference = random_expr(rng)
        assert d.parse(d.text(expr)) == expr, d.text(expr)
        low, high = d.bounds(expr)
        for binding in bindings:
            got = value(expr, binding)
            assert got == reference(**binding), (d.text(expr), binding)
            assert low <= got <= high, (d.text(expr), binding, low, high)


def test_two_computations_of_one_size_have_one_text():
    """Swin's padded height, as the dynamo exporter computes it twice (the window partition and
    its reverse), and the window count, written in other orders: one canonical text."""
    padded = d.parse("h//2 + (4 + -1*((h//2)%4)) % 4")
    again = d.parse("((4 - (h//2)%4) % 4) + h//2")
    assert padded == again and d.text(padded) == d.text(again)
    assert d.mod(padded, 4) == d.const(0)  # a multiple of the window: provably
    assert d.parse("2*(a+b)") == d.parse("b*2+a+a")
    assert d.text(d.parse("b*a*4")) == "4*a*b"


def test_floor_division_and_remainder_split_off_what_the_divisor_divides():
    assert d.text(d.floordiv(d.parse("4*a+b+5"), 4)) == "(b+1)//4+a+1"
    assert d.floordiv(d.parse("h//2"), 3) == d.parse("h//6")
    assert d.mod(d.parse("(h%8)"), 4) == d.parse("h%4")
    assert d.mod(d.parse("6*a+3"), 3) == d.const(0)
    assert d.floordiv(d.parse("h%4"), 4) == d.const(0)  # bounds: 0..3
    with pytest.raises(ValueError, match="positive"):
        d.floordiv(d.sym("h"), 0)


def test_min_and_max_drop_what_the_bounds_order():
    assert d.extreme(True, d.parse("h%4"), d.const(5)) == d.parse("h%4")
    assert d.extreme(False, d.parse("h%4"), d.const(5)) == d.const(5)
    assert d.text(d.extreme(True, d.sym("seq"), d.const(512))) == "min(512,seq)"
    ranged = {"seq": (1, 128)}
    assert d.extreme(True, d.sym("seq"), d.const(512), ranged) == d.sym("seq")  # a declared range decides
    assert d.bounds(d.parse("2*seq-1"), ranged) == (1, 255)


def test_ranges_simplify_an_expression_made_without_them():
    """A position table's slice, min(2048, seq), is seq where the declared range keeps seq <= 2048
    (the run-time routes read it as the length itself), and a floor division the range bounds
    below its divisor is 0; outside the range nothing is dropped."""
    table = d.parse("8*min(2048,seq) + (seq-1)//64")
    assert d.simplified(table, {"seq": (1, 64)}) == d.parse("8*seq")
    assert d.simplified(table, {"seq": (1, 4096)}) == table
    assert d.simplified(d.parse("max(h,w)*h"), {"h": (32, 64), "w": (1, 16)}) == d.parse("h*h")
    for seq in (1, 17, 64):  # the same value wherever the range holds
        assert d.substitute(table, {"seq": seq}) == d.substitute(d.simplified(table, {"seq": (1, 64)}), {"seq": seq})


def test_exact_division_sees_through_sums_and_rounded_sizes():
    """The element count of Swin's windows over the padded plane is the batch; a product over
    one of its factors is the rest; anything else is no exact quotient."""
    hp, wp = d.parse("h//2+(4-(h//2)%4)%4"), d.parse("w//2+(4-(w//2)%4)%4")
    windows = d.mul(
        d.mul(d.sym("batch"), d.scale(d.floordiv(hp, 4), 4)), d.mul(d.scale(d.floordiv(wp, 4), 4), d.const(16))
    )
    assert d.divide(windows, d.mul(d.mul(hp, wp), d.const(16))) == d.sym("batch")
    assert d.divide(d.parse("6*a*b"), d.parse("3*a")) == d.parse("2*b")
    assert d.divide(d.parse("(a+1)*b"), d.parse("a+1")) == d.sym("b")
    assert d.divide(d.parse("a*b+1"), d.sym("a")) is None
    assert d.divide(d.parse("16*((h+1)//2)*batch"), d.sym("batch")) == d.parse("16*((h+1)//2)")


def test_names_older_kiln_wrote_read_as_their_expressions():
    assert d.parse("batch.x4") == d.parse("4*batch")
    assert d.parse("h.d4") == d.parse("h//4")
    assert d.parse("seq.min512") == d.parse("min(seq,512)")
    assert d.parse("h.x2.d4") == d.parse("h//2")
    assert d.parse("odd.name") == d.sym("odd.name")  # no meaning kiln knows: a symbol


@pytest.mark.parametrize("text", ["h+", "(h", "h//0", "h//x", "min(h)", "2 3", "h$"])
def test_text_that_is_no_dim_is_a_named_error(text):
    if text == "min(h)":
        assert d.parse(text) == d.sym("h")  # (min of one operand is it)
        return
    with pytest.raises(d.DimSyntaxError):
        d.parse(text)


def test_types_read_and_print_expression_dims():
    t = parse_type("f32[4*batch, min(seq,512), (h+3)//4]")
    assert t.shape == ("4*batch", "min(512,seq)", "(h+3)//4")
    assert str(t) == "f32[4*batch,min(512,seq),(h+3)//4]"
    assert parse_type(str(t)) == t
    assert parse_type("i64[2*3]").shape == (6,)


def test_sizes_torch_traced_as_sympy_expressions_are_the_same_expressions():
    """torch.compile(dynamic=True) hands sizes as sympy expressions (``s0*s1``, FloorDiv, Mod,
    Max): kiln reads each as its own expression; a fraction or a power is no size kiln names."""
    sympy = pytest.importorskip("sympy", reason="sympy comes with torch (the 'torch' extra)")
    functions = pytest.importorskip("torch.utils._sympy.functions", reason="torch's sympy functions")
    from kiln.ops.symbolic_dims import from_sympy

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    assert from_sympy(4 * s0 * s1 + 3) == d.parse("4*s0*s1+3")
    assert from_sympy(functions.FloorDiv(s0 + 3, 4)) == d.parse("(s0+3)//4")
    assert from_sympy(functions.Mod(s0, 4)) == d.parse("s0%4")
    assert from_sympy(sympy.Max(s0, 2 * s1)) == d.parse("max(s0,2*s1)")
    assert from_sympy(s0 / 3) is None and from_sympy(s0**2) is None


def test_hostile_dim_text_is_a_named_error_never_a_crash():
    """Text kiln did not write (an IR file, a damaged artifact): nesting or length beyond any size
    kiln names is a DimSyntaxError, never a RecursionError; a type with such a dim is refused."""
    with pytest.raises(d.DimSyntaxError):
        d.parse("(" * 5000 + "h" + ")" * 5000)
    with pytest.raises(d.DimSyntaxError):
        d.parse("+".join(["h"] * 3000))
    with pytest.raises(ValueError):
        parse_type("f32[" + "(" * 600 + "h" + ")" * 600 + "]")
