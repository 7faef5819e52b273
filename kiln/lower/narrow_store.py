"""What a reduced-precision product stores of its output for the products that read it.

An int8 product whose output an int8 product reads as its activations also stores it quantized
with the reader's own parameters (``Requantize``; the reader takes the bytes, ``QuantSpec.given``);
a bf16 product whose output a bf16 product reads in place (a MatMul's A rows, a channels-last
convolution's input) also stores it rounded to bfloat16 (``Requantize.bf16``; ``GemmSpec.given``).
Either way the reader's operand is bit for bit what it would have made of the floats; when nothing
else reads the floats the producer stores only the narrow form (``kiln.lower.quantized_only``).
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node, Value
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower.engine import activation_quantization
from kiln.lower.kir import Buffer, Requantize
from kiln.lower.lowering import Lowerer
from kiln.passes.layout import range_key


def requantize(lw: Lowerer, out: Value) -> Requantize | None:
    """The Requantize of an int8 product's output ``out`` when an int8 product reads it as its
    activations (with the calibrated range both see): the producer stores it quantized in its
    finish, the readers take those bytes (``QuantSpec.given``) instead of quantizing the floats
    in a pass of their own. The float output is still stored (the engine finishes tiles in it,
    and other readers may want it), unless nothing else reads it (``kiln.lower.quantized_only``)."""
    if "requantize" in lw.disabled or out in lw.outputs:
        return None
    if out.type.dtype is not DType.FLOAT32:  # type: ignore[union-attr]
        return None
    keys = [key for node in lw.consumers().get(out, []) if (key := _int8_reader(lw, node, out)) is not None]
    if not keys or keys[0] not in lw.ranges:
        return None
    qmax = lw.target.int8_max
    scale, zero = activation_quantization(*lw.ranges[keys[0]], qmax)
    dest = lw.scratch_buffer(DType.UINT8, size_product(lw.shape(out)), "q")
    lw.quantized[out] = requant = Requantize(dest, float(np.float32(1.0 / scale)), zero, qmax)
    return requant


def narrow_store(lw: Lowerer, out: Value, precision: str) -> Requantize | None:
    """What a product of ``precision`` also stores of its output ``out`` for its readers: int8
    bytes (``requantize``), bf16 halves (``_store_bf16``), or nothing."""
    if precision == "int8":
        return requantize(lw, out)
    return _store_bf16(lw, out) if precision == "bf16" else None


def _weights_reader(lw: Lowerer, node: Node, value: Value):  # type: ignore[no-untyped-def]
    """(op, attrs, weights) when ``node`` (or the product a fused group anchors) is an engine
    product of ``value`` (its first input) and a constant float32 weight (its second): a Conv,
    kiln::ConvNHWC (op "ConvNHWC") or MatMul the engine lowers; else None."""
    op, domain, inputs, attrs = node.op, node.domain, list(node.inputs), node.attrs
    if domain == "kiln" and op == "Fused" and attrs.get("kind") == "epilogue":
        body = attrs["body"]
        anchor, bindings = body.nodes[0], dict(zip(body.inputs, node.inputs))
        op, domain, attrs = anchor.op, anchor.domain, anchor.attrs
        inputs = [None if v is None else bindings.get(v) for v in anchor.inputs]
    if domain not in ("", "kiln") or (domain == "kiln" and op != "ConvNHWC"):
        return None
    if len(inputs) < 2 or inputs[0] is not value or inputs[1] is None or "kiln_qdq" in attrs:
        return None
    if "gemm" not in lw.target.engines:
        return None
    weights = lw.constant(inputs[1])
    if weights is None or inputs[1].type.dtype is not DType.FLOAT32:  # type: ignore[union-attr]
        return None
    return op, attrs, weights


def _int8_reader(lw: Lowerer, node: Node, value: Value) -> str | None:
    """The key of ``value``'s calibrated range (``kiln.passes.layout.range_key``) when ``node``
    (or the product a fused group anchors) is an int8 product of the engine with ``value`` as its
    activations: a Conv's or kiln::ConvNHWC's input, a MatMul's A against one constant weight
    matrix (``lower_conv_gemm``, ``lower_conv_nhwc``, ``lower_matmul_gemm``); else None."""
    found = _weights_reader(lw, node, value)
    if found is None or node.name in lw.keep_fp32:
        return None
    op, attrs, weights = found
    key = range_key(attrs, value)
    if op in ("Conv", "ConvNHWC") and int(attrs.get("group", 1)) == 1 and len(lw.shape(value)) in (3, 4):
        return key
    if op == "MatMul" and len(lw.shape(value)) >= 2 and weights.ndim >= 2 and size_product(weights.shape[:-2]) == 1:
        return key
    return None


# -- bf16 between layers ----------------------------------------------------------------------------------


def _store_bf16(lw: Lowerer, out: Value) -> Requantize | None:
    """The bf16 copy of a bf16 product's output ``out`` when a bf16 product reads it in place
    (``_bf16_reader``): the producer rounds each finished tile once (the conversion the reader
    would do: the same function, so bit for bit the same operands), the reader takes those halves
    (``GemmSpec.given``); the floats are still stored unless nothing else reads them
    (``kiln.lower.quantized_only``): a ResNet block's first two convolutions pass bf16 on."""
    if "requantize" in lw.disabled or out in lw.outputs:
        return None
    if out.type.dtype is not DType.FLOAT32:  # type: ignore[union-attr]
        return None
    if not any(_bf16_reader(lw, node, out) for node in lw.consumers().get(out, [])):
        return None
    dest = lw.scratch_buffer(DType.UINT16, size_product(lw.shape(out)), "h")
    lw.quantized[out] = requant = Requantize(dest, 1.0, 0, 0, bf16=True)
    return requant


def _bf16_reader(lw: Lowerer, node: Node, value: Value) -> bool:
    """Whether ``node`` is a bf16 product that reads ``value`` as bf16 halves in place: a
    channels-last convolution's input (``lower_conv_nhwc``: its padded copy made of the halves) or
    a MatMul's A against one constant weight matrix (``lower_matmul_gemm``: rows read in place)."""
    found = _weights_reader(lw, node, value)
    if found is None:
        return False
    op, _, weights = found
    if op == "ConvNHWC":
        return True
    return op == "MatMul" and len(lw.shape(value)) >= 2 and weights.ndim >= 2 and size_product(weights.shape[:-2]) == 1


def bf16_given(lw: Lowerer, value: Value) -> Buffer | None:
    """The bf16 halves of ``value`` its producer stored (``_store_bf16``), or None."""
    stored = lw.quantized.get(value)
    return stored.dest if stored is not None and stored.bf16 else None
