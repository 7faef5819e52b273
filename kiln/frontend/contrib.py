"""ONNX Runtime's contrib ops (domain ``com.microsoft``) that its GenAI model builder writes for a
decoder, converted into the standard ops they compute, so a builder's model compiles like any export:

* ``MatMulNBits``: A . W with W stored as 4- or 8-bit codes per block of K and a float scale (and
  zero point) per block: dequantized here into the float32 constant it stands for (``--precision
  int4-weights`` quantizes it again into kiln's own layout).
* ``GatherBlockQuantized``: rows of a table stored as MatMulNBits stores weights (the builder's
  tied embedding and head), dequantized into its float constant and gathered.
* ``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization``: RMSNorm (after adding a
  skip and a bias): x / sqrt(mean(x^2) + epsilon) * scale, over the last axis.
* ``GroupQueryAttention``: the new tokens' Q, K and V (or one packed QKV), rotary embeddings from
  the cos/sin caches at each token's position, the past K/V concatenated with the new (the present
  outputs), causal (and local-window, softcap) attention with each K/V head serving its group of
  query heads: Expand/Reshape heads, MatMul, Softmax, MatMul, which kiln's fusion matches
  (``kiln.passes.grouped_heads`` reads each K/V head in place). Token t of batch row b sits at
  position seqlens_k[b] + 1 - S + t (seqlens_k: the index of the row's last token), which is
  where its K/V land in the present when the rows share one length (the builder's batch of
  equal-length prompts, and every decode step after it); rows of different lengths are not this
  converter's (their K/V would land where the row's own length says).

Anything else these ops can say (packed QKV with position ids, attention bias, head sinks, g_idx,
interleaved rotary beyond half-rotation, shared past/present buffers) is refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from kiln.frontend.converters import GraphBuilder, converter
from kiln.ir.graph import Value
from kiln.ir.types import TensorType
from kiln.ops.inference import UnsupportedConstruct

DOMAIN = "com.microsoft"


def attribute(proto: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in proto.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


class Steps:
    """Emits a contrib node's standard ops, each intermediate named after the node's first output."""

    def __init__(self, builder: GraphBuilder, proto: onnx.NodeProto) -> None:
        self.builder, self.proto, self.count = builder, proto, 0

    def __call__(
        self, op: str, inputs: list[Value | None], attrs: dict[str, Any] | None = None, out: str = ""
    ) -> Value:
        self.count += 1
        name = out or f"{self.proto.output[0]}/kiln_{op.lower()}_{self.count}"
        return self.builder.emit(op, inputs, attrs or {}, [name], self.proto.name)[0]

    def const(self, array: Any, hint: str) -> Value:
        return self.builder.const(np.asarray(array), f"{self.proto.output[0]}/{hint}")


def _known(builder: GraphBuilder, proto: onnx.NodeProto, index: int, what: str) -> np.ndarray | None:
    """Input ``index`` as a constant: known at import, an initializer, or a Reshape of one (a
    weight too large for the import's own evaluation: the builder's shared embedding table)."""
    value = builder.input(proto, index)
    if value is None:
        return None
    found = builder.scope.known.get(value, builder.constants.get(value))
    shape = getattr(value.type, "shape", None)
    if found is None and shape is not None and all(isinstance(d, int) for d in shape):
        reshape = next((n for n in reversed(builder.nodes) if value in n.outputs and n.op == "Reshape"), None)
        source = builder.constants.get(reshape.inputs[0]) if reshape is not None else None  # type: ignore[arg-type]
        if source is not None and np.asarray(source).size == int(np.prod(shape)):
            found = np.asarray(source).reshape(shape)
    if found is None:
        raise UnsupportedConstruct(f"{what} is computed at run time (kiln takes it as a constant)")
    return np.asarray(found)


def unpacked(data: np.ndarray, bits: int, rows: int) -> np.ndarray:
    """``rows`` rows of ``bits``-bit codes packed low bits first into the bytes of ``data``, as
    [rows, codes in a row]."""
    data = np.asarray(data).astype(np.uint8).reshape(rows, -1)
    mask = (1 << bits) - 1
    return np.stack([(data >> (bits * i)) & mask for i in range(8 // bits)], axis=-1).reshape(rows, -1)


def dequantized_rows(packed: np.ndarray, scales: np.ndarray, zero: np.ndarray | None, shape: tuple[int, int], bits: int, block: int, what: str) -> np.ndarray:  # fmt: skip
    """[rows, columns] float32 from codes packed along each row (MatMulNBits' B, one row a column
    of the product; GatherBlockQuantized's table): each block of ``block`` codes of a row is
    (code - zero point) x its scale; zero points packed like the codes (each row's rounded up to
    whole bytes), or floats, or absent (the middle code, 2^(bits-1))."""
    rows, columns = shape
    blocks = -(-columns // block)
    if packed.size * 8 != rows * blocks * block * bits or scales.size != rows * blocks:
        raise UnsupportedConstruct(f"{what}'s codes {packed.shape} or scales {scales.shape} do not hold {rows} x {blocks} blocks of {block}")  # fmt: skip
    zeros = np.full((rows, blocks), 1 << (bits - 1), np.float32)
    if zero is not None and zero.dtype == np.uint8:
        if zero.size != rows * -(-blocks * bits // 8):
            raise UnsupportedConstruct(f"{what}'s zero points of {zero.size} bytes, expected {rows * -(-blocks * bits // 8)}")  # fmt: skip
        zeros = unpacked(zero, bits, rows)[:, :blocks].astype(np.float32)
    elif zero is not None:
        zeros = np.asarray(zero, np.float32).reshape(rows, blocks)
    codes = unpacked(packed, bits, rows).astype(np.float32).reshape(rows, blocks, block)
    values = (codes - zeros[..., None]) * np.asarray(scales, np.float32).reshape(rows, blocks, 1)
    return values.reshape(rows, blocks * block)[:, :columns]


def dequantized_nbits(proto: onnx.NodeProto, builder: GraphBuilder) -> np.ndarray:
    """MatMulNBits's B as the float32 [K, N] it stands for (``dequantized_rows``: B holds one row
    of codes per column of the product)."""
    k, n, bits, block = (int(attribute(proto, key, default)) for key, default in (("K", 0), ("N", 0), ("bits", 4), ("block_size", 0)))  # fmt: skip
    if bits not in (2, 4, 8) or block < 16 or block & (block - 1) or k < 1 or n < 1:
        raise UnsupportedConstruct(f"MatMulNBits with K={k}, N={n}, bits={bits}, block_size={block}")
    if _known(builder, proto, 4, "g_idx") is not None:
        raise UnsupportedConstruct("MatMulNBits with g_idx (an act-order permutation)")
    packed, scales = _known(builder, proto, 1, "B"), _known(builder, proto, 2, "scales")
    if packed is None or scales is None:
        raise UnsupportedConstruct("MatMulNBits without B or scales")
    zero = _known(builder, proto, 3, "zero_points")
    return np.ascontiguousarray(dequantized_rows(packed, scales, zero, (n, k), bits, block, "MatMulNBits").T)


@converter("MatMulNBits", 1, DOMAIN)
def _matmul_nbits(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    step = Steps(builder, proto)
    weights = step.const(dequantized_nbits(proto, builder), "weights")
    bias = builder.input(proto, 5)
    product = step("MatMul", [builder.input(proto, 0), weights], out="" if bias is not None else proto.output[0])
    if bias is not None:
        step("Add", [product, bias], out=proto.output[0])


@converter("GatherBlockQuantized", 1, DOMAIN)
def _gather_block_quantized(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    """Rows of a table stored as MatMulNBits stores its weights (the builder's tied embedding and
    head share one): the table dequantized into its float constant, then a Gather."""
    bits, block = int(attribute(proto, "bits", 4)), int(attribute(proto, "block_size", 128))
    data = _known(builder, proto, 0, "data")
    axes = (int(attribute(proto, "gather_axis", 0)), int(attribute(proto, "quantize_axis", 1)))
    if data is None or data.dtype != np.uint8 or data.ndim != 2 or axes not in ((0, 1), (0, -1)) or bits not in (4, 8):
        raise UnsupportedConstruct("GatherBlockQuantized other than rows of a [rows, columns] uint8 table quantized along its columns")  # fmt: skip
    rows, columns = data.shape[0], data.shape[1] * 8 // bits
    scales = _known(builder, proto, 2, "scales")
    if scales is None:
        raise UnsupportedConstruct("GatherBlockQuantized without scales")
    zero = _known(builder, proto, 3, "zero_points")
    table = dequantized_rows(data, scales, zero, (rows, columns), bits, block, "GatherBlockQuantized")
    step = Steps(builder, proto)
    weights = step.const(np.ascontiguousarray(table), "table")
    step("Gather", [weights, builder.input(proto, 1)], {"axis": 0}, out=proto.output[0])


def _rms(step: Steps, x: Value, scale: Value | None, epsilon: float, out: str) -> tuple[Value, Value]:
    """(x / sqrt(mean(x^2) + epsilon) x scale, 1 / sqrt(mean(x^2) + epsilon)) over the last axis."""
    square = step("Mul", [x, x])
    mean = step("ReduceMean", [square, step.const(np.array([-1], np.int64), "axes")], {"keepdims": 1})
    root = step("Sqrt", [step("Add", [mean, step.const(np.array(epsilon, np.float32), "epsilon")])])
    inverse = step("Reciprocal", [root])
    normalized = step("Mul", [x, inverse], out="" if scale is not None else out)
    return (step("Mul", [normalized, scale], out=out) if scale is not None else normalized), inverse


def float_input(builder: GraphBuilder, proto: onnx.NodeProto, index: int) -> Value | None:
    value = builder.input(proto, index)
    if value is not None and isinstance(value.type, TensorType) and value.type.dtype.short != "f32":
        raise UnsupportedConstruct(f"input {index} of type {value.type.dtype.short}: kiln converts the float32 form")
    return value


@converter("SimplifiedLayerNormalization", 1)  # (onnxruntime registers it in the ONNX domain too)
@converter("SimplifiedLayerNormalization", 1, DOMAIN)
def _simplified_norm(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    if int(attribute(proto, "axis", -1)) != -1:
        raise UnsupportedConstruct("SimplifiedLayerNormalization over another axis than the last")
    step = Steps(builder, proto)
    x, scale = float_input(builder, proto, 0), float_input(builder, proto, 1)
    _, inverse = _rms(step, x, scale, float(attribute(proto, "epsilon", 1e-5)), proto.output[0])  # type: ignore[arg-type]
    if len(proto.output) > 1 and proto.output[1]:
        step("Identity", [inverse], out=proto.output[1])


@converter("SkipSimplifiedLayerNormalization", 1, DOMAIN)
def _skip_simplified_norm(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    if len(proto.output) > 1 and proto.output[1]:
        raise UnsupportedConstruct("SkipSimplifiedLayerNormalization's mean output (a simplified norm has none)")
    step = Steps(builder, proto)
    x, skip, scale = (float_input(builder, proto, i) for i in range(3))
    total = step("Add", [x, skip])
    bias = builder.input(proto, 3)
    if bias is not None:
        total = step("Add", [total, bias])
    _, inverse = _rms(step, total, scale, float(attribute(proto, "epsilon", 1e-5)), proto.output[0])  # type: ignore[arg-type]
    for index, value in ((2, inverse), (3, total)):
        if len(proto.output) > index and proto.output[index]:
            step("Identity", [value], out=proto.output[index])
