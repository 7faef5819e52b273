"""Attention as one kernel: ``MatMul(Q, K^T) -> scale/mask chain -> Softmax -> MatMul(., V)``.

Per batch element (b, h) and query row i, the Lk scores live in a scratch row of the arena: they
are accumulated as ``s += Q[i, d] * K^T[d, :]`` (contiguous, vectorized), finished by the fused
chain (scale, mask: any elementwise ops, broadcast operands included), turned into probabilities
(max, exp with a double-precision sum, one normalization), and immediately consumed by
``O[i, :] += p_j * V[j, :]``. The [.., Lq, Lk] score tensor is never written to memory. Rows of
different (b, h) run on different cores.
"""

from __future__ import annotations

import math

from kiln.errors import KilnError
from kiln.ir.graph import Node
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower.engine import WEIGHT_FORMATS, batch_position, compose_chain, epilogue_helper
from kiln.lower.kir import (
    GROUP_ROWS,
    Assign,
    AttentionOperand,
    AttentionSpec,
    Binary,
    Cast,
    Const,
    Expr,
    For,
    Kernel,
    Let,
    Load,
    Schedule,
    Select,
    Stmt,
    Store,
    Unary,
    add,
    buffers_in,
    i64,
)
from kiln.lower.lowering import CannotLower, Lowerer
from kiln.lower.pointwise import FLOAT_OPS
from kiln.passes.fuse import attention_view, transpose_perm

F32, F64 = DType.FLOAT32, DType.FLOAT64


def lower_attention(lw: Lowerer, node: Node) -> list[Kernel]:
    if "attention" not in lw.target.engines:
        raise CannotLower(f"target {lw.target.name} has no attention driver (the group runs on the reference)")
    body = node.attrs["body"]
    bindings = dict(zip(body.inputs, node.inputs))
    # [Transpose of Q / K^T / V ...] MatMul, chain..., Softmax, MatMul [Transpose of the output]
    nodes = list(body.nodes)
    softmax = next(i for i, n in enumerate(nodes) if n.op in ("Softmax", "SafeSoftmax"))
    safe = nodes[softmax].op == "SafeSoftmax"  # a fully masked row: zeros, not NaN
    lead = next(i for i, n in enumerate(nodes) if n.op != "Transpose")
    first, chain, second, tail = nodes[lead], nodes[lead + 1 : softmax], nodes[softmax + 1], nodes[softmax + 2 :]
    # operands a Transpose rearranges are read in place through strides: each logical operand's
    # stored tensor and the permutation that reads it (the identity when nothing was folded)
    folded = {n.outputs[0]: (bindings[n.inputs[0]], transpose_perm(n)) for n in nodes[:lead]}
    logical = (first.inputs[0], first.inputs[1], second.inputs[1])
    placed = [folded[x] if x in folded else (bindings[x], tuple(range(len(x.type.shape)))) for x in logical]  # type: ignore[union-attr, arg-type]
    (q, _), (kt, _), (v, _) = placed
    out = node.outputs[0]
    q_shape, kt_shape, v_shape = (tuple(x.type.shape) for x in logical)  # type: ignore[union-attr, arg-type]
    out_shape = tuple(second.outputs[0].type.shape)  # type: ignore[union-attr, arg-type]
    batch_shape = out_shape[:-2]
    views = [attention_view(lw.shape(stored), perm, False, batch_shape, lw.layout(stored)) for stored, perm in placed]
    views.append(
        attention_view(lw.shape(out), transpose_perm(tail[0]), inverse=True)
        if tail
        else attention_view(out_shape, tuple(range(len(out_shape))), inverse=False)
    )
    queries, depth = q_shape[-2:]
    keys, width = kt_shape[-1], v_shape[-1]
    if kt_shape[-2] != depth or v_shape[-2] != keys:
        raise CannotLower("attention operands do not chain")
    scores_shape = (*batch_shape, queries, keys)
    compose = compose_chain(lw, chain, bindings, scores_shape, first.outputs[0])
    q_buf, kt_buf, v_buf, dst = lw.buffer(q), lw.buffer(kt), lw.buffer(v), lw.buffer(out)
    if all(b.dtype is F32 for b in (q_buf, kt_buf, v_buf, dst)) and all(view is not None for view in views):
        sizes, buffers = (queries, keys, depth, width), (q_buf, kt_buf, v_buf, dst)
        return [_attention_driver(lw, node, compose if chain else None, batch_shape, sizes, buffers, views, safe)]
    if any(lw.layout(stored) != lw.shape(stored) for stored, _ in placed):
        raise KilnError(f"node {node.label}: a cache laid out in place is read by the float32 driver only (kiln bug)")
    if folded or tail:  # the fusion pass folds Transposes only where the driver's strides can express them
        raise CannotLower("attention with folded Transposes needs the float32 driver")
    if any(tuple(x[:-2]) != tuple(batch_shape) for x in (q_shape, kt_shape, v_shape)):
        raise CannotLower("broadcasting attention (shared K/V heads) needs the float32 driver")
    sizes, buffers = (queries, keys, depth, width), (q_buf, kt_buf, v_buf, dst)
    return [_attention_loops(lw, node, compose, batch_shape, sizes, buffers, safe)]


