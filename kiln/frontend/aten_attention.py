"""The conversion table's attention entries: ``F.scaled_dot_product_attention`` (kept out of
torch's decompositions: ``KEPT``) and ``nn.TransformerEncoderLayer``'s fused inference op, written
as softmax(q k^T * scale + mask) v, the one form kiln fuses into its attention kernel."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.frontend.aten import (
    UnsupportedFxOp,
    converts,
    transpose_2d,
)
from kiln.ir.graph import Value
from kiln.ir.types import DType

FxConverter = Any  # kiln.frontend.fx.FxConverter


# -- PyTorch's fused inference fast paths ---------------------------------------------------------------
# nn.TransformerEncoderLayer calls one fused op in eval mode without gradients (batch_first; dynamo
# keeps it; nn.MultiheadAttention's own fast path it traces through); no decomposition reaches core
# ATen, so it is written out here in kiln ops, in the form kiln's attention fusion matches.


def _linear(fx: FxConverter, x: Value, weight: Value, bias: Value | None) -> Value:
    product = fx.one("MatMul", [x, transpose_2d(fx, weight)])
    return product if bias is None else fx.one("Add", [product, bias])


def _heads_attention(fx: FxConverter, q: Value, k: Value, v: Value, heads: int, mask: Value | None) -> Value:
    """softmax(q k^T / sqrt(d) + mask) v over ``heads`` heads of [batch, seq, embed] projections."""
    embed = int(fx.shape(q)[-1])
    depth = embed // heads
    split = [
        fx.one("Transpose", [fx.one("Reshape", [t, fx.ints([0, 0, heads, depth])])], perm=[0, 2, 1, 3])
        for t in (q, k, v)
    ]
    scores = fx.one("MatMul", [split[0], fx.one("Transpose", [split[1]], perm=[0, 1, 3, 2])])
    scores = fx.one("Mul", [scores, fx.const(np.asarray(1.0 / np.sqrt(depth), q.type.dtype.numpy), "scale")])  # type: ignore[union-attr]
    if mask is not None:
        scores = fx.one("Add", [scores, mask])
    context = fx.one("MatMul", [fx.one("Softmax", [scores], axis=-1), split[2]])
    return fx.one("Reshape", [fx.one("Transpose", [context], perm=[0, 2, 1, 3]), fx.ints([0, 0, embed])])


def _attention_mask(fx: FxConverter, op: str, mask: Value | None, mask_type: Any, dtype: Any) -> Value | None:
    """A fast path's mask as an additive one broadcast over [batch, heads, query, key]: type 0 an
    [query, key] attention mask, 1 a [batch, key] padding mask (True: ignored), 2 already
    [batch, heads, query, key]."""
    if mask is None:
        return None
    if mask.type.dtype is DType.BOOL:  # type: ignore[union-attr]
        zero, low = (fx.const(np.asarray(v, dtype), "mask") for v in (0.0, -np.inf))
        mask = fx.one("Where", [mask, low, zero])
    rank = fx.rank(mask)
    if mask_type == 1 and rank == 2:
        return fx.one("Unsqueeze", [mask, fx.ints([1, 2], "axes")])  # [batch, 1, 1, key]
    if rank in (2, 4):  # [query, key] or [batch, heads, query, key]: broadcasts as it is
        return mask
    raise UnsupportedFxOp(op, f"a rank-{rank} mask of type {mask_type}")


@converts("aten._transformer_encoder_layer_fwd.default")
def _encoder_layer(  # type: ignore[no-untyped-def]
    fx: FxConverter,
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
) -> Value:
    def norm(x: Value, weight: Value, bias: Value) -> Value:
        return fx.emit("LayerNormalization", [x, weight, bias], {"axis": -1, "epsilon": float(eps)}, 1)[0]

    embed = int(embed_dim)
    mask = _attention_mask(fx, "aten._transformer_encoder_layer_fwd.default", mask, mask_type, src.type.dtype.numpy)
    x = src
    attend = norm(x, norm_weight_1, norm_bias_1) if norm_first else x
    q, k, v = fx.emit(
        "Split", [_linear(fx, attend, qkv_weight, qkv_bias), fx.ints([embed] * 3, "split")], {"axis": -1}, 3
    )
    x = fx.one("Add", [x, _linear(fx, _heads_attention(fx, q, k, v, int(num_heads), mask), proj_weight, proj_bias)])
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    hidden = _linear(fx, norm(x, norm_weight_2, norm_bias_2) if norm_first else x, ffn_weight_1, ffn_bias_1)
    hidden = fx.one("Gelu", [hidden]) if use_gelu else fx.one("Relu", [hidden])
    x = fx.one("Add", [x, _linear(fx, hidden, ffn_weight_2, ffn_bias_2)])
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


# -- scaled dot-product attention ------------------------------------------------------------------------

KEPT = ("aten.scaled_dot_product_attention.default", "aten._scaled_dot_product_flash_attention_for_cpu.default")


def decompositions() -> dict:
    """torch's core ATen decompositions, without the ops the table converts whole (``KEPT``)."""
    from torch._decomp import core_aten_decompositions

    return {op: fn for op, fn in core_aten_decompositions().items() if str(op) not in KEPT}


