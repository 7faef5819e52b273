"""Fuzzing names on every target (issue 47): a model whose every value and node is renamed with drawn
text in each generated language's syntax (C/C++ comments and strings, line continuations and the
??/ trigraph, Python/Triton strings, Tcl and shell substitutions) compiles on cpu, gpu (Triton's
interpreter) and fpga (the C simulation, which builds and runs the generated HLS C++) to the
reference's answer, and no name reaches a generated source except through kiln.source_text.

CI runs a few examples per target (a C simulation takes seconds); ``KILN_FUZZ_EXAMPLES=200`` runs more.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from tests.fuzz.test_fuzz_ops import HOSTILE_TEXT
from tests.hostile.test_round_three import fpga_ready, named_mlp, raw_names_in

EXAMPLES = max(3, int(os.environ.get("KILN_FUZZ_EXAMPLES", "40")) // 10)
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None
)
TARGETS = ["cpu", "gpu:interpret", "fpga:vitis"]


def ready(target: str) -> str | None:
    if target.startswith("gpu"):
        try:
            import triton  # noqa: F401
        except ImportError:
            return "the gpu target renders Triton kernels (pip install triton)"
    if target.startswith("fpga"):
        return fpga_ready()
    return None


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(names=st.lists(HOSTILE_TEXT, min_size=4, max_size=4))
def test_hostile_names_compile_right_and_never_reach_a_source(target, names):
    reason = ready(target)
    if reason:
        pytest.skip(reason)
    names = [f"{name[:200]}{i}" for i, name in enumerate(names)]  # unique, and short enough to compile fast
    model, feeds = named_mlp(names)
    calibration = {"calibration": [feeds]} if target.startswith("fpga") else {}
    compiled = kiln.compile(model, target=target, **calibration)
    want = kiln.compile(model, target="reference").run(feeds)
    got = compiled.run(feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-3, atol=0.05 if target.startswith("fpga") else 1e-4)
    for plan in compiled.plans:
        assert raw_names_in(getattr(plan, "source", ""), names) == []
    assert not any(p.name.lower().startswith("pwned") for p in os.scandir("."))
