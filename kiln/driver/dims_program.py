"""The dims vector of a new binding without specializing the graph: each dim a term of earlier ones.

The run-time dims route (``kiln.driver.spatial``) passes every symbolic dim of the graph to its
kernels. Specializing the graph at a new binding gives them exactly, but it infers every node
again (about 20 ms for mobilenet_v2: more than its run). Each dim the graph names is a layer's
size, made by one op from the sizes before it: a window's ``(d + a) // s + c0``, a flatten's
product, a broadcast's copy. So each is fitted, in the graph's order, as one term of the earlier
dims (``kiln.driver.spatial.TermFitter``'s terms: ``c0 + c * d_j``, ``c0 + c * d_j * d_k``, or a floor
division of one dim by one of the graph's window strides), from the vectors of bindings that were
specialized anyway: the lowered ones and the check bindings. Half of those fit, the other half
check; a dim no term fits, or that two terms fit differently, leaves the program out (every new
binding is then specialized, as before).

A dim whose name is an expression of the input dims (``(h+1)//2``, ``4*((h+3)//4)``:
``kiln.ir.dims``) is not fitted: the name is its program, checked against the vectors like a
fitted step. Evaluating the program costs microseconds. It is trusted only where it cannot be wrong unseen:
a binding whose vector has a dim below 1 (0 only for an input or a named expression of them, an
empty cache's past, with no fitted step reading it), above its size at the capacity (kernels are laid out
there), or two dims apart that were equal at every binding specialized (a residual Add, a U-Net's
Concat: the model may have no shapes there), is specialized instead, which raises InputError
where the model has no shapes.

The dims outside the route (a size class's batch) are inputs too: each class's variant has its own
capacity, and the program is fitted over every class's bindings (a term of the batch is no constant
then), else — no term fits them all — over the first class's only, the others specialized per
binding as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import dims as sizes

Step = tuple[int, int, int, tuple[tuple[int, int, int], ...]]  # (index, c0, c, factors (j, a, s))


@dataclass(frozen=True)
class DimsProgram:
    """``inputs``: the vector's entries bound by the call (by dim name); ``steps``: the others, in
    order, each ``c0 + c * prod(floor((d_j + a) / s))`` over earlier entries; ``capacity``: the
    vector at the capacity (an upper bound of every entry); ``equal``: groups of entries equal at
    every binding specialized."""

    names: tuple[str, ...]
    inputs: tuple[int, ...]
    steps: tuple[Step, ...]
    capacity: tuple[int, ...]
    equal: tuple[tuple[int, ...], ...]
    # entries whose dim is an expression of the input dims (``(h+1)//2``: kiln.ir.dims): the name
    # itself is the program, evaluated, never fitted
    named: tuple[int, ...] = ()
    # input entries outside the route (a size class's batch): each binding of them that was fitted
    # has its variant, laid out at its own capacity — ``capacity`` the first's, ``classes`` the
    # others' — and a call whose entries there match none is specialized
    fixed: tuple[int, ...] = ()
    classes: tuple[tuple[int, ...], ...] = ()

    def capacity_for(self, vector: np.ndarray) -> np.ndarray | None:
        """The capacity of the variant whose binding of the ``fixed`` entries is ``vector``'s (None: none)."""
        for capacity in (self.capacity, *self.classes):
            if all(vector[i] == capacity[i] for i in self.fixed):
                return np.asarray(capacity, dtype=np.int64)
        return None

    def __call__(self, dims: dict[str, Any]) -> np.ndarray | None:
        """The vector at ``dims`` (every input dim bound), or None where only specializing can tell."""
        vector = np.full(len(self.names), -1, dtype=np.int64)
        for index in self.inputs:
            size = dims.get(self.names[index])
            if size is None:
                return None
            vector[index] = size
        given = {self.names[i]: int(vector[i]) for i in self.inputs}
        for index in self.named:
            value = sizes.substitute(sizes.parse(self.names[index]), given)
            if not value.is_constant:
                return None
            vector[index] = value.constant
        # a size of 0 (an empty cache's past) is given exactly where an input or an expression of
        # them is 0; a fitted step that reads one was fitted on sizes of 2 and up: specialize
        exact = {*self.inputs, *self.named}
        empty = {i for i in exact if vector[i] == 0}
        for index, c0, c, factors in self.steps:
            product = 1
            for j, add, divisor in factors:
                if j in empty:
                    return None
                product *= (int(vector[j]) + add) // divisor
            value = c0 + c * product
            if not -(1 << 62) < value < 1 << 62:  # beyond any tensor: only specializing can tell (and refuse)
                return None
            vector[index] = value
        capacity = self.capacity_for(vector)
        if capacity is None:
            return None
        kept = capacity >= 1  # (-1: a dim no value keeps after folding)
        low = np.array([0 if i in exact else 1 for i in range(len(vector))], dtype=np.int64)
        if (vector[kept] < low[kept]).any() or (vector[kept] > capacity[kept]).any():
            return None
        if any(len(set(vector[list(group)].tolist())) != 1 for group in self.equal):
            return None
        return vector

    def as_meta(self) -> dict[str, Any]:
        return {
            "inputs": list(self.inputs),
            "steps": [[i, c0, c, [list(f) for f in factors]] for i, c0, c, factors in self.steps],
            "capacity": list(self.capacity),
            "equal": [list(group) for group in self.equal],
            "named": list(self.named),
            "fixed": list(self.fixed),
            "classes": [list(c) for c in self.classes],
        }

    @classmethod
    def from_meta(cls, found: Any, names: tuple[str, ...], divisors: tuple[int, ...]) -> DimsProgram:
        """A program read back from an artifact, checked for shape: entries in range, each step over
        earlier entries, divisors the graph's strides (ValueError where not)."""
        n = len(names)

        def ints(values: Any, low: int, high: int) -> tuple[int, ...]:
            if not isinstance(values, list) or any(type(v) is not int or not low <= v < high for v in values):
                raise ValueError(f"not integers in [{low}, {high}): {str(values)[:60]}")
            return tuple(values)

        if not isinstance(found, dict):
            raise ValueError("not a mapping")
        inputs = ints(found.get("inputs"), 0, n)
        capacity = ints(found.get("capacity"), -1, 1 << 31)
        if len(capacity) != n:
            raise ValueError("a capacity per dim")
        steps = []
        for step in found.get("steps") if isinstance(found.get("steps"), list) else [None]:
            if not isinstance(step, list) or len(step) != 4 or not isinstance(step[3], list) or len(step[3]) > 2:
                raise ValueError(f"a step {str(step)[:60]}")
            (index,) = ints([step[0]], 0, n)
            c0, c = ints(step[1:3], -(1 << 31), 1 << 31)
            factors = tuple(ints(f, 0, 1 << 31) if isinstance(f, list) and len(f) == 3 else () for f in step[3])
            if (
                any(len(f) != 3 or f[0] >= index or f[2] not in (1, *divisors) or f[1] >= f[2] for f in factors)
                or index in inputs
            ):
                raise ValueError(f"a step {str(step)[:60]}")
            steps.append((index, c0, c, factors))
        equal = tuple(ints(group, 0, n) for group in found.get("equal") or [])
        named = ints(found.get("named") or [], 0, n)
        given = {names[i] for i in inputs}
        if any(i in inputs or not expression_of(names[i], given) for i in named):
            raise ValueError("a named entry that is no expression of the input dims")
        fixed = ints(found.get("fixed") or [], 0, n)  # (a file from before size classes were fitted: none)
        if any(i not in inputs for i in fixed):
            raise ValueError("a fixed entry that is no input dim")
        classes = found.get("classes") or []
        if not isinstance(classes, list) or any(not isinstance(c, list) or len(c) != n for c in classes):
            raise ValueError("a capacity per dim in each class")
        others = tuple(ints(c, -1, 1 << 31) for c in classes)
        return cls(names, inputs, tuple(steps), capacity, equal, named, fixed, others)  # type: ignore[arg-type]


def expression_of(name: str, inputs: set[str]) -> bool:
    """Whether the dim ``name`` is an expression (kiln.ir.dims) of the dims ``inputs`` only."""
    if not sizes.is_dim_text(name):
        return False
    expr = sizes.parse(name)
    return not expr.is_constant and expr.symbol is None and sizes.symbols(expr) <= inputs
