"""Every op's lowering in one table: the pointwise family (``lowering.py``) and each op family's
module. The driver hands ``lowerings()`` to the ``Lowerer``; an op is native on a target when
this table has it and its lowering accepts the node for that target (``CannotLower`` otherwise)."""

from __future__ import annotations

from functools import lru_cache

from kiln.ir.graph import Node
from kiln.lower import (
    fused_lowering,
    gemm_lowering,
    index_lowering,
    movement_lowering,
    nn_lowering,
    resize_lowering,
    window_lowering,
)
from kiln.lower import lowering as pointwise
from kiln.lower.lowering import ALIASES, Lowering


@lru_cache(maxsize=1)
def lowerings() -> dict[str, Lowering]:
    """op (``kiln::Op`` for kiln's own ops) -> lowering; later families override earlier ones (the
    matrix-multiply engine's MatMul/Conv take over from the loop nests, which they fall back to)."""
    table: dict[str, Lowering] = {}
    for family in (
        pointwise,
        movement_lowering,
        resize_lowering,
        nn_lowering,
        window_lowering,
        gemm_lowering,
        index_lowering,
    ):
        table.update(family.LOWERINGS)
    table["kiln::Fused"] = fused_lowering.lower_fused
    table["kiln::SafeSoftmax"] = nn_lowering.lower_softmax
    return table


def lowerable(node: Node) -> bool:
    """Whether lowering has a rule for ``node``'s op (what ``decompose`` keeps whole)."""
    return bool(node.domain) or node.op in lowerings() or node.op in ALIASES
