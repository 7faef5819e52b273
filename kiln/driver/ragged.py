"""Requests of different lengths run as one batch: each sample its own valid length.

A model whose batch is sample-parallel (its size classes: ``kiln.passes.batching``) and whose
sequence length pads (``kiln.passes.padding``) runs a request at length ``L`` padded to a compiled
length with the valid length ``L`` as an input that masks the padded positions. Requests of
different lengths share that batch when each sample has its own valid length: ``pad(graph,
padding, per_sample=batch)`` types the valid input ``[batch]`` and places it along each masked
operand's batch dim (``NotPerSample`` where an operand has none: a batch folded with the heads).
``Ragged.run`` pads each request's padded inputs to the smallest compiled length that holds the
longest, concatenates them along the batch, runs once, and gives each request its own rows cut
back to its own length: what a request alone at its length computes (the masks see to that),
with a batch's cost. The server's batcher joins requests so (``kiln.serve.batcher``).

The per-sample graph is a model of its own, compiled at the padded classes (the length is not
taken at run time here: one run holds several lengths) with the batch's size classes; ``warm``
compiles them all before serving, so serving compiles nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.driver.sizes import padded_classes
from kiln.driver.variants import Compilation, Source
from kiln.errors import KilnError
from kiln.passes.padding import NotPerSample, pad


class NotRagged(KilnError):
    """The model cannot run requests of different lengths as one batch (the reason)."""


class Ragged:
    """``model``'s per-sample-length model (see the module's note); ``NotRagged`` saying why not."""

    def __init__(self, model: Any) -> None:
        padder, chunking = model.padder(), model.chunking()
        if chunking is None:
            raise NotRagged("no dim is sample-parallel with size classes")
        if padder is None:
            raise NotRagged("no dim with a declared range pads")
        self.batch, self.symbol, self.padding = chunking.symbol, padder.symbol, padder.padding
        try:
            graph = pad(model.graph, padder.padding, per_sample=chunking.symbol)
        except NotPerSample as err:
            raise NotRagged(f"lengths per sample cannot reach every mask: {err}") from err
        self.classes = padded_classes(model.ranges[self.symbol])
        compilation = Compilation(Source(graph), model.compiled_for, model.options)
        inner = model.model_padded(compilation, self.symbol, self.classes[0])
        chunked = inner.chunking()
        if chunked is None or chunked.symbol != self.batch:
            raise NotRagged(f"{self.batch} is not sample-parallel once each sample has its own length")
        self.inner, self.names = inner, [v.name for v in model.signature.inputs]
        shapes = [getattr(v.type, "shape", None) for v in model.signature.inputs]
        self.along = [bool(shape) and str(shape[0]) == self.batch for shape in shapes]  # batched inputs
        self.model = model

    def warm(self) -> int:
        """Compile every (length class, batch class) the joined runs use now; how many."""
        wanted = [
            {self.symbol: size, self.batch: rows} for size in self.classes for rows in self.inner.chunking().classes
        ]
        self.inner.prepare_many(wanted)
        return len(wanted)

    def length_of(self, feeds: dict[str, Any]) -> int:
        """A request's length: its first padded input's size along the padded dim."""
        name, axis = next((n, a) for n, a in zip(self.names, self.padding.inputs) if a is not None)
        return int(np.shape(feeds[name])[axis])

    def run(self, requests: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
        """Each request's outputs, from one run of them all (inputs already checked by the
        model's signature; batched along the first dim, as the batcher joins them)."""
        lengths = [self.length_of(feeds) for feeds in requests]
        size = next(c for c in self.classes if c >= max(lengths))
        inputs = []
        for name, axis, along in zip(self.names, self.padding.inputs, self.along):
            arrays = [np.asarray(feeds[name]) for feeds in requests]
            if axis is not None:
                arrays = [_padded(a, axis, size) for a in arrays]
            inputs.append(np.concatenate(arrays) if along else arrays[0])  # (the rest: the same in each)
        first = self.names[self.along.index(True)]
        rows = [int(np.shape(feeds[first])[0]) for feeds in requests]
        valid = np.repeat(np.asarray(lengths, np.int64), rows)
        outputs = self.inner.execute([*inputs, valid])
        self.model.ran_too(self.inner)
        names = [v.name for v in self.model.signature.outputs]
        found, start = [], 0
        for count, length in zip(rows, lengths):
            own = {}
            for name, array, axes in zip(names, outputs, self.padding.outputs):
                index = [slice(None)] * np.ndim(array)
                index[0] = slice(start, start + count)
                for axis in axes:
                    index[axis] = slice(0, length)
                own[name] = np.ascontiguousarray(array[tuple(index)])
            found.append(own)
            start += count
        return found


def _padded(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, size - array.shape[axis])
    return np.pad(array, widths)
