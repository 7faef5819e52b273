"""The ``fpga`` target: kernels rendered as synthesizable HLS C++ for AMD/Xilinx Vitis HLS.

The shared graph passes and kernel IR (no engines: matrix products and convolutions stay loop
nests), then a fixed-point design (``formats``: every tensor's ``ap_fixed`` from calibration, every
accumulator proved wide enough), then HLS C++ (``hls``). There is no FPGA and no vendor tool
here: the executable is the C simulation, the same C++ built by g++ against the ``ap_types``
headers the installed hls4ml package ships (or ``KILN_AP_TYPES``), bit for bit what the fixed-point
reference (``reference``) computes. ``estimate`` gives latency and resources (estimates, from
documented formulas); ``project`` writes what ``vitis_hls`` opens.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kiln.backends.cpu import toolchain
from kiln.backends.fpga.estimate import Estimate, check_fits, estimate
from kiln.backends.fpga.formats import Design, DesignError, design
from kiln.backends.fpga.hls import render as render_hls
from kiln.backends.fpga.project import estimate_json
from kiln.backends.fpga.rewrite import canonical
from kiln.backends.fpga.streams import segment_streams
from kiln.backends.fpga.target import FpgaTarget, parse_variant
from kiln.backends.registry import Backend, BuildOptions, Loaded, PlanFacts, Section, Threading, library_runner
from kiln.errors import CompilerError, KilnError
from kiln.lower.engine import WEIGHT_FORMATS
from kiln.lower.kir import Buffer, Kernel
from kiln.lower.target import Target, TargetError

# the designs rendered in this process, by source (kiln explain and kiln compile -o read them)
DESIGNS: dict[str, tuple[Design, PlanFacts, Estimate]] = {}
CXX_FLAGS = ("-std=c++14", "-O1", "-fPIC", "-shared", "-w")


@lru_cache(maxsize=1)
def ap_types() -> str:
    """The folder holding ``ap_fixed.h``: ``KILN_AP_TYPES``, else the installed hls4ml package's
    (never copied into kiln); '' when neither is there."""
    given = os.environ.get("KILN_AP_TYPES")
    if given:
        return given if os.path.isfile(os.path.join(given, "ap_fixed.h")) else ""
    try:
        import importlib.util

        spec = importlib.util.find_spec("hls4ml")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return ""
    folder = os.path.join(next(iter(spec.submodule_search_locations)), "templates", "vivado", "ap_types")
    return folder if os.path.isfile(os.path.join(folder, "ap_fixed.h")) else ""


def cxx() -> str:
    found = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not found:
        raise CompilerError("the fpga target's C simulation needs a C++ compiler (g++): none found")
    return found


class FpgaBackend(Backend):
    name = "fpga"
    reads_plan = True

    def describe(self, variant: str) -> Target:
        return parse_variant(variant)

    def variants(self) -> list[str]:
        return ["fpga:vitis"]

    def available(self) -> str:
        if not ap_types():
            return "the ap_types headers are missing: install hls4ml (pip install hls4ml) or set KILN_AP_TYPES"
        try:
            cxx()
        except CompilerError as err:
            return str(err)
        return ""

    def render(
        self,
        segments: Sequence[Sequence[Kernel]],
        table: dict[Buffer, int],
        options: BuildOptions,
        target: Target,
        facts: PlanFacts | None = None,
    ) -> str:
        assert isinstance(target, FpgaTarget) and facts is not None
        found = self.design(segments, facts, target)
        estimated = estimate(found, facts, target)
        check_fits(estimated, target, {k.name: ", ".join(k.sources) for s in segments for k in s})
        source = render_hls(found, facts, segments, table, target)
        DESIGNS[source] = (found, facts, estimated)  # for explain and project writing in this process
        while len(DESIGNS) > 16:
            DESIGNS.pop(next(iter(DESIGNS)))
        return source

    def design(self, segments: Sequence[Sequence[Kernel]], facts: PlanFacts, target: FpgaTarget) -> Design:
        segments = [
            [canonical(k, facts.constants) for k in segment] for segment in segments
        ]  # constant powers rewritten
        try:
            found = design(segments, facts, target.bits, dict(target.widths))
        except DesignError:
            raise
        except (KeyError, AssertionError) as err:  # a construct the design does not cover
            raise DesignError(f"the fpga target cannot make a fixed-point design of this plan: {err!r}") from None
        by_kernel = {kd.kernel.name: kd for kd in found.kernels}
        for number, segment in enumerate(segments):
            found.streams.update(segment_streams(number, [by_kernel[k.name] for k in segment], facts, target.reuse))
        return found

    def build(self, source: str, target: Target, options: BuildOptions) -> tuple[Path, ...]:
        missing = self.available()
        if missing:
            raise TargetError(f"target {target.name}: {missing}")
        compiler, headers = cxx(), ap_types()
        version = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()

        def command(source_path: str, output: str) -> list[str]:
            return [compiler, *CXX_FLAGS, f"-I{headers}", source_path, "-o", output]

        return (toolchain.build_program(source, [compiler, version, headers, *CXX_FLAGS], command, ".cpp"),)

    def load(self, plan: Any, target: Target, parallelism: Threading) -> Loaded:
        segments = [s for s in plan.steps if hasattr(s, "kernels")]
        if not segments:
            return Loaded([])
        if plan.library is None:
            raise KilnError("a plan with native segments lacks its library (kiln bug)")
        try:
            library = ctypes.CDLL(str(plan.library))
        except OSError as err:
            raise KilnError(f"cannot load the C simulation {plan.library}: {err}") from None
        runners = []
        for number in range(len(segments)):
            function = getattr(library, f"kiln_segment{number}")
            function.argtypes = [ctypes.c_void_p]
            function.restype = ctypes.c_int
            runners.append(library_runner(function))
        return Loaded(runners)

    def explain(self, plan: Any, arches: tuple[str, ...], progress: Any) -> list[Section]:
        found = DESIGNS.get(plan.source)
        if found is None:
            return []
        design_, _, estimated = found
        target = plan.target
        rows = [
            [
                kd.kernel.name,
                ", ".join(kd.kernel.sources)[:48],
                ", ".join(design_.formats[b].text() for b in kd.kernel.writes if b in design_.formats),
                str(usage.reuse),
                f"{usage.cycles:,}",
                f"{usage.dsp:,}",
                f"{usage.bram_18k:,}",
                f"{usage.lut:,}",
                f"{usage.ff:,}",
            ]
            for kd, usage in estimated.kernels
        ]
        part = target.resources
        total = estimated.total
        notes = [
            "ESTIMATES from kiln's analytical model (kiln/backends/fpga/estimate.py), not synthesis results",
            f"model: latency {estimated.latency:,} cycles = {estimated.latency_us:.2f} us at {target.clock_mhz:g} MHz; "
            f"interval {estimated.interval:,} cycles ({estimated.throughput:,.0f} inferences/s, DATAFLOW)",
            f"{part.device} ({part.board}): DSP {total.dsp:,}/{part.dsp:,}, BRAM_18K {total.bram_18k:,}/{part.bram_18k:,}, "
            f"LUT {total.lut:,}/{part.lut:,}, FF {total.ff:,}/{part.ff:,}",
        ]
        columns = ["kernel", "nodes", "output format", "reuse", "cycles", "DSP", "BRAM_18K", "LUT", "FF"]
        return [Section("fpga", "fpga design (estimates)", columns, rows, notes, estimate_json(estimated, target))]

    def identity(self, target: Target, debug: bool = False) -> tuple[str, ...]:
        return ("g++", *CXX_FLAGS, ap_types())

    def precisions(self, target: Target) -> dict[str, str]:
        fixed = "the fpga target computes in fixed point (ap_fixed, widths from calibration)"
        return {"fp32": "", "bf16": fixed, "int8": fixed, **dict.fromkeys(WEIGHT_FORMATS, fixed)}


__all__ = ["FpgaBackend", "FpgaTarget", "ap_types"]
