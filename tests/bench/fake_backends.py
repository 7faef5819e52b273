"""Backends that misbehave on purpose, registered for the harness tests (``--plugin``)."""

import os
import time

import numpy as np

import kiln
from kiln.bench.backends import Backend, Session, register

_LEAKED: list[bytes] = []


class _Run(Session):
    def __init__(self, model, leak: int = 0, sleep: float = 0.0):
        self.model, self.leak, self.sleep = model, leak, sleep

    def run(self, feeds):
        if self.leak:
            _LEAKED.append(np.ones(self.leak, np.uint8).tobytes())  # never freed: a leak
        if self.sleep:
            time.sleep(self.sleep)
        return list(self.model.run(feeds).values())


class _Fake(Backend):
    leak = 0
    sleep = 0.0

    def version(self):
        return "0-test"

    def compile(self, model, example):
        self.artifact = kiln.compile(str(model.onnx_path))

    def load(self):
        return _Run(self.artifact, self.leak, self.sleep)


class Crash(_Fake):
    name = "fake-crash"

    def compile(self, model, example):
        os._exit(7)


class Hang(_Fake):
    name = "fake-hang"
    sleep = 3600.0


class Slow(_Fake):
    """Compiles for 4 s: long enough to lose its node mid-job in the fleet tests."""

    name = "fake-slow"

    def compile(self, model, example):
        time.sleep(4.0)
        super().compile(model, example)


class Sluggish(Slow):
    name = "fake-sluggish"


class Leak(_Fake):
    name = "fake-leak"
    leak = 1_000_000  # 1 MB per inference


class Fail(_Fake):
    name = "fake-error"

    def compile(self, model, example):
        raise ValueError("this backend cannot compile anything")


class Missing(_Fake):
    name = "fake-missing"

    def availability(self):
        return "not installed (needs imaginary-package)"


class MissingSubpackage(_Fake):
    name = "fake-missing-subpackage"
    requires = ("no_such_package.compiler",)


class BrokenCheck(_Fake):
    name = "fake-broken-check"

    def availability(self):
        raise RuntimeError("driver query exploded")


class RefusesNewIR(_Fake):
    """Refuses models by their IR version, as onnxruntime 1.31 refused IR 14 (1.32 accepts it: a
    test must not depend on a real peer's refusal)."""

    name = "fake-refuses-ir14"

    def compile(self, model, example):
        import onnx

        version = onnx.load(str(model.onnx_path), load_external_data=False).ir_version
        if version >= 11:
            raise RuntimeError(f"Unsupported model IR version: {version}, max supported IR version: 10")
        super().compile(model, example)


class Hungry(_Fake):
    """Needs 256 MB at batch 1 and 16 GB from batch 2 on: under a worker's memory limit, its
    batch sweep ends in an out-of-memory row (a study's synthetic OOM)."""

    name = "fake-hungry"

    def compile(self, model, example):
        self.held = bytearray((256 << 20) if model.batch == 1 else (16 << 30))
        super().compile(model, example)


for _cls in (Hungry, Crash, Hang, Slow, Sluggish, Leak, Fail, Missing, MissingSubpackage, BrokenCheck, RefusesNewIR):
    register(_cls.name, f"{__name__}:{_cls.__name__}")