def _attention_loops(lw: Lowerer, node: Node, compose, batch_shape, sizes, buffers, safe) -> Kernel:  # type: ignore[no-untyped-def]
    """Attention as loop nests (any dtype): per (batch, head) and query row, the scores row in a
    scratch buffer, its max, exp and sum, then the weighted sum of V."""
    queries, keys, depth, width = sizes
    q_buf, kt_buf, v_buf, dst = buffers
    batch = size_product(batch_shape) if batch_shape else 1
    body = node.attrs["body"]
    row = lw.scratch_buffer(F32, batch * keys, hint="scores")

    bh, i, d, j = lw.index("bh"), lw.index("i"), lw.index("d"), lw.index("j")
    # loops over independent elements get their own index names, so the schedule can SIMD them
    # (the max and sum loops carry a scalar from one key to the next and stay scalar)
    jv, dv = lw.index("jv"), lw.index("dv")

    def row_at(key: Expr) -> Expr:  # this (b, h)'s scratch row
        return add(Binary("*", bh, i64(keys)), key)

    at = row_at(j)
    q_value = lw.scalar(F32, "q")
    high, total, inverse, p = lw.scalar(F32, "m"), lw.scalar(F64, "sum"), lw.scalar(F32, "inv"), lw.scalar(F32, "p")
    position: list[Expr] = [*batch_position(bh, batch_shape), i, jv] if batch_shape else [i, jv]
    q_at = add(Binary("*", bh, i64(queries * depth)), add(Binary("*", i, i64(depth)), d))
    kt_at = add(Binary("*", bh, i64(depth * keys)), add(Binary("*", d, i64(keys)), jv))
    out_at = add(Binary("*", bh, i64(queries * width)), add(Binary("*", i, i64(width)), dv))
    v_at = add(Binary("*", bh, i64(keys * width)), add(Binary("*", j, i64(width)), dv))
    vat = row_at(jv)
    per_row: list[Stmt] = [
        For(jv, keys, [Store(row, vat, Const(0.0, F32))]),
        For(
            d,
            depth,
            [
                Let(q_value, Load(q_buf, q_at)),
                For(
                    jv, keys, [Store(row, vat, Binary("+", Load(row, vat), Binary("*", q_value, Load(kt_buf, kt_at))))]
                ),
            ],
        ),
        For(jv, keys, [Store(row, vat, compose(position, Load(row, vat), None))]),
        Let(high, Const(-math.inf, F32)),
        For(j, keys, [Assign(high, FLOAT_OPS["Max"]([high, Load(row, at)], {}, F32))]),
        # exp over the row (float32: the target may use a fast version), then its sum in double
        For(jv, keys, [Store(row, vat, Unary("exp", Binary("-", Load(row, vat), high)))]),
        Let(total, Const(0.0, F64)),
        For(j, keys, [Assign(total, Binary("+", total, Cast(F64, Load(row, at))))]),
        Let(inverse, Cast(F32, Binary("/", Const(1.0, F64), total))),
        For(dv, width, [Store(dst, out_at, Const(0.0, F32))]),
        For(
            j,
            keys,
            [
                # NaN-safe: a fully masked row's total is NaN, and its probabilities become zeros
                Let(p, Select(Binary("!=", total, total), Const(0.0, F32), Binary("*", Load(row, at), inverse)))
                if safe
                else Let(p, Binary("*", Load(row, at), inverse)),
                For(dv, width, [Store(dst, out_at, Binary("+", Load(dst, out_at), Binary("*", p, Load(v_buf, v_at))))]),
            ],
        ),
    ]
    stmts: list[Stmt] = [For(bh, batch, [For(i, queries, per_row)])]
    lw.kernel_count += 1
    kernel = Kernel(
        f"k{lw.kernel_count}",
        "attention",
        stmts,
        [b for b in buffers_in(stmts) if b is not dst],
        [dst, row],
        [f"{node.name}: " + ", ".join(n.op for n in body.nodes)],
        Schedule(parallel=bh.name if batch > 1 else None, vectorize=jv.name, simd=(dv.name,)),
        flops=2 * batch * queries * keys * (depth + width),
    )
    return kernel


