"""``kiln diff``: where does the compiled model start to disagree with the reference?

The model is optimized as the cpu target would (passes may be disabled to bisect); every tensor
that survives optimization as a node output (a fused group's output stands for its last node)
becomes a graph output of a debugging compile, so the compiled code materializes it. The reference
interpreter runs the *original* graph with every value recorded. Tensors are matched by name
(passes keep the names of the values they do not rewrite), compared (max / median / p99 of the
absolute and relative error), and the first tensor in execution order beyond tolerance is named
together with the node that produced it and the source nodes fused into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import InputError
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import TensorType


@dataclass
class TensorDiff:
    name: str
    node: str  # the optimized graph's node that produced it (with its fused source nodes)
    max_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    relative_l2: float
    shape: tuple[int, ...]

    def beyond(self, tolerance: float) -> bool:
        return not np.isfinite(self.relative_l2) or self.relative_l2 > tolerance


@dataclass
class DiffReport:
    tensors: list[TensorDiff]
    unmatched: int  # surviving tensors with no same-named reference value
    tolerance: float

    @property
    def first_divergence(self) -> TensorDiff | None:
        return next((t for t in self.tensors if t.beyond(self.tolerance)), None)


def _describe(node: Node) -> str:
    if node.domain == "kiln" and node.op == "Fused":
        members = ", ".join(f"{n.name or n.op} ({n.op})" for n in node.attrs["body"].nodes)
        return f"{node.label} = [{members}]"
    return node.label


def _compare(name: str, node: str, got: np.ndarray, want: np.ndarray) -> TensorDiff:
    got64, want64 = np.asarray(got, np.float64).reshape(-1), np.asarray(want, np.float64).reshape(-1)
    if got64.size == 0:
        return TensorDiff(name, node, 0.0, 0.0, 0.0, 0.0, 0.0, tuple(np.shape(want)))
    error = np.abs(got64 - want64)
    both_nan = np.isnan(got64) & np.isnan(want64)
    error[both_nan] = 0.0
    scale = np.maximum(np.abs(want64), 1e-30)
    norm = float(np.linalg.norm(want64[~both_nan]))
    relative_l2 = float(np.linalg.norm(error)) / norm if norm > 0 else float(np.linalg.norm(error))
    return TensorDiff(
        name,
        node,
        float(error.max()),
        float(np.median(error)),
        float(np.percentile(error, 99)),
        float((error / scale).max()),
        relative_l2,
        tuple(np.shape(want)),
    )


def diff(
    graph: Graph,
    feeds: dict[str, np.ndarray],
    disable: set[str] | None = None,
    tolerance: float = 1e-4,
    level: int = 2,
    target: str = "cpu",
) -> DiffReport:
    """``graph``: imported, symbolic dims already bound (``specialize``). The compile is the real
    pipeline's (``kiln.driver.pipeline``) with every float tensor that survives the passes made an
    output, then compared with the same-named value of the reference interpreter."""
    from kiln.driver.options import CompileOptions
    from kiln.driver.pipeline import compile_plan
    from kiln.ops.interpreter import Interpreter
    from kiln.runtime.executable import Executable

    options = CompileOptions.from_env(level=level, disabled=frozenset(disable or ()), plan_cache=False)
    inputs = [np.asarray(feeds[v.name]) for v in graph.inputs]

    # the reference: every value of the original graph
    every = [v for node in graph.nodes for v in node.outputs if isinstance(v.type, TensorType)]
    reference_values = Interpreter(graph.with_(outputs=list(dict.fromkeys([*graph.outputs, *every])))).run(inputs)
    reference = {v.name: r for v, r in zip(dict.fromkeys([*graph.outputs, *every]), reference_values)}

    # the compiled model with every surviving tensor exposed
    surviving: list[Value] = []

    def expose(optimized: Graph) -> Graph:
        producers = {value: node for node in optimized.nodes for value in node.outputs}
        surviving.extend(v for v in producers if isinstance(v.type, TensorType) and v.type.dtype.is_float)
        return optimized.with_(outputs=list(dict.fromkeys([*optimized.outputs, *surviving])))

    plan = compile_plan(graph, target, options, expose=expose)
    if plan.whole_graph_reason:
        raise ValueError(f"the model runs on the reference, nothing compiled to compare: {plan.whole_graph_reason}")
    optimized = plan.graph
    producers = {value: node for node in optimized.nodes for value in node.outputs}
    compiled = Executable(plan).run([np.asarray(feeds[v.name]) for v in plan.graph.inputs])
    got = {v.name: r for v, r in zip(plan.graph.outputs, compiled)}

    tensors, unmatched = [], 0
    for value in dict.fromkeys([*surviving, *optimized.outputs]):
        if value.name not in reference or value.name not in got:
            unmatched += 1
            continue
        want = reference[value.name]
        if np.shape(want) != np.shape(got[value.name]):
            unmatched += 1
            continue
        tensors.append(
            _compare(
                value.name, _describe(producers[value]) if value in producers else "graph input", got[value.name], want
            )
        )
    return DiffReport(tensors, unmatched, tolerance)


def feeds_for(graph: Graph, path: str | None, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs from an .npz (by input name) or .npy (the single input), else random data."""
    from kiln.ir.types import random_tensor

    given: dict[str, Any] = {}
    if path is not None:
        from kiln.arrays import ArrayFileError, load_npy, load_npz

        try:
            given = load_npz(path) if str(path).endswith(".npz") else {graph.inputs[0].name: load_npy(path)}
        except (ArrayFileError, OSError) as err:
            raise InputError(f"inputs {path}: {err}") from None
    rng = np.random.default_rng(seed)
    return {
        v.name: np.asarray(given[v.name])
        if v.name in given
        else random_tensor(v.type.dtype, [int(d) for d in v.type.shape], rng)  # type: ignore[union-attr]
        for v in graph.inputs
    }
