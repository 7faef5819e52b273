"""What a run is given, checked: inputs by name, dtype, shape and consistent symbolic dims, before
anything runs, so a wrong input is a clear ``InputError``; foreign arrays (torch, DLPack) read in
place where they can be."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import InputError
from kiln.ir.graph import Graph
from kiln.ir.types import DType, SequenceType, TensorType


@dataclass(frozen=True)
class TensorInfo:
    """An input's or output's description, like onnxruntime's ``get_inputs()``."""

    name: str
    dtype: np.dtype | None  # None for sequences and optionals
    shape: tuple[int | str, ...] | None  # ints, symbolic dims by name; None when the rank is unknown
    type: str  # kiln's text form, e.g. f32[batch,3,224,224]

    @staticmethod
    def of(value: Any) -> TensorInfo:
        kind = value.type
        if isinstance(kind, TensorType):
            shape = tuple(kind.shape) if kind.shape is not None else None
            return TensorInfo(value.name, np.dtype(kind.dtype.numpy), shape, str(kind))
        return TensorInfo(value.name, None, None, str(kind))


def check_feeds(signature: Graph, feeds: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[Any]:
    """``feeds`` in ``signature``'s input order, checked; raises InputError naming the input and
    the mismatch (``defaults``: initializers a caller may override, named in the message)."""
    names = [v.name for v in signature.inputs]
    if not isinstance(feeds, Mapping):
        raise InputError(f"run() takes a dict of input name -> array, got {type(feeds).__name__}")
    unknown = [k for k in feeds if k not in names]
    missing = [k for k in names if k not in feeds]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown input(s) {unknown}")
        if missing:
            parts.append(f"missing input(s) {missing}")
        listed = f" (and defaults it may override: {sorted(defaults)})" if defaults else ""
        raise InputError(f"{'; '.join(parts)}; the model's inputs are {names}{listed}")
    bindings: dict[str, int] = {}
    return [check_input(value.name, value.type, feeds[value.name], bindings) for value in signature.inputs]


class FeedChecker:
    """``check_feeds`` for one signature, with its common case made cheap: a dict holding exactly
    the inputs, each a NumPy array of the declared dtype and static shape, is accepted after one
    comparison per input; anything else takes ``check_feeds``'s full checks (and its messages)."""

    def __init__(self, signature: Graph, defaults: Mapping[str, Any]) -> None:
        self.signature, self.defaults = signature, defaults
        expected = []
        for value in signature.inputs:
            kind = value.type
            if not isinstance(kind, TensorType) or kind.shape is None or not kind.is_static:
                break  # (the list stays short of the inputs: no fast path)
            expected.append((value.name, np.dtype(kind.dtype.numpy), tuple(int(d) for d in kind.shape)))
        self.expected = expected if len(expected) == len(signature.inputs) else None

    def __call__(self, feeds: Mapping[str, Any]) -> list[Any]:
        expected = self.expected
        if expected is not None and type(feeds) is dict and len(feeds) == len(expected):
            arrays = []
            for name, dtype, shape in expected:
                data = feeds.get(name)
                if type(data) is not np.ndarray or data.dtype != dtype or data.shape != shape:
                    break
                arrays.append(data)
            else:
                return arrays
        return check_feeds(self.signature, feeds, self.defaults)


def foreign_array(name: str, data: Any) -> Any:
    """A torch tensor, a DLPack producer or an array-interface object as a NumPy array, in place
    where the layout and dtype allow (DLPack: no copy); other objects are returned as they are."""
    if hasattr(data, "__dlpack__"):
        source = data.detach() if hasattr(data, "detach") else data  # a tensor that requires grad
        try:
            return np.from_dlpack(source)
        except (TypeError, BufferError, RuntimeError, ValueError) as err:
            device = getattr(source, "device", None)
            if device is not None and str(device) != "cpu":
                raise InputError(
                    f"input {name!r}: a tensor on {device}; the cpu target reads host memory (move it: .cpu())"
                ) from None
            try:  # a dtype DLPack cannot carry to NumPy (bfloat16...): the array protocol, a copy
                return np.asarray(source)
            except Exception:
                raise InputError(f"input {name!r}: cannot read a {type(data).__name__} as an array ({err})") from None
    if hasattr(data, "__array_interface__") or hasattr(data, "__array__"):
        return np.asarray(data)
    return data


def check_input(name: str, expected: Any, data: Any, bindings: dict[str, int]) -> Any:
    if isinstance(expected, SequenceType):
        if not isinstance(data, (list, tuple)):
            raise InputError(
                f"input {name!r}: expected a sequence (list) of {expected.elem}, got {type(data).__name__}"
            )
        return [check_input(f"{name}[{i}]", expected.elem, item, {}) for i, item in enumerate(data)]
    if not isinstance(expected, TensorType):
        return data
    if not isinstance(data, np.ndarray):
        data = foreign_array(name, data)
    if not isinstance(data, np.ndarray):
        if isinstance(data, (int, float, bool, list, tuple, np.generic)):
            try:
                data = np.asarray(data, dtype=expected.dtype.numpy)
            except (ValueError, TypeError, OverflowError) as err:  # ragged nesting, strings for numbers
                raise InputError(
                    f"input {name!r}: expected an array {expected}, got a {type(data).__name__} "
                    f"NumPy cannot read as one ({err})"
                ) from None
        else:
            raise InputError(f"input {name!r}: expected an array {expected}, got {type(data).__name__}")
    try:
        got = DType.from_numpy(data.dtype)
    except ValueError:
        got = None
    if got != expected.dtype:
        raise InputError(f"input {name!r}: expected dtype {expected.dtype.short} ({expected}), got {data.dtype}")
    if expected.shape is not None:
        if data.ndim != len(expected.shape):
            raise InputError(
                f"input {name!r}: expected rank {len(expected.shape)} ({expected}), got shape {list(data.shape)}"
            )
        for axis, (dim, size) in enumerate(zip(expected.shape, data.shape)):
            if isinstance(dim, int) and dim != size:
                raise InputError(f"input {name!r}: expected shape {expected}, got {list(data.shape)} (axis {axis})")
            if isinstance(dim, str) and bindings.setdefault(dim, size) != size:
                raise InputError(
                    f"input {name!r}: dim {dim!r} is {size} on axis {axis} but {bindings[dim]} in an earlier input"
                )
    return data
