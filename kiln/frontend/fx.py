"""PyTorch FX graphs in core ATen (what ``torch.export`` gives after ``run_decompositions`` and what
``make_fx`` traces for the dynamo backend) -> kiln's graph IR, directly, op by op: no ONNX in
between. The conversion table is ``CONVERTERS`` (entries in ``kiln.frontend.aten``, ``aten_attention``
and ``aten_extended``, all registered once this module is imported); an op it lacks is an
``UnsupportedFxOp`` naming it, which the dynamo backend turns into an eager fallback.

Weights (parameters, buffers, lifted constants, ``get_attr`` tensors) become the graph's
constants; user inputs become its inputs, with the dims torch marks symbolic as kiln's symbolic
dims (``s0``, ``s1``... as torch names them).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from kiln.errors import KilnError, UnsupportedModelError
from kiln.frontend import aten_extended, aten_nn  # noqa: F401  (their entries register in CONVERTERS)
from kiln.frontend.aten import CONVERTERS, OPSET, UnsupportedFxOp, dim_of, torch_dtype
from kiln.frontend.aten_attention import decompositions
from kiln.frontend.converters import GraphBuilder
from kiln.ir.graph import Graph, Value, unique_name
from kiln.ir.types import DType, TensorType
from kiln.ops.inference import UnsupportedConstruct
from kiln.ops.verify import verify

__all__ = [
    "CONVERTERS",
    "FxConverter",
    "UnsupportedFxOp",
    "decompositions",
    "import_exported",
    "import_traced",
    "torch_dtype",
]


class FxConverter:
    """Converts one FX graph; ``values`` maps FX nodes to kiln values (or tuples of them)."""

    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.constants: dict[Value, np.ndarray] = {}
        scope = SimpleNamespace(values={}, known={}, symbolic={})
        self.builder = GraphBuilder(None, scope, self.taken, self.constants)
        self.values: dict[Any, Any] = {}
        self.inputs: list[Value] = []
        self.renamed: dict[str, str] = {}  # placeholder name -> the graph input's name
        # torch's shape of each converted value (its FX node's example): sizes torch knows where
        # kiln's inference made fresh symbols (a view's -1 over a broadcast's dim)
        self.torch_shapes: dict[Value, tuple] = {}

    # -- helpers for converters -----------------------------------------------------------------

    def emit(self, op: str, inputs: list[Value | None], attrs: dict | None = None, outputs: int = 1) -> list[Value]:
        try:
            return self.builder.emit(op, inputs, attrs or {}, outputs)
        except UnsupportedConstruct as err:
            raise UnsupportedFxOp(op, str(err)) from None

    def one(self, op: str, inputs: list[Value | None], **attrs: Any) -> Value:
        return self.emit(op, inputs, attrs)[0]

    def const(self, array: Any, hint: str = "c") -> Value:
        return self.builder.const(np.asarray(array), hint)

    def ints(self, values: Any, hint: str = "shape") -> Value:
        """Constant sizes; a size that is a symbol of this trace is refused, never its example's
        value (a converter that takes symbolic sizes computes them: ``aten.size_value``)."""
        for v in values:
            if type(v).__name__ == "SymInt" and not v.node.expr.is_number:
                raise UnsupportedFxOp("a symbolic size", f"{v} where kiln needs a constant")
        return self.const(np.asarray([int(v) for v in values], np.int64), hint)

    def tensor(self, arg: Any, like: Value | None = None) -> Value:
        """An FX argument as a kiln value: a node's value, or a Python number as a constant of
        ``like``'s type (torch's scalar promotion: a float scalar with an int tensor is float)."""
        if isinstance(arg, Value):
            return arg
        if hasattr(arg, "op") and arg in self.values:
            return self.values[arg]
        if type(arg).__name__ in ("SymInt", "SymFloat", "SymBool") and not arg.node.expr.is_number:
            return self._symbolic_scalar(arg, like)  # never its example's value: a size of this call
        dtype = np.float32
        if like is not None and isinstance(like.type, TensorType):
            dtype = like.type.dtype.numpy
            if isinstance(arg, float) and not np.issubdtype(dtype, np.floating):
                dtype = np.float32
        elif isinstance(arg, bool):
            dtype = np.bool_
        elif isinstance(arg, int):
            dtype = np.int64
        return self.const(np.asarray(arg, dtype=dtype), "scalar")

    def _symbolic_scalar(self, arg: Any, like: Value | None) -> Value:
        """A size computed from the inputs' shapes (``x * x.shape[-1]``) as a 0-d tensor of
        ``like``'s dtype (int64 alone)."""
        from kiln.frontend.aten import size_value

        if type(arg).__name__ != "SymInt":
            raise UnsupportedFxOp(
                "a symbolic scalar", f"{arg} ({type(arg).__name__}): kiln computes integer sizes only"
            )
        scalar = self.one("Squeeze", [size_value(self, arg), self.ints([0], "axes")])
        if like is not None and isinstance(like.type, TensorType) and like.type.dtype != DType.INT64:
            dtype = like.type.dtype if like.type.dtype.numpy.kind == "f" else DType.FLOAT32
            scalar = self.one("Cast", [scalar], to=dtype.onnx_code)
        return scalar

    def rank(self, value: Value) -> int:
        return len(value.type.shape)  # type: ignore[union-attr]

    def shape(self, value: Value) -> tuple:
        return tuple(value.type.shape)  # type: ignore[union-attr]

    def same_dims(self, a: Value, b: Value, dims: slice) -> bool:
        """Whether ``a`` and ``b`` have the same sizes in ``dims``: by kiln's types, else by
        torch's (ints, or one expression of the trace's symbols: what torch's guards hold)."""
        if self.shape(a)[dims] == self.shape(b)[dims]:
            return True
        ta, tb = self.torch_shapes.get(a), self.torch_shapes.get(b)
        if ta is None or tb is None or len(ta) != len(self.shape(a)) or len(tb) != len(self.shape(b)):
            return False
        return [str(d) for d in ta[dims]] == [str(d) for d in tb[dims]]

    def axis(self, dim: int, value: Value) -> int:
        return dim + self.rank(value) if dim < 0 else dim

    # -- the graph ---------------------------------------------------------------------------------

    def placeholder(self, name: str, example: Any) -> Value:
        name = self.renamed.get(name, name)
        dtype = torch_dtype(example.dtype)
        value = Value(unique_name(name, self.taken), TensorType(dtype, tuple(dim_of(d) for d in example.shape)))
        self.inputs.append(value)
        return value

    def constant(self, name: str, tensor: Any) -> Value:
        """A weight: its values copied out of torch (kiln packs and folds its own copies)."""
        import torch

        data = tensor.detach().cpu()
        if data.dtype == torch.bfloat16:  # NumPy has no bfloat16 of its own: through float32, exactly
            array = data.float().numpy().astype(DType.BFLOAT16.numpy)
        else:
            array = data.numpy()
        return self.builder.const(np.ascontiguousarray(array), name)

    def convert(self, graph: Any, placeholders: dict[str, Any], outputs_of: Callable[[Any], list[Any]]) -> Graph:
        """``placeholders``: FX placeholder name -> ("input", example) or ("constant", tensor)."""
        import torch

        for node in graph.nodes:
            if node.op == "placeholder":
                kind, item = placeholders[node.name]
                if kind == "skip":
                    continue
                if kind == "size":  # a symbolic size passed beside its tensor: torch's symbol
                    self.values[node] = item
                    continue
                self.values[node] = (
                    self.placeholder(node.name, item) if kind == "input" else self.constant(node.name, item)
                )
            elif node.op == "get_attr":
                item = placeholders[node.name][1]
                if not isinstance(item, torch.Tensor):  # a subgraph: control flow (torch.cond, while_loop)
                    raise UnsupportedModelError(
                        [
                            f"{node.target}: a {type(item).__name__} (control flow such as torch.cond); kiln takes tensors"
                        ],
                        "torch graph",
                    )
                self.values[node] = self.constant(node.target, item)
            elif node.op == "call_function":
                self.values[node] = self.call(node)
                example = node.meta.get("val")
                if isinstance(self.values[node], Value) and hasattr(example, "shape"):
                    self.torch_shapes[self.values[node]] = tuple(example.shape)
            elif node.op == "output":
                results = [self.values[n] if n is not None else None for n in outputs_of(node)]
                if any(r is None or not isinstance(r, Value) for r in results):
                    raise UnsupportedFxOp("output", "outputs that are not tensors")
                return self.finish(results)  # type: ignore[arg-type]
            else:
                raise UnsupportedFxOp(node.op)
        raise KilnError("the FX graph has no output node")

    def call(self, node: Any) -> Any:
        target = node.target
        if target is operator.getitem:
            source, index = node.args
            return self.values[source][index]
        example = node.meta.get("val")
        if _op_name(target) in ("aten.size.default", "aten.sym_size.default") and isinstance(example, (tuple, list)):
            return tuple(example)  # sizes read by the ops that take sizes, as below
        if type(example).__name__ in ("SymInt", "SymFloat", "SymBool"):
            # a size computed from symbolic sizes (sym_size, their products): torch's expression,
            # read by the ops that take sizes (a view's target shape)
            return example
        name = _op_name(target)
        converter = CONVERTERS.get(name)
        if converter is None:
            raise UnsupportedFxOp(name)
        args = [self._arg(a) for a in node.args]
        kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
        try:
            return converter(self, *args, **kwargs)
        except (UnsupportedFxOp, KilnError):
            raise
        except Exception as err:
            raise UnsupportedFxOp(name, f"{type(err).__name__}: {err}") from err

    def _arg(self, arg: Any) -> Any:
        if isinstance(arg, (list, tuple)):
            return type(arg)(self._arg(a) for a in arg)
        if hasattr(arg, "op") and hasattr(arg, "target"):
            return self.values[arg]
        return arg

    def finish(self, outputs: list[Value]) -> Graph:
        # an output that is an input or a constant gets its own value (a graph's outputs are computed)
        seen: set[Value] = set()
        final = []
        for value in outputs:
            if value in self.inputs or value in self.constants or value in seen:
                value = self.one("Identity", [value])
            seen.add(value)
            final.append(value)
        graph = Graph(
            tuple(self.inputs),
            tuple(final),
            tuple(self.builder.nodes),
            dict(self.constants),
            opsets={"": OPSET},
        )
        return verify(graph)


