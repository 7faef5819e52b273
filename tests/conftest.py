"""Shared fixtures. ``target`` runs a test once per target this machine can run: every registered
cpu ISA path the CPU offers, and ``kir``, the test-only third target (``tests/targets/kir_backend.py``)
registered here through the public registry. A new target registers itself and joins every test
that takes ``target``."""

from __future__ import annotations

import pytest

from tests.targets.kir_backend import ensure_registered

ensure_registered()

COMPILED_TARGETS = ["cpu", "cpu:avx512", "cpu:avx2", "cpu:generic", "kir", "kir:loops", "gpu:interpret"]


def runnable(target: str) -> str:
    """``target``, or a skip saying why this machine cannot run it."""
    from kiln.backends import parse
    from kiln.lower.target import TargetError

    try:
        parse(target)
    except TargetError as err:
        pytest.skip(f"{target}: {err}")
    return target


@pytest.fixture(params=COMPILED_TARGETS)
def target(request):
    return runnable(request.param)
