"""How the C renderer writes engine calls (``c.py``'s statements call ``engine_call``): the
matrix-multiply engine's ``kiln_gemm`` descriptor (gemm.c, and its reduced-precision paths:
gemm_lowp.c, gemm_bf16.c, gemm_int8.c), the Winograd transforms (winograd.c) and the attention
driver (attention.c)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.lower.kir import (
    AttentionSpec,
    DirectOperand,
    EngineCall,
    For,
    GemmSpec,
    If,
    Im2colOperand,
    MatrixOperand,
    PackedOperand,
    Stmt,
    TileFinish,
    WinogradInput,
    WinogradOutput,
    epilogue_of,
)


def narrow_products(body: Sequence[Stmt]) -> set[str]:
    """The reduced-precision paths (``bf16``, ``int8``, ``w8``, ``w4``, ``wbf16``) ``body``'s engine
    calls use."""
    found: set[str] = set()
    for s in body:
        if isinstance(s, (GemmSpec, AttentionSpec)) and s.precision != "fp32":
            found.add(s.precision)
            if isinstance(s, GemmSpec) and s.prompt == "bf16":  # (gemm_wbf16.c: the bf16 kernels, both widenings)
                found |= {"bf16", "wbf16", "w4", "w8"}
            if isinstance(s, GemmSpec) and s.prompt == "int8":  # (gemm_wa8.c: the int8 kernels, both widenings)
                found |= {"int8", "wa8", "w4", "w8"}
        if isinstance(s, AttentionSpec) and s.wide:
            found |= {"bf16", "wbf16", "w4", "w8"}
        elif isinstance(s, (For, If)):
            found |= narrow_products(s.body)
    return found


def _operand_fields(name: str, operand: object) -> list[tuple[str, str]]:
    """The ``kiln_gemm`` members describing operand ``name`` ('a' or 'b') (see gemm.c)."""
    if isinstance(operand, PackedOperand) and operand.layout != "f32":  # the bf16 path's (gemm_bf16.c)
        return [(f"{name}_low", operand.buffer.name), (f"{name}_packed_size", str(operand.buffer.size)),
                (f"{name}_pbs", str(operand.batch_stride))]  # fmt: skip
    if isinstance(operand, PackedOperand):
        return [(f"{name}_packed", operand.buffer.name), (f"{name}_packed_size", str(operand.buffer.size)),
                (f"{name}_pbs", str(operand.batch_stride))]  # fmt: skip
    if isinstance(operand, DirectOperand):  # the reduced-precision direct convolution (gemm_lowp.c)
        geometry = "(const int64_t[]){" + ", ".join(_integer(v) for v in operand.geometry) + "}"
        return [("b", operand.buffer.name), ("b_size", str(operand.buffer.size)),
                ("b_bs", str(operand.batch_stride)), ("conv", geometry), ("direct", "1")]  # fmt: skip
    if isinstance(operand, Im2colOperand):
        geometry = "(const int64_t[]){" + ", ".join(_integer(v) for v in operand.geometry) + "}"
        return [("b", operand.buffer.name), ("b_size", str(operand.buffer.size)),
                ("b_bs", str(operand.batch_stride)), ("conv", geometry), ("pack_b", "kiln_pack_im2col")]  # fmt: skip
    assert isinstance(operand, MatrixOperand), operand
    return [(name, operand.buffer.name), (f"{name}_size", str(operand.buffer.size)),
            (f"{name}_bs", str(operand.batch_stride)), (f"{name}_rs", str(operand.row_stride)),
            (f"{name}_cs", str(operand.col_stride)), (f"pack_{name}", f"kiln_pack_{name}_strided")]  # fmt: skip


def _integer(value: object) -> str:
    """A size: a number, or a run-time size's C expression (``kiln.driver.spatial``)."""
    return str(int(value)) if isinstance(value, (int, np.integer)) else str(value)  # type: ignore[call-overload]


def _float(value: float) -> str:
    if value == float("inf"):
        return "INFINITY"
    if value == float("-inf"):
        return "-INFINITY"
    return f"{float(value)!r}f"


