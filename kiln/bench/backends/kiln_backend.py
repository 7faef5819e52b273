"""kiln itself, on any of its targets (``kiln`` is the default target; ``kiln-<target>`` names one)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import kiln
from kiln.bench.backends.base import Backend, Session
from kiln.driver import plan_cache
from kiln.memory import return_freed


@contextlib.contextmanager
def cold_cache() -> Iterator[None]:
    """kiln's caches (plans, built libraries) empty, as on a new machine, for the block's compiles."""
    cold = tempfile.mkdtemp(prefix="kiln-bench-cold-")
    previous = os.environ.get("KILN_CACHE_DIR")
    os.environ["KILN_CACHE_DIR"] = cold
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("KILN_CACHE_DIR", None)
        else:
            os.environ["KILN_CACHE_DIR"] = previous
        shutil.rmtree(cold, ignore_errors=True)


class _KilnSession(Session):
    def __init__(self, model: Any) -> None:
        self.model = model

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.model.run(feeds).values())

    def close(self) -> None:
        self.model.close()


class KilnBackend(Backend):
    name = "kiln"
    target = "cpu"
    precision = "fp32"  # of matrix products and convolutions (kiln.compile's precision)

    @property
    def native(self) -> bool:
        """A native code target (built, saved as an artifact, loaded), not the reference interpreter."""
        return self.target.split(":")[0] == "cpu"

    def availability(self) -> str | None:
        from kiln.backends import registry
        from kiln.errors import KilnError

        try:
            target = registry.parse(self.target)
        except KilnError as err:  # e.g. cpu:avx2 on a CPU without AVX2
            return str(err)
        if self.precision != "fp32":  # e.g. bf16 on a CPU without bf16 instructions
            reason = registry.backend(target.backend).precisions(target).get(self.precision, "unknown precision")
            if reason:
                return reason
        return super().availability()

    def version(self) -> str:
        return kiln.__version__

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"threads": self.threads, "target": self.target, "precision": self.precision}
        if self.precision == "bf16":
            from kiln.backends.cpu import features

            config["bf16_path"] = features.bf16_path()[1]
        return config

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        self.figures: dict[str, Any] = {}
        # the model's file first, outside kiln's cold cache: resolving a zoo model there would
        # export it again through torch inside kiln's timed compile (19 s and 416 MB that are not kiln's)
        source = str(model.onnx_path)
        if self.native and self.cold_compile:
            # cold: kiln's caches (plans, built libraries) empty, as on a new machine; then the
            # compile that is benchmarked, with the caches as they are (a plan-cache hit says so)
            with cold_cache():
                start = time.perf_counter()
                self._sized(kiln.compile(source, target=self.target, **self._precision(model)), model, example)
                self.figures["compile_cold_s"] = time.perf_counter() - start
                plan_cache.wait()
            # the cold compile's model is gone: its memory goes back to the OS before the compile
            # that is kept, as if each had its own process (glibc keeps freed blocks otherwise, and
            # the kept compile's peak stacked on them: resnet50's row peaked 384 MB, 2026-11-27)
            return_freed(collect=True)
        hits = plan_cache.STATS["hits"]
        start = time.perf_counter()
        compiled = kiln.compile(source, target=self.target, **self._precision(model))
        if compiled.accuracy is not None:
            self.figures["kiln_accuracy"] = compiled.accuracy.as_dict()
        if self.native:
            self._sized(compiled, model, example)  # compiled for the example's dims here, not on the first run
            self.figures["compile_cached_s"] = time.perf_counter() - start
            self.figures["plan_cache_hit"] = plan_cache.STATS["hits"] > hits
            # compile = build the artifact; load = read it back, as a deployment would
            handle, path = tempfile.mkstemp(suffix=".kiln")
            os.close(handle)
            try:
                compiled.save(path)
            except BaseException:
                os.unlink(path)
                raise
            self.artifact = path
            # the prepared binding's plan is stored in the background and holds its packed weights
            # until written: part of the compile, not of the load measured next (resnet50's row held
            # 160 MB of them through its load and runs, 2026-11-27)
            plan_cache.wait()
        else:
            self.artifact = compiled

    def _sized(self, compiled: Any, model: Any, example: dict[str, np.ndarray]) -> None:
        """Compile what the runs will need: the example's dims, or for a variable batch its
        range declared on the model's first symbolic dim (its size classes: nothing compiles
        during the run when the dim is sample-parallel)."""
        if model.batch_range is None:
            compiled.prepare(example)
            return
        from kiln.passes.batching import symbols

        first = next(iter(symbols(compiled.signature)), None)
        if first is None:
            compiled.prepare(example)
            return
        compiled.declare({first: tuple(model.batch_range)})

    def _precision(self, model: Any) -> dict[str, Any]:
        """kiln.compile's precision arguments; int8 calibrates on the inputs every int8 row gets."""
        if self.precision != "int8":
            return {"precision": self.precision}
        from kiln.bench.backends.onnxruntime_backend import CALIBRATION_SEEDS

        return {"precision": "int8", "calibration": [model.inputs(seed=seed, batch=1) for seed in CALIBRATION_SEEDS]}

    def compile_figures(self) -> dict[str, Any]:
        return getattr(self, "figures", {})

    def compiled_count(self) -> int | None:
        model = getattr(self, "loaded", None)
        return None if model is None or not hasattr(model, "variants") else len(model.variants) + model.evicted

    def load(self) -> Session:
        if self.native:
            try:
                self.loaded = kiln.load(self.artifact, threads=self.threads)
                return _KilnSession(self.loaded)
            finally:  # the loaded model holds what it needs: the file goes (a bench run once left 1.6 GB)
                os.unlink(self.artifact)
        return _KilnSession(self.artifact)  # the reference has no artifact: load time is ~0


class KilnAvx2Backend(KilnBackend):
    """kiln's AVX2 code path (``cpu:avx2``), e.g. on an AVX-512 machine: both ISAs in one run."""

    name = "kiln-avx2"
    target = "cpu:avx2"


class KilnBf16Backend(KilnBackend):
    """kiln with its matrix products and convolutions in bf16 (AMX-BF16, else AVX512_BF16): a
    different accuracy class, so its rows carry the agreement with the fp32 reference."""

    name = "kiln-bf16"
    precision = "bf16"


class KilnInt8Backend(KilnBackend):
    """kiln's int8 post-training quantization, calibrated (min-max) on the same inputs
    onnxruntime-int8 gets; its accuracy report (vs kiln fp32, on inputs kept out of calibration)
    is in the row's config."""

    name = "kiln-int8"
    precision = "int8"


class KilnReferenceBackend(KilnBackend):
    """kiln's reference interpreter: the oracle, exact and slow."""

    name = "kiln-reference"
    target = "reference"
