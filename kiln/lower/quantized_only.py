"""int8 and bf16 activations that leave their producer only in their narrow form.

An int8 (bf16) product whose output only int8 (bf16) products read stores it twice: as float32
(its finish and epilogue write it, then read it back) and as the unsigned bytes (bfloat16 halves)
its readers take (``Requantize``). When nothing reads the floats -- every reader is an engine
product that takes the narrow form as its operand, none of their epilogues reads the floats, no
host fallback does, it is not an output -- and the producer's epilogue is simple enough to run on
a tile (``TileFinish``: a bias, Relu, Clip; or none), the producer is marked ``Requantize.only``:
the engine finishes each tile in a scratch and stores only the narrow form (a ResNet's first two
convolutions of every block). The floats' buffer is still planned (its writes and reads stay
declared) but never touched. Products on the row-major layouts only (a MatMul's rows, a
channels-last convolution's pixels): a NCHW convolution's output keeps both.
"""

from __future__ import annotations

from dataclasses import replace

from kiln.lower.kir import Buffer, DirectOperand, GemmSpec, Kernel, buffers_in


def store_quantized_only(kernels: list[Kernel], other_reads: set[Buffer]) -> int:
    """Marks the producers among ``kernels`` whose floats nothing reads (``other_reads``: the
    buffers host fallbacks and the outputs read); returns how many."""
    producers = {
        spec.out: spec
        for kernel in kernels
        for spec in kernel.body
        if isinstance(spec, GemmSpec)
        and _row_major(spec)
        and spec.requant is not None
        and (spec.finish is not None or spec.epilogue is None)
    }
    readers: dict[Buffer, list[Kernel]] = {}
    for kernel in kernels:
        for buffer in kernel.reads:
            if buffer in producers:
                readers.setdefault(buffer, []).append(kernel)
    marked = 0
    for out, spec in producers.items():
        if out in other_reads or not all(_takes_bytes(kernel, out, spec) for kernel in readers.get(out, [])):
            continue
        assert spec.requant is not None
        spec.requant = replace(spec.requant, only=True)
        spec.epilogue = None  # (its TileFinish, if any, is the whole epilogue)
        marked += 1
    _drop_bf16_copies(kernels)
    return marked


def _drop_bf16_copies(kernels: list[Kernel]) -> None:
    """A bf16 product that must store its floats anyway (a residual reads them) stores no bf16
    copy: rounding each finished tile again costs its producer what it saves its readers (measured
    on ResNet-50's block outputs), so the readers convert the floats as before."""
    dropped: set[Buffer] = set()
    for kernel in kernels:
        for spec in kernel.body:
            if isinstance(spec, GemmSpec) and spec.requant is not None and spec.requant.bf16 and not spec.requant.only:
                dropped.add(spec.requant.dest)
                kernel.writes = [b for b in kernel.writes if b is not spec.requant.dest]
                spec.requant = None
    for kernel in kernels:
        for spec in kernel.body:
            if isinstance(spec, GemmSpec) and spec.given is not None and spec.given in dropped:
                kernel.reads = [b for b in kernel.reads if b is not spec.given]
                spec.given = None


def _row_major(spec: GemmSpec) -> bool:
    """The engine can store the output narrow tile by tile: an int8 MatMul's rows, a bf16
    product's (its tiles are the output's), a channels-last direct convolution's pixels."""
    if isinstance(spec.b, DirectOperand):
        return spec.precision in ("int8", "bf16") and bool(spec.b.geometry[11])
    if spec.precision == "bf16":
        return spec.requant is not None and spec.requant.bf16
    return spec.precision == "int8" and spec.quant is not None and not spec.quant.rows


def _takes_bytes(kernel: Kernel, out: Buffer, producer: GemmSpec) -> bool:
    """Whether ``kernel`` reads ``out`` only as the quantized activations its producer stored."""
    if len(kernel.body) != 1 or not isinstance(kernel.body[0], GemmSpec):
        return False
    spec = kernel.body[0]
    assert producer.requant is not None
    given = spec.given if spec.precision == "bf16" else spec.quant.given if spec.quant is not None else None
    if given is None or given is not producer.requant.dest:
        return False
    if spec.epilogue is not None and out in buffers_in(spec.epilogue.body):
        return False
    rows = spec.quant.rows if spec.quant is not None else False
    quantized, other = (spec.b, spec.a) if rows or isinstance(spec.b, DirectOperand) else (spec.a, spec.b)
    return getattr(quantized, "buffer", None) is out and getattr(other, "buffer", None) is not out
