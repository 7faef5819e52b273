"""Declared ranges of a model's symbolic dims, and runs at any size of a sample-parallel dim from a
few compiled sizes (its size classes), with no compile at run time; likewise a paddable dim (a
sequence length, ``kiln.passes.padding``): a run pads it to the smallest compiled length that
holds it and cuts the outputs back.

``kiln.passes.batching`` proves a dim sample-parallel (each output sample computed from its own
input sample alone). A run at ``n`` samples is then split into chunks whose sizes are classes
(largest first: 37 with classes 1 and 8 is 8+8+8+8+1+1+1+1+1), each chunk runs on its class's
compiled variant, and the outputs are joined along their samples' dim.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.backends.registry import Backend
from kiln.errors import ArgumentError, InputError
from kiln.ir import dims as size_exprs
from kiln.passes.batching import Parallel, symbols
from kiln.passes.padding import Padding

MAX_DIM = (1 << 31) - 1  # a bound dim: far past any tensor a machine holds, far below index overflow
DEFAULT_RANGE = (1, MAX_DIM)  # a sample-parallel dim nobody bounded: every size runs from the classes
DEFAULT_CLASSES = Backend.batch_classes  # compiled sizes of a sample-parallel dim (a target may have its own)
MAX_CLASSES = 8
MAX_CLASS = 4096  # a class is compiled at its size: larger ones are arenas of gigabytes for no speed


def declared_ranges(dims: Any) -> dict[str, Any]:
    """The dims of a ``dims=`` argument that declare a range (``(1, 64)``, ``"1..64"``), not a size."""
    return {k: v for k, v in dims.items() if isinstance(v, (tuple, list, str))} if isinstance(dims, dict) else {}


def parse_range(name: str, value: Any) -> tuple[int, int]:
    """A declared range: ``(low, high)`` (both included), or ``"low..high"``."""
    if isinstance(value, str):
        low, sep, high = value.partition("..")
        if not sep:
            raise ArgumentError(f"dims: {name}={value!r} is not a range (write LOW..HIGH, e.g. 1..64)")
        value = (low, high)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ArgumentError(f"dims: {name}={value!r} is not a range (a pair (low, high))")
    try:
        low, high = (int(str(v).strip()) for v in value)
    except ValueError:
        raise ArgumentError(f"dims: {name}={value!r}: a range's ends are integers") from None
    if not 0 <= low <= high <= MAX_DIM:
        raise ArgumentError(f"dims: {name}={low}..{high} is not a range of sizes (0 <= low <= high <= {MAX_DIM})")
    return low, high


def _sizes(name: str, value: Any) -> list[int]:
    """``value`` ("1,4,16" or a list) as 1 to MAX_CLASSES distinct positive sizes, ascending."""
    try:
        classes = sorted({int(v) for v in (value.split(",") if isinstance(value, str) else value)})
    except (TypeError, ValueError):
        raise ArgumentError(f"size classes of {name}: {value!r} is not a list of sizes") from None
    if not classes or classes[0] < 1 or len(classes) > MAX_CLASSES:
        raise ArgumentError(f"size classes of {name}: 1 to {MAX_CLASSES} positive sizes, got {classes}")
    return classes


def parse_classes(name: str, value: Any, bounds: tuple[int, int]) -> tuple[int, ...]:
    """Size classes: distinct positive sizes inside ``bounds`` (at most MAX_CLASSES), with 1 or the
    range's low end among them, so every size in the range is a sum of classes."""
    classes = _sizes(name, value)
    if classes[0] != 1:
        raise ArgumentError(f"size classes of {name}: {classes} must include 1 (every size is then a sum of them)")
    if classes[-1] > MAX_CLASS:
        raise ArgumentError(f"size classes of {name}: {classes[-1]} is too large a class (at most {MAX_CLASS})")
    if classes[-1] > bounds[1]:
        raise ArgumentError(f"size classes of {name}: {classes[-1]} is past the range's end {bounds[1]}")
    return tuple(classes)


def default_classes(bounds: tuple[int, int], classes: tuple[int, ...] = DEFAULT_CLASSES) -> tuple[int, ...]:
    """``classes`` (a target's, ``Backend.batch_classes``) inside ``bounds``."""
    return tuple(c for c in classes if c <= max(1, bounds[1]))


def check_ranges(dims: dict[str, int], ranges: dict[str, tuple[int, int]]) -> None:
    for name, (low, high) in ranges.items():
        size = dims.get(name)
        if size is not None and not low <= size <= high:
            raise InputError(
                f"{name}={size} is outside the range this model was compiled for ({name}={low}..{high}); "
                f"compile it with --dim {name}=LOW..HIGH covering {size}"
            )


