"""What each engine call of the kernel IR computes, in NumPy: the oracle that lets the kernel-IR
interpreter run engine kernels (and so a target with no engines of its own test the same
lowering). Every operand's extent is checked against its buffer first: a call that would read or
write outside a buffer is an error naming it, never a silent wrong answer.

``run(machine, call)``: ``machine`` is the interpreter running the kernel (its ``buffers``, its
``run(body, env)`` for the epilogue helpers, its ``fail(message)`` for out-of-range operands).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from kiln.lower.kir import (
    AttentionOperand,
    AttentionSpec,
    Buffer,
    Function,
    GemmSpec,
    Im2colOperand,
    MatrixOperand,
    PackedOperand,
    WinogradInput,
    WinogradOutput,
)
from kiln.lower.winograd import TRANSFORMS


def run(machine: Any, call: Any) -> None:
    if isinstance(call, GemmSpec):
        _gemm(machine, call)
    elif isinstance(call, WinogradInput):
        _winograd_input(machine, call)
    elif isinstance(call, WinogradOutput):
        _winograd_output(machine, call)
    elif isinstance(call, AttentionSpec):
        _attention(machine, call)
    else:
        raise TypeError(f"not an engine call: {call!r}")


def _array(machine: Any, buffer: Buffer) -> np.ndarray:
    array = machine.buffers.get(buffer)
    if array is None:
        machine.fail(f"buffer {buffer.name} was not given")
    return array


def _strided(
    machine: Any, buffer: Buffer, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], what: str
) -> np.ndarray:
    """A read/write view of ``buffer`` (elements) after checking every index it covers is inside."""
    array = _array(machine, buffer)
    low = offset + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    high = offset + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides))
    if 0 in shape:
        return np.empty(shape, array.dtype)
    if low < 0 or high >= array.size:
        machine.fail(f"{what} reads {buffer.name}[{low}..{high}] outside [0, {array.size})")
    item = array.itemsize
    return np.lib.stride_tricks.as_strided(array[offset:], shape, tuple(s * item for s in strides), writeable=True)


def _matrices(machine: Any, operand: Any, batch: int, rows: int, cols: int, what: str, pack_rows: bool) -> np.ndarray:
    """[batch, rows, cols] float64 copy of a gemm operand."""
    if isinstance(operand, MatrixOperand):
        view = _strided(
            machine,
            operand.buffer,
            0,
            (batch, rows, cols),
            (operand.batch_stride, operand.row_stride, operand.col_stride),
            what,
        )
        return view.astype(np.float64)
    if isinstance(operand, PackedOperand):  # panels of ``panel`` rows (A) or columns (B), k-major
        panel = operand.panel
        outer, depth = (rows, cols) if pack_rows else (cols, rows)
        panels = -(-outer // panel)
        view = _strided(
            machine,
            operand.buffer,
            0,
            (batch, panels, depth, panel),
            (operand.batch_stride, depth * panel, panel, 1),
            what,
        )
        whole = view.transpose(0, 1, 3, 2).reshape(batch, panels * panel, depth)[:, :outer]  # [b, outer, depth]
        return (whole if pack_rows else whole.transpose(0, 2, 1)).astype(np.float64)
    assert isinstance(operand, Im2colOperand), operand
    c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = operand.geometry
    images = _strided(machine, operand.buffer, 0, (batch, c, h, w), (operand.batch_stride, h * w, w, 1), what)
    padded = np.zeros(
        (batch, c, h + pt + (oh - 1) * sh + (kh - 1) * dh + 1, w + pl + (ow - 1) * sw + (kw - 1) * dw + 1)
    )
    padded[:, :, pt : pt + h, pl : pl + w] = images
    columns = np.empty((batch, c, kh, kw, oh, ow))
    for y in range(kh):
        for x in range(kw):
            columns[:, :, y, x] = padded[
                :, :, y * dh : y * dh + (oh - 1) * sh + 1 : sh, x * dw : x * dw + (ow - 1) * sw + 1 : sw
            ]
    return columns.reshape(batch, c * kh * kw, oh * ow)


def _epilogue(machine: Any, function: Function | None, batch: int, rows: int, cols: int) -> None:
    """The helper over whole outputs: (bt, 0, rows, 0, cols) for each batch element."""
    if function is None:
        return
    names = [p.name for p in function.params]
    for bt in range(batch):
        machine.run(function.body, dict(zip(names, (bt, 0, rows, 0, cols))))


def _gemm(machine: Any, call: GemmSpec) -> None:
    a = _matrices(machine, call.a, call.batch, call.m, call.k, "gemm operand A", pack_rows=True)
    b = _matrices(machine, call.b, call.batch, call.k, call.n, "gemm operand B", pack_rows=False)
    out = _strided(
        machine, call.out, 0, (call.batch, call.m, call.n), (call.out_batch_stride, call.ldc, 1), "gemm output"
    )
    out[...] = (a @ b).astype(out.dtype)
    _epilogue(machine, call.epilogue, call.batch, call.m, call.n)
    if call.requant is not None:  # the finished output also stored quantized (the C engine's formula)
        r = call.requant
        dest = _strided(
            machine, r.dest, 0, (call.batch, call.m, call.n), (call.out_batch_stride, call.ldc, 1), "requantized output"
        )
        if r.bf16:  # rounded to nearest even, as the bits of a bfloat16
            dest[...] = out.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
            return
        with np.errstate(invalid="ignore"):
            q = np.rint(out.astype(np.float32) * np.float32(r.inv)) + np.float32(r.zero)
        dest[...] = np.clip(np.nan_to_num(q, nan=0.0), 0, r.qmax).astype(dest.dtype)


def _winograd_input(machine: Any, call: WinogradInput) -> None:
    m, size = call.tile, call.tile + 2
    bt = np.asarray(TRANSFORMS[m]["BT"], np.float64)
    tiles = call.tiles_h * call.tiles_w
    image = _strided(
        machine, call.source, 0, (call.batch, call.channels, call.height, call.width),
        (call.channels * call.height * call.width, call.height * call.width, call.width, 1), "winograd input",
    )  # fmt: skip
    padded = np.zeros((call.batch, call.channels, call.tiles_h * m + 2, call.tiles_w * m + 2))
    rows, cols = min(call.height, padded.shape[2] - call.pad_top), min(call.width, padded.shape[3] - call.pad_left)
    padded[:, :, call.pad_top : call.pad_top + rows, call.pad_left : call.pad_left + cols] = image[:, :, :rows, :cols]
    dest = _strided(
        machine, call.dest, 0, (size * size, call.channels, call.batch * tiles),
        (call.channels * call.batch * tiles, call.batch * tiles, 1), "winograd transformed input",
    )  # fmt: skip
    for th in range(call.tiles_h):
        for tw in range(call.tiles_w):
            patch = padded[:, :, th * m : th * m + size, tw * m : tw * m + size]  # [n, c, size, size]
            v = np.einsum("ij,ncjk,lk->ncil", bt, patch, bt).reshape(call.batch, call.channels, size * size)
            for n in range(call.batch):
                dest[:, :, n * tiles + th * call.tiles_w + tw] = v[n].T
    dest[...] = dest.astype(np.float32)


def _winograd_output(machine: Any, call: WinogradOutput) -> None:
    m, size = call.tile, call.tile + 2
    at = np.asarray(TRANSFORMS[m]["AT"], np.float64)
    tiles = call.tiles_h * call.tiles_w
    count = call.batch * tiles  # [point][channel][tile], or [point][tile][channel] when tile-major
    strides = (
        (call.out_channels * count, 1, call.out_channels) if call.tile_major else (call.out_channels * count, count, 1)
    )
    products = _strided(
        machine, call.products, 0, (size * size, call.out_channels, count), strides, "winograd products"
    ).astype(np.float64)
    dest = _strided(
        machine, call.dest, 0, (call.batch, call.out_channels, call.out_h, call.out_w),
        (call.out_channels * call.out_h * call.out_w, call.out_h * call.out_w, call.out_w, 1), "winograd output",
    )  # fmt: skip
    bias = 0.0
    if call.bias is not None:
        bias = _strided(machine, call.bias, 0, (call.out_channels,), (1,), "winograd bias")[None, :, None, None]
    whole = np.zeros((call.batch, call.out_channels, call.tiles_h * m, call.tiles_w * m))
    for n in range(call.batch):
        for th in range(call.tiles_h):
            for tw in range(call.tiles_w):
                tile = products[:, :, n * tiles + th * call.tiles_w + tw].T.reshape(call.out_channels, size, size)
                whole[n, :, th * m : th * m + m, tw * m : tw * m + m] = np.einsum("ij,cjk,lk->cil", at, tile, at)
    dest[...] = (whole[:, :, : call.out_h, : call.out_w] + bias).astype(np.float32)
    _epilogue(machine, call.epilogue, call.batch, call.out_channels, call.out_h * call.out_w)


def _slice(machine: Any, operand: AttentionOperand, s: int, rows: int, cols: int, what: str) -> np.ndarray:
    outer, inner = divmod(s, operand.inner)
    offset = outer * operand.outer_stride + inner * operand.inner_stride
    return _strided(machine, operand.buffer, offset, (rows, cols), (operand.row_stride, operand.col_stride), what)


def _attention(machine: Any, call: AttentionSpec) -> None:
    block = _strided(machine, call.scores, 0, (call.queries, call.keys), (call.keys, 1), "attention scores")
    for s in range(call.batch):
        q = _slice(machine, call.q, s, call.queries, call.depth, "attention Q").astype(np.float64)
        kt = _slice(machine, call.kt, s, call.depth, call.keys, "attention K^T").astype(np.float64)
        v = _slice(machine, call.v, s, call.keys, call.width, "attention V").astype(np.float64)
        block[...] = (q @ kt).astype(np.float32)
        if call.epilogue is not None:  # the chain reads and writes this slice's scores block
            names = [p.name for p in call.epilogue.params]
            machine.run(call.epilogue.body, dict(zip(names, (s, 0, call.queries, 0, call.keys))))
        scores = block.astype(np.float64)
        with np.errstate(invalid="ignore"):
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            weights /= weights.sum(axis=1, keepdims=True)
        if call.safe:  # a fully masked row (all -inf): zeros
            weights[np.isnan(weights).any(axis=1)] = 0.0
        out = _slice(machine, call.out, s, call.queries, call.width, "attention output")
        out[...] = (weights @ v).astype(np.float32)
