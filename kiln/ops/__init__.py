"""kiln's op registry: one definition per op (see ``kiln.ops.registry``)."""

from __future__ import annotations

from kiln.ops.registry import REGISTRY, Attr, InferContext, OpDef, RunContext, lookup, register

_LOADED = False


def load_all() -> None:
    """Import every op family once, filling ``REGISTRY``."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    from kiln.ops import control, elementwise, kiln_ops, misc, nn, shape  # noqa: F401


__all__ = ["REGISTRY", "Attr", "InferContext", "OpDef", "RunContext", "load_all", "lookup", "register"]
