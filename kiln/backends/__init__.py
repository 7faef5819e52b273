"""kiln's targets. Importing this package registers the built-in ones: ``cpu`` (C, this machine
or one ISA), ``gpu`` (Triton: a CUDA device, or ``gpu:interpret`` on the CPU), ``fpga`` (HLS C++, C-simulated) and ``reference`` (the reference interpreter, no compilation). See ``registry``."""

from __future__ import annotations

from kiln.backends.cpu import CpuBackend
from kiln.backends.fpga import FpgaBackend
from kiln.backends.gpu import GpuBackend
from kiln.backends.registry import (
    Backend,
    BuildOptions,
    Loaded,
    Threading,
    backend,
    names,
    parse,
    register,
    unregister,
)


class ReferenceBackend(Backend):
    """``reference``: every node runs its reference implementation (the oracle of every test)."""

    name = "reference"
    compiles = False


register(CpuBackend())
register(GpuBackend())
register(FpgaBackend())
register(ReferenceBackend())

__all__ = ["Backend", "BuildOptions", "Loaded", "Threading", "backend", "names", "parse", "register", "unregister"]
