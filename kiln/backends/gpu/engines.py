"""The gpu target's engine kernels: a matrix product or convolution (``GemmSpec``) as a tiled
``tl.dot`` kernel, and attention (``AttentionSpec``) as one flash-attention kernel, each with its
fused epilogue applied to a register tile (the helper's per-element work, rendered by
``render.Statements`` with the tile's rows and columns as its loop indices)."""

from __future__ import annotations

from collections.abc import Sequence

from kiln.backends.gpu.render import CannotRender, Context, Launch, Statements, function_text, p2
from kiln.lower.kir import (
    AttentionOperand,
    AttentionSpec,
    Buffer,
    For,
    Function,
    GemmSpec,
    If,
    Im2colOperand,
    Index,
    Kernel,
    MatrixOperand,
    PackedOperand,
    Scalar,
    Stmt,
    Store,
)


def _edge_nest(helper: Function) -> tuple[Index, Index, list[Stmt]]:
    """The (row, column) loops of an epilogue helper's general (edge-tile) nest and their body."""

    def find(body: Sequence[Stmt]) -> tuple[Index, Index, list[Stmt]] | None:
        for stmt in reversed(list(body)):
            if isinstance(stmt, If):
                found = find(stmt.body)
                if found:
                    return found
            if isinstance(stmt, For) and len(stmt.body) == 1 and isinstance(stmt.body[0], For):
                inner = stmt.body[0]
                if isinstance(stmt.start, Scalar) and isinstance(inner.start, Scalar):
                    return stmt.index, inner.index, inner.body
        return None

    found = find(helper.body)
    if found is None:
        raise CannotRender(f"epilogue {helper.name} has no row/column nest")
    return found


def _epilogue(ctx: Context, helper: Function, block: Buffer, value: str, mask: str, rows: str, cols: str) -> None:
    """The helper's per-element work on a register tile: its loads of ``block`` at the element it
    stores are ``value``; (bt, row, column) are the tile's."""
    row, col, body = _edge_nest(helper)
    ctx.env[row.name], ctx.env[col.name] = rows, cols
    for param in helper.params:
        if param.name == "bt":
            ctx.env[param.name] = "bt"
    stores = [s for s in body if isinstance(s, Store) and s.buffer is block]
    for store in stores:
        ctx.override.append((block, store.index, value))
    Statements(ctx).block(body, mask, mask)
    ctx.override.clear()


def _operand_address(op: MatrixOperand | PackedOperand, rows: str, cols: str, k: int, side: str) -> tuple[str, int]:
    """Where element (row, column) of a product operand sits in its buffer at the first k step, and
    how far one step along k moves it (every layout here is affine in k: the loop only adds)."""
    if isinstance(op, MatrixOperand):
        step = op.col_stride if side == "a" else op.row_stride
        return f"bt * {op.batch_stride} + {rows} * {op.row_stride} + {cols} * {op.col_stride}", step
    if op.layout != "f32":
        raise CannotRender(f"packed layout {op.layout} is the CPU engine's reduced-precision one")
    panel = op.panel
    if side == "a":  # [batch][ceil(m/panel)][k][panel]
        return (
            f"bt * {op.batch_stride} + ({rows} // {panel}) * {k * panel} + {cols} * {panel} + {rows} % {panel}",
            panel,
        )
    return f"bt * {op.batch_stride} + ({cols} // {panel}) * {k * panel} + {rows} * {panel} + {cols} % {panel}", panel