def _op_name(target: Any) -> str:
    """``aten.convolution.default`` for an OpOverload, else the callable's name."""
    text = str(target)
    return text if text.startswith(("aten.", "prims.")) else getattr(target, "__name__", text)


def import_exported(program: Any, names: Sequence[str] | None = None) -> Graph:
    """A ``torch.export.ExportedProgram`` (decomposed to core ATen here) as a kiln graph; ``names``
    renames its user inputs (default: torch's placeholder names)."""
    from torch.export.graph_signature import InputKind, OutputKind

    program = program.run_decompositions(decompositions())
    signature = program.graph_signature
    writes = [
        spec.target or spec.arg.name
        for spec in signature.output_specs
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)
    ]
    if writes:  # a compiled model is a function of its inputs: it cannot carry writes back
        raise UnsupportedFxOp(
            "in-place writes",
            f"the program writes {', '.join(map(str, writes))} in place; kiln.compile builds a pure function of the "
            "inputs (torch.compile(module, backend='kiln') applies such writes every call)",
        )
    state = program.state_dict
    constants = getattr(program, "constants", {})
    placeholders: dict[str, Any] = {}
    user = iter(n.meta["val"] for n in program.graph.nodes if n.op == "placeholder" and n.name in signature.user_inputs)
    for spec in signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            placeholders[name] = ("input", next(user))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            placeholders[name] = ("constant", state[spec.target] if spec.target in state else constants[spec.target])
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            placeholders[name] = ("constant", constants[spec.target])
        else:
            raise UnsupportedFxOp(f"input kind {spec.kind}")
    converter = FxConverter()
    if names is not None:
        users = [n for n in signature.user_inputs]
        converter.renamed = dict(zip(users, names))
    return converter.convert(program.graph, placeholders, lambda node: list(node.args[0]))


