"""The buffers a run-time sizes route lays its inputs out in, and a KV cache updated where it lies.

Kernels that take their sizes at run time (``kiln.driver.extents``, ``kiln.driver.spatial``) read
each input densely at its sizes in the first elements of a buffer of its capacity's shape
(``extents.lay_out``). ``LaidInputs`` keeps those buffers between calls (a decode loop lays its
inputs out every step; a fresh zeroed buffer each time cost a third of a GPT-2 step in page faults).

A decode step whose KV cache is updated in place (``kiln.passes.cache_in_place``: the executable's
``boxed`` inputs and ``updates`` outputs) reads each past laid out as a box at the origin of its
layout (the present's capacity shape) and writes the present's new rows into that same buffer,
which the run gives back as the present: a view of the buffer at the present's sizes. The next
step's past is that view: read where it lies, the step writes its new rows after it — no row of the
cache moves. That is only done where nothing can see the rows written: the buffer is one a run gave
back, and the past is the only array left that views it (its reference count says so), and no other
run is using it; otherwise the past is copied into a buffer of the run's own, which the run then
gives back as the present.
"""

from __future__ import annotations

import math
import sys
import threading
import weakref
from typing import Any

import numpy as np

from kiln.driver.extents import read_back

# references to a given-back buffer while ``_owned`` looks at it: the past's view of it, the local
# name and getrefcount's own argument (anything more is someone else's view)
_SOLE = 3


def box(shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The index of a box of ``shape`` at the origin."""
    return tuple(slice(0, int(s)) for s in shape)


class LaidInputs:
    """Capacity-shaped buffers that inputs are laid out in (``lay_out``), kept between calls. Each
    dense buffer keeps ``lay_out``'s contract (the rest zero): it remembers how far it was written
    and zeroes only what a shorter call leaves behind. A call takes a set of buffers and gives it
    back after its run (concurrent calls take sets of their own). Boxed inputs: see the module."""

    def __init__(self, keep: int = 4) -> None:
        self.free: list[list[Any]] = []  # sets of [buffer, elements written]
        self.keep = keep
        self.lock = threading.Lock()
        self.given: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self.busy: set[int] = set()  # given-back buffers a run is writing now

    def lay(
        self, arrays: list[Any], shapes: list[tuple[int, ...]], recycled: Any = None, boxed: Any = None
    ) -> tuple[list[Any], list[Any]]:
        """(the arrays laid out, the set of buffers to ``give_back``); an array that is already
        laid out so in an output's memory (``recycled``: an earlier call's present KV cache, now
        the past) is read where it is. ``boxed``: input position -> its layout (see the module)."""
        with self.lock:
            taken = self.free.pop() if self.free else [None] * len(arrays)  # (a model's inputs: one count)
        laid: list[Any] = []
        try:
            for i, (array, shape) in enumerate(zip(arrays, shapes)):
                laid.append(self._laid(i, np.asarray(array), shape, taken, recycled, boxed))
        except BaseException:  # (a buffer this call took is free again)
            with self.lock:
                self.busy.difference_update(id(a) for a in laid)
            raise
        return laid, taken

    def _laid(
        self, i: int, array: np.ndarray, shape: tuple[int, ...], taken: list[Any], recycled: Any, boxed: Any
    ) -> Any:
        """Input ``i`` laid out (see ``lay``)."""
        layout = boxed.get(i) if boxed else None
        if layout is not None:
            return self._boxed(array, layout)
        if array.shape == tuple(shape):
            return array
        in_place = recycled.laid_in_place(array, tuple(shape)) if recycled is not None else None
        if in_place is not None:
            return in_place
        held = taken[i]
        if held is None or held[0].shape != tuple(shape) or held[0].dtype != array.dtype:
            held = taken[i] = [np.zeros(shape, array.dtype), 0]
        flat = held[0].reshape(-1)
        flat[: array.size] = array.reshape(-1)
        if held[1] > array.size:
            flat[array.size : held[1]] = 0
        held[1] = array.size
        return held[0]

    def _boxed(self, array: np.ndarray, layout: tuple[int, ...]) -> np.ndarray:
        """The buffer ``array`` lies at the origin of (it is marked busy), or a new one with
        ``array`` copied into its box (never this pool's: the run gives it back as the present)."""
        owner = self._owned(array, layout)
        if owner is not None:
            return owner
        fresh = np.empty(layout, array.dtype)
        fresh[box(array.shape)] = array
        return fresh

    def _owned(self, array: np.ndarray, layout: tuple[int, ...]) -> np.ndarray | None:
        base = array.base
        if (
            not isinstance(base, np.ndarray)
            or base.shape != tuple(layout)
            or base.dtype != array.dtype
            or array.strides != base.strides
            or array.__array_interface__["data"][0] != base.__array_interface__["data"][0]
            or any(s > c for s, c in zip(array.shape, layout))
        ):
            return None
        with self.lock:
            if self.given.get(id(base)) is not base or id(base) in self.busy or sys.getrefcount(base) > _SOLE:
                return None
            self.busy.add(id(base))
        return base

    def give_back(self, taken: list[Any]) -> None:
        with self.lock:
            if len(self.free) < self.keep:
                self.free.append(taken)

    def run(self, executable: Any, inputs: list[Any], shapes: list[Any], vector: Any, out_shapes: list[Any]) -> list:
        """``executable`` run on ``inputs`` laid out at ``shapes`` (and the dims ``vector``), its
        outputs read back at ``out_shapes``; an output that is a laid-out input's memory is copied
        (the buffer is the next call's), but for a present updated in place (given back)."""
        recycled = getattr(executable, "recycled", None)
        boxed, updates = getattr(executable, "boxed", {}), getattr(executable, "updates", {})
        laid, taken = self.lay(inputs, shapes, recycled, boxed)
        try:
            raw = executable.run([*laid, vector])
            outputs = []
            for j, (output, shape) in enumerate(zip(raw, out_shapes)):
                if j in updates:  # the present, in its past's buffer: given back as a view at its sizes
                    owner = laid[updates[j]]
                    with self.lock:
                        self.given[id(owner)] = owner
                    outputs.append(output.reshape(owner.shape)[box(shape)])
                    continue
                if recycled is not None:  # (computed at these sizes: each output written densely up to them)
                    recycled.written(output, math.prod(shape))
                outputs.append(read_back(output, shape))
            # (a view's base is the array owning its memory: one look per output, not one per held buffer)
            held = {id(h[0]) for h in taken if h is not None}
            return [o.copy() if id(o) in held or id(o.base) in held else o for o in outputs]
        finally:
            with self.lock:
                self.busy.difference_update(id(laid[i]) for i in boxed)
            self.give_back(taken)
