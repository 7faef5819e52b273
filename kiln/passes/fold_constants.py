"""Constant folding, and type refinement on the way.

* A node whose inputs are all constants is evaluated with its reference implementation and
  becomes a constant (unless its output would be huge: folding must not bloat the model).
* ``Shape``/``Size`` of a value with a static shape fold without evaluating anything, which is
  what collapses exporters' shape subgraphs (Shape -> Gather -> Concat -> Reshape).
* Every other node has its output types re-inferred with the constants now known, so dims that
  were symbols at import (a Reshape target computed from shapes) become static where they can.
Runs anywhere; the pipeline runs it again after passes that create constants.

``UNFOLDED`` names values that must stay computed (a compile whose kernels take a length at run
time keeps a [seq, seq] causal mask a kernel's result: as a constant it would be the capacity's).
"""

from __future__ import annotations

from contextvars import ContextVar

import numpy as np

from kiln.errors import KilnError, ShapeInferenceError
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import TensorType, Type
from kiln.ops.inference import KNOWN_VALUE_LIMIT, SMALL_VALUE, Memo, infer_node, memo_key
from kiln.ops.interpreter import evaluate_node, node_failure
from kiln.ops.registry import nondeterministic
from kiln.passes.rewrite import Rewriter

FOLD_LIMIT = 16 * 1024 * 1024  # elements: never materialize larger constants
UNFOLDED: ContextVar[frozenset[str]] = ContextVar("UNFOLDED", default=frozenset())


def fold_constants(graph: Graph, verified: bool = False) -> Graph:
    """``verified``: ``graph``'s types were checked (the pass pipeline verifies after each pass):
    a node whose inputs and outputs are all static has nothing to refine and is not inferred again."""
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        node = rewriter.resolved(node)
        if not (verified and _static(node)):
            node = refine_types(rewriter, node)
        if _fold_shape(rewriter, node) or _fold(rewriter, node):
            rewriter.drop(node)
            continue
        rewriter.keep(node)
    return rewriter.finish()


def _static(node: Node) -> bool:
    return all(isinstance(o.type, TensorType) and o.type.is_static for o in node.outputs) and all(
        v is None or (isinstance(v.type, TensorType) and v.type.is_static) for v in node.inputs
    )


def _fold_shape(rewriter: Rewriter, node: Node) -> bool:
    if node.op not in ("Shape", "Size") or node.domain:
        return False
    source = node.inputs[0]
    if source is None or not isinstance(source.type, TensorType) or not source.type.is_static:
        return False
    shape = [int(d) for d in source.type.shape]  # type: ignore[union-attr]
    if node.op == "Size":
        array = np.array(int(np.prod(shape)), dtype=np.int64)
    else:
        rank = len(shape)
        start = node.attrs.get("start", 0)
        end = node.attrs.get("end", rank)
        start = max(0, min(rank, start + rank if start < 0 else start))
        end = max(0, min(rank, end + rank if end < 0 else end))
        array = np.array(shape[start:end], dtype=np.int64)
    rewriter.replace(node.outputs[0], rewriter.add_constant(array, node.outputs[0].name))
    return True


