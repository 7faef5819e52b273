"""Heavier peers (optional extras): TVM, IREE; and the ones that cannot run here, with reasons."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session, Unavailable


class TvmBackend(Backend):
    """Apache TVM: Relax from ONNX, built for the host CPU, untuned (tuning takes hours)."""

    name = "tvm"
    requires = ("tvm",)

    def version(self) -> str:
        import tvm

        return tvm.__version__

    def _target(self) -> dict[str, Any]:
        return {"kind": "llvm", "mcpu": _llvm_cpu(), "num-cores": self.threads}

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "target": self._target(), "tuning": "none"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import onnx
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx

        shapes = {k: list(v.shape) for k, v in example.items()}
        module = from_onnx(onnx.load(str(model.onnx_path)), shape_dict=shapes, keep_params_in_input=False)
        module = relax.transform.DecomposeOpsForInference()(module)
        module = relax.transform.LegalizeOps()(module)
        self.artifact = tvm.compile(module, target=tvm.target.Target(self._target()))

    def load(self) -> Session:
        import tvm
        from tvm import relax

        os.environ["TVM_NUM_THREADS"] = str(self.threads)
        machine = relax.VirtualMachine(self.artifact, tvm.cpu())
        return _TvmSession(machine)


class _TvmSession(Session):
    def __init__(self, machine: Any) -> None:
        self.machine = machine

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import tvm

        output = self.machine["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
        outputs = (
            output
            if isinstance(output, (list, tuple)) or (hasattr(output, "__len__") and not hasattr(output, "numpy"))
            else [output]
        )
        return [o.numpy() for o in outputs]


class IreeBackend(Backend):
    """IREE: iree-import-onnx, then iree-compile for llvm-cpu on the host CPU; local-task driver."""

    name = "iree"
    requires = ("iree.compiler", "iree.runtime")

    def version(self) -> str:
        from iree.compiler import version

        return getattr(version, "VERSION", "unknown")

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "backend": "llvm-cpu", "target_cpu": "host", "driver": "local-task"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        workdir = tempfile.mkdtemp(prefix="kiln-iree-")
        mlir = os.path.join(workdir, "model.mlir")
        vmfb = os.path.join(workdir, "model.vmfb")
        # installed beside this interpreter even when its environment is not activated
        importer = shutil.which("iree-import-onnx") or shutil.which(
            "iree-import-onnx", path=os.path.dirname(sys.executable)
        )
        if importer is None:
            raise Unavailable("iree-import-onnx is not on PATH (install iree-base-compiler[onnx])")
        subprocess.run([importer, str(model.onnx_path), "-o", mlir], check=True, capture_output=True)
        from iree.compiler import compile_file

        compile_file(
            mlir,
            output_file=vmfb,
            extra_args=[
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=host",
            ],
        )
        self.artifact = vmfb

    def load(self) -> Session:
        import iree.runtime as runtime

        runtime.flags.parse_flags(f"--task_topology_max_group_count={self.threads}")  # pin the thread count
        with open(self.artifact, "rb") as handle:
            module = runtime.load_vm_flatbuffer(handle.read(), driver="local-task")
        # iree-import-onnx names the entry after the ONNX graph; pick the synchronous one
        names = [n for n in module.vm_module.function_names if not n.startswith("__") and not n.endswith("$async")]
        if not names:
            raise RuntimeError(
                f"the compiled IREE module exports no entry function ({module.vm_module.function_names})"
            )
        return _IreeSession(module[names[0]])


class _IreeSession(Session):
    def __init__(self, entry: Any) -> None:
        self.entry = entry

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        output = self.entry(*feeds.values())
        outputs = output if isinstance(output, (list, tuple)) else [output]
        return [np.asarray(o.to_host() if hasattr(o, "to_host") else o) for o in outputs]


class TensorRtBackend(Backend):
    """NVIDIA TensorRT: the ONNX parser, an engine built for the example shapes, I/O buffers held
    as CUDA tensors by a CUDA-enabled torch. Needs an NVIDIA GPU; runs energy through NVML."""

    name = "tensorrt"
    requires = ("tensorrt", "torch")
    device = "cuda"

    def availability(self) -> str | None:
        if shutil.which("nvidia-smi") is None:
            return "no NVIDIA GPU on this machine (nvidia-smi not found)"
        reason = super().availability()
        if reason:
            return reason
        import torch

        if not torch.cuda.is_available():
            return "torch has no CUDA here (TensorRT's buffers are CUDA tensors)"
        return None

    def version(self) -> str:
        import tensorrt

        return tensorrt.__version__

    def config(self) -> dict[str, Any]:
        return {"device": "cuda:0", "precision": "fp32", "profile": "static shapes of the example inputs"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import tensorrt as trt

        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        with open(model.onnx_path, "rb") as handle:
            if not parser.parse(handle.read()):
                errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
                raise RuntimeError(f"TensorRT's ONNX parser refused the model: {errors}")
        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        for name, array in example.items():
            profile.set_shape(name, array.shape, array.shape, array.shape)
        config.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError("TensorRT could not build an engine for this model")
        self.artifact = bytes(serialized)

    def load(self) -> Session:
        import tensorrt as trt

        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        return _TensorRtSession(runtime.deserialize_cuda_engine(self.artifact))


class _TensorRtSession(Session):
    def __init__(self, engine: Any) -> None:
        import threading

        self.engine = engine
        self.local = threading.local()  # an execution context per thread
        self.outputs = [
            engine.get_tensor_name(i)
            for i in range(engine.num_io_tensors)
            if engine.get_tensor_mode(engine.get_tensor_name(i)).name == "OUTPUT"
        ]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import tensorrt as trt
        import torch

        context = getattr(self.local, "context", None)
        if context is None:
            context = self.local.context = self.engine.create_execution_context()
            self.local.stream = torch.cuda.Stream()
        keep = []
        for name, array in feeds.items():
            tensor = torch.from_numpy(np.ascontiguousarray(array)).cuda()
            keep.append(tensor)
            context.set_input_shape(name, tuple(array.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        results = []
        for name in self.outputs:
            dtype = torch.from_numpy(np.zeros(0, dtype=trt.nptype(self.engine.get_tensor_dtype(name)))).dtype
            tensor = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device="cuda")
            context.set_tensor_address(name, tensor.data_ptr())
            results.append(tensor)
        context.execute_async_v3(self.local.stream.cuda_stream)
        self.local.stream.synchronize()
        return [t.cpu().numpy() for t in results]


def _llvm_cpu() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = handle.read()
    except OSError:
        pass
    if "avx512f" in flags and "AMD" in flags:
        return "znver4"
    if "avx512f" in flags:
        return "skylake-avx512"
    if "avx2" in flags:
        return "haswell"
    return platform.machine()
