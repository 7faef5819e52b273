"""``CompileOptions``: every setting a compile depends on, typed, in one place.

Environment variables remain as overrides (for a deployed service, a CI job, a bisection), but
they are read once, by ``CompileOptions.from_env`` when a compile starts, never at their point of
use deep in a pass or a renderer:

    KILN_DISABLE=winograd,fuse   passes and algorithms turned off (``disabled``)
    KILN_TUNED=0                 ignore the tuning database (``tuned``)
    KILN_DEBUG=1                 checked indices, sanitizers, kernel-IR verification (``debug``)
    KILN_PLAN_CACHE=0            no plan cache (``plan_cache``)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kiln.backends import BuildOptions
from kiln.errors import KilnError
from kiln.lower.engine import WEIGHT_FORMATS
from kiln.passes import PASS_NAMES

# algorithms ``disabled`` may name besides the graph passes ("size-classes": every size of a
# sample-parallel dim compiles, as for any other dim; "run-time-length": a padded dim compiles its
# padded lengths instead of kernels that take the length at run time; "run-time-dims": ranged dims
# that neither chunk nor pad compile per size instead of kernels that take them at run time;
# "direct-window": depthwise convolutions by their plane's taps, never output by output;
# "size-specific": lowerings that hold at the compiled sizes only, such as a window's tap that no
# output reaches left out, are not made; "requantize": int8 and bf16 products store no narrow copy
# of their output for their readers, each reader quantizes or rounds the floats itself,
# kiln.lower.narrow_store; "quantized-only": int8 and bf16 products whose floats nothing reads still
# store them, kiln.lower.quantized_only; "cache-in-place": the run-time dims route lays a decode step's
# KV cache out dense at its sizes and copies the past into the present each step,
# kiln.passes.cache_in_place)
ALGORITHMS = (
    "winograd",
    "direct",
    "direct-window",
    "size-specific",
    "requantize",
    "quantized-only",
    "size-classes",
    "run-time-length",
    "run-time-dims",
    "cache-in-place",
)
# of matrix products and convolutions; "auto": the best this target computes natively (bf16 where
# the CPU has bf16 instructions), said by the compiled model (``precision``); "int8-weights",
# "int4-weights" and its variants: the constant weights of matrix products narrow (per output
# column, per group of k), activations and sums float32 (kiln.lower.engine.WEIGHT_FORMATS)
PRECISIONS = ("fp32", "bf16", "int8", *WEIGHT_FORMATS, "auto")
FALSE = ("0", "", "false", "no", "off")


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    return default if value is None else value.strip().lower() not in FALSE


@dataclass(frozen=True)
class Quantization:
    """What an int8 compile quantizes with (``kiln.quantize`` computes it from calibration data):
    each activation's range by value name (lo, hi) and the nodes kept in fp32 (mixed precision:
    the most sensitive layers when an accuracy budget asks for it)."""

    ranges: tuple[tuple[str, float, float], ...] = ()
    keep: frozenset[str] = frozenset()
    method: str = "minmax"

    def digest(self) -> str:
        import hashlib

        text = repr((self.method, sorted(self.ranges), sorted(self.keep)))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompileOptions:
    level: int = 2  # -O level, 0..3
    disabled: frozenset[str] = field(default_factory=frozenset)  # pass names and ALGORITHMS
    tuned: bool = True  # read schedules from the tuning database
    debug: bool = False  # generated code checks indices, built with sanitizers; kernel IR verified
    profile: bool = False  # per-kernel timers in the generated code
    plan_cache: bool = True  # read and write the on-disk plan cache
    precision: str = "fp32"
    quantization: Quantization = field(default_factory=Quantization)  # int8's ranges and fp32 layers
    generation: bool = False  # a decode step for kiln.generate: its logits at each row's last position only
    # past input name -> its present's shape at the capacity: the KV cache updated in place (given by
    # the run-time dims route only, whose runs lay those inputs out so; kiln.passes.cache_in_place)
    cache_layouts: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.level, int) or not 0 <= self.level <= 3:
            raise KilnError(f"optimization level must be 0..3, got {self.level!r}")
        unknown = set(self.disabled) - set(PASS_NAMES) - set(ALGORITHMS)
        if unknown:
            raise KilnError(
                f"cannot disable {sorted(unknown)}: not a pass or algorithm "
                f"(passes: {', '.join(PASS_NAMES)}; algorithms: {', '.join(ALGORITHMS)})"
            )
        if self.precision not in PRECISIONS:
            raise KilnError(f"precision {self.precision!r} is not supported; supported: {', '.join(PRECISIONS)}")
        object.__setattr__(self, "disabled", frozenset(self.disabled))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **given: Any) -> CompileOptions:
        """Defaults, then the KILN_* overrides, then what the caller passed (``given``; None
        values are ignored). Reads the environment once."""
        env = os.environ if env is None else env
        settings: dict[str, Any] = {
            "disabled": frozenset(p.strip() for p in env.get("KILN_DISABLE", "").split(",") if p.strip()),
            "tuned": _flag(env, "KILN_TUNED", True),
            "debug": _flag(env, "KILN_DEBUG", False),
            "plan_cache": _flag(env, "KILN_PLAN_CACHE", True),
        }
        for key, value in given.items():
            if value is None:
                continue
            if key == "disabled":
                value = frozenset(settings["disabled"]) | frozenset(value)
            settings[key] = value
        return cls(**settings)

    def with_(self, **changes: Any) -> CompileOptions:
        return replace(self, **changes)

    @property
    def build(self) -> BuildOptions:
        """What of these options a backend's render and build read."""
        return BuildOptions(self.level, self.debug, self.profile)

    @property
    def passes_disabled(self) -> frozenset[str]:
        return frozenset(d for d in self.disabled if d in PASS_NAMES)

    @property
    def algorithms_disabled(self) -> frozenset[str]:
        return frozenset(d for d in self.disabled if d in ALGORITHMS)

    def key(self) -> str:
        """What of these options changes a plan (part of the plan cache's key)."""
        key = f"O{self.level};off={','.join(sorted(self.disabled))};dbg={int(self.debug)};{self.precision}"
        quantized = self.precision == "int8" or self.quantization.ranges  # int8, or a fixed-point design's ranges
        key += ";gen" if self.generation else ""
        key += "".join(f";kv={name}:{'x'.join(map(str, layout))}" for name, layout in self.cache_layouts)
        return key + (f";q={self.quantization.digest()}" if quantized else "")
