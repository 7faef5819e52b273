"""Strings, classic-ML (ai.onnx.ml) ops, image decoding and random generators."""

from __future__ import annotations

from kiln.ir.types import DType, TensorType, Type
from kiln.ops.registry import InferContext, broadcast_shapes, register, same_as_input


def _string_normalizer(ctx: InferContext) -> list[Type]:
    shape = ctx.shape(0)
    if ctx.attr("stopwords") and shape is not None:
        shape = (*shape[:-1], ctx.fresh("n"))
    return [TensorType(DType.STRING, shape)]


def _string_split(ctx: InferContext) -> list[Type]:
    shape = ctx.shape(0)
    pieces = None if shape is None else (*shape, ctx.fresh("n"))
    return [TensorType(DType.STRING, pieces), TensorType(DType.INT64, shape)]


def _tfidf(ctx: InferContext) -> list[Type]:
    shape = ctx.shape(0)
    width = max(ctx.attr("ngram_indexes")) + 1
    out = (width,) if shape is not None and len(shape) == 1 else (shape[0] if shape else ctx.fresh(), width)
    return [TensorType(DType.FLOAT32, out)]


def _label_encoder(ctx: InferContext) -> list[Type]:
    attrs = ctx.node.attrs
    if "values_tensor" in attrs:
        from kiln.ir.types import DType as _DType

        dtype = _DType.from_numpy(attrs["values_tensor"].dtype)
    elif "values_strings" in attrs:
        dtype = DType.STRING
    elif "values_int64s" in attrs:
        dtype = DType.INT64
    else:
        dtype = DType.FLOAT32
    return [TensorType(dtype, ctx.shape(0))]


def _tree_ensemble(ctx: InferContext) -> list[Type]:
    shape = ctx.shape(0)
    rows = shape[0] if shape else ctx.fresh()
    return [TensorType(ctx.dtype(0), (rows, ctx.attr("n_targets")))]


def _image_decoder(ctx: InferContext) -> list[Type]:
    channels = 1 if ctx.attr("pixel_format") == "Grayscale" else 3
    return [TensorType(DType.UINT8, (ctx.fresh("h"), ctx.fresh("w"), channels))]


def _random(ctx: InferContext) -> list[Type]:
    return [TensorType(DType.from_onnx(int(ctx.attr("dtype") or 1)), tuple(ctx.attr("shape")))]


def _register() -> None:
    register("StringNormalizer", _string_normalizer)
    register(
        "StringConcat",
        lambda ctx: [TensorType(DType.STRING, broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1)))],
    )
    register("RegexFullMatch", same_as_input(dtype=DType.BOOL))
    register("StringSplit", _string_split)
    register("TfIdfVectorizer", _tfidf)
    register("LabelEncoder", _label_encoder, domain="ai.onnx.ml")
    register("TreeEnsemble", _tree_ensemble, domain="ai.onnx.ml")
    register("ImageDecoder", _image_decoder)
    register("RandomNormal", _random)
    register("RandomUniform", _random)


_register()
