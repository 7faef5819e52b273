"""The FPGA rows: kiln's fpga target and hls4ml, both run as C SIMULATIONS (the HLS C++ built by
g++ against the ap_types headers) — no FPGA and no vendor tool is on these machines.

Every figure of these rows says what it is: the latency and throughput columns time the C
simulation on this CPU (row names carry "(csim)"); the accuracy is the simulation's fixed-point
result against the fp32 reference (bit-accurate with what the hardware would compute); kiln's
latency and resources on the part are its analytical ESTIMATES (``kiln.backends.fpga.estimate``).
hls4ml reports resources only from synthesis (``vitis_hls``), which is not here: its row has none.

Both get the same total bits (``BITS``) and reuse factor (``REUSE``): kiln chooses the integer
bits per tensor from calibration, hls4ml takes its default ``fixed<BITS, 6>`` everywhere.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session, Unavailable
from kiln.bench.backends.kiln_backend import KilnBackend, cold_cache

BITS = 16
REUSE = 1
HLS4ML_INTEGER_BITS = 6  # hls4ml's default precision: ap_fixed<16,6>
PART = "xcu250"


class KilnFpgaBackend(KilnBackend):
    """kiln's fpga target (``fpga:vitis``): calibrated fixed point, run as its C simulation."""

    name = "kiln-fpga"
    target = f"fpga:vitis,bits={BITS}" if BITS != 16 else "fpga:vitis"
    simulated = "csim"

    def availability(self) -> str | None:
        from kiln.backends import registry

        reason = registry.backend("fpga").available()
        return reason or super().availability()

    def config(self) -> dict[str, Any]:
        return {
            "threads": 1,
            "target": self.target,
            "executes": "C simulation (g++, ap_types): timings are of the simulation on this CPU, not of a device",
            "precision": f"ap_fixed<{BITS}, I> per tensor (I from calibration), reuse {REUSE}, {PART}",
        }

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import kiln
        from kiln.backends.fpga import DESIGNS
        from kiln.backends.fpga.estimate import DoesNotFit
        from kiln.backends.fpga.project import estimate_json
        from kiln.bench.backends.onnxruntime_backend import CALIBRATION_SEEDS
        from kiln.driver import plan_cache

        self.figures: dict[str, Any] = {}
        calibration = [model.inputs(seed=seed) for seed in CALIBRATION_SEEDS]
        try:
            with cold_cache():  # nothing cached, as every peer's compile: calibration, design, g++
                compiled = kiln.compile(str(model.onnx_path), target=self.target, calibration=calibration)
                compiled.prepare(example)  # the C simulation built and loaded before its cache folder goes
                plan_cache.wait()  # the plan's background save, before its folder goes
        except DoesNotFit as err:  # what the model would need on the part: the row says it
            raise Unavailable(str(err)) from None
        if compiled.accuracy is not None:
            self.figures["kiln_accuracy"] = compiled.accuracy.as_dict()
        for plan in getattr(compiled, "plans", []):
            found = DESIGNS.get(plan.source)
            if found is not None:
                self.figures["fpga_estimates"] = estimate_json(found[2], plan.target)
        self.artifact = compiled


class _Hls4mlSession(Session):
    def __init__(self, model: Any, shapes: list[tuple[int, ...]], folder: str) -> None:
        self.model, self.shapes, self.folder = model, shapes, folder

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        (x,) = feeds.values()
        batch = x.shape[0]
        y = np.asarray(self.model.predict(np.ascontiguousarray(x, dtype=np.float32)))
        return [y.reshape(batch, *shape[1:]).astype(np.float32) for shape in self.shapes]

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)  # hls4ml's project, made by compile


class Hls4mlBackend(Backend):
    """hls4ml (ONNX in through QONNX), io_parallel, its C simulation (``compile`` + ``predict``)."""

    name = "hls4ml"
    requires = ("hls4ml", "qonnx")
    simulated = "csim"

    def version(self) -> str:
        import hls4ml

        return hls4ml.__version__

    def availability(self) -> str | None:
        if shutil.which("g++") is None:
            return "hls4ml's C simulation needs g++: not found"
        return super().availability()

    def config(self) -> dict[str, Any]:
        return {
            "threads": 1,
            "executes": "C simulation (hls4ml compile/predict): timings are of the simulation on this CPU",
            "precision": f"fixed<{BITS},{HLS4ML_INTEGER_BITS}> (hls4ml's default integer bits), reuse {REUSE}",
            "io_type": "io_parallel",
            "resources": "hls4ml estimates resources only by synthesis (vitis_hls: not installed here)",
        }

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        if len(example) != 1:
            raise Unavailable("hls4ml takes models of one input")
        self.folder = tempfile.mkdtemp(prefix="kiln-bench-hls4ml-")
        try:
            self.artifact = convert(str(model.onnx_path), self.folder)
        except Exception as err:  # hls4ml's own errors name unsupported layers in many exception types
            shutil.rmtree(self.folder, ignore_errors=True)
            raise Unavailable(f"hls4ml cannot take this model: {type(err).__name__}: {str(err)[:200]}") from None
        self.shapes = output_shapes(str(model.onnx_path))

    def load(self) -> Session:
        return _Hls4mlSession(self.artifact, self.shapes, self.folder)


def convert(path: str, folder: str) -> Any:
    """hls4ml's C-simulation model of the ONNX file ``path`` (its project in ``folder``)."""
    import logging

    import hls4ml
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.channels_last import ConvertToChannelsLastAndClean
    from qonnx.transformation.gemm_to_matmul import GemmToMatMul
    from qonnx.util.cleanup import cleanup_model

    logging.getLogger("hls4ml").setLevel(logging.WARNING)
    wrapper = cleanup_model(cleanup_model(ModelWrapper(path)).transform(GemmToMatMul()))
    if any(n.op_type in ("Conv", "MaxPool", "AveragePool") for n in wrapper.graph.node):
        wrapper = cleanup_model(wrapper.transform(ConvertToChannelsLastAndClean(make_input_channels_last=False)))
    config = hls4ml.utils.config_from_onnx_model(
        wrapper,
        granularity="model",
        backend="Vitis",
        default_precision=f"fixed<{BITS},{HLS4ML_INTEGER_BITS}>",
        default_reuse_factor=REUSE,
    )
    from kiln.backends.fpga.target import PARTS

    converted = hls4ml.converters.convert_from_onnx_model(
        wrapper, output_dir=folder, backend="Vitis", hls_config=config, io_type="io_parallel", part=PARTS[PART].device
    )
    converted.compile()
    return converted


def output_shapes(path: str) -> list[tuple[int, ...]]:
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return [tuple(d.dim_value or 1 for d in o.type.tensor_type.shape.dim) for o in graph.output]


__all__ = ["Hls4mlBackend", "KilnFpgaBackend", "convert"]
