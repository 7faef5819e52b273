"""The padding analysis' states and results (``kiln.passes.padding`` describes them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.ir.graph import Node, Value
from kiln.passes.batching import Sizes, rank_of

VALID = "kiln_valid_"  # the padded graph's extra input: VALID + symbol, the run's true length
PASSING = frozenset({"Identity", "Cast", "CastLike", "Dropout"})  # copy values: zeros stay zeros
ZERO_SUMS = frozenset({"ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare"})  # a 0 adds nothing


@dataclass(frozen=True)
class Padded:
    axes: tuple[int, ...]
    zero: frozenset[int] = frozenset()
    ident: bool = False  # one axis, and each element is its own position (a Range(0, length))
    uniform: bool = False  # its values do not vary along the padded dims (a broadcast of a constant)
    # (one axis) shifted by a slice (``x[:, :-1]``, ``x[:, 1:]``): its length is the run's length
    # minus ``short`` and it is valid below that; ``kiln.passes.padding_shifts`` follows it
    short: int = 0
    # each element is its position plus this (a Range(0, length) sliced from 1: the positions a
    # shifted copy is written to); None: not so (``ident`` is offset 0)
    offset: int | None = None


@dataclass(frozen=True)
class IndexTuple:
    """Index tuples along the last dim (for GatherND): component ``k`` is the position along
    dim ``parts[k]`` of the leading dims (None: a value independent of the positions)."""

    axes: tuple[int, ...]
    parts: tuple[int | None, ...]
    # component k is the position plus offsets[k] (() : all 0), the tuples' positions valid below
    # the length minus ``short`` (tuples written to shifted positions: ``kiln.passes.padding_shifts``)
    offsets: tuple[int, ...] = ()
    short: int = 0


@dataclass(frozen=True)
class ShiftedSizes:
    """A shape vector read from a shifted value (``Padded.short``): the elements ``mask`` marks
    are the length minus ``short``."""

    mask: tuple[bool, ...]
    short: int


@dataclass(frozen=True)
class Merged:
    """Positions merged with the dims around them into dim ``axis`` (a Linear on [batch*seq,
    768] rows): index ``(o * length + position) * inner + i``; only row-wise ops may read it, a
    Reshape splits it again."""

    axis: int
    outer: int  # whole indices of the dims before merged into it
    inner: int  # elements of the dims after merged into it


@dataclass(frozen=True)
class Stride:
    """An integer tensor independent of the positions times the length (``row * length``: the
    start of each row of a flattened [rows, length] tensor)."""


@dataclass(frozen=True)
class FlatIndex:
    """``row * length + position``: indices into a flattened [rows, length] tensor, each
    pointing at its own row's element at the position (``axes``: where positions vary)."""

    axes: tuple[int, ...]


State = Padded | Merged | Sizes | ShiftedSizes | Stride | FlatIndex | IndexTuple | None


@dataclass(frozen=True)
class Mask:
    """Operand ``index`` of the node computing ``output`` read as ``Where(valid along axis, x,
    fill)``; ``divide``: the node (a ReduceMean) becomes a ReduceSum divided by L times the
    static count of its other reduced elements."""

    output: str
    index: int
    axis: int
    fill: float
    divide: int = 0


@dataclass(frozen=True)
class Padding:
    """How a paddable symbol sits at the graph's boundary (each input's padded dim, or None;
    each output's padded dims, cut back to the valid length after a run) and the masks ``pad``
    writes."""

    symbol: str
    inputs: tuple[int | None, ...]
    outputs: tuple[tuple[int, ...], ...]
    masks: tuple[Mask, ...] = field(default=())

    @property
    def valid_input(self) -> str:
        return VALID + self.symbol


def is_shifted(state: State) -> bool:
    """A state only ``kiln.passes.padding_shifts`` may read (the others assume a length of L)."""
    if isinstance(state, Padded):
        return bool(state.short) or state.offset not in (None, 0)
    if isinstance(state, IndexTuple):
        return bool(state.short) or any(state.offsets)
    return isinstance(state, ShiftedSizes)


def where_mask(node: Node, read: list[State], kind: type) -> tuple[bool, ...] | None:
    """A Where between two 1-D shape vectors (element i is either branch's element i): which
    elements may be the length, read from ``kind`` states' masks (a branch independent of the
    length, of static size, has none); None when a branch is neither."""
    masks = []
    for index in (1, 2):
        state, value = read[index], node.inputs[index]
        length = rank_of(value) == 1 and value.type.shape[0]
        if isinstance(state, kind) and state.mask is not None:
            masks.append(state.mask)
        elif state is None and isinstance(length, int):
            masks.append((False,) * length)
    if len(masks) != 2 or len(masks[0]) != len(masks[1]):
        return None
    return tuple(a or b for a, b in zip(*masks))


def broadcast_dims(out_rank: int, value: Value, axes: tuple[int, ...]) -> set[int]:
    """``value``'s dims ``axes`` as dims of an output of rank ``out_rank`` it broadcasts to."""
    return {out_rank - rank_of(value) + a for a in axes}
