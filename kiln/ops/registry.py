"""The op registry: each op is defined once with its attributes, type inference and reference.

An ``OpDef`` describes kiln's canonical form of an op: the newest ONNX version of it (the frontend
rewrites older forms, e.g. attribute axes, into this one). Its parts:

* ``attrs``: name -> ``Attr`` (kind and default; ``REQUIRED`` when the op cannot run without it);
* ``infer(ctx) -> list[Type]``: output types from input types, attributes and any input values
  known at compile time; symbolic dims propagate, data-dependent dims get fresh symbols;
* ``reference(ctx, inputs) -> list``: NumPy semantics. Standard ONNX ops default to onnx's own
  per-op reference code (``onnx.reference.ops``); ops kiln introduces, and ONNX ops whose onnx
  implementation is wrong or missing, define their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import ShapeInferenceError
from kiln.ir.graph import Node
from kiln.ir.types import Dim, DType, TensorType, Type
from kiln.ops.symbolic_dims import clamped_base

REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    """An attribute's kind (``int``, ``float``, ``string``, ``ints``, ``floats``, ``strings``,
    ``tensor``, ``graph``, ``graphs``, ``type``) and its default."""

    kind: str
    default: Any = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


Infer = Callable[["InferContext"], Sequence[Type]]
Reference = Callable[["RunContext", list[Any]], Sequence[Any]]


@dataclass
class OpDef:
    op: str
    domain: str
    version: int
    attrs: dict[str, Attr]
    infer: Infer
    reference: Reference | None
    num_inputs: tuple[int, int]  # (min, max); max -1 = variadic
    num_outputs: tuple[int, int]
    # True when the reference is onnx's: the interpreter then builds onnx's op object for the node.
    onnx_reference: bool = False
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # what passes and lowerings may assume, declared with the op (``declare_trait``): "fusable"
    # (elementwise with scalar semantics in kiln.lower.pointwise: may join a fused loop), "anchor"
    # (a Conv/MatMul whose output tiles take a fused epilogue), "tunable" (schedules the tuner
    # measures), "alias" (the output is the input's data: no kernel), "reshape" (an alias that
    # only changes the shape)
    traits: frozenset[str] = frozenset()

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op)


REGISTRY: dict[tuple[str, str], OpDef] = {}


def nondeterministic(node: Any) -> bool:
    """Its outputs differ run to run: never folded, merged or evaluated at compile time."""
    return has_trait(node.op, node.domain, "nondeterministic")


ATTR_KINDS = {
    1: "float",
    2: "int",
    3: "string",
    4: "tensor",
    5: "graph",
    6: "floats",
    7: "ints",
    8: "strings",
    9: "tensors",
    10: "graphs",
    11: "sparse_tensor",
    13: "type",
    14: "types",
}


def _onnx_schema(op: str, domain: str) -> Any:
    import onnx.defs

    # ask first: a C++ exception thrown through onnx's bindings aborts a process running under
    # AddressSanitizer (KILN_DEBUG with libasan preloaded)
    if not onnx.defs.has(op, domain=domain):
        return None  # an op kiln introduces itself
    try:
        return onnx.defs.get_schema(op, domain=domain)
    except Exception:
        return None


def _schema_attrs(schema: Any) -> dict[str, Attr]:
    """Attribute kinds and defaults as the ONNX standard states them."""
    import onnx.helper

    attrs: dict[str, Attr] = {}
    for name, spec in schema.attributes.items():
        kind = ATTR_KINDS.get(int(spec.type), "unknown")
        if spec.required:
            default: Any = REQUIRED
        elif spec.default_value.type:
            default = onnx.helper.get_attribute_value(spec.default_value)
            default = tuple(default) if isinstance(default, list) else default
            default = default.decode() if isinstance(default, bytes) else default
        else:
            default = None
        attrs[name] = Attr(kind, default)
    return attrs


def _arity(low: int, high: int) -> tuple[int, int]:
    return (low, -1 if high > 1000 else high)


TRAITS = frozenset(
    {"fusable", "anchor", "tunable", "alias", "reshape"}  # declared with their op families
    | {
        "elementwise",
        "layout_free",
        "accumulating",
        "axis",
        "contracting",
        "nondeterministic",
        "aligned",
        "per_sample",
    }  # kiln.ops.categories
)


def declare_trait(trait: str, ops: Iterable[str], domain: str = "") -> None:
    """Give each registered op in ``ops`` the trait (an unknown trait or op is a kiln bug)."""
    if trait not in TRAITS:
        raise ValueError(f"unknown op trait {trait!r}; traits: {sorted(TRAITS)}")
    for op in ops:
        definition = REGISTRY[(domain, op)]
        definition.traits = definition.traits | {trait}


def has_trait(op: str, domain: str, trait: str) -> bool:
    """Whether the op (by type and domain) was declared with ``trait``."""
    definition = lookup(op, domain)
    return definition is not None and trait in definition.traits


def ops_with(trait: str, domain: str = "") -> frozenset[str]:
    """Every registered op of ``domain`` with ``trait``."""
    return frozenset(d.op for d in REGISTRY.values() if d.domain == domain and trait in d.traits)


def register(
    op: str,
    infer: Infer,
    *,
    domain: str = "",
    attrs: dict[str, Attr] | None = None,
    inputs: tuple[int, int] | int | None = None,
    outputs: tuple[int, int] | int | None = None,
    reference: Reference | None = None,
    version: int | None = None,
    doc: str = "",
) -> OpDef:
    """Define ``op``. Without ``reference`` the op runs onnx's reference code at ``version``.

    For a standard ONNX op, attributes (kinds, defaults) and arity default to the ONNX schema.
    """
    if (domain, op) in REGISTRY:
        raise ValueError(f"op {domain}::{op} is defined twice")
    schema = _onnx_schema(op, domain)
    if schema is not None:
        attrs = {**_schema_attrs(schema), **(attrs or {})}
        inputs = inputs if inputs is not None else _arity(schema.min_input, schema.max_input)
        outputs = outputs if outputs is not None else _arity(schema.min_output, schema.max_output)
    inputs = 1 if inputs is None else inputs
    outputs = 1 if outputs is None else outputs
    definition = OpDef(
        op=op,
        domain=domain,
        version=version or (schema.since_version if schema is not None else 1),
        attrs=dict(attrs or {}),
        infer=infer,
        reference=reference,
        num_inputs=(inputs, inputs) if isinstance(inputs, int) else inputs,
        num_outputs=(outputs, outputs) if isinstance(outputs, int) else outputs,
        onnx_reference=reference is None,
        doc=doc,
    )
    REGISTRY[(domain, op)] = definition
    return definition


def lookup(op: str, domain: str = "") -> OpDef | None:
    if domain == "ai.onnx":
        domain = ""
    return REGISTRY.get((domain, op))


# -- contexts ------------------------------------------------------------------------------------


class InferContext:
    """What ``infer`` sees: the node, its input types and the input values known at compile time."""

    def __init__(
        self,
        node: Node,
        opdef: OpDef,
        input_types: Sequence[Type | None],
        values: Sequence[np.ndarray | None] = (),
        symbolic: Sequence[tuple[Dim, ...] | None] = (),
        num_outputs: int | None = None,
        large: int | None = None,
    ) -> None:
        self.node = node
        self.opdef = opdef
        self.input_types = list(input_types)
        self.values = list(values) + [None] * (len(input_types) - len(values))
        self.symbolic = list(symbolic) + [None] * (len(input_types) - len(symbolic))
        self.num_outputs = len(node.outputs) if num_outputs is None else num_outputs
        # Symbolic contents of 1-D integer outputs (shape tensors), for shape ops downstream.
        self.out_symbolic: dict[int, tuple[Dim, ...]] = {}
        self._fresh = 0
        # for ``kiln.ops.inference``'s memo: whether a fresh symbol was made, or a known value
        # larger than ``large`` elements was read
        self.fresh_used = False
        self.read_large = False
        self._large = large

    @property
    def num_inputs(self) -> int:
        return len(self.input_types)

    def has(self, index: int) -> bool:
        return index < len(self.input_types) and self.input_types[index] is not None

    def attr(self, name: str) -> Any:
        if name in self.node.attrs:
            return self.node.attrs[name]
        spec = self.opdef.attrs.get(name)
        if spec is None:
            raise KeyError(f"op {self.opdef.op} has no attribute {name!r}")
        if spec.required:
            raise ShapeInferenceError(f"missing required attribute {name!r}")
        return spec.default

    def attr_or(self, name: str, default: Any) -> Any:
        """The attribute if the op has it (with its default), else ``default``."""
        if name not in self.opdef.attrs and name not in self.node.attrs:
            return default
        value = self.attr(name)
        return default if value is None else value

    def tensor(self, index: int) -> TensorType:
        value_type = self.input_types[index] if index < len(self.input_types) else None
        if not isinstance(value_type, TensorType):
            raise ShapeInferenceError(f"input {index} must be a tensor, got {value_type}")
        return value_type

    def shape(self, index: int) -> tuple[Dim, ...] | None:
        return self.tensor(index).shape

    def dtype(self, index: int) -> DType:
        return self.tensor(index).dtype

    def value(self, index: int) -> np.ndarray | None:
        found = self.values[index] if index < len(self.values) else None
        if found is not None and self._large is not None and np.size(found) > self._large:
            self.read_large = True
        return found

    def dims_value(self, index: int) -> tuple[Dim, ...] | None:
        """Contents of a 1-D integer input as dims (ints, or symbols where only those are known);
        None where an element is an expression that may be negative (never a dim)."""
        found = self.integers_value(index)
        if found is None or any(not isinstance(d, (int, str)) for d in found):
            return None
        return found

    def integers_value(self, index: int) -> tuple | None:
        """Contents of a 1-D integer input: ints, sizes' dims, and expressions
        (``kiln.ir.dims.Expr``) for elements computed from sizes that may be negative."""
        if not self.has(index):
            return None
        array = self.value(index)
        if array is not None:
            return tuple(int(x) for x in np.asarray(array).reshape(-1))
        return self.symbolic[index] if index < len(self.symbolic) else None

    def ints_value(self, index: int) -> list[int] | None:
        dims = self.dims_value(index)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        return [int(d) for d in dims]

    def fresh(self, tag: str = "d") -> str:
        """A new symbol for a dim no rule determines (deterministic per node)."""
        self._fresh += 1
        self.fresh_used = True
        base = self.node.outputs[0].name if self.node.outputs else self.node.op
        clean = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "v"
        if clean[0].isdigit():
            clean = "v" + clean
        return f"{clean}_{tag}{self._fresh}"

    def fresh_shape(self, rank: int | None, tag: str = "d") -> tuple[Dim, ...] | None:
        return None if rank is None else tuple(self.fresh(tag) for _ in range(rank))


class RunContext:
    """What ``reference`` sees: the node, its attributes with defaults, and the interpreter."""

    def __init__(self, node: Node, opdef: OpDef, interpreter: Any = None) -> None:
        self.node = node
        self.opdef = opdef
        self.interpreter = interpreter

    def attr(self, name: str) -> Any:
        if name in self.node.attrs:
            return self.node.attrs[name]
        spec = self.opdef.attrs[name]
        return None if spec.required else spec.default


# -- shared inference helpers --------------------------------------------------------------------


def broadcast_shapes(ctx: InferContext, *shapes: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """Numpy-style broadcast of (possibly symbolic) shapes; raises on a static mismatch."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    result: list[Dim] = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        result.append(_broadcast_dim(ctx, dims))
    return tuple(result)


def _broadcast_dim(ctx: InferContext, dims: list[Dim]) -> Dim:
    static = {d for d in dims if isinstance(d, int) and d != 1}
    symbols = {d for d in dims if isinstance(d, str)}
    if len(static) > 1:
        raise ShapeInferenceError(f"cannot broadcast dims {sorted(static)}")
    if static:
        return static.pop()  # a symbol meeting a static dim must be that dim or 1
    if len(symbols) == 1:
        return symbols.pop()
    # min(s, d) (a slice [0:s] of d >= 1 elements) against s itself: they are equal, or one is 1
    # and then so is s: the result is s in every run that broadcasts
    bases = {clamped_base(d) or d for d in symbols}
    if len(bases) == 1 and bases <= symbols:
        return bases.pop()
    if symbols:
        return ctx.fresh("b")
    return 1


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeInferenceError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def same_as_input(index: int = 0, dtype: DType | None = None) -> Infer:
    """Infer: one output with input ``index``'s shape (and its dtype unless ``dtype`` is given)."""

    def infer(ctx: InferContext) -> list[Type]:
        source = ctx.tensor(index)
        return [TensorType(dtype or source.dtype, source.shape)]

    return infer