@dataclass(frozen=True)
class Chunking:
    """How runs at any size of ``parallel.symbol`` become runs at its ``classes``."""

    parallel: Parallel
    classes: tuple[int, ...]

    @property
    def symbol(self) -> str:
        return self.parallel.symbol

    def holds(self, dims: dict[str, int]) -> bool:
        """Whether the proof's guards are 0 at ``dims`` (one it cannot evaluate does not hold):
        where not, the run compiles for its size instead of running as chunks."""
        return all(
            size_exprs.substitute(size_exprs.parse(g), dims) == size_exprs.const(0) for g in self.parallel.guards
        )

    def chunks(self, size: int) -> list[int]:
        """``size`` as a sum of classes, largest first."""
        parts = []
        for chosen in sorted(self.classes, reverse=True):
            count, size = divmod(size, chosen)
            parts.extend([chosen] * count)
        assert size == 0  # 1 is a class
        return parts

    def split(self, inputs: list[Any], parts: list[int]) -> list[list[Any]]:
        """Each chunk's inputs: the samples' slices of the inputs that hold them, the others whole."""
        chunks = []
        start = 0
        for part in parts:
            chunk = []
            for array, axis in zip(inputs, self.parallel.inputs):
                if axis is None:
                    chunk.append(array)
                else:
                    index = [slice(None)] * np.ndim(array)
                    index[axis] = slice(start, start + part)
                    chunk.append(np.ascontiguousarray(array[tuple(index)]))
            chunks.append(chunk)
            start += part
        return chunks

    def join(self, results: list[list[Any]]) -> list[Any]:
        """The chunks' outputs joined along their samples' dims (the others are the first chunk's)."""
        joined = []
        for position, axis in enumerate(self.parallel.outputs):
            if axis is None or len(results) == 1:
                joined.append(results[0][position])
            else:
                joined.append(np.concatenate([r[position] for r in results], axis=axis))
        return joined


def padded_classes(bounds: tuple[int, int]) -> tuple[int, ...]:
    """Default compiled lengths of a padded dim: powers of two from 16 to the range's end (which
    is a class too), the largest MAX_CLASSES of them: a run pads to at most twice its length."""
    low, high = bounds
    classes = []
    size = 16
    while size < high:
        if size >= low:
            classes.append(size)
        size *= 2
    classes.append(high)
    return tuple(classes[-MAX_CLASSES:])


def parse_padded_classes(name: str, value: Any, bounds: tuple[int, int]) -> tuple[int, ...]:
    """Compiled lengths of a padded dim: distinct positive sizes, the largest at least the range's
    end (every length in the range pads to one), at most MAX_CLASS."""
    classes = _sizes(name, value)
    if classes[-1] > MAX_CLASS:
        raise ArgumentError(f"size classes of {name}: {classes[-1]} is too large a class (at most {MAX_CLASS})")
    if classes[-1] < bounds[1]:
        raise ArgumentError(
            f"size classes of {name}: the largest, {classes[-1]}, is below the range's end {bounds[1]} "
            "(a padded dim runs at the smallest class at least its length)"
        )
    return tuple(classes)


@dataclass(frozen=True)
class Padder:
    """How runs at any length of ``padding.symbol`` run padded to one of ``classes``."""

    padding: Padding
    classes: tuple[int, ...]
    # run-time length (``kiln.driver.extents``): the lengths its kernels were lowered at, the
    # capacity (the one class) first, the floor the smallest; a run pads only to the floor
    samples: tuple[int, ...] = ()

    @property
    def symbol(self) -> str:
        return self.padding.symbol

    @property
    def floor(self) -> int:
        return min(self.samples) if self.samples else 0

    def class_for(self, length: int) -> int:
        if self.samples:  # the kernels take the length at run time
            return max(length, self.floor)
        return next(c for c in self.classes if c >= length)  # the range's end is at most the largest

    def pad(self, inputs: list[Any], length: int, size: int) -> list[Any]:
        """The inputs padded with zeros to ``size`` along their padded dims, then the length."""
        padded = []
        for array, axis in zip(inputs, self.padding.inputs):
            if axis is None or size == length:
                padded.append(array)
                continue
            array = np.asarray(array)
            widths = [(0, 0)] * array.ndim
            widths[axis] = (0, size - length)
            padded.append(np.pad(array, widths))
        return [*padded, np.array(length, np.int64)]

    def cut(self, outputs: list[Any], length: int) -> list[Any]:
        """The outputs cut back to the valid length along their padded dims."""
        cut = []
        for array, axes in zip(outputs, self.padding.outputs):
            if axes:
                index = [slice(None)] * np.ndim(array)
                for axis in axes:
                    index[axis] = slice(0, length)
                array = np.ascontiguousarray(array[tuple(index)])
            cut.append(array)
        return cut


def check_capacity(bindings: Iterable[tuple[dict[str, int], Any]], ranges: dict[str, tuple[int, int]]) -> None:
    """Refuse, when they are declared, ranges whose kernels' working memory at the capacity (where
    they are laid out) this machine could never hold: every run would fail wanting it."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    for dims, plan in bindings:
        need = plan.memory.arena_bytes if plan.memory is not None else 0
        if need > physical:
            shown = ", ".join(f"{name}={low}..{high}" for name, (low, high) in ranges.items())
            raise ArgumentError(
                f"dims: {shown}: kernels laid out at the largest sizes ({dims}) need {need:,} bytes "
                f"({need / 2**30:.1f} GiB) of working memory and this machine has {physical / 2**30:.1f} GiB: "
                "declare smaller ranges"
            )


def check_dims(dims: Any, signature: Any) -> dict[str, int]:
    """``dims`` as a binding of ``signature``'s symbolic input dims: names it has, sizes that are
    integers in 0..MAX_DIM. Raises ArgumentError naming the first that is not."""
    if not isinstance(dims, dict):
        raise ArgumentError(f"dims must be a dict of symbolic dim name -> size, got {type(dims).__name__}")
    names = sorted(symbols(signature))
    checked: dict[str, int] = {}
    for name, size in dims.items():
        if not isinstance(name, str) or name not in names:
            raise ArgumentError(
                f"dims: {name!r} is not a symbolic input dim of this model (its dims: {', '.join(names) or 'none'})"
            )
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 <= int(size) <= MAX_DIM:
            raise ArgumentError(f"dims: {name}={size!r} is not a size (an integer in 0..{MAX_DIM})")
        checked[name] = int(size)
    return checked
