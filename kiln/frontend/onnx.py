"""ONNX frontend: a model (path, bytes or ModelProto) -> kiln Graph.

Every node goes through a converter chosen by (op, opset): the highest registered version <= the
model's opset for that domain (see ``kiln.frontend.converters``). Converters rewrite older ONNX forms
into kiln's canonical form of each op. Problems (unknown ops, unsupported attributes, failed type
inference) are all collected and raised together, each naming its node.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln import integrity
from kiln.errors import (
    InvalidModelError,
    KilnError,
    ModelLoadError,
    ShapeInferenceError,
    UnsupportedModelError,
    VerificationError,
)
from kiln.frontend import contrib, contrib_attention  # noqa: F401  (ONNX Runtime's contrib ops register)
from kiln.frontend.converters import GraphBuilder, PoisonedInputs, pick_converter
from kiln.ir.graph import Graph, Value, constant_type, unique_name
from kiln.ir.types import DType, OptionalType, SequenceType, TensorType, Type
from kiln.memory import aligned_if_big
from kiln.ops.inference import UnsupportedConstruct, check_size
from kiln.ops.registry import ATTR_KINDS, lookup
from kiln.ops.verify import verify

ModelSource = str | os.PathLike | bytes | onnx.ModelProto

# Inputs to compile-time evaluation are capped so that import never does real model work.


def load_model(source: ModelSource) -> tuple[onnx.ModelProto, str]:
    """Read an ONNX model; returns it with a description of where it came from for errors. A
    file's external data files are checked here and read tensor by tensor as the import converts
    them (``array_from_tensor``): never whole into the model's message beside the arrays made of
    it (a 1B decoder's 5 GB of weights were held twice at its import's peak)."""
    if isinstance(source, onnx.ModelProto):
        return source, "<ModelProto>"
    if isinstance(source, (bytes, bytearray)):
        try:
            model = onnx.load_from_string(bytes(source))
        except Exception as err:
            raise ModelLoadError(f"<bytes>: not a valid ONNX model ({type(err).__name__}: {err})") from None
        return _check_model_proto(model, "<bytes>"), "<bytes>"
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, expected an .onnx file")
    try:  # a regular file only: a FIFO or a device is refused, never read forever
        with integrity.open_regular(path, "model") as handle:
            identity = integrity.file_identity(os.fstat(handle.fileno()))
            data = handle.read()
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot be read ({err.strerror or err})") from None
    try:
        model = onnx.load_from_string(data)
    except Exception as err:
        raise ModelLoadError(f"{path}: not a valid ONNX model ({type(err).__name__}: {err})") from None
    del data
    _EXTERNAL[str(path)] = (identity, _check_external_data(model, path))
    return _check_model_proto(model, str(path)), str(path)


# the external-data files of the ONNX files this process imported: (path) -> (the file's identity
# when read, the files' names); the plan cache's index lists them without parsing the model again
# (a big model's second parse holds the interpreter's lock for a second)
_EXTERNAL: dict[str, tuple[tuple[int, ...], list[str]]] = {}


def external_files(path: str | os.PathLike) -> list[str]:
    """The external-data files (relative to its folder) an ONNX file's tensors live in: as the
    import read them if the file is unchanged since, else parsed from the file again."""
    found = _EXTERNAL.get(str(path))
    try:
        if found is not None and found[0] == integrity.file_identity(os.stat(path)):
            return list(found[1])
    except OSError:
        pass
    from onnx.external_data_helper import _get_all_tensors

    return _locations(_get_all_tensors(onnx.load(str(path), load_external_data=False)))


def _locations(tensors: Any) -> list[str]:
    from onnx.external_data_helper import uses_external_data

    found: dict[str, None] = {}
    for tensor in tensors:
        if uses_external_data(tensor):
            found.update({e.value: None for e in tensor.external_data if e.key == "location"})
    return list(found)


def _check_external_data(model: onnx.ModelProto, path: Path) -> list[str]:
    """The files the tensors stored beside the model file live in, each of which must be a
    regular file (a FIFO planted as a weight file would block the read forever)."""
    from onnx.external_data_helper import _get_all_tensors

    locations = _locations(_get_all_tensors(model))
    for location in sorted(locations):
        try:
            integrity.check_regular(path.parent / location, "external data file")
        except integrity.IrregularFile as err:
            raise ModelLoadError(f"{path}: {err}") from None
    return locations


def _check_model_proto(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{where}: not a valid ONNX model (no graph)")
    return model


def import_onnx(source: ModelSource) -> Graph:
    """Import an ONNX model into kiln's IR; raises UnsupportedModelError listing every problem."""
    model, where = load_model(source)
    opsets = _check_versions(model, where)
    importer = _Importer(opsets, where)
    if not isinstance(source, (onnx.ModelProto, bytes, bytearray)):  # (external data: beside the file)
        importer.folder = str(Path(source).parent)
    try:
        graph = importer.graph(model.graph, outer={}, hints=None)
    except KilnError:
        raise
    except Exception as err:  # a damaged model the per-node checks did not catch (e.g. non-UTF-8 names)
        raise InvalidModelError(
            f"{where}: malformed model ({type(err).__name__}: {err}); if the file is a valid ONNX model, this is a kiln bug"
        ) from err
    if importer.problems:
        unsupported = [p for p in importer.problems if p.startswith("unsupported:")]
        lines = [p.split(":", 1)[1].strip() for p in importer.problems]
        if unsupported:
            raise UnsupportedModelError(lines, source=where)
        raise InvalidModelError(f"{where}: {len(lines)} problem(s):\n" + "\n".join(f"  - {x}" for x in lines))
    try:
        return verify(graph)
    except VerificationError as err:
        raise InvalidModelError(f"{where}: the imported graph is malformed:\n{err}") from None


