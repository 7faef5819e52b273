"""The ``interface=m_axi`` design: weights in DDR read through AXI masters, the top function's
tensors behind m_axi pointers with an s_axilite control port (what a Vitis kernel on an Alveo
card, or a Zynq's PS driving the PL, expects).

- **weights** (``weights=auto|rom|ddr``): on-chip ROMs where they fit, else in DDR. ``auto``
  moves the largest constants (of at least ``DDR_MIN_ELEMENTS``) to DDR until the rest take at
  most ``ON_CHIP_SHARE`` of the part's block RAM; ``ddr`` moves every one that large; ``rom``
  none (smaller ones, biases, are ROMs always). Each kernel reading DDR weights has
  its own read-only m_axi port (``ddr_<kernel>``, its own bundle: dataflow processes never
  share one) to its region of one packed array of mantissas; loads in a pipelined loop of
  consecutive addresses become bursts. The packed array is in the source for the C simulation
  and the testbench (outside synthesis: on a card the host writes it to DDR);
- **the top**: ``kiln_top<i>(const t_x *in_x, ..., t_y *out_y, const <word> *ddr_k1, ...)``, each
  pointer an m_axi port on a bundle of its own and an s_axilite register, ``return`` on s_axilite (ap_ctrl_hs). The
  inputs are read in a pipelined loop (a burst) into the arrays the kernels take, the outputs
  written back the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.backends.fpga.fixed import Format, mantissa_type, quantize
from kiln.backends.fpga.formats import Design, KernelDesign, is_float
from kiln.backends.fpga.target import FpgaTarget
from kiln.backends.registry import PlanFacts
from kiln.lower.kir import Buffer

DDR_MIN_ELEMENTS = 1024  # constants this large may live in DDR under interface=m_axi
ON_CHIP_SHARE = 0.5  # of the part's block RAM the weights may take (the rest: windows, locals)
AXI_BITS = 512  # bits one AXI beat carries (Alveo/Zynq UltraScale+ HBM/DDR data width)
DDR_LATENCY = 64  # cycles before a burst's first beat arrives (an estimate)


@dataclass(frozen=True)
class Region:
    """A kernel's weights in DDR: ``offsets`` of each buffer within the kernel's region, which
    starts at ``start`` of the segment's packed array."""

    kernel: str
    start: int
    offsets: dict[Buffer, int]
    size: int


def in_ddr(design: Design, facts: PlanFacts, target: FpgaTarget) -> set[Buffer]:
    """The weights a design reads from DDR (empty unless ``interface=m_axi``)."""
    if target.interface != "m_axi" or target.weights == "rom":
        return set()
    weights = [b for b, v in facts.constants.items() if is_float(b) and b in design.formats]
    large = sorted((b for b in weights if b.size >= DDR_MIN_ELEMENTS), key=lambda b: -b.size * design.formats[b].width)
    if target.weights == "ddr":
        return set(large)
    on_chip = sum(b.size * design.formats[b].width for b in weights)
    budget = ON_CHIP_SHARE * target.resources.bram_18k * 18432
    moved: set[Buffer] = set()
    for buffer in large:
        if on_chip <= budget:
            break
        moved.add(buffer)
        on_chip -= buffer.size * design.formats[buffer].width
    return moved


def regions(kernels: list[KernelDesign], ddr: set[Buffer]) -> list[Region]:
    found, start = [], 0
    for kd in kernels:
        used = [b for b in dict.fromkeys(kd.kernel.reads) if b in ddr]
        if not used:
            continue
        offsets, size = {}, 0
        for buffer in used:
            offsets[buffer] = size
            size += buffer.size
        found.append(Region(kd.kernel.name, start, offsets, size))
        start += size
    return found


def word_type(design: Design, ddr: set[Buffer]) -> str:
    """The C integer of the packed array's words: wide enough for every DDR tensor's mantissa."""
    return mantissa_type(max((design.formats[b].width for b in ddr), default=16))


def packed(number: int, found: list[Region], design: Design, facts: PlanFacts, ddr: set[Buffer]) -> str:
    """The segment's weights as the host writes them to DDR (the C simulation's and testbench's)."""
    words: list[str] = []
    for region in found:
        for buffer in region.offsets:
            fmt: Format = design.formats[buffer]
            words.extend(str(quantize(float(v), fmt)) for v in facts.constants[buffer].reshape(-1))
    total = sum(r.size for r in found)
    body = ",".join(words) if words else "0"
    return (
        "#ifndef __SYNTHESIS__\n"
        f"extern const {word_type(design, ddr)} kiln_ddr{number}[{max(total, 1)}] = {{{body}}};  // weights, as DDR holds them\n"
        "#endif"
    )


def ports(inputs: list, outputs: list, found: list[Region], reports: bool, word: str, element) -> list[str]:  # type: ignore[no-untyped-def]
    """The m_axi top's parameters (``element(buffer)``: a tensor's C type)."""
    params = [f"const {element(b)} *in_{b.name}" for b in inputs]
    params += [f"{element(b)} *out_{b.name}" for b in outputs]
    params += [f"const {word} *ddr_{r.kernel}" for r in found]
    return params + (["int status[1]"] if reports else [])


def pragmas(inputs: list, outputs: list, found: list[Region], reports: bool, emit) -> None:  # type: ignore[no-untyped-def]
    """The m_axi top's interface pragmas."""
    for b in inputs:
        emit(f"#pragma HLS INTERFACE m_axi port=in_{b.name} offset=slave bundle=gmem_in_{b.name} depth={b.size}")
    for b in outputs:
        emit(f"#pragma HLS INTERFACE m_axi port=out_{b.name} offset=slave bundle=gmem_out_{b.name} depth={b.size}")
    for r in found:
        emit(
            f"#pragma HLS INTERFACE m_axi port=ddr_{r.kernel} offset=slave bundle=gmem_{r.kernel} "
            f"depth={r.size} max_read_burst_length=256 latency={DDR_LATENCY}"
        )
    for name in [*(f"in_{b.name}" for b in inputs), *(f"out_{b.name}" for b in outputs)]:
        emit(f"#pragma HLS INTERFACE s_axilite port={name}")
    for r in found:
        emit(f"#pragma HLS INTERFACE s_axilite port=ddr_{r.kernel}")
    if reports:
        emit("#pragma HLS INTERFACE s_axilite port=status")
    emit("#pragma HLS INTERFACE s_axilite port=return")


def beats(words: int, width: int) -> int:
    """AXI beats (cycles at best) that ``words`` of ``width`` bits take."""
    return -(-words * width // AXI_BITS)
