"""Lowerings of kiln's channels-last ops (``kiln.passes.layout`` puts them in a region that runs
channels last): ``kiln::DepthwiseConv``, a depthwise convolution on [N, H, W, C] data.

Each pixel's channels are contiguous, so the kernel is vectorized across channels: each tap's
weights for a vector of channels are one vector (packed tap-major at compile time). Row by row,
channel block by channel block, each output is its whole sum (bias + every tap) stored once with
the epilogue applied; interior pixels go ``UNROLL_PIXELS`` at a time, tap by tap, each tap's
weights loaded once for all of them and one running sum per pixel in a register, with no bounds
tests. Border rows and columns: on small kernels, written out with only the taps that fall
inside each output (decided here); from ``PADDED_MIN_TAPS`` taps, the input is first copied into
a zero-bordered scratch, so every output is an interior one. Threads take rows or, on small
planes, channel blocks.
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.types import TensorType
from kiln.lower.engine import Epilogue
from kiln.lower.kir import Assign, Binary, Const, Expr, For, If, Kernel, Let, Load, Schedule, Stmt, Store, add, i64, mul
from kiln.lower.lowering import CannotLower, Lowerer
from kiln.lower.nn_lowering import require_float
from kiln.lower.target import PARALLEL_MIN
from kiln.lower.window_lowering import window_interior

UNROLL_PIXELS = 4  # interior output pixels sharing each load of a tap's weights (their sums in registers)
# taps from which the input is copied zero-bordered first: the border code grows as the border
# (kernel size) times the taps per output, so a 7x7 layer's is thousands of statements (GCC took
# 18 s on ConvNeXt-T's); the copy costs the kernel 3-16% there (Zen 3, 7x7 layers
# of 7x7 to 56x56) and 4-69% on 3x3 layers, whose border code is small (benchmarks/depthwise.py)
PADDED_MIN_TAPS = 25


class _Depthwise:
    """One kiln::DepthwiseConv node's geometry and the expressions its loops are built from."""

    def __init__(self, lw: Lowerer, node: Node, epilogue: Epilogue | None) -> None:
        x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
        for value in (x, w, out):
            if value is None or not isinstance(value.type, TensorType) or not value.type.is_static:
                raise CannotLower(f"{node.label}: every operand needs a static tensor shape")
        assert x is not None and w is not None
        self.lw, self.node, self.epilogue = lw, node, epilogue
        self.dtype = require_float(lw, node)
        self.batch, self.height, self.width, self.channels = lw.shape(x)
        _, self.out_h, self.out_w, _ = lw.shape(out)
        self.kernel_h, self.kernel_w = (int(k) for k in node.attrs["kernel_shape"])
        self.stride = tuple(int(k) for k in node.attrs.get("strides") or (1, 1))
        self.dilation = tuple(int(k) for k in node.attrs.get("dilations") or (1, 1))
        self.pads = tuple(int(k) for k in (node.attrs.get("pads") or (0, 0, 0, 0))[:2])
        self.taps = [(kh, kw) for kh in range(self.kernel_h) for kw in range(self.kernel_w)]
        self.tap_index = {tap: i for i, tap in enumerate(self.taps)}
        self.x_buf, self.dst = lw.buffer(x), lw.buffer(out)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        self.bias = lw.buffer(bias) if bias is not None else None
        self.weights = self._weights(w)
        lanes = lw.target.lanes(self.dtype)
        self.block = lanes if self.channels % lanes == 0 else self.channels
        self.blocks = self.channels // self.block
        # many rows: threads take rows, and each group of pixels runs through every channel block
        # while its inputs are in L1; few rows (small planes): threads take channel blocks
        # (sizes taken at run time: one structure for every plane, so threads always take rows)
        self.run_time_sizes = "size-specific" in lw.disabled
        self.by_rows = self.run_time_sizes or self.out_h >= 4 * lw.target.cores
        if self.run_time_sizes:
            lw.divisors.add(UNROLL_PIXELS)  # the interior's groups of pixels: ``width // UNROLL_PIXELS``
        self.n, self.cb, self.c = lw.index("n"), lw.index("cb"), lw.index("c")
        self.oh, self.ow, self.q = lw.index("oh"), lw.index("ow"), lw.index("q")
        self.channel: Expr = add(mul(self.cb, i64(self.block)), self.c)
        # where the taps read: (buffer, rows, columns, top pad, left pad) of the input as it is,
        # or of its zero-bordered copy (``padded_body``: no pads left to subtract)
        self.source = (self.x_buf, self.height, self.width, *self.pads)

    def _weights(self, w):  # type: ignore[no-untyped-def]
        """The buffer the taps' weights are read from: [tap][channel] (a constant, packed), else
        the operand as it is, [channel][tap]."""
        weights, taps, channels = self.lw.constant(w), len(self.taps), self.channels
        if weights is None:
            return self.lw.buffer(w), lambda tap, ch: add(mul(ch, i64(taps)), i64(tap))
        packed = self.lw.packed_constant(
            ("depthwise-nhwc", w.name),
            lambda: np.ascontiguousarray(weights.reshape(channels, taps).T.astype(self.dtype.numpy)).reshape(-1),
        )
        return packed, lambda tap, ch: add(ch, i64(tap * channels))

    # -- expressions ---------------------------------------------------------------------------

    def weight(self, tap: int) -> Expr:
        buffer, at = self.weights
        return Load(buffer, at(tap, self.channel))

    def pixel(self, row: Expr, col: Expr, rows: int, cols: int) -> Expr:
        image_row = add(mul(self.n, i64(rows)), row)
        return add(mul(add(mul(image_row, i64(cols)), col), i64(self.channels)), self.channel)

    def input_at(self, row: Expr, col: Expr, kh: int, kw: int) -> tuple[Expr, Expr]:
        (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = self.stride, self.dilation, self.source[3:]
        return (
            add(mul(row, i64(stride_h)), i64(kh * dil_h - pad_t)),
            add(mul(col, i64(stride_w)), i64(kw * dil_w - pad_l)),
        )

    def term(self, row: Expr, col: Expr, tap: tuple[int, int], weight: Expr | None = None) -> Expr:
        in_row, in_col = self.input_at(row, col, *tap)
        factor = weight if weight is not None else self.weight(self.tap_index[tap])
        buffer, rows, cols = self.source[:3]
        return Binary("*", factor, Load(buffer, self.pixel(in_row, in_col, rows, cols)))

    def start(self) -> Expr:
        return Load(self.bias, self.channel) if self.bias is not None else Const(0, self.dtype)

    def finish(self, row: Expr, col: Expr, value: Expr) -> Store:
        target = self.pixel(row, col, self.out_h, self.out_w)
        if self.epilogue is not None:
            value = self.epilogue([self.n, row, col, self.channel], value, target)
        return Store(self.dst, target, value)

    def output(self, row: Expr, col: Expr, valid: list[tuple[int, int]]) -> Store:
        value = self.start()
        for tap in valid:
            value = Binary("+", value, self.term(row, col, tap))
        return self.finish(row, col, value)

    # -- loops ----------------------------------------------------------------------------------

    def blockwise(self, stmts: list[Stmt]) -> list[Stmt]:
        return [For(self.cb, self.blocks, stmts)] if self.by_rows else stmts

    def vector(self, stmts: list[Stmt]) -> list[Stmt]:
        return self.blockwise([For(self.c, self.block, stmts)])

    def row(self, row: Expr, kh_valid: list[int], cols, col_lo: int, col_hi: int) -> list[Stmt]:  # type: ignore[no-untyped-def]
        """One output row: border columns (each with its own taps), then the interior."""
        stmts: list[Stmt] = []
        for col in [*range(col_lo), *range(col_hi, self.out_w)]:
            valid = [(kh, kw) for kh, kw in self.taps if kh in kh_valid and cols[kw][0] <= col < cols[kw][1]]
            stmts.extend(self.vector([self.output(row, i64(col), valid)]))
        valid = [(kh, kw) for kh, kw in self.taps if kh in kh_valid]
        groups = (col_hi - col_lo) // UNROLL_PIXELS
        # sizes taken at run time: both loops at every size (either may run no times), so the
        # program is one at every width and its extents are terms of the dims
        if groups or self.run_time_sizes:
            stmts.append(For(self.q, groups, self.vector(self._group(row, valid, col_lo))))
        rest = col_lo + groups * UNROLL_PIXELS
        if rest < col_hi or self.run_time_sizes:
            stmts.append(For(self.ow, col_hi, self.vector([self.output(row, self.ow, valid)]), start=rest))
        return stmts

    def _group(self, row: Expr, valid: list[tuple[int, int]], col_lo: int) -> list[Stmt]:
        """UNROLL_PIXELS interior pixels, tap by tap: each tap's weights loaded once for all of
        them, one running sum per pixel in a register (each sum in the order ``output`` adds)."""
        first = add(mul(self.q, i64(UNROLL_PIXELS)), i64(col_lo))
        cols = [add(first, i64(u)) for u in range(UNROLL_PIXELS)]
        sums = [self.lw.scalar(self.dtype, "acc") for _ in cols]
        stmts: list[Stmt] = [Let(total, self.start()) for total in sums]
        for tap in valid:
            weight = self.lw.scalar(self.dtype, "w")
            stmts.append(Let(weight, self.weight(self.tap_index[tap])))
            stmts += [
                Assign(total, Binary("+", total, self.term(row, col, tap, weight))) for total, col in zip(sums, cols)
            ]
        return stmts + [self.finish(row, col, total) for total, col in zip(sums, cols)]

    def padded_rows_cols(self) -> tuple[int, int] | None:
        """Rows and columns of the zero-bordered copy: the input at (top pad, left pad), zeros
        around it up to the last row and column a tap reads (None: negative pads)."""
        (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = self.stride, self.dilation, self.pads
        if pad_t < 0 or pad_l < 0:
            return None
        rows = max(self.height + pad_t, (self.out_h - 1) * stride_h + (self.kernel_h - 1) * dil_h + 1)
        cols = max(self.width + pad_l, (self.out_w - 1) * stride_w + (self.kernel_w - 1) * dil_w + 1)
        return rows, cols

    def padded_body(self, rows: int, cols: int) -> tuple[list[Stmt], list[Stmt]]:
        """(the copy into the zero-bordered scratch, the outputs read from it). Taking rows, the
        copy's input rows are shared out as the output rows are (the same parallel loop index);
        taking channel blocks, each block copies its own channels."""
        copy = self.lw.scratch_buffer(self.dtype, self.batch * rows * cols * self.channels, hint="dwpad")
        pad_t, pad_l = self.pads
        self.source = (copy, rows, cols, 0, 0)
        zero = Const(0, self.dtype)
        channels = self.channels if self.by_rows else self.block
        lane = self.lw.index("q")  # taking rows, a run of pixels is one run of elements

        def run(row: Expr, col: int, count: int, value) -> list[Stmt]:  # type: ignore[no-untyped-def]
            """``count`` pixels of a padded row from column ``col`` (their ``channels``): zeros or the input."""
            if count <= 0:
                return []
            start = add(mul(add(mul(self.n, i64(rows)), row), i64(cols * self.channels)), i64(col * self.channels))
            if self.by_rows:
                return [For(lane, count * channels, [Store(copy, add(start, lane), value(lane))])]
            pixel = self.lw.index("p")
            at = add(add(start, mul(pixel, i64(self.channels))), self.channel)
            return [For(pixel, count, [For(self.c, channels, [Store(copy, at, value(pixel))])])]

        def source(offset: Expr) -> Expr:  # the input row ``r``'s element ``offset`` (taking rows) or pixel
            image_row = add(mul(self.n, i64(self.height)), r)
            if self.by_rows:
                return Load(self.x_buf, add(mul(image_row, i64(self.width * self.channels)), offset))
            return Load(
                self.x_buf, add(mul(add(mul(image_row, i64(self.width)), offset), i64(self.channels)), self.channel)
            )

        r = self.oh if self.by_rows else self.lw.index("r")
        middle = add(r, i64(pad_t))
        inside = [
            *run(middle, 0, pad_l, lambda _: zero),
            *run(middle, pad_l, self.width, source),
            *run(middle, pad_l + self.width, cols - pad_l - self.width, lambda _: zero),
        ]
        above = self.lw.index("t")
        top = [For(above, pad_t, run(above, 0, cols, lambda _: zero))] if pad_t else []
        filled: list[Stmt] = [*top, For(r, self.height, inside)]
        below = rows - pad_t - self.height
        if below > 0 or (below == 0 and self.run_time_sizes):
            bottom = self.lw.index("t")
            filled.append(For(bottom, below, run(add(bottom, i64(pad_t + self.height)), 0, cols, lambda _: zero)))
        compute: list[Stmt] = [
            For(self.oh, self.out_h, self.row(self.oh, list(range(self.kernel_h)), None, 0, self.out_w))
        ]
        return filled, compute

    def bordered_body(self) -> list[Stmt]:
        """Border rows and columns written out, each output with only the taps that fall inside."""
        shapes = (
            (self.batch, self.channels, self.height, self.width),
            (self.channels, 1, self.kernel_h, self.kernel_w),
            (self.batch, self.channels, self.out_h, self.out_w),
        )
        interior = window_interior(shapes, (self.stride, self.dilation, self.pads))
        if interior is None:
            return self.tested()
        rows, cols, (row_lo, row_hi, col_lo, col_hi) = interior
        body: list[Stmt] = []
        for r in [*range(row_lo), *range(row_hi, self.out_h)]:  # border rows
            kh_valid = [kh for kh in range(self.kernel_h) if rows[kh][0] <= r < rows[kh][1]]
            body.extend(self.row(i64(r), kh_valid, cols, col_lo, col_hi))
        if row_hi > row_lo:
            every = list(range(self.kernel_h))
            body.append(For(self.oh, row_hi, self.row(self.oh, every, cols, col_lo, col_hi), start=row_lo))
        return body

    def tested(self) -> list[Stmt]:
        """A border too wide to write out: each output's taps tested one by one."""
        total = self.lw.scalar(self.dtype, "acc")
        steps: list[Stmt] = [Let(total, self.start())]
        for tap in self.taps:
            in_row, in_col = self.input_at(self.oh, self.ow, *tap)
            inside = Binary(
                "&&",
                Binary("&&", Binary(">=", in_row, i64(0)), Binary("<", in_row, i64(self.height))),
                Binary("&&", Binary(">=", in_col, i64(0)), Binary("<", in_col, i64(self.width))),
            )
            steps.append(If(inside, [Assign(total, Binary("+", total, self.term(self.oh, self.ow, tap)))]))
        steps.append(self.finish(self.oh, self.ow, total))
        return [For(self.oh, self.out_h, [For(self.ow, self.out_w, self.vector(steps))])]

    def kernel(self) -> Kernel:
        geometry = self.padded_rows_cols() if len(self.taps) >= PADDED_MIN_TAPS else None
        if geometry is None:
            filled, body = [], self.bordered_body()
        else:
            filled, body = self.padded_body(*geometry)
        work = self.batch * self.out_h * self.out_w * self.channels
        parallel = None if work < PARALLEL_MIN else (self.oh.name if self.by_rows else self.cb.name)
        per_image = [*filled, *body] if self.by_rows else [For(self.cb, self.blocks, [*filled, *body])]
        stmts: list[Stmt] = [For(self.n, self.batch, per_image)]
        node = self.node
        kernel = self.lw.kernel(
            node, "depthwise-conv", stmts, list(node.inputs), [node.outputs[0]],
            Schedule(parallel=parallel, vectorize=self.c.name),
        )  # fmt: skip
        kernel.flops = 2 * work * len(self.taps)
        if self.source[0] is not self.x_buf:  # the zero-bordered copy: memory planning needs it written here
            kernel.writes.append(self.source[0])
        return kernel


def lower_depthwise_nhwc(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    return [_Depthwise(lw, node, epilogue).kernel()]


LOWERINGS = {"kiln::DepthwiseConv": lower_depthwise_nhwc}
