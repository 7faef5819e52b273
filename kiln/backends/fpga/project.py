"""What ``kiln compile --target fpga -o DIR`` writes: a Vitis HLS project a vendor tool opens.

    DIR/firmware/kiln_model.cpp   the HLS C++ (the C-simulation entry is outside synthesis)
    DIR/tb/kiln_tb.cpp            a testbench: the inputs, and the outputs the fixed-point
    DIR/tb/inputs.dat, expected.dat   reference computes, compared bit for bit (C simulation)
    DIR/build_prj.tcl             vitis_hls -f build_prj.tcl: csim, csynth, export (IP catalog)
    DIR/estimates.json            kiln's estimates (not synthesis results)
    DIR/README.txt

Only a plan whose every node runs in the design (one segment, no host fallback) makes a project.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kiln.backends.fpga.estimate import Estimate
from kiln.backends.fpga.formats import Design, is_float
from kiln.backends.fpga.hls import DESIGN_MARK
from kiln.backends.fpga.target import FpgaTarget
from kiln.backends.registry import PlanFacts
from kiln.output_files import OutputFolder
from kiln.source_text import c_string, tcl_comment


def write_project(
    folder: Path,
    source: str,
    design: Design,
    facts: PlanFacts,
    target: FpgaTarget,
    found: Estimate,
    inputs: list[np.ndarray],
    expected: list[np.ndarray],
) -> list[Path]:
    """The project's files under ``folder`` (made if missing; files kiln writes only). A link, FIFO
    or non-folder at the folder or anywhere inside it is refused (OutputPathError), never followed."""
    written = []
    with OutputFolder(folder, "fpga project folder") as root:
        with root.folder("firmware") as firmware, root.folder("tb") as bench:
            written.append(firmware.write("kiln_model.cpp", source))
            written.append(firmware.write("kiln_model.h", header(source)))
            written.append(bench.write("inputs.dat", _numbers(inputs)))
            written.append(bench.write("expected.dat", _numbers(expected)))
            written.append(bench.write("kiln_tb.cpp", _testbench(design, facts, source)))
        written.append(root.write("build_prj.tcl", _tcl(target)))
        written.append(root.write("estimates.json", json.dumps(estimate_json(found, target), indent=1)))
        written.append(root.write("README.txt", _readme(target)))
    return written


def _numbers(arrays: list[np.ndarray]) -> str:
    return "\n".join(" ".join(repr(float(v)) for v in a.reshape(-1)) for a in arrays) + "\n"


def estimate_json(found: Estimate, target: FpgaTarget) -> dict[str, Any]:
    part = target.resources
    return {
        "kind": "estimate (kiln's analytical model, not synthesis results)",
        "part": part.device,
        "clock_mhz": target.clock_mhz,
        "reuse": target.reuse,
        "latency_cycles": found.latency,
        "latency_us": found.latency_us,
        "interval_cycles": found.interval,
        "throughput_per_s": found.throughput,
        "resources": {r: getattr(found.total, r) for r in ("dsp", "bram_18k", "lut", "ff")},
        "available": {"dsp": part.dsp, "bram_18k": part.bram_18k, "lut": part.lut, "ff": part.ff},
        "kernels": [
            {
                "kernel": kd.kernel.name,
                "kind": kd.kernel.kind,
                "nodes": kd.kernel.sources,
                "cycles": usage.cycles,
                "reuse": usage.reuse,
                "dsp": usage.dsp,
                "bram_18k": usage.bram_18k,
                "lut": usage.lut,
                "ff": usage.ff,
            }
            for kd, usage in found.kernels
        ],
    }


def _testbench(design: Design, facts: PlanFacts, source: str) -> str:
    inputs, outputs = facts.inputs, facts.outputs
    m_axi = "#pragma HLS INTERFACE m_axi" in source
    lines = [
        "// kiln's testbench: the model's inputs, and the outputs kiln's fixed-point reference computes;",
        "// the C simulation must match them exactly (returns 1 on any difference).",
        "#include <cstdio>",
        "#include <fstream>",
        '#include "../firmware/kiln_model.h"',
        "int main() {",
        '  std::ifstream in("tb/inputs.dat"), want("tb/expected.dat");',
        "  int failures = 0;",
    ]
    names = []
    for b in [*inputs, *outputs]:
        kind = f"t_{b.name}" if is_float(b) else "long long"
        # m_axi: the tensors in memory the top's masters read and write; axis: streams
        lines.append(f"  static {kind} s_{b.name}[{b.size}];" if m_axi else f"  hls::stream<{kind}> s_{b.name};")
        names.append(f"s_{b.name}")
    for b in inputs:
        kind = f"t_{b.name}" if is_float(b) else "long long"
        put = f"s_{b.name}[i] = ({kind})(v);" if m_axi else f"s_{b.name}.write(({kind})(v));"
        lines.append(f"  for (int i = 0; i < {b.size}; ++i) {{ double v; in >> v; {put} }}")
    names += _weights(source)
    if any(line.startswith("void kiln_top0(") and "int status[1]" in line for line in source.splitlines()):
        lines.append("  int status[1] = {0};  // set when an index input is out of range")
        names.append("status")
    lines.append(f"  kiln_top0({', '.join(names)});")
    for b in outputs:
        got = f"s_{b.name}[i]" if m_axi else f"s_{b.name}.read()"
        read = f"{got}.to_double()" if is_float(b) else f"(double){got}"
        lines.append(
            f"  for (int i = 0; i < {b.size}; ++i) {{ double v; want >> v; double got = (float){read};"
            f' if (got != v) {{ if (failures++ < 10) printf("{c_string(b.name)}[%d]: %.9g, expected %.9g\\n", i, got, v); }} }}'
        )
    lines += [
        '  printf(failures ? "FAILED: %d difference(s)\\n" : "PASSED: bit for bit\\n", failures);',
        "  return failures ? 1 : 0;",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _weights(source: str) -> list[str]:
    """The DDR regions an m_axi top takes (``kiln_ddr0 + start`` each, from its C-simulation entry)."""
    call = next((line for line in source.splitlines() if line.strip().startswith("kiln_top0(")), "")
    return [a.strip() for a in call.split("(", 1)[-1].rstrip(");").split(",") if "kiln_ddr" in a]


def _tcl(target: FpgaTarget) -> str:
    period = 1000.0 / target.clock_mhz
    return f"""# vitis_hls -f build_prj.tcl   (written by kiln for {tcl_comment(target.spec or "fpga:vitis")})
