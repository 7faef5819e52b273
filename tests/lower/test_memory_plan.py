"""The arena's plan: buffers alive at the same time never share bytes, at the capacity and, for a
plan whose sizes grow with a run-time length, at every length its formulas are evaluated at."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir.types import DType
from kiln.lower.kir import Buffer
from kiln.lower.memory import ALIGNMENT, growing_layout, plan_memory


def _disjoint(buffers, lifetimes, offsets, sizes) -> None:
    for i, a in enumerate(buffers):
        for b in buffers[i + 1 :]:
            (s1, e1), (s2, e2) = lifetimes[a], lifetimes[b]
            if s1 > e2 or s2 > e1:
                continue  # never alive together: they may share
            apart = offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a]
            assert apart, f"{a.name} and {b.name} overlap"


def _random_plan(seed: int, count: int = 40, steps: int = 30, capacity: int = 64):
    rng = np.random.default_rng(seed)
    buffers, coefficients, access = [], {}, [([], []) for _ in range(steps)]
    for i in range(count):
        c0, c1, c2 = (int(rng.integers(0, 300)), int(rng.integers(0, 40)), int(rng.integers(0, 3)) * (i % 3 == 0))
        size = c0 + c1 * capacity + c2 * capacity * capacity
        buffer = Buffer(f"t{i}", DType.UINT8, max(size, 1))
        start = int(rng.integers(0, steps))
        end = min(steps - 1, start + int(rng.integers(0, 6)))
        access[start][1].append(buffer)
        access[end][0].append(buffer)
        buffers.append(buffer)
        coefficients[buffer] = (c0, c1, c2) if size else (1, 0, 0)
    plan = plan_memory(access, set(buffers))
    return plan, buffers, coefficients


@pytest.mark.parametrize("seed", range(6))
def test_a_growing_layout_keeps_live_buffers_apart_at_every_length(seed):
    """At every length from the floor to the capacity: buffers alive together are disjoint, the
    arena never exceeds the capacity's plan, and it grows with the length."""
    capacity, floor = 64, 4
    plan, buffers, coefficients = _random_plan(seed, capacity=capacity)
    valid = Buffer("valid", DType.INT64, 1)
    layout = growing_layout(plan, coefficients, valid, floor, capacity)
    previous = 0
    for n in range(floor, capacity + 1):
        offsets, arena = layout.at(n)
        by_buffer = dict(zip(layout.order, offsets))
        sizes = {b: sum(c * n**k for k, c in enumerate(coefficients[b])) for b in buffers}
        assert all(o % ALIGNMENT == 0 for o in offsets)
        _disjoint(buffers, plan.lifetimes, by_buffer, sizes)
        assert max(by_buffer[b] + sizes[b] for b in buffers) <= arena <= plan.arena_bytes
        assert arena >= previous
        previous = arena
    # below the floor the kernels run at the floor: so is the layout
    assert layout.at(1) == layout.at(floor)
    assert layout.at(floor)[1] < layout.at(capacity)[1]


def test_a_size_that_shrinks_as_the_length_grows_is_refused():
    plan, buffers, coefficients = _random_plan(0)
    valid = Buffer("valid", DType.INT64, 1)
    first = buffers[0]
    shrinking = dict(coefficients)
    shrinking[first] = (first.nbytes + 10 * 64, -10, 0)  # its capacity size, but larger when shorter
    with pytest.raises(ValueError, match="shrinks"):
        growing_layout(plan, shrinking, valid, 4, 64)
    wrong = dict(coefficients)
    wrong[first] = (first.nbytes + 1, 0, 0)  # not the buffer's size at the capacity
    with pytest.raises(ValueError, match="not its size"):
        growing_layout(plan, wrong, valid, 4, 64)
