"""The fpga target's kind: an FPGA part, its clock, the design's memory interface, reuse and bits.

Named ``fpga:vitis`` (AMD/Xilinx Vitis HLS) with attributes after commas:
``fpga:vitis,part=xczu7ev,clock=200,reuse=4,bits=16,interface=m_axi,weights=auto``. The parts' resources are
their data sheets' (DS962 UltraScale+, DS190 Zynq-7000, the Alveo U250 data sheet): what the
estimates are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.lower.target import Target, TargetError


@dataclass(frozen=True)
class Part:
    name: str  # the short name users give
    device: str  # the full part number vitis_hls wants
    dsp: int
    bram_18k: int
    lut: int
    ff: int
    board: str


PARTS = {
    p.name: p
    for p in (
        Part("xcu250", "xcu250-figd2104-2L-e", 12288, 5376, 1728000, 3456000, "Alveo U250"),
        Part("xcvu9p", "xcvu9p-flga2104-2L-e", 6840, 4320, 1182240, 2364480, "VCU118"),
        Part("xczu7ev", "xczu7ev-ffvc1156-2-e", 1728, 624, 230400, 460800, "ZCU104"),
        Part("xc7z020", "xc7z020clg400-1", 220, 280, 53200, 106400, "PYNQ-Z2"),
    )
}
# axis: AXI-Stream in and out, weights in on-chip ROMs; m_axi: tensors behind AXI masters with an
# s_axilite control port, large weights in DDR (``axi``)
INTERFACES = ("axis", "m_axi")
WEIGHTS = ("auto", "rom", "ddr")  # where weights live under m_axi: ROMs where they fit (auto), all ROMs, DDR
DEFAULTS = {"part": "xcu250", "clock": "200", "reuse": "1", "bits": "16", "interface": "axis", "weights": "auto"}


@dataclass(frozen=True, kw_only=True)
class FpgaTarget(Target):
    backend: str = "fpga"
    tool: str = "vitis"
    part: str = "xcu250"
    clock_mhz: float = 200.0
    reuse: int = 1  # hls4ml's reuse factor: each multiplier used this many times
    bits: int = 16  # total bits of every tensor's ap_fixed (integer bits from calibration)
    interface: str = "axis"
    weights: str = "auto"
    # per tensor (by name) total bits other than ``bits``: the per-layer budget max_accuracy_drop finds
    widths: tuple[tuple[str, int], ...] = ()

    @property
    def vector_bytes(self) -> int:
        return 4  # the loop nests' shape (one element per iteration; the schedule unrolls)

    @property
    def pixel_major(self) -> bool:
        return True  # a convolution's pipeline takes one output pixel per initiation interval

    @property
    def resources(self) -> Part:
        return PARTS[self.part]

    @property
    def summary(self) -> str:
        return f"Vitis HLS, {self.resources.device} at {self.clock_mhz:g} MHz, reuse {self.reuse}, {self.bits}-bit"

    def with_widths(self, widths: dict[str, int]) -> FpgaTarget:
        from dataclasses import replace

        return replace(self, widths=tuple(sorted(widths.items())))

    def with_bits(self, bits: int) -> FpgaTarget:
        from dataclasses import replace

        spec = ",".join([p for p in self.spec.split(",") if not p.startswith("bits=")] + [f"bits={bits}"])
        return replace(self, bits=bits, spec=spec)


def parse_variant(variant: str) -> FpgaTarget:
    """``vitis[,key=value...]`` as a target; TargetError naming what is wrong."""
    tool, _, rest = variant.partition(",")
    if tool not in ("", "vitis"):
        raise TargetError(f"unknown target 'fpga:{variant}'; the fpga target's tools: vitis (fpga:vitis)")
    settings = dict(DEFAULTS)
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals or key not in DEFAULTS:
            raise TargetError(f"fpga target attribute {item!r}: give key=value with key one of {', '.join(DEFAULTS)}")
        settings[key] = value
    if settings["part"] not in PARTS:
        raise TargetError(f"unknown FPGA part {settings['part']!r}; known parts: {', '.join(PARTS)}")
    if settings["interface"] not in INTERFACES:
        raise TargetError(f"fpga interface {settings['interface']!r}: supported: {', '.join(INTERFACES)}")
    if settings["weights"] not in WEIGHTS:
        raise TargetError(f"fpga weights {settings['weights']!r}: one of {', '.join(WEIGHTS)}")
    if settings["weights"] == "ddr" and settings["interface"] != "m_axi":
        raise TargetError("fpga weights=ddr reads them through AXI masters: give interface=m_axi too")
    try:
        clock, reuse, bits = float(settings["clock"]), int(settings["reuse"]), int(settings["bits"])
    except ValueError:
        raise TargetError(f"fpga target attributes clock, reuse and bits are numbers, got {rest!r}") from None
    if not (10 <= clock <= 1000 and 1 <= reuse <= 1 << 20 and 4 <= bits <= 32):
        raise TargetError("fpga target: clock must be 10..1000 MHz, reuse 1..1048576, bits 4..32")
    # the spec is rebuilt from the parsed values (never the user's raw text: it names the target in
    # generated sources and reports), so "clock=200\n" and "clock=2e2" both read clock=200
    settings.update(clock=f"{clock:g}", reuse=str(reuse), bits=str(bits))
    spec = "fpga:vitis" + "".join(f",{k}={settings[k]}" for k in DEFAULTS if settings[k] != DEFAULTS[k])
    return FpgaTarget(
        engines=(),
        spec=spec,
        part=settings["part"],
        clock_mhz=clock,
        reuse=reuse,
        bits=bits,
        interface=settings["interface"],
        weights=settings["weights"],
    )
