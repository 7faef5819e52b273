"""Which lowering takes an op is decided by explicit priority, never by the order families load."""

from __future__ import annotations

import pytest

from kiln.lower import families
from kiln.lower.engine import NotForEngine
from kiln.lower.families import ENGINE, LOOPS, Rule, chain


def test_an_engine_rule_is_tried_first_and_refusal_falls_to_the_loop_nests():
    calls = []

    def engine(lw, node, **kwargs):
        calls.append("engine")
        if node == "refused":
            raise NotForEngine("not float32")
        return ["engine kernels"]

    def loops(lw, node, **kwargs):
        calls.append("loops")
        return ["loop kernels"]

    lower = chain([Rule("MatMul", loops, LOOPS), Rule("MatMul", engine, ENGINE)])  # listed loops first
    assert lower(None, "taken") == ["engine kernels"] and calls == ["engine"]
    assert lower(None, "refused") == ["loop kernels"] and calls == ["engine", "engine", "loops"]


def test_two_rules_of_one_op_at_one_priority_are_refused(monkeypatch):
    original = families.rules
    monkeypatch.setattr(families, "rules", lambda: [*original(), Rule("Relu", lambda lw, node: [], LOOPS)])
    families.lowerings.cache_clear()
    try:
        with pytest.raises(ValueError, match="two lowerings of Relu at priority 0"):
            families.lowerings()
    finally:
        monkeypatch.undo()
        families.lowerings.cache_clear()


def test_matmul_and_conv_go_to_the_engine_before_the_loop_nests():
    ops = {}
    for rule in families.rules():
        ops.setdefault(rule.op, []).append(rule.priority)
    assert sorted(ops["MatMul"]) == [LOOPS, ENGINE] and sorted(ops["Conv"]) == [LOOPS, ENGINE]
