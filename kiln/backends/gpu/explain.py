"""What ``kiln explain`` shows of a gpu plan, contributed through the backend's hooks: the Triton
kernel functions (launches, grid, blocks, and per architecture compiled ahead without a GPU:
registers, spills, shared memory), and with ``--profile`` the time a run spends moving data host
-> device, in kernels, and device -> host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.backends.gpu.ahead import compile_ahead
from kiln.backends.gpu.module import source_file
from kiln.backends.gpu.render import Launch
from kiln.backends.gpu.runtime import module, transfer_times
from kiln.backends.registry import Section


def kernel_report(plan: Any, arches: tuple[str, ...], progress: Callable[[str], Any]) -> dict:
    """The kernel functions of ``plan`` and, per architecture in ``arches``, their resources."""
    path = source_file(plan.source)
    namespace = module(plan.source, interpret=plan.target.interpret)
    launches = [Launch.of(fields) for segment in namespace["LAUNCHES"].values() for fields in segment]
    functions: dict[str, dict] = {}
    for launch in launches:
        entry = functions.setdefault(
            launch.function,
            {
                "function": launch.function,
                "kind": launch.kind,
                "kernels": [],
                "grid": list(launch.grid),
                "blocks": dict(launch.constants),
                "num_warps": launch.num_warps,
                "num_stages": launch.num_stages,
                "arch": {},
            },
        )
        entry["kernels"].append(launch.kernel)
    for arch in arches:
        with progress(f"compiling {len(functions)} Triton kernels for {arch}..."):
            for found in compile_ahead(plan.source, arch):
                functions[found.function]["arch"][arch] = {
                    "registers": found.registers,
                    "spill_bytes": found.spill_bytes,
                    "stack_bytes": found.stack_bytes,
                    "shared_bytes": found.shared_bytes,
                    "error": found.error,
                }
    return {
        "source": str(path),
        "launches": len(launches),
        "functions": list(functions.values()),
        "arches": list(arches),
    }


def kernel_section(found: dict) -> Section:
    arches = found["arches"]
    columns = ["function", "kind", "launches", "grid", "blocks", "warps/stages"]
    columns += [f"{arch} regs / spill B / smem B" for arch in arches]
    rows = []
    for entry in found["functions"]:
        cells = []
        for arch in arches:
            usage = entry["arch"][arch]
            if usage["error"]:
                cells.append(f"does not compile: {usage['error']}")
            else:
                spill = usage["spill_bytes"]
                cells.append(f"{usage['registers']} / {f'{spill} SPILLS' if spill else 0} / {usage['shared_bytes']}")
        rows.append(
            [
                entry["function"],
                entry["kind"],
                str(len(entry["kernels"])),
                "x".join(map(str, entry["grid"])),
                ", ".join(f"{k}={v}" for k, v in entry["blocks"].items()),
                f"{entry['num_warps']}/{entry['num_stages']}",
                *cells,
            ]
        )
    title = f"Triton kernels: {len(found['functions'])} functions, {found['launches']} launches"
    return Section("gpu", title, columns, rows, [f"Triton source: {found['source']}"], found)


def tuning_note(tuning: Any) -> str:
    """The tuner's summary in words (``off``: the rendered blocks, as in the interpreter)."""
    if not isinstance(tuning, dict):
        return "as rendered (tuning off: KILN_GPU_TUNE=0, or Triton's interpreter)"
    return (
        f"{tuning['tuned']} distinct launches measured, {tuning['cached']} launches from the cache, "
        f"{tuning['changed']} changed, {tuning['failed']} candidates refused; measured kernels "
        f"{tuning['rendered_ms']:.3f} -> {tuning['chosen_ms']:.3f} ms; {tuning['seconds']:.1f} s"
    )


def transfer_section(executable: Any, target: Any) -> Section:
    """Per run: host -> device, kernels, device -> host (after the caller's runs)."""
    times = transfer_times(executable.runners)
    if times is None:
        return Section("transfers", "data movement", [], [], ["no native segment: nothing ran on the device"], {})
    note = (
        f"per run ({times['runs']} runs on {target.name}): host -> device {times['upload_ms']:.3f} ms, "
        f"kernels {times['compute_ms']:.3f} ms, device -> host {times['download_ms']:.3f} ms; CUDA graphs: "
        f"{times['cuda_graphs']}; block sizes: {tuning_note(times['tuning'])}"
        + (" (Triton's interpreter on the CPU: kernel time is not a GPU's)" if target.interpret else "")
    )
    return Section("transfers", "data movement", [], [], [note], times)
