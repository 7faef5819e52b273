"""Every op's lowering in one table: the pointwise family (``lowering.py``) and each op family's
module. The driver hands ``lowerings()`` to the ``Lowerer``; an op is native on a target when
this table has it and its lowering accepts the node for that target (``CannotLower`` otherwise)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kiln.ir.graph import Node
from kiln.lower import (
    channels_last,
    fused_lowering,
    gemm_lowering,
    index_lowering,
    movement_lowering,
    nn_lowering,
    resize_lowering,
    window_lowering,
)
from kiln.lower import lowering as pointwise
from kiln.lower.engine import NotForEngine
from kiln.lower.lowering import ALIASES, Lowering

LOOPS, ENGINE = 0, 10  # priorities: a kiln engine's lowering is tried before the loop nests


@dataclass(frozen=True)
class Rule:
    """One way to lower ``op``: ``lower`` raises ``NotForEngine`` when the node is not its to
    take (a dtype, a shape, a target without the engine), and the next rule by priority is tried."""

    op: str
    lower: Lowering
    priority: int = LOOPS


def rules() -> list[Rule]:
    """Every family's rules: the loop-nest families at LOOPS, the engines' at their own priority."""
    found = [
        Rule(op, lower)
        for family in (
            pointwise,
            movement_lowering,
            resize_lowering,
            nn_lowering,
            window_lowering,
            channels_last,
            index_lowering,
        )
        for op, lower in family.LOWERINGS.items()
    ]
    found += [Rule(op, lower, ENGINE) for op, lower in gemm_lowering.ENGINE_LOWERINGS.items()]
    found += [Rule("kiln::Fused", fused_lowering.lower_fused), Rule("kiln::SafeSoftmax", nn_lowering.lower_softmax)]
    return found


def chain(candidates: list[Rule]) -> Lowering:
    """One lowering trying ``candidates`` highest priority first."""
    if len(candidates) == 1:
        return candidates[0].lower
    ordered = sorted(candidates, key=lambda rule: -rule.priority)

    def lower(lw: Any, node: Node, *args: Any, **kwargs: Any) -> Any:
        for rule in ordered[:-1]:
            try:
                return rule.lower(lw, node, *args, **kwargs)
            except NotForEngine:
                continue
        return ordered[-1].lower(lw, node, *args, **kwargs)

    return lower


@lru_cache(maxsize=1)
def lowerings() -> dict[str, Lowering]:
    """op (``kiln::Op`` for kiln's own ops) -> its lowering: the op's rules tried by priority
    (the matrix-multiply engine's MatMul/Conv before the loop nests they fall back to). Two rules
    of one op at one priority are an error: which wins is never an accident of order."""
    by_op: dict[str, list[Rule]] = {}
    for rule in rules():
        same = [r for r in by_op.get(rule.op, []) if r.priority == rule.priority]
        if same:
            raise ValueError(f"two lowerings of {rule.op} at priority {rule.priority}: give one a priority of its own")
        by_op.setdefault(rule.op, []).append(rule)
    return {op: chain(candidates) for op, candidates in by_op.items()}


def lowerable(node: Node) -> bool:
    """Whether lowering has a rule for ``node``'s op (what ``decompose`` keeps whole)."""
    return bool(node.domain) or node.op in lowerings() or node.op in ALIASES