open_project -reset kiln_prj
set_top kiln_top0
add_files firmware/kiln_model.cpp -cflags "-std=c++14"
add_files -tb tb/kiln_tb.cpp -cflags "-std=c++14"
add_files -tb tb/inputs.dat
add_files -tb tb/expected.dat
open_solution -reset solution1 -flow_target vivado
set_part {{{target.resources.device}}}
create_clock -period {period:.3f} -name default
csim_design
csynth_design
export_design -format ip_catalog
exit
"""


def _readme(target: FpgaTarget) -> str:
    return f"""kiln HLS project for {target.resources.device} ({target.resources.board}) at {target.clock_mhz:g} MHz.

  vitis_hls -f build_prj.tcl     C simulation (bit for bit against kiln's reference), synthesis, IP export

estimates.json holds kiln's ESTIMATES (an analytical model), not synthesis results: run the
vendor tool for those. Without it, the same C++ is what kiln runs as its C simulation.
"""


def header(source: str) -> str:
    """The declarations a testbench includes: the headers, helpers, tensor types and the top
    functions' prototypes (``source`` is ``render``'s)."""
    head = source.split(DESIGN_MARK)[0]
    lines = source.splitlines()
    prototypes = [line[:-2] + ";" for line in lines if line.startswith("void kiln_top")]
    # an m_axi design's weights, as the host writes them to DDR (the testbench passes them)
    weights = [line.split(" = ")[0] + ";" for line in lines if line.startswith("extern const ") and "kiln_ddr" in line]
    if weights:
        prototypes += ["#ifndef __SYNTHESIS__", *weights, "#endif"]
    return "#pragma once\n" + head + "\n".join(prototypes) + "\n"