@functools.lru_cache(maxsize=1)
def known_opsets() -> dict[str, int]:
    """The newest opset of each domain whose schemas kiln has (those of the installed onnx)."""
    newest: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = "" if schema.domain == "ai.onnx" else schema.domain
        newest[domain] = max(newest.get(domain, 0), schema.since_version)
    newest[""] = max(newest.get("", 0), onnx.defs.onnx_opset_version())
    return newest


def _check_versions(model: onnx.ModelProto, where: str) -> dict[str, int]:
    """The model's opsets by domain; IR versions and opsets newer than kiln knows are refused (their
    semantics may differ), as is a model that imports no opset or one domain twice (ONNX requires
    exactly one import per domain)."""
    if model.ir_version < 1:
        raise InvalidModelError(f"{where}: the model declares no IR version (ONNX requires one)")
    if model.ir_version > onnx.IR_VERSION:
        raise UnsupportedModelError(
            [f"IR version {model.ir_version} is newer than kiln reads ({onnx.IR_VERSION})"], source=where
        )
    if not model.opset_import:
        raise InvalidModelError(f"{where}: the model imports no opset (ONNX requires one per domain it uses)")
    opsets: dict[str, int] = {}
    problems = []
    for entry in model.opset_import:
        domain = "" if entry.domain == "ai.onnx" else entry.domain
        if domain in opsets:
            raise InvalidModelError(f"{where}: opset of domain {entry.domain or 'ai.onnx'!r} imported twice")
        opsets[domain] = entry.version
        newest = known_opsets().get(domain)
        if newest is not None and entry.version > newest:
            problems.append(
                f"opset {entry.version} of domain {entry.domain or 'ai.onnx'!r} is newer than kiln knows ({newest})"
            )
        if entry.version < 1 and domain in ("", "ai.onnx.ml"):
            problems.append(f"opset {entry.version} of domain {entry.domain or 'ai.onnx'!r} does not exist")
    if problems:
        raise UnsupportedModelError(problems, source=where)
    return opsets


# -- type conversion -------------------------------------------------------------------------------


def _symbol(text: str | bytes) -> str:
    if isinstance(text, bytes):  # protobuf hands back bytes for a string field that is not UTF-8
        text = text.decode("utf-8", errors="replace")
    clean = "".join(c if c.isalnum() or c == "_" else "_" for c in text) or "d"
    return "s_" + clean if clean[0].isdigit() else clean


