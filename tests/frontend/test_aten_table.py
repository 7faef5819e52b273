"""The ATen -> kiln conversion table, one test per entry: each entry's op called on its own (traced
with ``make_fx``, no decompositions: the op itself is in the graph, which the test checks),
converted by kiln and evaluated by kiln's reference interpreter, against eager PyTorch. A new
table entry without a sample here fails ``test_every_entry_has_a_sample``."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch")

from kiln.frontend.fx import CONVERTERS, import_traced  # noqa: E402
from kiln.ops.interpreter import Interpreter  # noqa: E402

A = torch.ops.aten


def t(*shape: int, seed: int = 0, low: float | None = None) -> torch.Tensor:
    data = np.random.default_rng(seed + 7 * sum(shape)).standard_normal(shape).astype(np.float32)
    if low is not None:
        data = np.abs(data) + low
    return torch.from_numpy(data)


def ints(*shape: int, high: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, high, shape).astype(np.int64))


def mask(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).random(shape) > 0.5)


X, Y = t(3, 4), t(3, 4, seed=1)
POS = t(3, 4, low=0.1)
IMAGE = t(2, 3, 6, 6)
SEQ = t(2, 5, 8)

# entry -> (function of the inputs calling that op, inputs)
SAMPLES: dict[str, tuple] = {
    "aten._adaptive_avg_pool2d.default": (lambda x: A._adaptive_avg_pool2d.default(x, [3, 3]), [IMAGE]),
    "aten.adaptive_avg_pool2d.default": (lambda x: A.adaptive_avg_pool2d.default(x, [1, 1]), [IMAGE]),
    "aten._assert_tensor_metadata.default": (
        lambda x: (A._assert_tensor_metadata.default(x, dtype=torch.float32), A.add.Tensor(x, 1.0))[1],
        [X],
    ),
    "aten._log_softmax.default": (lambda x: A._log_softmax.default(x, 1, False), [X]),
    "aten._softmax.default": (lambda x: A._softmax.default(x, -1, False), [X]),
    "aten.softmax.int": (lambda x: A.softmax.int(x, 0), [X]),
    "aten._native_batch_norm_legit_no_training.default": (
        lambda x, w, b, m, v: A._native_batch_norm_legit_no_training.default(x, w, b, m, v, 0.1, 1e-5)[0],
        [IMAGE, t(3), t(3, seed=1), t(3, seed=2), t(3, low=0.5)],
    ),
    "aten.native_batch_norm.default": (
        lambda x, w, b, m, v: A.native_batch_norm.default(x, w, b, m, v, False, 0.1, 1e-5)[0],
        [IMAGE, t(3), t(3, seed=1), t(3, seed=2), t(3, low=0.5)],
    ),
    "aten.native_layer_norm.default": (
        lambda x, w, b: A.native_layer_norm.default(x, [8], w, b, 1e-5)[0],
        [SEQ, t(8), t(8, seed=1)],
    ),
    "aten.native_group_norm.default": (
        lambda x, w, b: A.native_group_norm.default(x, w, b, 2, 4, 25, 2, 1e-5),
        [t(2, 4, 5, 5), t(4), t(4, seed=1)],
    ),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (
        lambda q, k, v: A._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)[0],
        [t(1, 2, 5, 8), t(1, 2, 5, 8, seed=1), t(1, 2, 5, 8, seed=2)],
    ),
    "aten.scaled_dot_product_attention.default": (
        lambda q, k, v, m: A.scaled_dot_product_attention.default(q, k, v, m),
        [t(1, 2, 5, 8), t(1, 2, 6, 8, seed=1), t(1, 2, 6, 4, seed=2), mask(5, 6)],
    ),
    "aten._to_copy.default": (lambda x: A._to_copy.default(x, dtype=torch.int32), [t(3, 4, low=0.0) * 3]),
    "aten.to.dtype": (lambda x: A.to.dtype(x, torch.float16), [X]),
    "aten._transformer_encoder_layer_fwd.default": None,  # filled below (many weights)
    "aten._unsafe_view.default": (lambda x: A._unsafe_view.default(x, [4, 3]), [X]),
    "aten.view.default": (lambda x: A.view.default(x, [2, 6]), [X]),
    "aten.view_copy.default": (lambda x: A.view_copy.default(x, [12]), [X]),
    "aten.reshape.default": (lambda x: A.reshape.default(x, [6, -1]), [X]),
    "aten.abs.default": (lambda x: A.abs.default(x), [X]),
    "aten.add.Scalar": (lambda x: A.add.Scalar(x, 2.5), [X]),
    "aten.add.Tensor": (lambda x, y: A.add.Tensor(x, y, alpha=2), [X, t(4, seed=3)]),
    "aten.addmm.default": (lambda b, x, w: A.addmm.default(b, x, w, beta=0.5, alpha=2), [t(5), X, t(4, 5, seed=2)]),
    "aten.alias.default": (lambda x: A.mul.Tensor(A.alias.default(x), 2), [X]),
    "aten.alias_copy.default": (lambda x: A.mul.Tensor(A.alias_copy.default(x), 2), [X]),
    "aten.all.default": (lambda m: A.all.default(m), [mask(3, 4)]),
    "aten.all.dim": (lambda m: A.all.dim(m, 1), [mask(3, 4)]),
    "aten.all.dims": (lambda m: A.all.dims(m, [0], True), [mask(3, 4)]),
    "aten.any.default": (lambda m: A.any.default(m), [mask(3, 4)]),
    "aten.any.dim": (lambda m: A.any.dim(m, 0), [mask(3, 4)]),
    "aten.any.dims": (lambda m: A.any.dims(m, [1]), [mask(3, 4)]),
    "aten.amax.default": (lambda x: A.amax.default(x, [1], True), [X]),
    "aten.amin.default": (lambda x: A.amin.default(x, [0]), [X]),
    "aten.argmax.default": (lambda x: A.argmax.default(x, 1), [X]),
    "aten.argmin.default": (lambda x: A.argmin.default(x), [X]),
    "aten.max.dim": (lambda x: A.max.dim(x, 1, True), [X]),
    "aten.min.dim": (lambda x: A.min.dim(x, 0), [X]),
    "aten.arange.default": (lambda x: A.add.Tensor(x, A.arange.default(4, dtype=torch.float32)), [X]),
    "aten.arange.start": (lambda x: A.add.Tensor(x, A.arange.start(2, 6, dtype=torch.float32)), [X]),
    "aten.arange.start_step": (lambda x: A.add.Tensor(x, A.arange.start_step(0, 8, 2, dtype=torch.float32)), [X]),
    "aten.avg_pool2d.default": (lambda x: A.avg_pool2d.default(x, [3, 3], [2, 2], [1, 1], False, False), [IMAGE]),
    "aten.bitwise_and.Tensor": (lambda a, b: A.bitwise_and.Tensor(a, b), [mask(3, 4), mask(3, 4, seed=1)]),
    "aten.bitwise_or.Tensor": (lambda a, b: A.bitwise_or.Tensor(a, b), [mask(3, 4), mask(3, 4, seed=1)]),
    "aten.bitwise_not.default": (lambda a: A.bitwise_not.default(a), [mask(3, 4)]),
    "aten.logical_and.default": (lambda a, b: A.logical_and.default(a, b), [mask(3, 4), mask(3, 4, seed=1)]),
    "aten.logical_or.default": (lambda a, b: A.logical_or.default(a, b), [mask(3, 4), mask(3, 4, seed=1)]),
    "aten.logical_not.default": (lambda a: A.logical_not.default(a), [mask(3, 4)]),
    "aten.bmm.default": (lambda a, b: A.bmm.default(a, b), [t(2, 3, 4), t(2, 4, 5, seed=1)]),
    "aten.mm.default": (lambda a, b: A.mm.default(a, b), [X, t(4, 2, seed=1)]),
    "aten.matmul.default": (lambda a, b: A.matmul.default(a, b), [SEQ, t(8, 3, seed=1)]),
    "aten.cat.default": (lambda a, b: A.cat.default([a, b], 1), [X, t(3, 2, seed=1)]),
    "aten.ceil.default": (lambda x: A.ceil.default(x), [X]),
    "aten.floor.default": (lambda x: A.floor.default(x), [X]),
    "aten.round.default": (lambda x: A.round.default(x), [X * 3]),
    "aten.trunc.default": (lambda x: A.trunc.default(x), [X * 3]),
    "aten.clamp.default": (lambda x: A.clamp.default(x, -0.5, 0.7), [X]),
    "aten.clamp.Tensor": (lambda x, lo, hi: A.clamp.Tensor(x, lo, hi), [X, t(4, seed=1) - 1, t(4, seed=2) + 1]),
    "aten.hardtanh.default": (lambda x: A.hardtanh.default(x, -1.0, 0.5), [X]),
    "aten.clone.default": (lambda x: A.mul.Tensor(A.clone.default(x), 3), [X]),
    "aten.constant_pad_nd.default": (lambda x: A.constant_pad_nd.default(x, [1, 2, 0, 1], 0.5), [IMAGE]),
    "aten.convolution.default": (
        lambda x, w, b: A.convolution.default(x, w, b, [2, 1], [1, 0], [1, 1], False, [0, 0], 1),
        [IMAGE, t(4, 3, 3, 3, seed=1), t(4, seed=2)],
    ),
    "aten.copy.default": (lambda x, y: A.copy.default(x, y), [X, t(4, seed=1)]),
    "aten.cos.default": (lambda x: A.cos.default(x), [X]),
    "aten.sin.default": (lambda x: A.sin.default(x), [X]),
    "aten.atan.default": (lambda x: A.atan.default(x), [X]),
    "aten.tan.default": (lambda x: A.tan.default(x), [X]),
    "aten.asin.default": (lambda x: A.asin.default(x), [torch.tanh(X)]),
    "aten.acos.default": (lambda x: A.acos.default(x), [torch.tanh(X)]),
    "aten.cumsum.default": (lambda x: A.cumsum.default(x, 1), [X]),
    "aten.detach.default": (lambda x: A.mul.Tensor(A.detach.default(x), 2), [X]),
    "aten.detach_copy.default": (lambda x: A.mul.Tensor(A.detach_copy.default(x), 2), [X]),
    "aten.lift_fresh_copy.default": (lambda x: A.mul.Tensor(A.lift_fresh_copy.default(x), 2), [X]),
    "aten.div.Scalar": (lambda x: A.div.Scalar(x, 4.0), [X]),
    "aten.div.Tensor": (lambda x, y: A.div.Tensor(x, y), [X, POS]),
    "aten.div.Tensor_mode": (lambda x, y: A.div.Tensor_mode(x, y, rounding_mode=None), [X, POS]),
    "aten.embedding.default": (lambda w, i: A.embedding.default(w, i), [t(6, 4), ints(2, 3, high=6)]),
    "aten.empty.memory_format": (lambda x: A.mul.Tensor(A.empty.memory_format([3, 4]), 0), [X]),
    "aten.empty_like.default": (lambda x: A.mul.Tensor(A.empty_like.default(x), 0), [X]),
    "aten.eq.Scalar": (lambda x: A.eq.Scalar(x, 1), [ints(3, 4)]),
    "aten.eq.Tensor": (lambda x, y: A.eq.Tensor(x, y), [ints(3, 4), ints(3, 4, seed=1)]),
    "aten.ne.Scalar": (lambda x: A.ne.Scalar(x, 2), [ints(3, 4)]),
    "aten.ne.Tensor": (lambda x, y: A.ne.Tensor(x, y), [ints(3, 4), ints(3, 4, seed=1)]),
    "aten.ge.Scalar": (lambda x: A.ge.Scalar(x, 0.1), [X]),
    "aten.ge.Tensor": (lambda x, y: A.ge.Tensor(x, y), [X, Y]),
    "aten.gt.Scalar": (lambda x: A.gt.Scalar(x, 0.1), [X]),
    "aten.gt.Tensor": (lambda x, y: A.gt.Tensor(x, y), [X, Y]),
    "aten.le.Scalar": (lambda x: A.le.Scalar(x, 0.1), [X]),
    "aten.le.Tensor": (lambda x, y: A.le.Tensor(x, y), [X, Y]),
    "aten.lt.Scalar": (lambda x: A.lt.Scalar(x, 0.1), [X]),
    "aten.lt.Tensor": (lambda x, y: A.lt.Tensor(x, y), [X, Y]),
    "aten.erf.default": (lambda x: A.erf.default(x), [X]),
    "aten.exp.default": (lambda x: A.exp.default(x), [X]),
    "aten.exp2.default": (lambda x: A.exp2.default(x), [X]),
    "aten.expm1.default": (lambda x: A.expm1.default(x), [X]),
    "aten.log.default": (lambda x: A.log.default(x), [POS]),
    "aten.log2.default": (lambda x: A.log2.default(x), [POS]),
    "aten.log1p.default": (lambda x: A.log1p.default(x), [POS]),
    "aten.expand.default": (lambda x: A.expand.default(x, [2, 3, 4]), [t(3, 1)]),
    "aten.expand_copy.default": (lambda x: A.expand_copy.default(x, [3, -1]), [t(1, 4)]),
    "aten.flatten.using_ints": (lambda x: A.flatten.using_ints(x, 1, -1), [IMAGE]),
    "aten.flip.default": (lambda x: A.flip.default(x, [0, -1]), [X]),
    "aten.full.default": (lambda x: A.add.Tensor(x, A.full.default([3, 4], 1.5)), [X]),
    "aten.full_like.default": (lambda x: A.full_like.default(x, 2.0), [X]),
    "aten.zeros.default": (lambda x: A.add.Tensor(x, A.zeros.default([4])), [X]),
    "aten.zeros_like.default": (lambda x: A.zeros_like.default(x, dtype=torch.int64), [X]),
    "aten.ones.default": (lambda x: A.add.Tensor(x, A.ones.default([3, 1])), [X]),
    "aten.ones_like.default": (lambda x: A.ones_like.default(x), [X]),
    "aten.scalar_tensor.default": (lambda x: A.add.Tensor(x, A.scalar_tensor.default(0.25)), [X]),
    "aten.gather.default": (lambda x, i: A.gather.default(x, 1, i), [X, ints(3, 2, high=4)]),
    "aten.index.Tensor": (
        lambda x, i, j: A.index.Tensor(x, [None, i, j]),
        [t(2, 3, 4), ints(5, high=3), ints(5, high=4, seed=1)],
    ),
    "aten.index_select.default": (lambda x, i: A.index_select.default(x, 1, i), [X, ints(5, high=4)]),
    "aten.gelu.default": (lambda x: A.gelu.default(x, approximate="tanh"), [X]),
    "aten.silu.default": (lambda x: A.silu.default(x), [X]),
    "aten.hardswish.default": (lambda x: A.hardswish.default(x), [X * 4]),
    "aten.leaky_relu.default": (lambda x: A.leaky_relu.default(x, 0.2), [X]),
    "aten.elu.default": (lambda x: A.elu.default(x, 1.6732632, 1.0507009, 1), [X]),
    "aten.relu.default": (lambda x: A.relu.default(x), [X]),
    "aten.sigmoid.default": (lambda x: A.sigmoid.default(x), [X]),
    "aten.tanh.default": (lambda x: A.tanh.default(x), [X]),
    "aten.masked_fill.Scalar": (lambda x, m: A.masked_fill.Scalar(x, m, -3.0), [X, mask(3, 4)]),
    "aten.masked_fill.Tensor": (lambda x, m, v: A.masked_fill.Tensor(x, m, v), [X, mask(3, 4), torch.tensor(7.0)]),
    "aten.max_pool2d_with_indices.default": (
        lambda x: A.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[0],
        [IMAGE],
    ),
    "aten.maximum.default": (lambda x, y: A.maximum.default(x, y), [X, Y]),
    "aten.minimum.default": (lambda x, y: A.minimum.default(x, y), [X, Y]),
    "aten.mean.default": (lambda x: A.mean.default(x), [X]),
    "aten.mean.dim": (lambda x: A.mean.dim(x, [-1], True), [X]),
    "aten.sum.default": (lambda x: A.sum.default(x), [X]),
    "aten.sum.dim_IntList": (lambda x: A.sum.dim_IntList(x, [0]), [X]),
    "aten.prod.dim_int": (lambda x: A.prod.dim_int(x, 1), [X]),
    "aten.var.correction": (lambda x: A.var.correction(x, [1], correction=1), [X]),
    "aten.var_mean.correction": (lambda x: A.var_mean.correction(x, [0], correction=0, keepdim=True), [X]),
    "aten.linalg_vector_norm.default": (lambda x: A.linalg_vector_norm.default(x, 2, [1]), [X]),
    "aten.mul.Scalar": (lambda x: A.mul.Scalar(x, -1.5), [X]),
    "aten.mul.Tensor": (lambda x, y: A.mul.Tensor(x, y), [X, Y]),
    "aten.sub.Scalar": (lambda x: A.sub.Scalar(x, 0.5), [X]),
    "aten.sub.Tensor": (lambda x, y: A.sub.Tensor(x, y, alpha=3), [X, Y]),
    "aten.neg.default": (lambda x: A.neg.default(x), [X]),
    "aten.sign.default": (lambda x: A.sign.default(x), [X]),
    "aten.reciprocal.default": (lambda x: A.reciprocal.default(x), [POS]),
    "aten.rsqrt.default": (lambda x: A.rsqrt.default(x), [POS]),
    "aten.sqrt.default": (lambda x: A.sqrt.default(x), [POS]),
    "aten.isnan.default": (lambda x: A.isnan.default(x), [torch.tensor([1.0, math.nan, -math.inf, 0.0])]),
    "aten.pow.Tensor_Scalar": (lambda x: A.pow.Tensor_Scalar(x, 3), [X]),
    "aten.pow.Tensor_Tensor": (lambda x, y: A.pow.Tensor_Tensor(x, y), [POS, Y]),
    "aten.remainder.Scalar": (lambda x: A.remainder.Scalar(x, 0.7), [X]),
    "aten.remainder.Tensor": (lambda x, y: A.remainder.Tensor(x, y), [X, Y]),
    "aten.fmod.Scalar": (lambda x: A.fmod.Scalar(x, 0.7), [X]),
    "aten.fmod.Tensor": (lambda x, y: A.fmod.Tensor(x, y), [X, POS]),
    "aten.permute.default": (lambda x: A.permute.default(x, [0, 2, 3, 1]), [IMAGE]),
    "aten.permute_copy.default": (lambda x: A.permute_copy.default(x, [1, 0]), [X]),
    "aten.t.default": (lambda x: A.t.default(x), [X]),
    "aten.t_copy.default": (lambda x: A.t_copy.default(x), [X]),
    "aten.transpose.int": (lambda x: A.transpose.int(x, 0, -1), [SEQ]),
    "aten.transpose_copy.int": (lambda x: A.transpose_copy.int(x, 1, 2), [SEQ]),
    "aten.repeat.default": (lambda x: A.repeat.default(x, [2, 1, 3]), [X]),
    "aten.scatter.src": (lambda x, i, s: A.scatter.src(x, 0, i, s), [X, torch.tensor([[2, 0, 1, 2]]), t(1, 4, seed=5)]),
    "aten.slice_scatter.default": (lambda x, s: A.slice_scatter.default(x, s, 1, 1, None, 2), [X, t(3, 2, seed=4)]),
    "aten.scatter.value": (lambda x, i: A.scatter.value(x, 1, i, 9.0), [X, torch.tensor([[3], [0], [1]])]),
    "aten.select.int": (lambda x: A.select.int(x, 1, -1), [SEQ]),
    "aten.select_copy.int": (lambda x: A.select_copy.int(x, 0, 1), [SEQ]),
    "aten.slice.Tensor": (lambda x: A.slice.Tensor(x, 1, 1, 5, 2), [SEQ]),
    "aten.slice_copy.Tensor": (lambda x: A.slice_copy.Tensor(x, -1, 2), [SEQ]),
    "aten.split.Tensor": (lambda x: A.split.Tensor(x, 3, 2), [SEQ]),
    "aten.split_copy.Tensor": (lambda x: A.split_copy.Tensor(x, 2, 1), [SEQ]),
    "aten.split_with_sizes.default": (lambda x: A.split_with_sizes.default(x, [1, 4], 1), [SEQ]),
    "aten.split_with_sizes_copy.default": (lambda x: A.split_with_sizes_copy.default(x, [5, 3], -1), [SEQ]),
    "aten.squeeze.default": (lambda x: A.squeeze.default(x), [t(3, 1, 4, 1)]),
    "aten.squeeze.dim": (lambda x: A.squeeze.dim(x, 1), [t(3, 1, 4, 1)]),
    "aten.squeeze.dims": (lambda x: A.squeeze.dims(x, [1, 3]), [t(3, 1, 4, 1)]),
    "aten.squeeze_copy.default": (lambda x: A.squeeze_copy.default(x), [t(1, 4)]),
    "aten.squeeze_copy.dim": (lambda x: A.squeeze_copy.dim(x, -1), [t(3, 1, 4, 1)]),
    "aten.squeeze_copy.dims": (lambda x: A.squeeze_copy.dims(x, [0]), [t(1, 4)]),
    "aten.unsqueeze.default": (lambda x: A.unsqueeze.default(x, -1), [X]),
    "aten.unsqueeze_copy.default": (lambda x: A.unsqueeze_copy.default(x, 0), [X]),
    "aten.topk.default": (lambda x: A.topk.default(x, 2, 1), [X]),
    "aten.sort.default": (lambda x: A.sort.default(x, 1, True), [X]),
    "aten.upsample_bilinear2d.default": (lambda x: A.upsample_bilinear2d.default(x, [9, 12], False), [IMAGE]),
    "aten.upsample_bicubic2d.default": (lambda x: A.upsample_bicubic2d.default(x, [4, 11], True), [IMAGE]),
    "aten.where.self": (lambda m, x, y: A.where.self(m, x, y), [mask(3, 4), X, Y]),
}


def _encoder_sample() -> tuple:
    embed, heads, ffn = 8, 2, 16
    weights = [
        t(3 * embed, embed, seed=1), t(3 * embed, seed=2), t(embed, embed, seed=3), t(embed, seed=4),
        t(embed, seed=5), t(embed, seed=6), t(embed, seed=7), t(embed, seed=8),
        t(ffn, embed, seed=9), t(ffn, seed=10), t(embed, ffn, seed=11), t(embed, seed=12),
    ]  # fmt: skip

    def call(x, *w):  # type: ignore[no-untyped-def]
        qkv_w, qkv_b, proj_w, proj_b, n1w, n1b, n2w, n2b, f1w, f1b, f2w, f2b = w
        return A._transformer_encoder_layer_fwd.default(
            x, embed, heads, qkv_w, qkv_b, proj_w, proj_b, True, False, 1e-5,
            n1w, n1b, n2w, n2b, f1w, f1b, f2w, f2b,
        )  # fmt: skip

    return call, [t(2, 5, embed), *weights]


SAMPLES["aten._transformer_encoder_layer_fwd.default"] = _encoder_sample()
# torch's values are whatever memory held (times 0 is NaN where it held a NaN): shapes and dtypes compare
UNINITIALISED = {"aten.empty.memory_format", "aten.empty_like.default"}


def test_every_entry_has_a_sample():
    missing = sorted(set(CONVERTERS) - {k for k, v in SAMPLES.items() if v is not None})
    assert not missing, f"table entries without a test sample: {missing}"


def _flat(value) -> list:  # type: ignore[no-untyped-def]
    if isinstance(value, (tuple, list)):
        return [x for part in value for x in _flat(part)]
    return [value]


@pytest.mark.parametrize("entry", sorted(k for k, v in SAMPLES.items() if v is not None))
def test_the_entry_matches_eager_pytorch(entry):
    from torch.fx.experimental.proxy_tensor import make_fx

    function, inputs = SAMPLES[entry]
    with torch.no_grad():
        expected = [e for e in _flat(function(*inputs)) if isinstance(e, torch.Tensor)]
        traced = make_fx(function)(*inputs)
        ops = {str(n.target) for n in traced.graph.nodes if n.op == "call_function"}
        if entry not in ops:  # a composite op: kept only in pre-dispatch graphs (export's, before decompositions)
            traced = make_fx(function, pre_dispatch=True)(*inputs)
            ops = {str(n.target) for n in traced.graph.nodes if n.op == "call_function"}
    assert entry in ops, f"the sample traced to {sorted(ops)}, not {entry}: it tests nothing"
    graph = import_traced(traced, list(inputs))
    got = Interpreter(graph).run([i.numpy() for i in inputs])
    assert len(got) == len(expected), (len(got), len(expected))
    for value, want in zip(got, expected):
        want = want.numpy()
        assert value.shape == want.shape, (value.shape, want.shape)
        if entry in ("aten.topk.default", "aten.sort.default") and want.dtype == np.int64:
            continue  # indices of ties may differ; the values (compared) may not
        assert value.dtype == want.dtype, (value.dtype, want.dtype)
        if entry in UNINITIALISED:
            continue
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5, equal_nan=True)
        else:
            np.testing.assert_array_equal(value, want)