def import_traced(module: Any, examples: list[Any], weights: set[int] | frozenset[int] = frozenset()) -> Graph:
    """A traced FX module (``make_fx`` with core ATen decompositions) called on ``examples`` as a
    kiln graph: ``get_attr`` tensors and the placeholders numbered in ``weights`` are constants,
    the other tensor placeholders its inputs (non-tensor ones, such as sizes, must be unused)."""
    placeholders: dict[str, Any] = {}
    position = 0
    for node in module.graph.nodes:
        if node.op == "placeholder":
            example = examples[position]
            position += 1
            if not hasattr(example, "shape"):  # a size dynamo passes beside the tensor carrying it
                if type(example).__name__ == "SymInt":
                    placeholders[node.name] = ("size", example)
                elif node.users:
                    raise UnsupportedFxOp("placeholder", f"{node.name} is a {type(example).__name__} the graph reads")
                else:
                    placeholders[node.name] = ("skip", example)
                continue
            placeholders[node.name] = ("constant" if position - 1 in weights else "input", example)
        elif node.op == "get_attr":
            placeholders[node.name] = ("constant", _attribute(module, node.target))
    converter = FxConverter()
    return converter.convert(module.graph, placeholders, lambda node: _flat(node.args[0]))


def _attribute(module: Any, target: str) -> Any:
    found = module
    for part in target.split("."):
        found = getattr(found, part)
    return found


def _flat(item: Any) -> list[Any]:
    if isinstance(item, (list, tuple)):
        return [x for part in item for x in _flat(part)]
    return [item]