def type_from_proto(proto: onnx.TypeProto, name: str) -> Type | None:
    kind = proto.WhichOneof("value")
    if kind == "tensor_type":
        tensor_type = proto.tensor_type
        if tensor_type.elem_type == 0:
            return None
        dtype = DType.from_onnx(tensor_type.elem_type)
        if not tensor_type.HasField("shape"):
            return TensorType(dtype, None)
        dims: list[int | str] = []
        for index, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                if dim.dim_value < 0:
                    raise InvalidModelError(f"value {name!r} has negative dim {dim.dim_value}")
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(_symbol(dim.dim_param))
            else:
                dims.append(_symbol(f"{name}_d{index}"))
        return TensorType(dtype, tuple(dims))
    if kind == "sequence_type":
        elem = type_from_proto(proto.sequence_type.elem_type, name)
        return SequenceType(elem) if elem is not None else None
    if kind == "optional_type":
        elem = type_from_proto(proto.optional_type.elem_type, name)
        return OptionalType(elem) if elem is not None else None
    return None


def array_from_tensor(proto: onnx.TensorProto, folder: str | None = None) -> np.ndarray:
    """A tensor's array; one whose data lives in an external file is read from ``folder`` (the
    model file's: checked by ``load_model``; None, a model given as bytes or a message: refused,
    never read relative to the working directory)."""
    from onnx.external_data_helper import uses_external_data

    if uses_external_data(proto):
        if folder is None:
            raise ValueError("its data lives in an external file: compile the model from its .onnx file's path")
        array = numpy_helper.to_array(proto, folder)
    else:
        array = numpy_helper.to_array(proto)
    if array.dtype.kind in "SU":
        array = array.astype(object)
    else:  # a big one moved to a 64-byte boundary once, here: the plan reads an embedding table as
        array = aligned_if_big(array)  # it is, and binds it where it lies (no copy per size class)
    return array


# -- the importer ----------------------------------------------------------------------------------


@dataclass
class _Scope:
    values: dict[str, Value]
    known: dict[Value, np.ndarray] = field(default_factory=dict)
    symbolic: dict[Value, tuple] = field(default_factory=dict)


