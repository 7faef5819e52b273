"""``kiln.ir.sized``: integers that keep the expression of the input dims they were computed from,
through the arithmetic, products, reshapes and quotients a lowering computes sizes with."""

from __future__ import annotations

import numpy as np

from kiln.ir import dims as d
from kiln.ir.sized import SizedInt, regrouped, size_product
from kiln.ir.types import DType, TensorType
from kiln.ops.inference import infer_node
from kiln.ops.symbolic_dims import bound, quotient, symbolic_product

AT = {"batch": 8, "seq": 64}


def sized(name: str) -> SizedInt:
    return SizedInt(AT[name], d.sym(name), AT)


def expr(value: object) -> str:
    assert isinstance(value, SizedInt), f"{value!r} lost its expression"
    return d.text(value.expr)


def test_arithmetic_keeps_the_expression_and_the_binding():
    seq, batch = sized("seq"), sized("batch")
    product = 4 * batch * seq + 1
    assert int(product) == 4 * 8 * 64 + 1 and expr(product) == "4*batch*seq+1"
    assert product.at == AT
    assert expr((seq + 63) // 64) == "(seq+63)//64" and int(seq % 5) == 4
    assert expr(size_product([batch, 16, seq])) == "16*batch*seq"


def test_a_reshape_of_folded_numbers_gets_back_the_sizes_it_regroups():
    """[4*batch, 16, seq] -> [batch, 4, 16, 64]: each target dim that is a run of source dims, or
    a factor of one (a product split by the binding's values), is that size's expression."""
    seq, batch = sized("seq"), sized("batch")
    source = (4 * batch, 16, seq)
    found = regrouped(source, [8, 4, 16, 64])
    assert [expr(x) if isinstance(x, SizedInt) else x for x in found] == ["batch", 4, 16, "seq"]
    flat = regrouped((batch * seq, 64), [8, 64, 64])  # [b*s, h] -> [b, s, h]
    assert (expr(flat[0]), expr(flat[1]), flat[2]) == ("batch", "seq", 64)
    merged = regrouped((batch, seq, 64), [512, 64])  # and back
    assert expr(merged[0]) == "batch*seq"
    assert regrouped((batch, seq), [16, 32]) == [16, 32]  # runs that do not line up: left as they are
    assert regrouped((8, 64), [512]) == [512]  # no size kept: nothing to do


def test_products_and_quotients_of_sizes_keep_them():
    seq, batch = sized("seq"), sized("batch")
    assert expr(symbolic_product(None, (batch, seq, 64))) == "64*batch*seq"
    assert expr(quotient(None, [batch, seq, 64], [seq])) == "64*batch"
    assert quotient(None, [8, 64], [64]) == 8  # plain numbers stay plain


def test_a_dim_bound_to_a_plain_number_is_that_number_in_a_kept_expression():
    """A length route's batch class is a number, its length a kept size: ``batch*seq`` at batch 8
    is ``8*seq`` (a product of the one run-time symbol the route reads), not a second symbol."""
    found = bound("batch*seq", {"batch": 8, "seq": sized("seq")})
    assert int(found) == 512 and expr(found) == "8*seq"


def test_type_inference_through_a_folded_reshape_keeps_the_length():
    """A Reshape whose target was folded to numbers at this binding (an exporter's computed view)
    types its output with the length's expression, as the run-time routes need to read it."""
    from kiln.ir.graph import Node, Value

    x = Value("x", TensorType(DType.FLOAT32, (sized("batch") * sized("seq"), 64)))
    target = Value("target", TensorType(DType.INT64, (3,)))
    node = Node("Reshape", (x, target), (Value("y", None),))
    (typed,), _ = infer_node(node, [x.type, target.type], [None, np.array([8, 64, 64], np.int64)], [None, None])
    assert [expr(dim) if isinstance(dim, SizedInt) else dim for dim in typed.shape] == ["batch", "seq", 64]
