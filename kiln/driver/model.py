"""The public model object: ``run(dict) -> dict``, ``__call__``, ``submit -> Future``.

The driver's: it decides what runs (a compiled variant, the reference interpreter) and hands the
runtime checked inputs (``kiln.runtime.inputs``).

Every target's compiled model shares this front: inputs are validated (name, dtype, shape,
consistent symbolic dims) before anything runs, so a wrong input is a clear ``InputError``.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.errors import ArgumentError, InputError, ResourceError
from kiln.ir.graph import Graph
from kiln.ir.types import TensorType
from kiln.runtime.inputs import FeedChecker, TensorInfo


class Model:
    """Base of compiled models; subclasses implement ``_execute(list) -> list``."""

    target = "abstract"

    def __init__(self, graph: Graph | None, signature: Graph | None = None, streams: int | None = None) -> None:
        self._graph = graph
        # requests ``submit`` runs at once (OpenVINO's streams): one of them at a time has the
        # thread pool, the others run on their own threads, so the cores are shared, not oversubscribed
        if streams is not None and (type(streams) is not int or not 1 <= streams <= 1024):
            raise ArgumentError(f"streams must be an integer in 1..1024 (requests at once), got {streams!r}")
        self.streams = streams or max(2, os.cpu_count() or 2)
        # what callers see: inputs, outputs, overridable defaults (the graph itself may load later)
        self.signature = signature if signature is not None else graph
        assert self.signature is not None
        self.input_names = [v.name for v in self.signature.inputs]
        self.output_names = [v.name for v in self.signature.outputs]
        # initializers the caller may override by name (ONNX: initializers listed as inputs)
        self.defaults = {v.name: v for v in self.signature.defaults if v.name not in self.input_names}
        self._overridden: dict[frozenset[str], Model] = {}
        self._override_lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._check = FeedChecker(self.signature, self.defaults)

    @property
    def graph(self) -> Graph:
        """The model's source graph (kiln IR)."""
        assert self._graph is not None
        return self._graph

    # -- public API ----------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Run once; returns {output name: array} in the model's output order. Inputs may be NumPy
        arrays, CPU torch tensors or anything exposing DLPack or the array interface (read in
        place where layout and dtype allow). ``outputs`` maps output names to preallocated arrays
        the results are written into (and returned). Raises InputError for a wrong input or
        output array, ExecutionError naming the node that failed, ResourceError when memory runs
        out."""
        overridden = self._overrides(feeds)
        if overridden:
            return overridden.run(feeds, outputs)
        targets = self._check_outputs(outputs) if outputs else {}
        results = self._outputs(self._execute_guarded(self.validate(feeds)))
        for name, array in targets.items():
            got = np.asarray(results[name])
            if got.shape != array.shape:
                raise InputError(
                    f"output {name!r}: the preallocated array has shape {list(array.shape)}, the result {list(got.shape)}"
                )
            np.copyto(array, got)
            results[name] = array
        return results

    def _check_outputs(self, outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(outputs, Mapping):
            raise InputError(f"outputs= takes a dict of output name -> array, got {type(outputs).__name__}")
        checked = {}
        for name, array in outputs.items():
            if name not in self.output_names:
                raise InputError(f"unknown output {name!r}; the model's outputs are {self.output_names}")
            declared = next(v.type for v in self.signature.outputs if v.name == name)
            if not isinstance(array, np.ndarray) or not array.flags.writeable:
                raise InputError(
                    f"output {name!r}: a preallocated output is a writeable NumPy array, got {type(array).__name__}"
                )
            if isinstance(declared, TensorType) and np.dtype(array.dtype) != np.dtype(declared.dtype.numpy):
                raise InputError(f"output {name!r}: expected dtype {declared.dtype.short}, the array is {array.dtype}")
            checked[name] = array
        return checked

    @property
    def inputs(self) -> list[TensorInfo]:
        """Each input's name, NumPy dtype and shape (symbolic dims by name, None for unknown)."""
        return [TensorInfo.of(v) for v in self.signature.inputs]

    @property
    def outputs(self) -> list[TensorInfo]:
        """Each output's name, NumPy dtype and shape (symbolic dims by name, None for unknown)."""
        return [TensorInfo.of(v) for v in self.signature.outputs]

    def _overrides(self, feeds: Any) -> Model | None:
        """The model that takes the defaults ``feeds`` overrides as inputs (None if it overrides
        none): compiled once per set of overridden names, the defaults staying constants otherwise."""
        if not self.defaults or not isinstance(feeds, Mapping):
            return None
        names = frozenset(name for name in feeds if name in self.defaults)
        if not names:
            return None
        with self._override_lock:
            model = self._overridden.get(names)
            if model is None:
                source = self.graph  # (its own values: a graph let go of and read again has new ones)
                values = sorted((v for v in source.constants if v.name in names), key=lambda v: v.name)
                graph = source.with_(
                    inputs=[*source.inputs, *values],
                    constants={v: a for v, a in source.constants.items() if v not in values},
                )
                model = self._overridden[names] = self.derive(graph)
        return model

    def derive(self, graph: Graph) -> Model:
        """A model of this kind for another graph (a default overridden, say)."""
        return type(self)(graph)

    def _execute_guarded(self, arrays: list[Any]) -> list[Any]:
        try:
            return self._execute(arrays)
        except MemoryError as err:  # an arena or an output too big for this machine
            raise ResourceError(f"out of memory running the model: {err}") from None

    def _outputs(self, results: list[Any]) -> dict[str, Any]:
        """Results by output name, in the model's order (an output declared twice comes back under
        its one name, as the same array)."""
        return dict(zip(self.output_names, results))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Positional/keyword convenience: one output comes back bare, several as a tuple."""
        if len(args) > len(self.input_names):
            raise InputError(f"model takes {len(self.input_names)} inputs, got {len(args)} positional")
        feeds = dict(zip(self.input_names, args))
        for key, value in kwargs.items():
            if key in feeds:
                raise InputError(f"input {key!r} given twice")
            feeds[key] = value
        overridden = self._overrides(feeds)
        if overridden is not None:
            return overridden(**feeds)
        # every declared output, a name declared twice included (run's dict has it once)
        outputs = self._execute_guarded(self.validate(feeds))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def submit(self, feeds: Mapping[str, Any]) -> concurrent.futures.Future:
        """Run asynchronously; returns a Future of ``run``'s dict. Inputs are checked and copied
        right away (the caller may reuse its arrays as soon as submit returns)."""
        overridden = self._overrides(feeds)
        if overridden is not None:
            return overridden.submit(feeds)
        arrays = self.validate(feeds)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.streams, thread_name_prefix=f"kiln-{self.target}"
            )
        # copies: the caller may reuse its buffers as soon as submit returns
        owned = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in arrays]
        return self._executor.submit(lambda: self._outputs(self._execute_guarded(owned)))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- validation ----------------------------------------------------------------------------

    def validate(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Inputs in graph order, checked; raises InputError naming the input and the mismatch."""
        return self._check(feeds)

    def _execute(self, inputs: list[Any]) -> list[Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        inputs = ", ".join(f"{v.name}: {v.type}" for v in self.signature.inputs)
        return f"<kiln {self.target} model ({inputs}) -> {self.output_names}>"