# Kept out of torch's decompositions (``KEPT``): torch's math decomposition scales q and k apart
# and guards against NaN in ways kiln's attention fusion does not match; written here as
# softmax(q k^T * scale + mask) v, the one form kiln fuses into its attention kernel.


def _causal_mask(fx: FxConverter, scores: Value) -> Value:
    """0 where key <= query, -inf above the diagonal ([query, key], top-left aligned as torch's
    is_causal); from the scores' shape, so a symbolic sequence length works too."""
    dtype = scores.type.dtype.numpy  # type: ignore[union-attr]
    shape = fx.shape(scores)
    if all(isinstance(d, int) for d in shape[-2:]):
        queries, keys = shape[-2], shape[-1]
        return fx.const(np.triu(np.full((queries, keys), -np.inf, dtype), 1).astype(dtype), "causal")
    sizes = fx.one("Shape", [scores])
    zero, one = fx.const(np.asarray(0, np.int64)), fx.const(np.asarray(1, np.int64))
    rows = fx.one("Range", [zero, fx.one("Gather", [sizes, fx.const(np.asarray(-2, np.int64))], axis=0), one])
    cols = fx.one("Range", [zero, fx.one("Gather", [sizes, fx.const(np.asarray(-1, np.int64))], axis=0), one])
    future = fx.one(
        "Greater",
        [fx.one("Unsqueeze", [cols, fx.ints([0], "axes")]), fx.one("Unsqueeze", [rows, fx.ints([1], "axes")])],
    )
    return fx.one("Where", [future, fx.const(np.asarray(-np.inf, dtype)), fx.const(np.asarray(0, dtype))])


def _sdpa(
    fx: FxConverter,
    q: Value,
    k: Value,
    v: Value,
    mask: Value | None,
    dropout: float,
    causal: bool,
    scale: Any,
    gqa: bool,
) -> Value:
    op = "aten.scaled_dot_product_attention.default"
    if dropout:
        raise UnsupportedFxOp(op, f"dropout_p={dropout} (inference only)")
    if not fx.same_dims(q, k, slice(None, -2)):
        raise UnsupportedFxOp(
            op, f"query heads {fx.shape(q)[:-2]} and key heads {fx.shape(k)[:-2]} differ (grouped-query attention)"
        )
    depth = fx.shape(q)[-1]
    if scale is None and not isinstance(depth, int):
        raise UnsupportedFxOp(op, f"a symbolic head size {depth}")
    dtype = q.type.dtype.numpy  # type: ignore[union-attr]
    factor = float(scale) if scale is not None else 1.0 / float(np.sqrt(depth))
    perm = list(range(fx.rank(k)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = fx.one(
        "Mul",
        [fx.one("MatMul", [q, fx.one("Transpose", [k], perm=perm)]), fx.const(np.asarray(factor, dtype), "scale")],
    )
    if causal:
        scores = fx.one("Add", [scores, _causal_mask(fx, scores)])
    if mask is not None:
        if mask.type.dtype is DType.BOOL:  # type: ignore[union-attr]  True: attend
            mask = fx.one("Where", [mask, fx.const(np.asarray(0, dtype)), fx.const(np.asarray(-np.inf, dtype))])
        scores = fx.one("Add", [scores, mask])
    return fx.one("MatMul", [fx.one("Softmax", [scores], axis=-1), v])


@converts("aten.scaled_dot_product_attention.default")
def _scaled_dot_product_attention(  # type: ignore[no-untyped-def]
    fx: FxConverter, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
) -> Value:
    return _sdpa(fx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@converts("aten._scaled_dot_product_flash_attention_for_cpu.default")
def _flash_attention_cpu(  # type: ignore[no-untyped-def]
    fx: FxConverter, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
) -> tuple:
    # (output, logsumexp): the log-sum-exp is for the backward pass; a graph reading it is refused
    return _sdpa(fx, q, k, v, attn_mask, dropout_p, is_causal, scale, False), None