def _attention_driver(lw: Lowerer, node: Node, compose, batch_shape, sizes, buffers, views, safe) -> Kernel:  # type: ignore[no-untyped-def]
    """float32 attention through ``kiln_attention`` (kiln/backends/cpu/attention.c): per (batch, head)
    slice two engine products and a row softmax over a per-thread scores block in the arena; the
    scale/mask chain is an epilogue helper reading that block through the descriptor. ``views``:
    how Q, K^T, V and the output sit in their buffers (``attention_view``), so heads are split and
    merged by the products' strides, not by copies."""
    queries, keys, depth, width = sizes
    q_buf, kt_buf, v_buf, dst = buffers
    batch = size_product(batch_shape) if batch_shape else 1
    threads = max(1, min(lw.target.cores, batch))  # participants (at most): the target's cores
    scores = lw.scratch_buffer(F32, threads * queries * keys, hint="scores")
    lw.kernel_count += 1
    name = f"k{lw.kernel_count}"

    def position_of(bt: Expr, row: Expr, col: Expr) -> list[Expr]:
        return [*batch_position(bt, batch_shape), row, col] if batch_shape else [row, col]

    def flat_of(bt: Expr, row: Expr, col: Expr) -> Expr:  # within the slice's block
        return add(Binary("*", row, i64(keys)), col)

    helper = None
    if compose is not None:
        helper = epilogue_helper(
            lw,
            name,
            scores,
            position_of,
            flat_of,
            lambda position, value, flat: compose(position, value, None),
            None,
            True,
        )
    operands = []  # how Q, K^T, V and the output sit in their buffers
    for buffer, (outer, outer_stride, inner, inner_stride, row_stride, col_stride) in zip(buffers, views):
        assert outer * inner == batch, (views, batch)
        operands.append(AttentionOperand(buffer, inner, outer_stride, inner_stride, row_stride, col_stride))
    # bf16 compiles take the products of attention to the bf16 path too (the avx512 targets'
    # 32-column panels; softmax and the chain stay float32); int8 compiles keep them float32
    precision = "bf16" if lw.precision == "bf16" and lw.target.gemm_cols == 32 else "fp32"
    wide = lw.precision in WEIGHT_FORMATS and bool(WEIGHT_FORMATS[lw.precision][3]) and lw.target.gemm_cols == 32
    # slices that share K and V (K's and V's inner slice dim repeats, stride 0: a grouped head's query
    # heads) are taken a few together on a decode step's rows, in blocks of their own
    _, _, k_inner, k_stride, _, _ = views[1]
    _, _, v_inner, v_stride, _, _ = views[2]
    shared = k_inner > 1 and k_stride == 0 and v_inner == k_inner and v_stride == 0
    rows = lw.scratch_buffer(F32, threads * GROUP_ROWS * keys, hint="rows") if shared else None
    call = AttentionSpec(
        batch, queries, keys, depth, width, *operands, scores, threads, helper, safe, precision, wide, rows
    )
    scratch = [scores, *([rows] if rows is not None else [])]
    return Kernel(
        name,
        "attention",
        [call],
        [q_buf, kt_buf, v_buf, *[b for b in buffers_in([call]) if b not in (q_buf, kt_buf, v_buf, dst, *scratch)]],
        [dst, *scratch],
        [f"{node.name}: " + ", ".join(n.op for n in node.attrs["body"].nodes)],
        flops=2 * batch * queries * keys * (depth + width),
    )
