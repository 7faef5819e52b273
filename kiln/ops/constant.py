"""The value a Constant node holds, from whichever of its attributes is set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.errors import ShapeInferenceError

_SCALARS = {
    "value_float": np.float32,
    "value_int": np.int64,
    "value_string": object,
}
_LISTS = {
    "value_floats": np.float32,
    "value_ints": np.int64,
    "value_strings": object,
}


def constant_value(attrs: Mapping[str, Any]) -> np.ndarray:
    """The array a Constant node produces; raises if not exactly one value attribute is set."""
    present = [k for k in attrs if k.startswith(("value", "sparse_value"))]
    if len(present) != 1:
        raise ShapeInferenceError(f"Constant needs exactly one value attribute, got {present}")
    key = present[0]
    value = attrs[key]
    if key in ("value", "sparse_value"):
        return np.asarray(value)
    if key in _SCALARS:
        return np.array(value, dtype=_SCALARS[key])
    return np.array(list(value), dtype=_LISTS[key])
