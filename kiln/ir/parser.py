"""Parser for the IR text form written by ``kiln.ir.printer`` (see that module for the syntax)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.ir.dims import DimSyntaxError, canonical
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType, OptionalType, SequenceType, TensorType, Type, split_dims

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<value>%(?:"(?:[^"\\]|\\.)*"|[A-Za-z0-9_.]+))
  | (?P<bytes>b"(?:[^"\\]|\\.)*")
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)|-inf\b)
  | (?P<ellipsis>\.\.\.)
  | (?P<arrow>->)
  | (?P<scope>::)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.*]*)
  | (?P<punct>[()\[\]{},:=<>@])
  | (?P<op>//|[*%+-])
    """,
    re.VERBOSE,
)


class ParseError(ValueError):
    """The text is not valid IR; the message gives the line and column."""


def parse_graph(text: str, data: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Parse IR text. ``data`` supplies tensors printed by reference (``tensor_data``)."""
    parser = _Parser(text, data or {})
    graph = parser.graph(parent=None)
    parser.expect_end()
    return graph


class _Parser:
    def __init__(self, text: str, data: Mapping[str, np.ndarray]) -> None:
        self.text = text
        self.data = data
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if not match:
                raise self.error_at(pos, f"unexpected character {text[pos]!r}")
            kind = match.lastgroup or ""
            if kind != "ws":
                self.tokens.append((kind, match.group(), pos))
            pos = match.end()
        self.index = 0

    # -- token helpers ---------------------------------------------------------------------------

    def error_at(self, pos: int, message: str) -> ParseError:
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return ParseError(f"line {line}, column {column}: {message}")

    def peek(self, offset: int = 0) -> tuple[str, str, int]:
        if self.index + offset < len(self.tokens):
            return self.tokens[self.index + offset]
        return ("end", "", len(self.text))

    def next(self) -> tuple[str, str, int]:
        token = self.peek()
        self.index += 1
        return token

    def at(self, text: str) -> bool:
        return self.peek()[1] == text and self.peek()[0] != "string"

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.index += 1
            return True
        return False

    def expect(self, text: str) -> None:
        kind, got, pos = self.next()
        if got != text or kind == "string":
            raise self.error_at(pos, f"expected {text!r}, got {got or 'end of text'!r}")

    def expect_kind(self, kind: str) -> str:
        got_kind, got, pos = self.next()
        if got_kind != kind:
            raise self.error_at(pos, f"expected a {kind}, got {got or 'end of text'!r}")
        return got

    def expect_end(self) -> None:
        kind, got, pos = self.peek()
        if kind != "end":
            raise self.error_at(pos, f"unexpected {got!r} after the graph")

    # -- grammar ---------------------------------------------------------------------------------

    def graph(self, parent: dict[str, Value] | None) -> Graph:
        self.expect("graph")
        kind, name, _ = self.next()
        name = json.loads(name) if kind == "string" else name
        scope: dict[str, Value] = dict(parent or {})
        local: set[str] = set()
        self.expect("(")
        inputs: list[Value] = []
        while not self.at(")"):
            value_name = self.value_name()
            self.expect(":")
            inputs.append(self.define(scope, local, value_name, self.type()))
            if not self.accept(","):
                break
        self.expect(")")
        self.expect("->")
        self.expect("(")
        output_names: list[tuple[str, int]] = []
        while not self.at(")"):
            pos = self.peek()[2]
            output_names.append((self.value_name(), pos))
            if not self.accept(","):
                break
        self.expect(")")
        opsets = {"": 21}
        if self.accept("opsets"):
            opsets = self.opsets()
        self.expect("{")
        constants: dict[Value, np.ndarray] = {}
        nodes: list[Node] = []
        while not self.accept("}"):
            if self.accept("const"):
                pos = self.peek()[2]
                value_name = self.value_name()
                self.expect(":")
                value_type = self.type()
                if self.accept("="):
                    array = self.array(value_type)
                elif value_name in self.data:
                    array = np.asarray(self.data[value_name])
                    self.check_data(value_name, value_type, array, pos)
                else:
                    raise self.error_at(pos, f"no data for constant %{value_name}")
                constants[self.define(scope, local, value_name, value_type, pos)] = array
            else:
                nodes.append(self.node(scope, local))
        outputs = []
        for value_name, pos in output_names:
            if value_name not in scope:
                raise self.error_at(pos, f"graph output %{value_name} is never defined")
            outputs.append(scope[value_name])
        return Graph(inputs, outputs, nodes, constants, name=name, opsets=opsets)

    def opsets(self) -> dict[str, int]:
        self.expect("{")
        opsets: dict[str, int] = {}
        while not self.at("}"):
            domain = json.loads(self.expect_kind("string"))
            self.expect(":")
            opsets[domain] = int(self.expect_kind("number"))
            if not self.accept(","):
                break
        self.expect("}")
        return opsets

    def define(self, scope: dict[str, Value], local: set[str], name: str, type_: Type, pos: int = -1) -> Value:
        if name in local:
            raise self.error_at(pos if pos >= 0 else self.peek()[2], f"%{name} is defined twice")
        local.add(name)
        value = Value(name, type_)
        scope[name] = value
        return value

    def value_name(self) -> str:
        text = self.expect_kind("value")[1:]
        return json.loads(text) if text.startswith('"') else text

    def type(self) -> Type:
        _, word, pos = self.next()
        if word in ("seq", "opt"):
            self.expect("<")
            elem = self.type()
            self.expect(">")
            return SequenceType(elem) if word == "seq" else OptionalType(elem)
        try:
            dtype = DType.from_short(word)
        except ValueError as err:
            raise self.error_at(pos, str(err)) from None
        self.expect("[")
        if self.accept("..."):
            self.expect("]")
            return TensorType(dtype, None)
        # dims are read from the text between the brackets (a dim may be an expression:
        # ``4*batch``, ``(h+3)//4``, ``min(seq,512)``), then the tokens in it are skipped
        start = self.tokens[self.index - 1][2] + 1
        close = self._closing_bracket(start)
        body = self.text[start:close]
        dims: list[int | str] = []
        if body.strip():
            for part in split_dims(body):
                try:
                    dim = canonical(part.strip())
                except DimSyntaxError as err:
                    raise self.error_at(start, f"expected a dim: {err}") from None
                if isinstance(dim, int) and dim < 0:
                    raise self.error_at(start, f"expected a dim, got {part.strip()!r}")
                dims.append(dim)
        while self.peek()[0] != "end" and self.peek()[2] < close:
            self.index += 1
        self.expect("]")
        return TensorType(dtype, tuple(dims))

    def _closing_bracket(self, start: int) -> int:
        depth = 0
        for position in range(start, len(self.text)):
            char = self.text[position]
            if char == "]" and depth == 0:
                return position
            depth += {"(": 1, ")": -1}.get(char, 0)
        raise self.error_at(start, "a type's dims with no closing ']'")

    def node(self, scope: dict[str, Value], local: set[str]) -> Node:
        outputs: list[tuple[str, Type, int]] = []
        if self.peek()[0] == "value":
            while True:
                pos = self.peek()[2]
                value_name = self.value_name()
                self.expect(":")
                outputs.append((value_name, self.type(), pos))
                if not self.accept(","):
                    break
            self.expect("=")
        op = self.expect_kind("ident")
        domain = ""
        if self.accept("::"):
            domain, op = op, self.expect_kind("ident")
        self.expect("(")
        inputs: list[Value | None] = []
        while not self.at(")"):
            if self.accept("_"):
                inputs.append(None)
            else:
                pos = self.peek()[2]
                name = self.value_name()
                if name not in scope:
                    raise self.error_at(pos, f"%{name} is used before it is defined")
                inputs.append(scope[name])
            if not self.accept(","):
                break
        self.expect(")")
        attrs: dict[str, Any] = {}
        if self.accept("{"):
            while not self.at("}"):
                key = self.expect_kind("ident")
                self.expect("=")
                attrs[key] = self.attr(scope, key, outputs)
                if not self.accept(","):
                    break
            self.expect("}")
        name = ""
        if self.accept("name"):
            self.expect("=")
            name = json.loads(self.expect_kind("string"))
        defined = [self.define(scope, local, n, t, pos) for n, t, pos in outputs]
        return Node(op, inputs, defined, attrs, name=name, domain=domain)

    def attr(self, scope: dict[str, Value], key: str, outputs: list) -> Any:
        kind, word, pos = self.peek()
        if kind == "number" or word in ("inf", "nan"):
            self.index += 1
            return _number(word)
        if kind == "string":
            self.index += 1
            return json.loads(word)
        if kind == "bytes":
            self.index += 1
            return json.loads(word[1:]).encode("latin-1")
        if word in ("true", "false"):
            self.index += 1
            return word == "true"
        if word == "[":
            self.index += 1
            items = []
            while not self.at("]"):
                items.append(self.attr(scope, key, outputs))
                if not self.accept(","):
                    break
            self.expect("]")
            return tuple(items)
        if word == "graph":
            return self.graph(parent=scope)
        if word == "type":
            self.index += 1
            self.expect("<")
            value_type = self.type()
            self.expect(">")
            return value_type
        if word == "tensor":
            self.index += 1
            self.expect("<")
            value_type = self.type()
            self.expect(">")
            if self.accept("@"):
                ref_kind, ref, ref_pos = self.next()
                ref = json.loads(ref) if ref_kind == "string" else ref
                if ref not in self.data:
                    raise self.error_at(ref_pos, f"no data for tensor @{ref}")
                return np.asarray(self.data[ref])
            return self.array(value_type)
        raise self.error_at(pos, f"expected an attribute value, got {word!r}")

    def check_data(self, name: str, value_type: Type, array: np.ndarray, pos: int) -> None:
        """A constant's data is exactly what the text declares: its dtype and its shape (data of
        another type would be read as the declared one: wrong answers, or reads past its end)."""
        if not isinstance(value_type, TensorType):
            return
        if array.dtype != value_type.dtype.numpy or (
            value_type.shape is not None and tuple(array.shape) != tuple(value_type.shape)
        ):
            raise self.error_at(
                pos,
                f"constant %{name}: its data is {array.dtype} {list(array.shape)}, the graph declares "
                f"{value_type.dtype.short} {list(value_type.shape) if value_type.shape is not None else '?'}",
            )

    def array(self, value_type: Type) -> np.ndarray:
        if not isinstance(value_type, TensorType) or not value_type.is_static:
            raise self.error_at(self.peek()[2], "inline data needs a static tensor type")
        pos = self.peek()[2]
        self.expect("[")
        items: list[Any] = []
        while not self.at("]"):
            kind, word, item_pos = self.next()
            if kind == "number" or word in ("inf", "nan"):
                items.append(_number(word))
            elif kind == "string":
                items.append(json.loads(word))
            elif word in ("true", "false"):
                items.append(word == "true")
            else:
                raise self.error_at(item_pos, f"expected a literal, got {word!r}")
            if not self.accept(","):
                break
        self.expect("]")
        shape = tuple(int(d) for d in value_type.shape or ())
        dtype = value_type.dtype.numpy
        if value_type.dtype is DType.STRING:
            array = np.array(items, dtype=object)
        else:
            array = np.array(items, dtype=np.float64 if dtype.kind not in "biu" else dtype)
            array = array.astype(dtype)
        if array.size != int(np.prod(shape)):
            raise self.error_at(pos, f"{array.size} values for type {value_type}")
        return array.reshape(shape)


def _number(word: str) -> int | float:
    if word in ("inf", "-inf", "nan"):
        return float(word)
    if re.fullmatch(r"-?\d+", word):
        return int(word)
    return float(word)
