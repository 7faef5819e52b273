"""Type and shape inference of one node, with the checks every caller wants: the op's schema allows
the inputs' dtypes (and inputs sharing a type variable share a dtype), an ``axis`` is in range,
no tensor is over kiln's size limit. The importer, the converters and the passes all infer through
``infer_node``."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx

from kiln.errors import ShapeInferenceError
from kiln.ir.graph import Node
from kiln.ir.sized import SizedInt
from kiln.ir.types import TensorType, Type
from kiln.ops.registry import InferContext, has_trait, lookup

KNOWN_VALUE_LIMIT = 4096  # elements: a computed value this small is kept for inference (shape arithmetic)


class UnsupportedConstruct(Exception):
    """A construct kiln does not support (raised by converters, reported with the node)."""


@functools.cache
def _shared_type_params(op: str, domain: str) -> tuple[tuple[str, bool, frozenset[str]], ...] | None:
    """(type variable or fixed type, variadic, allowed type strings) per formal input of the
    newest ONNX schema, or None."""
    if not onnx.defs.has(op, domain=domain):  # kiln's own or a custom domain (and no C++ exception)
        return None
    try:
        schema = onnx.defs.get_schema(op, domain=domain)
    except Exception:
        return None
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    params = []
    for formal in schema.inputs:
        variadic = formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        # a heterogeneous variadic (Loop's carried values) binds its type variable per element
        type_str = formal.type_str if not variadic or formal.is_homogeneous else ""
        kinds = allowed.get(type_str, frozenset({type_str}) if type_str.startswith("tensor(") else frozenset())
        # only tensor types listed: a dtype outside them is refused (else the list is not checked)
        if not all(a.startswith("tensor(") for a in kinds):
            kinds = frozenset()
        params.append((type_str, variadic, kinds))
    return tuple(params)


@functools.cache
def _type_string(onnx_code: int) -> str:
    """The schema's spelling of a tensor dtype: ``tensor(float)``."""
    return f"tensor({onnx.TensorProto.DataType.Name(onnx_code).lower()})"


def check_type_constraints(node: Node, input_types: list[Type | None]) -> None:
    """Each input's dtype must be one the op's schema allows (Reshape's shape is int64), and
    inputs bound to one type variable (MatMul's T for A and B) must share it: a float32 x float64
    MatMul is rejected here, naming the inputs, not when it runs."""
    params = _shared_type_params(node.op, node.domain)
    if not params:
        return
    seen: dict[str, tuple[str, str]] = {}
    for index, (value, value_type) in enumerate(zip(node.inputs, input_types)):
        if value is None or not isinstance(value_type, TensorType):
            continue
        position = min(index, len(params) - 1)
        type_var, variadic, allowed = params[position]
        if index >= len(params) and not variadic:
            continue
        type_str = _type_string(value_type.dtype.onnx_code)
        if allowed and type_str not in allowed:
            raise ShapeInferenceError(
                f"input %{value.name} is {value_type.dtype.short}, which the {node.op} schema does not allow there "
                f"({', '.join(sorted(a[7:-1] for a in allowed))})"
            )
        if not type_var or "(" in type_var:
            continue  # a fixed type (tensor(int64)), not a variable, or a heterogeneous variadic
        dtype = value_type.dtype.short
        first = seen.setdefault(type_var, (value.name, dtype))
        if first[1] != dtype:
            raise ShapeInferenceError(
                f"inputs %{first[0]} ({first[1]}) and %{value.name} ({dtype}) must have the same type ({type_var} in the {node.op} schema)"
            )


def infer_node(
    node: Node,
    input_types: list[Type | None],
    known: list[np.ndarray | None],
    symbolic: list[tuple | None],
) -> tuple[list[Type], dict[int, tuple]]:
    """Run the registry's inference for ``node``; returns output types and symbolic contents.
    Results are remembered by everything inference reads (op, attributes, input types, small
    known values, symbolic contents): the twelve layers of a transformer infer once."""
    key = memo_key(node, input_types, known, symbolic)
    found = _INFERRED.get(key)
    if found is not None:
        return list(found[0]), dict(found[1])
    opdef = lookup(node.op, node.domain)
    if opdef is None:
        raise UnsupportedConstruct("unknown op")
    check_type_constraints(node, input_types)
    _check_axis(node, input_types)
    ctx = InferContext(node, opdef, input_types, known, symbolic, large=SMALL_VALUE)
    try:
        types = list(opdef.infer(ctx))
    except ValueError as err:  # a shape from the inputs' values that is none (Pad removing more than a dim holds)
        if "dim" not in str(err):
            raise
        raise ShapeInferenceError(f"the inputs' values give no valid shape: {err}") from None
    if len(types) < len(node.outputs):
        raise ShapeInferenceError(f"inference gave {len(types)} output types for {len(node.outputs)} outputs")
    for index, value_type in enumerate(types[: len(node.outputs)]):
        check_size(value_type, f"output {index}")
    types = types[: len(node.outputs)]
    # not remembered: a result named after this node's outputs (fresh symbols), or one that read
    # a value too large to be part of the key
    if not ctx.fresh_used and not ctx.read_large:
        _INFERRED.put(key, (tuple(types), dict(ctx.out_symbolic)))
    return types, ctx.out_symbolic