class _Importer:
    def __init__(self, opsets: dict[str, int], where: str) -> None:
        self.opsets = opsets
        self.where = where
        self.problems: list[str] = []
        self.produced_later: set[str] = set()
        self.folder: str | None = None  # where the model's external data files are (load_model checked them)

    def graph(
        self,
        proto: onnx.GraphProto,
        outer: dict[str, Value],
        hints: list[Type] | None,
        outer_known: dict[Value, np.ndarray] | None = None,
    ) -> Graph:
        scope = _Scope(values=dict(outer), known=dict(outer_known or {}))
        taken = {v.name for v in outer.values()}
        constants: dict[Value, np.ndarray] = {}
        initializer_names = {init.name for init in proto.initializer} | {
            s.values.name for s in proto.sparse_initializer
        }
        self._initializers(proto, scope, taken, constants)
        inputs: list[Value] = []
        real_inputs = [i for i in proto.input if i.name not in initializer_names]
        listed: set[str] = set()
        for info in proto.input:
            if info.name in listed:
                self.problems.append(f"invalid: graph input name {info.name!r} is used twice")
            listed.add(info.name)
        # an initializer that is also a graph input is a default the caller may override; its
        # declared type must be the data's
        defaults = [scope.values[i.name] for i in proto.input if i.name in initializer_names and i.name in scope.values]
        for info in proto.input:
            if info.name in initializer_names and info.name in scope.values:
                self._check_declared(f"graph input {info.name!r} (an initializer)", info.type, scope.values[info.name])
        for index, info in enumerate(real_inputs):
            inputs.append(self._input(info, index, hints, scope, taken))
        self.produced_later = {name for node_proto in proto.node for name in node_proto.output}
        builder = GraphBuilder(self, scope, taken, constants)
        builder.own.update(initializer_names, (info.name for info in real_inputs))
        for node_proto in proto.node:
            self.node(node_proto, builder)
        outputs: list[Value] = []
        for info in proto.output:
            if info.name not in scope.values:
                self.problems.append(f"invalid: graph output {info.name!r} is never produced")
                continue
            outputs.append(scope.values[info.name])
            if scope.values[info.name] not in builder.poisoned:
                self._check_declared(f"graph output {info.name!r}", info.type, scope.values[info.name])
        return Graph(
            inputs,
            outputs,
            builder.nodes,
            constants,
            name=_symbol(proto.name or "main"),
            opsets=dict(self.opsets),
            defaults=tuple(defaults),
        )

    def _initializers(
        self, proto: onnx.GraphProto, scope: _Scope, taken: set[str], constants: dict[Value, np.ndarray]
    ) -> None:
        """Each (sparse) initializer as a constant in ``constants`` and ``scope``; damaged or
        unsupported ones and repeated names are problems."""
        seen_initializers: set[str] = set()
        for init in proto.initializer:
            if init.name in seen_initializers:
                self.problems.append(f"invalid: initializer name {init.name!r} is used twice")
                continue
            seen_initializers.add(init.name)
            try:
                array = array_from_tensor(init, self.folder)
                array_type = constant_type(array)
            except Exception as err:  # damaged data, or an element type kiln does not know (float6)
                kind = "unsupported" if "element type" in str(err) or "no kiln equivalent" in str(err) else "invalid"
                self.problems.append(f"{kind}: initializer {init.name!r}: {err}")
                continue
            value = Value(unique_name(init.name, taken), array_type)
            constants[value] = array
            scope.values[init.name] = value
            scope.known[value] = array
        for sparse in proto.sparse_initializer:
            try:
                array = numpy_helper.to_array(sparse)  # type: ignore[arg-type]
                array_type = constant_type(array)
            except Exception as err:
                self.problems.append(f"unsupported: sparse initializer {sparse.values.name!r}: {err}")
                continue
            value = Value(unique_name(sparse.values.name, taken), array_type)
            constants[value] = array
            scope.values[sparse.values.name] = value
            scope.known[value] = array

    def _input(
        self, info: onnx.ValueInfoProto, index: int, hints: list[Type] | None, scope: _Scope, taken: set[str]
    ) -> Value:
        """A graph input's value (its declared type, else the hint at ``index``)."""
        try:
            value_type = type_from_proto(info.type, info.name)
        except ValueError as err:  # an element type code kiln does not know
            self.problems.append(f"unsupported: graph input {info.name!r}: {err}")
            value_type = None
        if value_type is None and hints is not None and index < len(hints):
            value_type = hints[index]
        if value_type is None:
            self.problems.append(f"invalid: graph input {info.name!r} has no type")
            value_type = TensorType(DType.FLOAT32, None)
        try:
            check_size(value_type, f"graph input {info.name!r}")
        except ShapeInferenceError as err:
            self.problems.append(f"invalid: {err}")
        value = Value(unique_name(info.name, taken), value_type)
        scope.values[info.name] = value
        return value

    def _check_declared(self, what: str, declared: onnx.TypeProto, value: Value) -> None:
        """A declared type that contradicts the data or inference (another dtype or rank, or a
        different static size) is a model error, named with both types."""
        try:
            expected = type_from_proto(declared, value.name)
        except (ValueError, KilnError):
            return
        got = value.type
        if not isinstance(expected, TensorType) or not isinstance(got, TensorType):
            return
        conflict = expected.dtype != got.dtype
        if expected.shape is not None and got.shape is not None:
            conflict |= len(expected.shape) != len(got.shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(expected.shape, got.shape)
            )
        if conflict:
            self.problems.append(f"invalid: {what} is declared {expected} but is {got}")

    def node(self, proto: onnx.NodeProto, builder: Any) -> None:
        domain = "" if proto.domain == "ai.onnx" else proto.domain
        opset = self.opsets.get(domain)
        label = f"node {proto.name or '<unnamed>'!r} (op {proto.op_type}, opset {opset})"
        missing = [name for name in proto.input if name and name not in builder.scope.values]
        if missing:
            later = [name for name in missing if name in self.produced_later]
            why = " (produced by a later node: a cycle, or nodes out of topological order)" if later else ""
            self.problems.append(f"invalid: {label}: input(s) {missing} are not defined before use{why}")
            builder.poison(proto)
            return
        # the types the node sees, for every message about it
        seen = [f"{name}: {builder.scope.values[name].type}" for name in proto.input if name]
        if seen and not any(builder.scope.values[n] in builder.poisoned for n in proto.input if n):
            label += f" with inputs {', '.join(seen)}"
        if opset is None:
            self.problems.append(f"unsupported: {label}: domain {proto.domain!r} is not imported by the model")
            builder.poison(proto)
            return
        converter = pick_converter(proto.op_type, domain, opset)
        opdef = lookup(proto.op_type, domain)
        if converter is None and opdef is None:
            self.problems.append(f"unsupported: {label}: unknown op")
            builder.poison(proto)
            return
        redefined = [name for name in proto.output if name and name in builder.own]
        if redefined:
            self.problems.append(
                f"invalid: {label}: output(s) {redefined} are already defined (each value has one producer)"
            )
            return
        try:
            if opdef is not None:
                _check_attribute_kinds(proto, opdef)
            if converter is not None:
                converter(proto, builder, label)
            else:
                builder.emit_proto(proto, label)
        except PoisonedInputs:
            builder.poison(proto)  # downstream of a node whose problem is already reported
        except UnsupportedConstruct as err:
            self.problems.append(f"unsupported: {label}: {err}")
            builder.poison(proto)
        except (ShapeInferenceError, InvalidModelError) as err:
            self.problems.append(f"invalid: {label}: {err}")
            builder.poison(proto)
        except KilnError as err:
            self.problems.append(f"invalid: {label}: {err}")
            builder.poison(proto)
        except Exception as err:
            self.problems.append(f"invalid: {label}: kiln bug while importing this node: {type(err).__name__}: {err}")
            builder.poison(proto)

    def attribute(self, proto: onnx.AttributeProto, builder: Any, hints: list[Type] | None) -> Any:
        if proto.name.startswith("kiln_"):  # kiln's own annotations (kiln.passes.quantized) come from kiln only
            raise UnsupportedConstruct(f"attribute {proto.name!r}: names starting with 'kiln_' are kiln's own")
        kind = proto.type
        if kind == onnx.AttributeProto.GRAPH:
            return self.graph(proto.g, builder.scope.values, hints, outer_known=builder.scope.known)
        if kind == onnx.AttributeProto.GRAPHS:
            return tuple(self.graph(g, builder.scope.values, hints) for g in proto.graphs)
        if kind == onnx.AttributeProto.TENSOR:
            return array_from_tensor(proto.t, self.folder)
        if kind == onnx.AttributeProto.SPARSE_TENSOR:
            return numpy_helper.to_array(proto.sparse_tensor)  # type: ignore[arg-type]
        if kind == onnx.AttributeProto.TYPE_PROTO:
            return type_from_proto(proto.tp, proto.name)
        if kind == onnx.AttributeProto.TENSORS:
            return tuple(array_from_tensor(t, self.folder) for t in proto.tensors)
        if proto.ref_attr_name:
            raise UnsupportedConstruct(f"attribute {proto.name!r} refers to a function attribute")
        value = helper.get_attribute_value(proto)
        if isinstance(value, bytes):
            return _text(value)
        if isinstance(value, list):
            return tuple(_text(v) if isinstance(v, bytes) else v for v in value)
        return value


def _text(value: bytes) -> str | bytes:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _check_attribute_kinds(proto: onnx.NodeProto, opdef: Any) -> None:
    """An attribute whose type differs from the schema's (Softmax's ``axis`` given as a string)
    is an invalid model, reported with the node, not a kiln bug further down."""
    for attribute in proto.attribute:
        spec = opdef.attrs.get(attribute.name)
        if spec is None or spec.kind == "unknown" or attribute.ref_attr_name:
            continue
        kind = ATTR_KINDS.get(int(attribute.type), "undefined")
        if kind == spec.kind or (kind, spec.kind) in (("int", "float"), ("ints", "floats")):
            continue
        raise InvalidModelError(f"attribute {attribute.name!r} must be {spec.kind}, got {kind}")
