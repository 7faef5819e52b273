"""A kernel's structure as one hashable key: two kernels with equal keys are the same program up
to the names kiln generated (loop indices, scalars, helpers) and which buffers they use (each
buffer is its position in the kernel's buffer list, with its dtype and size).

Renderers that write each distinct kernel once (the cpu target's ``Templates``: a transformer's
twelve identical layers, a CNN stage's blocks) ask for the key before writing a kernel out, so
a repeated kernel costs one walk of its IR instead of a rendering (a 7x7 depthwise convolution
written without bounds tests is thousands of statements: rendering it is most of a cold
compile's Python time).

Every node is interned to a small int from its tag, its own values and its operands' ints (a
DAG is walked once per kernel: fused chains share operands); names are renamed in order of first
appearance. Anything the walk does not know how to encode makes the kernel unkeyable (None): it
is then rendered as before, never wrongly shared.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from kiln.lower.kir import Binary, Buffer, Cast, Const, Function, Index, Kernel, Load, Scalar, Schedule, Select, Unary


class _Unkeyable(Exception):
    pass


class _Name(int):
    """A generated name, already renamed (a helper function's)."""


_EXPRESSIONS: dict[type, tuple[str, ...]] = {
    Load: ("buffer", "index"),
    Binary: ("a", "b"),
    Unary: ("a",),
    Cast: ("a",),
    Select: ("cond", "a", "b"),
}


class StructureKeys:
    """Interned structures shared by every kernel keyed through one instance (equal structures in
    different kernels get the same int)."""

    def __init__(self) -> None:
        self._interned: dict[tuple[Any, ...], int] = {}

    def key(self, kernel: Kernel, used: list[Buffer]) -> int | None:
        """The key of ``kernel`` rendered with ``used`` as its buffer list (None: unkeyable)."""
        try:
            return _Walk(self._interned, {b: i for i, b in enumerate(used)}).key(kernel, used)
        except _Unkeyable:
            return None


class _Walk:
    def __init__(self, interned: dict[tuple[Any, ...], int], table: dict[Buffer, int]) -> None:
        self.interned = interned
        self.table = table
        self.names: dict[str, int] = {}
        self.done: dict[
            int, int
        ] = {}  # id(node) -> its interned int (each shared node once; the kernel holds them all)

    def intern(self, item: tuple[Any, ...]) -> int:
        found = self.interned.get(item)
        if found is None:
            found = self.interned[item] = len(self.interned)
        return found

    def name(self, text: str | None) -> int | None:
        if text is None:
            return None
        return self.names.setdefault(text, len(self.names))

    def key(self, kernel: Kernel, used: list[Buffer]) -> int:
        buffers = tuple((b.dtype.name, b.size) for b in used)
        parts = (kernel.kind, buffers, self.node(kernel.schedule), self.node(kernel.length), self.node(kernel.dims))
        return self.intern(("kernel", parts, self.node(kernel.body)))

    def leaf(self, node: object) -> tuple[Any, ...] | None:
        """The encoding of a node with no operands, None for a node that has some."""
        if isinstance(node, _Name):
            return ("name", int(node))
        if node is None or isinstance(node, (bool, int, str)):
            return (type(node).__name__, node)
        if isinstance(node, float):
            return ("float", repr(node))
        if isinstance(node, enum.Enum):
            return ("enum", type(node).__name__, node.name)
        if isinstance(node, Buffer):
            if node not in self.table:
                raise _Unkeyable(node.name)
            return ("buffer", self.table[node])
        if isinstance(node, Const):
            return ("const", type(node.value).__name__, repr(node.value), node.dtype.name)
        if isinstance(node, Index):
            return ("index", self.name(node.name))
        if isinstance(node, Scalar):
            return ("scalar", self.name(node.name), node.dtype.name)
        if isinstance(node, Schedule):
            return (
                "schedule",
                self.name(node.parallel),
                self.name(node.vectorize),
                tuple((self.name(k), v) for k, v in node.unroll.items()),
                tuple(self.name(s) for s in node.simd),
                tuple((self.name(k), v) for k, v in node.bind.items()),
                tuple((self.name(k), v) for k, v in node.pipeline.items()),
            )
        return None

    def children(self, node: object) -> tuple[str, list[object]]:
        kind = type(node)
        fields = _EXPRESSIONS.get(kind)
        if fields is not None:
            head = getattr(node, "op", None) or getattr(node, "dtype", None)
            return f"{kind.__name__}:{head}", [getattr(node, f) for f in fields]
        if isinstance(node, (list, tuple)):
            return kind.__name__, list(node)
        if isinstance(node, dict):
            return "dict", [item for pair in node.items() for item in pair]
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            values = [getattr(node, f.name) for f in dataclasses.fields(node)]
            if isinstance(node, Function):
                values[0] = _Name(self.name(node.name))  # its name is generated
            return kind.__name__, values
        raise _Unkeyable(kind.__name__)

    def node(self, root: object) -> int:
        """``root``'s interned int: an iterative postorder (chains of fused ops run thousands deep)."""
        stack: list[tuple[object, list[object] | None, str]] = [(root, None, "")]
        results: list[int] = []
        while stack:
            node, kids, tag = stack.pop()
            if kids is not None:  # its operands are done: the last len(kids) results
                count = len(kids)
                own = tuple(results[len(results) - count :]) if count else ()
                del results[len(results) - count :]
                value = self.intern((tag, own))
                if not isinstance(node, (list, tuple, dict)):
                    self.done[id(node)] = value
                results.append(value)
                continue
            if id(node) in self.done:
                results.append(self.done[id(node)])
                continue
            encoded = self.leaf(node)
            if encoded is not None:
                results.append(self.intern(encoded))  # type: ignore[arg-type]
                continue
            tag, operands = self.children(node)
            stack.append((node, operands, tag))
            stack.extend((child, None, "") for child in reversed(operands))
        return results[-1]
