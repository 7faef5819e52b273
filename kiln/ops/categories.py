"""Op categories on the registry: what passes, lowering and the quantizer may assume of an op,
declared once, here, and asked of the registry (``has_trait``, ``ops_with``) wherever it matters;
no pass keeps a list of op names of its own.

    elementwise      each output element comes from the same (broadcast) position of the inputs
    layout_free      one data input, each element computed alone: commutes with any permutation
                     of its input's dims (a Transpose moves past it)
    accumulating     sums or compares many elements: float16/bfloat16 inputs are computed in
                     float32 (``widen_half``)
    axis             its ``axis`` attribute names a dim of input 0 (checked by type inference)
    contracting      sums over a dim of its operands (an empty one gives a non-empty result)
    nondeterministic outputs differ run to run: never folded, merged or evaluated ahead
    aligned          each output element reads its inputs at the same (broadcast) position only:
                     elementwise with comparisons, logic, casts and selection
    per_sample       input 0's leading dim holds samples and every other input is per model
                     (weights): each output sample is computed from its own input sample alone
The older traits (``fusable``, ``anchor``, ``tunable``, ``alias``, ``reshape``) are declared with
their op families (``kiln.ops.elementwise``, ``nn``, ``shape``).
"""

from __future__ import annotations

from kiln.ops.registry import REGISTRY, declare_trait

CATEGORIES: dict[str, str] = {
    "elementwise": "Add Sub Mul Div Pow Max Min Neg Abs Relu Sigmoid Tanh Exp Log Sqrt Reciprocal Erf Floor Ceil "
    "Softplus Softsign Elu Selu Celu LeakyRelu ThresholdedRelu HardSigmoid HardSwish Gelu Mish Clip",
    "layout_free": "Relu Sigmoid Tanh Neg Abs Exp Log Sqrt Erf Reciprocal Floor Ceil Round Sign Softplus Softsign "
    "Elu Selu LeakyRelu HardSigmoid HardSwish Gelu Mish Cast Identity IsNaN Not",
    "accumulating": "MatMul Gemm Softmax LogSoftmax LayerNormalization ReduceSum ReduceMean ReduceMax ReduceMin "
    "ReduceProd ReduceL1 ReduceL2 ReduceSumSquare ReduceLogSum Conv MaxPool AveragePool GlobalAveragePool "
    "GlobalMaxPool CumSum CumProd ArgMax ArgMin",
    "axis": "Softmax LogSoftmax Hardmax LpNormalization LayerNormalization Concat Gather GatherElements Split "
    "ArgMax ArgMin Compress ScatterElements OneHot Flatten",
    "contracting": "MatMul Gemm Conv Einsum",
    "nondeterministic": "RandomNormal RandomUniform RandomNormalLike RandomUniformLike Bernoulli Multinomial",
    "aligned": "Add Sub Mul Div Pow Mod BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot PRelu Max Min Sum Mean "
    "Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Not Where Clip Cast CastLike Identity Dropout IsNaN IsInf "
    "Abs Neg Exp Log Sqrt Reciprocal Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Tanh Sigmoid Relu Erf "
    "Floor Ceil Round Sign Softplus Softsign Elu Selu Celu LeakyRelu ThresholdedRelu HardSigmoid HardSwish Gelu Mish "
    "Shrink Swish",
    "per_sample": "Conv ConvTranspose MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool GlobalLpPool "
    "BatchNormalization InstanceNormalization LRN DepthToSpace SpaceToDepth",
}
KILN_CATEGORIES: dict[str, str] = {"contracting": "Fused"}  # kiln's own ops (a fused product, attention)


def declare() -> None:
    """Give every registered op its categories (ops kiln does not define yet, such as
    Multinomial, are categorized when they are)."""
    for category, ops in CATEGORIES.items():
        declare_trait(category, [op for op in ops.split() if ("", op) in REGISTRY])
    for category, ops in KILN_CATEGORIES.items():
        declare_trait(category, ops.split(), domain="kiln")