def engine_call(stmt: EngineCall, indent: str) -> list[str]:
    """An engine call as a call into kiln's C drivers: the matrix-multiply engine's ``kiln_gemm``
    descriptor (gemm.c), the Winograd transforms (winograd.c) and the attention driver
    (attention.c); a descriptor carries the epilogue and the segment's buffer table."""
    lines = [f"{indent}{{", f"{indent}  kiln_gemm g = {{0}};"]
    epilogue = epilogue_of(stmt)
    finish = stmt.finish if isinstance(stmt, GemmSpec) and stmt.precision in ("fp32", "w8", "w4") else None
    only = isinstance(stmt, GemmSpec) and stmt.requant is not None and stmt.requant.only
    if only:  # int8 bytes (bf16 halves) only: the epilogue on each tile's scratch (gemm_lowp.c)
        finish = stmt.finish or TileFinish()  # (no epilogue: the bounds still say "none")
        lines.append(f"{indent}  g.r_only = 1;")
    if finish is not None:  # the same epilogue, in the micro-kernel's registers (gemm.c)
        lines += [f"{indent}  g.f_on = {int(not only)};", f"{indent}  g.f_relu = {int(finish.relu)};"]
        lines += [f"{indent}  g.f_{name} = {_float(value)};" for name, value in (("lo", finish.lo), ("hi", finish.hi))]
        lines += [f"{indent}  g.f_{name} = {b.name};" for name, b in (("row", finish.row), ("col", finish.col)) if b]
    elif epilogue is not None:
        lines.append(f"{indent}  g.epilogue = {epilogue.name};")
        lines.append(f"{indent}  g.buffers = buffers;")
    if isinstance(stmt, GemmSpec):
        fields = [("batch", stmt.batch), ("M", stmt.m), ("N", stmt.n), ("K", stmt.k)]
        fields += [*_operand_fields("a", stmt.a), *_operand_fields("b", stmt.b)]
        fields += [("c", stmt.out.name), ("c_size", stmt.out.size), ("c_bs", stmt.out_batch_stride), ("ldc", stmt.ldc)]
        fields += [(name, value) for name, value in zip(("mc", "nc", "kc"), stmt.blocking) if value]
        if stmt.quant is not None:
            q = stmt.quant
            fields += [("q_scale", q.scale.name), ("q_offset", q.offset.name), ("q_rows", int(q.rows)),
                       ("q_inv", f"{q.inv!r}f"), ("q_zero", q.zero), ("q_max", q.qmax)]  # fmt: skip
            if q.given is not None:  # quantized by their producer (its Requantize)
                fields += [("q_given", q.given.name), ("q_given_size", q.given.size)]
        if stmt.scales is not None:  # weight-only int8 (int4): B's column (float16 group) scales (gemm_w8.c, gemm_w4.c)
            fields.append(("q_half" if stmt.precision == "w4" else "q_scale", stmt.scales.name))
        if stmt.group:
            fields.append(("q_group", stmt.group))
        if stmt.offsets is not None:
            fields.append(("q_min", stmt.offsets.name))
        if stmt.prompt:  # a prompt's rows through the bf16 or int8 kernels (gemm_wbf16.c, gemm_wa8.c)
            fields.append(("q_wide", {"bf16": "kiln_gemm_wbf16_run", "int8": "kiln_gemm_wa8_run"}[stmt.prompt]))
        if stmt.given is not None:  # rounded to bf16 by their producer (its Requantize)
            fields += [("h_given", stmt.given.name), ("q_given_size", stmt.given.size)]
        if stmt.requant is not None and stmt.requant.bf16:
            fields.append(("h_out", stmt.requant.dest.name))
        elif stmt.requant is not None:
            r = stmt.requant
            fields += [("r_out", r.dest.name), ("r_inv", f"{r.inv!r}f"), ("r_zero", r.zero), ("r_max", r.qmax)]
        lines.extend(f"{indent}  g.{name} = {value};" for name, value in fields)
        path = {"bf16": "bf16_", "int8": "int8_", "w8": "w8_", "w4": "w4_"}.get(stmt.precision, "")
        lines.append(f"{indent}  kiln_gemm_{path}run(&g);")
    elif isinstance(stmt, WinogradInput):
        args = [stmt.tile, stmt.source.name, stmt.dest.name, stmt.batch, stmt.channels, stmt.height, stmt.width,
                stmt.pad_top, stmt.pad_left, stmt.tiles_h, stmt.tiles_w]  # fmt: skip
        lines.append(f"{indent}  kiln_winograd_in({', '.join(str(a) for a in args)});")
    elif isinstance(stmt, WinogradOutput):
        bias = stmt.bias.name if stmt.bias is not None else "(const float *)0"
        args = [stmt.tile, stmt.products.name, stmt.dest.name, bias, stmt.batch, stmt.out_channels, stmt.out_h,
                stmt.out_w, stmt.tiles_h, stmt.tiles_w, int(stmt.tile_major), "&g"]  # fmt: skip
        lines.append(f"{indent}  kiln_winograd_out({', '.join(str(a) for a in args)});")
    else:
        args: list[object] = [stmt.batch, stmt.queries, stmt.keys, stmt.depth, stmt.width]
        for operand in (stmt.q, stmt.kt, stmt.v, stmt.out):
            args += [operand.buffer.name, operand.buffer.size, operand.inner, operand.outer_stride,
                     operand.inner_stride, operand.row_stride, operand.col_stride]  # fmt: skip
        rows = stmt.rows.name if stmt.rows is not None else "(float *)0"
        args += [stmt.scores.name, rows, stmt.threads, int(stmt.safe), "&g"]
        wide = "kiln_gemm_wide_run" if stmt.wide else "kiln_gemm_run"  # (gemm_wbf16.c: by the rows)
        args.append("kiln_gemm_bf16_run" if stmt.precision == "bf16" else wide)
        lines.append(f"{indent}  kiln_attention({', '.join(str(a) for a in args)});")
    lines.append(f"{indent}}}")
    return lines