def gemm_blocks(m: int, n: int, k: int) -> dict[str, int]:
    """Tile sizes of a product: 64x64 output tiles (at least 16, tl.dot's minimum), 32-deep steps;
    a short K takes two 16-deep steps rather than one (a k loop of one step is unrolled whole, and
    ptxas then spills VGG's first convolution, K = 27, to the stack)."""
    return {"BM": min(64, max(16, p2(m))), "BN": min(64, max(16, p2(n))), "BK": min(32, max(16, p2(k) // 2))}


def render_gemm(name: str, kernel: Kernel, call: GemmSpec, table: dict[Buffer, int]) -> tuple[str, Launch]:
    if call.precision != "fp32" or call.quant is not None:
        raise CannotRender(f"the gpu target multiplies in fp32, not {call.precision}")
    ctx = Context("[BM, BN]", "_z")
    m, n, k = call.m, call.n, call.k
    blocks = gemm_blocks(m, n, k)
    a_ptr, b_ptr = ctx.pointer(call.a.buffer), ctx.pointer(call.b.buffer)
    out = ctx.pointer(call.out)
    even = k % blocks["BK"] == 0  # no k step runs past K: its loads need no k mask
    index = "tl.int64"  # (32-bit tile indices were tried: ptxas then spills the implicit GEMMs on sm_80)
    a_at, a_step = _operand_address(call.a, "rm[:, None]", "rk[None, :]", k, "a")
    head = [
        "    _zero = tl.full([], 0, tl.int64)",
        f"    bt = tl.program_id(2).to({index})",
        f"    rm = tl.program_id(0).to({index}) * BM + tl.arange(0, BM).to({index})",
        f"    rn = tl.program_id(1).to({index}) * BN + tl.arange(0, BN).to({index})",
        f"    rk = tl.arange(0, BK).to({index})",
        "    acc = tl.full([BM, BN], 0, tl.float32)",
        f"    a_at = {a_ptr} + ({a_at})",
        f"    a_rows = rm[:, None] < {m}",
    ]
    kind = "matmul"
    if isinstance(call.b, Im2colOperand):
        # the convolution's input read as its im2col matrix: each k step's addresses computed here
        kind = "conv"
        _, h, w, kh, kw, sh, sw, dh, dw, pt, pl, _, ow = call.b.geometry
        head += [
            f"    ih0 = (rn[None, :] // {ow}) * {sh} - {pt}",
            f"    iw0 = (rn[None, :] % {ow}) * {sw} - {pl}",
            f"    b_cols = rn[None, :] < {n}",
            f"    for _k in range(0, {k}, BK):",
            "        kk = _k + rk",
            f"        a = tl.load(a_at + _k * {a_step}, mask=a_rows{'' if even else f' & (kk[None, :] < {k})'}, other=0.0)",
            "        br = kk[:, None]",
            f"        tap = br % {kh * kw}",
            f"        ih = ih0 + (tap // {kw}) * {dh}",
            f"        iw = iw0 + (tap % {kw}) * {dw}",
            f"        inside = (br < {k}) & b_cols & (ih >= 0) & (ih < {h}) & (iw >= 0) & (iw < {w})",
            f"        b = tl.load({b_ptr} + (bt * {call.b.batch_stride} + (br // {kh * kw}) * {h * w} + ih * {w} + iw), "
            "mask=inside, other=0.0)",
        ]
    elif isinstance(call.b, (MatrixOperand, PackedOperand)):
        b_at, b_step = _operand_address(call.b, "rk[:, None]", "rn[None, :]", k, "b")
        head += [
            f"    b_at = {b_ptr} + ({b_at})",
            f"    b_cols = rn[None, :] < {n}",
            f"    for _k in range(0, {k}, BK):",
            f"        a = tl.load(a_at + _k * {a_step}, mask=a_rows{'' if even else f' & ((_k + rk)[None, :] < {k})'}, other=0.0)",
            f"        b = tl.load(b_at + _k * {b_step}, mask=b_cols{'' if even else f' & ((_k + rk)[:, None] < {k})'}, other=0.0)",
        ]
    else:
        raise CannotRender(f"product operand {type(call.b).__name__} is the CPU engine's")
    head += [
        '        acc = tl.dot(a, b, acc, input_precision="ieee")',
        "    ri = rm[:, None]",
        "    rj = rn[None, :]",
        "    _z = tl.full([BM, BN], 0, tl.int64)",
        f"    _tile = (ri < {m}) & (rj < {n})",
    ]
    if call.epilogue is not None:
        _epilogue(ctx, call.epilogue, call.out, "acc", "_tile", "ri", "rj")
    else:
        ctx.emit(f"tl.store({out} + (bt * {call.out_batch_stride} + ri * {call.ldc} + rj), acc, mask=_tile)")
    source, signature = function_text(name, ctx, list(blocks), head)
    grid = (-(-m // blocks["BM"]), -(-n // blocks["BN"]), call.batch)
    slots = tuple(table[b] for b in ctx.pointers)
    launch = Launch(name, kernel.name, grid, slots, blocks, 4, 3, kind, signature, (("BM", m), ("BN", n)))
    return source, launch


def _slice_start(op: AttentionOperand) -> str:
    return f"(bt // {op.inner}) * {op.outer_stride} + (bt % {op.inner}) * {op.inner_stride}"


def attention_blocks(queries: int, keys: int, depth: int, width: int) -> dict[str, int]:
    """64 queries x 32 keys per step (with 8 warps: 128 registers a thread for head size 64, no
    spills on sm_80/sm_90; 64 keys a step spill), the whole head depth and width."""
    return {
        "BQ": min(64, max(16, p2(queries))),
        "BKEY": min(32, max(16, p2(keys))),
        "BD": max(16, p2(depth)),
        "BW": max(16, p2(width)),
    }


def render_attention(name: str, kernel: Kernel, call: AttentionSpec, table: dict[Buffer, int]) -> tuple[str, Launch]:
    if call.precision != "fp32":
        raise CannotRender(f"the gpu target's attention computes in fp32, not {call.precision}")
    ctx = Context("[BQ, BKEY]", "_z")
    q, kt, v, out = (ctx.pointer(op.buffer) for op in (call.q, call.kt, call.v, call.out))
    nq, nk, d, w = call.queries, call.keys, call.depth, call.width
    head = [
        "    _zero = tl.full([], 0, tl.int64)",
        "    bt = tl.program_id(1).to(tl.int64)",
        "    rq = tl.program_id(0).to(tl.int64) * BQ + tl.arange(0, BQ).to(tl.int64)",
        "    rd = tl.arange(0, BD).to(tl.int64)",
        "    rw = tl.arange(0, BW).to(tl.int64)",
        f"    qt = tl.load({q} + ({_slice_start(call.q)} + rq[:, None] * {call.q.row_stride} + rd[None, :] * "
        f"{call.q.col_stride}), mask=(rq[:, None] < {nq}) & (rd[None, :] < {d}), other=0.0)",
        '    m_i = tl.full([BQ], float("-inf"), tl.float32)',
        "    l_i = tl.full([BQ], 0, tl.float32)",
        "    acc = tl.full([BQ, BW], 0, tl.float32)",
        "    _z = tl.full([BQ, BKEY], 0, tl.int64)",
        f"    for _s in range(0, {nk}, BKEY):",
        "        rk = _s + tl.arange(0, BKEY).to(tl.int64)",
        f"        kb = tl.load({kt} + ({_slice_start(call.kt)} + rd[:, None] * {call.kt.row_stride} + rk[None, :] * "
        f"{call.kt.col_stride}), mask=(rd[:, None] < {d}) & (rk[None, :] < {nk}), other=0.0)",
        '        sc = tl.dot(qt, kb, input_precision="ieee")',
        "        ri = rq[:, None]",
        "        rj = rk[None, :]",
        f"        _tile = (ri < {nq}) & (rj < {nk})",
    ]
    body_indent = "        "
    ctx.indent = body_indent
    if call.epilogue is not None:
        ctx.intercept[call.scores] = "sc"
        _epilogue(ctx, call.epilogue, call.scores, "sc", "_tile", "ri", "rj")
    tail = [
        f'sc = tl.where(rj < {nk}, sc, float("-inf"))',
        "m_new = tl.maximum(m_i, tl.reduce(sc, 1, tl.standard._elementwise_max))",
        'm_use = tl.where(m_new == float("-inf"), 0.0, m_new)',
        "p = tl.exp(sc - m_use[:, None])",
        "alpha = tl.exp(m_i - m_use)",
        "l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)",
        f"vb = tl.load({v} + ({_slice_start(call.v)} + rk[:, None] * {call.v.row_stride} + rw[None, :] * "
        f"{call.v.col_stride}), mask=(rk[:, None] < {nk}) & (rw[None, :] < {w}), other=0.0)",
        'acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")',
        "m_i = m_new",
    ]
    ctx.lines.extend(body_indent + line for line in tail)
    result = "tl.where(l_i[:, None] == 0, 0.0, acc / l_i[:, None])" if call.safe else "acc / l_i[:, None]"
    ctx.lines.extend(
        [
            f"    result = {result}",
            f"    tl.store({out} + ({_slice_start(call.out)} + rq[:, None] * {call.out.row_stride} + rw[None, :] * "
            f"{call.out.col_stride}), result, mask=(rq[:, None] < {nq}) & (rw[None, :] < {w}))",
        ]
    )
    ctx.pointers.pop(call.scores, None)  # the scores never reach memory
    blocks = attention_blocks(nq, nk, d, w)
    source, signature = function_text(name, ctx, list(blocks), head)
    grid = (-(-nq // blocks["BQ"]), call.batch)
    warps = 8 if blocks["BQ"] * max(blocks["BD"], blocks["BW"]) >= 4096 else 4
    launch = Launch(
        name,
        kernel.name,
        grid,
        tuple(table[b] for b in ctx.pointers),
        blocks,
        warps,
        2,
        "attention",
        signature,
        (("BQ", nq),),
    )
    return source, launch