SMALL_VALUE = 64  # elements: a known input value at most this large is part of the memo's key


class Memo:
    """Results by ``memo_key`` (a None key is never found nor kept), at most ``limit`` of them
    (emptied when full: a compile refills what it repeats)."""

    def __init__(self, limit: int = 8192) -> None:
        self.limit = limit
        self.found: dict[tuple, Any] = {}

    def get(self, key: tuple | None) -> Any:
        return None if key is None else self.found.get(key)

    def put(self, key: tuple | None, value: Any) -> None:
        if key is None:
            return
        if len(self.found) >= self.limit:
            self.found.clear()
        self.found[key] = value


_INFERRED = Memo()


def _frozen(value: object) -> object:
    """``value`` as a hashable key part, or raises TypeError (then nothing is remembered)."""
    if isinstance(value, float):
        return ("float", value.hex())  # exact: -0.0 is not 0.0, and a NaN is found again
    if isinstance(value, (str, int, bool, type(None))):
        return (type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, np.ndarray):
        if value.size > SMALL_VALUE or value.dtype == object:
            raise TypeError("a large array")
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.tobytes())
    raise TypeError(type(value).__name__)


def memo_key(
    node: Node, input_types: list[Type | None], known: list[np.ndarray | None], symbolic: list[tuple | None]
) -> tuple | None:
    try:
        key = (
            node.op,
            node.domain,
            len(node.outputs),
            tuple(sorted((name, _frozen(value)) for name, value in node.attrs.items())),
            tuple(input_types),
            tuple(
                None if v is None else ("large",) if np.size(v) > SMALL_VALUE else _frozen(np.asarray(v)) for v in known
            ),
            tuple(None if s is None else _frozen(tuple(s)) for s in symbolic),
            _sized(input_types),  # (a size that keeps its expression infers types that keep theirs)
        )
        hash(key)
        return key
    except TypeError:  # an attribute kiln cannot key (a subgraph): inferred every time
        return None


def _sized(input_types: list[Type | None]) -> tuple | None:
    """The expressions of the inputs' ``SizedInt`` dims (None: there are none, the usual case)."""
    found = [
        (i, j, d.expr)
        for i, t in enumerate(input_types)
        if isinstance(t, TensorType) and t.shape is not None
        for j, d in enumerate(t.shape)
        if isinstance(d, SizedInt)
    ]
    return tuple(found) if found else None


# The largest tensor kiln accepts: more than any machine it targets can hold, and far below the
# point where element counts overflow 64-bit index arithmetic in generated code.
MAX_TENSOR_BYTES = 1 << 40


def _check_axis(node: Node, input_types: list[Type | None]) -> None:
    if "axis" not in node.attrs or not input_types or not isinstance(input_types[0], TensorType):
        return
    shape = input_types[0].shape
    axis = node.attrs["axis"]
    if shape is None or not isinstance(axis, int) or not has_trait(node.op, node.domain, "axis"):
        return
    rank = max(len(shape), 1)
    low, high = -rank, rank - 1  # inclusive
    if node.op == "Flatten":
        high = rank
    elif node.op == "OneHot":
        low, high = -rank - 1, rank
    if not low <= axis <= high:
        raise ShapeInferenceError(f"axis {axis} is out of range for input %{node.inputs[0].name} of rank {len(shape)}")


def check_size(value_type: Type | None, what: str) -> None:
    """Reject a tensor too large for any machine (dims such as 2^40 x 2^40) with its type."""
    if not isinstance(value_type, TensorType) or value_type.shape is None:
        return
    size = value_type.dtype.numpy.itemsize
    for dim in value_type.shape:
        if isinstance(dim, int):
            size *= max(dim, 1)
    if size > MAX_TENSOR_BYTES:
        raise ShapeInferenceError(
            f"{what} would be {value_type} ({size:,} bytes), over kiln's limit of {MAX_TENSOR_BYTES:,} bytes per tensor"
        )
