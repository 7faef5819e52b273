"""The dims vector of the route whose kernels take sizes at run time (``kiln.driver.spatial``):
every symbolic dim of the graph (``graph_symbols``), each one's size at a binding (``dim_values``:
the graph specialized there), and the bindings the route lowers (``generic_samples``: the
capacity first, then sizes spread so no two dims agree by accident) and checks (``checks``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kiln.ir.graph import Graph
from kiln.passes.specialize import specialize

CHECKS = 8  # bindings beyond the lowered ones where the fitted terms are compared


def _near(target: int, low: int, high: int, residue: int) -> int:
    """The size nearest ``target`` in (low, high) that is ``residue`` modulo 32 (else odd): sizes
    whose halvings are odd or even in different ways, so a layer's dims are no multiple of the
    next one's at every binding lowered."""
    for modulus, wanted in ((32, residue), (2, 1)):
        base = target - (target - wanted) % modulus
        for candidate in (base, base + modulus, base - modulus):
            if low < candidate < high and abs(candidate - target) <= max(1, (high - low) // 8):
                return candidate
    return target


def samples(ranges: dict[str, tuple[int, int]]) -> tuple[tuple[int, ...], ...] | None:
    """The bindings lowered (capacity first): per dim its range's end, two sizes between and its
    low end; one dim's sizes between rise where the next one's fall, so two dims never take the
    same sizes. None when a range is too short to tell (four distinct sizes per dim)."""
    columns = []
    for index, (low, high) in enumerate(ranges.values()):
        upper, lower = (3 * high + low) // 4, (high + 3 * low) // 4
        if index % 2:
            upper, lower = lower, upper
        column = [high, _near(upper, low, high, 1), _near(lower, low, high, 19), low]
        for row in (1, 2):  # never the size an earlier dim takes at that binding
            taken = {earlier[row] for earlier in columns}
            for step in (0, 2, -2, 4, -4, 6, -6, 8, -8):
                if low < column[row] + step < high and column[row] + step not in taken:
                    column[row] += step
                    break
        if len(set(column)) != 4 or any(column[r] == earlier[r] for earlier in columns for r in (1, 2)):
            return None
        columns.append(tuple(column))
    return tuple(zip(*columns))


def generic_samples(
    graph: Graph, names: tuple[str, ...], ranges: dict[str, tuple[int, int]], dims: dict[str, int]
) -> tuple[tuple[int, ...], ...] | None:
    """``samples``, each raised (all dims by one at a time) until no dim of the graph that differs
    from its size at the capacity is 0 or 1: a lowering there is the general program (a plane of
    one pixel simplifies its index arithmetic away), which runs right at those sizes too. None
    when the ranges are too short, or too small for any binding but the capacity to be general."""
    chosen = samples(ranges)
    if chosen is None:
        return None
    highs = [high for _, high in ranges.values()]
    capacity = dim_values(graph, names, {**dims, **dict(zip(ranges, chosen[0]))})
    rows = [chosen[0]]
    for row in chosen[1:]:
        sizes = list(row)
        while True:
            vector = dim_values(graph, names, {**dims, **dict(zip(ranges, sizes))})
            if not ((vector != capacity) & (vector <= 1)).any():
                break
            if any(size >= high for size, high in zip(sizes, highs)):
                return None
            sizes = [min(size + 1, high) for size, high in zip(sizes, highs)]
        rows.append(tuple(sizes))
    return tuple(rows) if len(set(rows)) == len(rows) else None


def checks(
    graph: Graph, names: tuple[str, ...], ranges: dict[str, tuple[int, int]], dims: dict[str, int]
) -> tuple[list[dict[str, int]], list[np.ndarray]]:
    """Further bindings (spread over the ranges, deterministic, general as ``generic_samples``'
    are) and their dims vectors: where the fitted terms are compared, one of them lowered and held
    out to check every term."""
    rng = np.random.default_rng(12345)
    capacity = dim_values(graph, names, {**dims, **{name: high for name, (_, high) in ranges.items()}})
    bindings, vectors = [], []
    for _ in range(8 * CHECKS):
        binding = {**dims, **{name: int(rng.integers(low, high + 1)) for name, (low, high) in ranges.items()}}
        vector = dim_values(graph, names, binding)
        if not ((vector != capacity) & (vector <= 1)).any():
            bindings.append(binding)
            vectors.append(vector)
        if len(bindings) == CHECKS:
            break
    return bindings, vectors


def graph_symbols(graph: Graph) -> tuple[str, ...]:
    """Every symbolic dim of the graph's values (inputs first), in a stable order."""
    found: dict[str, None] = {}
    values = [*graph.inputs, *(v for node in graph.nodes for v in node.outputs if v is not None)]
    for value in values:
        for dim in getattr(value.type, "shape", None) or ():
            if isinstance(dim, str):
                found.setdefault(dim)
    return tuple(found)


def dim_values(graph: Graph, names: tuple[str, ...], dims: dict[str, int]) -> np.ndarray:
    """The dims vector at ``dims`` (every input dim bound): each symbol's size in the graph
    specialized there (-1 for one that no value keeps after folding). Raises ShapeInferenceError
    when the model has no shapes there. Remembered per graph and binding (a compile asks for the
    same bindings' vectors while it samples, checks, fits the dims program and lowers)."""
    key = (id(graph.nodes), names, tuple(sorted(dims.items())))
    with _memo_lock:
        found = _memo.get(key)
    if found is not None and found[0] is graph.nodes:
        return found[1].copy()
    vector = _dim_values(graph, names, dims)
    with _memo_lock:
        _memo[key] = (graph.nodes, vector.copy())
        while len(_memo) > MEMO:
            _memo.pop(next(iter(_memo)))
    return vector


MEMO = 256  # vectors remembered (bindings x graphs)
_memo: dict[tuple, tuple[Any, np.ndarray]] = {}
_memo_lock = threading.Lock()


def _dim_values(graph: Graph, names: tuple[str, ...], dims: dict[str, int]) -> np.ndarray:
    bound = specialize(graph, dims)
    sizes = dict(dims)
    symbolic = {v.name: v for v in [*graph.inputs, *(v for n in graph.nodes for v in n.outputs if v is not None)]}
    for value in [*bound.inputs, *(v for node in bound.nodes for v in node.outputs if v is not None)]:
        original = symbolic.get(value.name)
        shape, before = getattr(value.type, "shape", None), getattr(getattr(original, "type", None), "shape", None)
        if shape is None or before is None or len(shape) != len(before):
            continue
        for symbol, size in zip(before, shape):
            if isinstance(symbol, str) and isinstance(size, int):
                sizes.setdefault(symbol, size)
    return np.array([sizes.get(name, -1) for name in names], dtype=np.int64)


# ops whose output shapes never depend on the values of the inputs at these positions (None: any)
_VALUE_BLIND = {
    "MatMul": None, "Gemm": None, "Conv": None, "ConvTranspose": None, "Add": None, "Sub": None,
    "Mul": None, "Div": None, "Gather": (0,), "Transpose": None, "Cast": None, "Relu": None,
}  # fmt: skip
STUB_BYTES = 1 << 16  # constants below this stay as they are (shape tensors are far smaller)


def shapes_only(graph: Graph) -> Graph:
    """``graph`` for computing shapes (``dim_values``) without its weights: each large constant
    that only value-blind inputs read (a product's weights, an embedding table: their shape
    decides the shapes, never their values) replaced by a zero-strided view of one element of its
    dtype (no memory). A model whose sizes run through one route keeps this once its weights are
    packed, so a binding whose vector the dims program cannot give (a size 0: an empty cache)
    is specialized without reading the model file again."""
    readers: dict[Any, list[tuple[str, int]]] = {}
    for node in graph.nodes:
        for position, value in enumerate(node.inputs):
            if value is not None:
                readers.setdefault(value, []).append((node.op, position))
    kept = {*graph.outputs, *graph.defaults}
    stubs = {}
    for value, array in graph.constants.items():
        uses = readers.get(value, [])
        blind = all(op in _VALUE_BLIND and (_VALUE_BLIND[op] is None or at in _VALUE_BLIND[op]) for op, at in uses)
        if array.nbytes >= STUB_BYTES and uses and blind and value not in kept:
            one = np.zeros(1, array.dtype)
            stubs[value] = np.lib.stride_tricks.as_strided(one, array.shape, (0,) * array.ndim, writeable=False)
    return graph.with_(constants={**graph.constants, **stubs}) if stubs else graph