def _fold(rewriter: Rewriter, node: Node) -> bool:
    if nondeterministic(node) or any(True for _ in node.subgraphs()):
        return False
    kept = UNFOLDED.get()
    if kept and any(out.name in kept for out in node.outputs):
        return False
    values = [None if v is None else rewriter.constant_value(v) for v in node.inputs]
    if any(v is not None and a is None for v, a in zip(node.inputs, values)):
        return False
    for out in node.outputs:
        if not isinstance(out.type, TensorType):
            return False
        if out.type.is_static and int(np.prod(out.type.shape)) > FOLD_LIMIT:  # type: ignore[arg-type]
            return False
    if not all(isinstance(o.type, TensorType) and o.type.is_static for o in node.outputs):
        # The size is unknown until evaluated: only fold small inputs (shape arithmetic), and
        # check what came out.
        if sum(v.size for v in values if v is not None) > 65536:
            return False
    key = _evaluation_key(node, values)
    found = _EVALUATED.get(key)
    if found is not None:
        outputs = [a.copy() for a in found]
    else:
        try:
            outputs = evaluate_node(node, values)
        except KilnError:
            raise
        except Exception as err:  # the model fails on these values whenever it runs: say so now
            raise node_failure(node, values, err, stage="constant folding") from err
        # remembered when it is shape arithmetic: small results (not a folded [seq, seq] mask)
        if all(isinstance(a, np.ndarray) and a.size <= KNOWN_VALUE_LIMIT for a in outputs):
            _EVALUATED.put(key, tuple(a.copy() for a in outputs))
    arrays = [np.asarray(a) if isinstance(a, np.ndarray) or np.isscalar(a) else None for a in outputs]
    if any(a is None or a.size > FOLD_LIMIT for a in arrays):
        return False
    for value, array in zip(node.outputs, arrays):
        if not _fits(value.type, array):  # type: ignore[arg-type]
            return False
    for value, array in zip(node.outputs, arrays):
        rewriter.replace(value, rewriter.add_constant(array, value.name))  # type: ignore[arg-type]
    return True


# Shape arithmetic evaluated once per distinct node and small inputs (every layer of a transformer
# computes the same Gather/Concat/Mul of the same sizes): by op, attributes and input values.
_EVALUATED = Memo()


def _evaluation_key(node: Node, values: list[np.ndarray | None]) -> tuple | None:
    if any(v is not None and np.size(v) > SMALL_VALUE for v in values):
        return None
    return memo_key(node, [None] * len(values), values, [])


def _fits(value_type: Type, array: np.ndarray) -> bool:
    """Whether a folded array agrees with the recorded type (same dtype, rank, static dims)."""
    if not isinstance(value_type, TensorType) or (
        value_type.dtype.numpy != array.dtype and value_type.dtype.short != "str"
    ):
        return False
    if value_type.shape is None:
        return True
    return len(value_type.shape) == array.ndim and all(
        not isinstance(d, int) or d == n for d, n in zip(value_type.shape, array.shape)
    )


def refine_types(rewriter: Rewriter, node: Node) -> Node:
    """``node`` with output types re-inferred from what is known now (never less precise)."""
    known = [rewriter.constant_value(v) for v in node.inputs]
    try:
        types, _ = infer_node(
            node, [None if v is None else v.type for v in node.inputs], known, [None] * len(node.inputs)
        )
    except ShapeInferenceError as err:
        # the inputs' shapes are what this model was given (a bound batch of 0, a target shape
        # computed from them): the model cannot run with them, a user's problem, not kiln's
        raise ShapeInferenceError(f"node {node.label}: {err}") from None
    except Exception:  # keep the recorded types; the verifier reports real conflicts
        return node
    outputs: list[Value] = []
    changed = False
    for old, new_type in zip(node.outputs, types):
        better = _more_precise(old.type, new_type)
        if better is None:
            outputs.append(old)
            continue
        value = Value(old.name, better)
        rewriter.replace(old, value)
        outputs.append(value)
        changed = True
    if not changed:
        return node
    return Node(node.op, node.inputs, outputs, dict(node.attrs), name=node.name, domain=node.domain)


def _more_precise(old: Type, new: Type) -> Type | None:
    """``old`` with dims made static where ``new`` knows them; None when nothing improves."""
    if not isinstance(old, TensorType) or not isinstance(new, TensorType) or old.dtype != new.dtype:
        return None
    if old.shape is None:
        return new if new.shape is not None else None
    if new.shape is None or len(new.shape) != len(old.shape):
        return None
    dims = [n if isinstance(n, int) and not isinstance(o, int) else o for o, n in zip(old.shape, new.shape)]
    return TensorType(old.dtype, tuple(dims)) if tuple(dims) != old.shape else None
