"""kiln's op registry: one definition per op (see ``kiln.ops.registry``).

Importing this package registers every op family: the registry's tables are full before any
module below it can look an op up (Python runs this file before any ``kiln.ops.*`` module)."""

from __future__ import annotations

from kiln.ops import control, elementwise, kiln_ops, misc, nn, shape, signal  # noqa: F401  (they register)
from kiln.ops.categories import declare
from kiln.ops.registry import REGISTRY, Attr, InferContext, OpDef, RunContext, lookup, register

declare()  # the op categories, once every op is registered

__all__ = ["REGISTRY", "Attr", "InferContext", "OpDef", "RunContext", "lookup", "register"]
