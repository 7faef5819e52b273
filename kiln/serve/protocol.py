"""The Open Inference Protocol (KServe v2) as kiln serves it: infer requests read and checked,
responses written, with the binary tensor data extension.

A request is JSON, or JSON followed by raw tensor bytes: the ``Inference-Header-Content-Length``
header says how long the JSON part is, and each input whose ``parameters.binary_data_size`` is set
takes that many bytes of what follows, in the order of ``inputs``. Outputs come back as JSON
``data`` lists, or as raw bytes after the JSON when the request asks (``parameters.binary_data`` on
an output, or ``binary_data_output`` on the request).

Everything a client sends is checked before it becomes an array: names, datatypes, shapes (each
dim a non-negative integer, the element count under the server's limit, computed without
overflow), the data's length against the shape, the binary sizes against the body. A request
that fails a check raises ``ProtocolError`` with the reason (HTTP 400).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import KilnError

# the protocol's datatypes and kiln's arrays (BYTES: strings, which no kiln model takes)
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
HEADER = "inference-header-content-length"
MAX_RANK = 16


class ProtocolError(KilnError):
    """A request the protocol (or the model's signature) does not allow: HTTP 400, with why."""


class Failure(Exception):
    """A request refused with an HTTP status (404: no such model, 413, 503...) and its reason
    (gRPC maps the status to its own codes)."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


def datatype_of(dtype: np.dtype) -> str:
    for name, known in DATATYPES.items():
        if known == dtype:
            return name
    raise ProtocolError(f"no protocol datatype for {dtype}")


@dataclass
class Limits:
    """What one request may carry."""

    max_request_bytes: int = 64 << 20
    max_elements: int = 1 << 26  # per tensor
    # JSON tensors become Python objects before arrays (~16x their text: "0," is 2 bytes, a float 32):
    # past this, tensors go in the binary extension
    max_json_bytes: int = 8 << 20


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    binary_outputs: set[str]  # outputs asked for as raw bytes
    all_binary: bool  # binary_data_output: every output as raw bytes
    wanted: list[str] | None  # the outputs asked for (None: all)


def read_request(body: bytes, header_length: str | None, limits: Limits) -> InferRequest:
    """An infer request's inputs as arrays, every field checked (``ProtocolError`` otherwise)."""
    if len(body) > limits.max_request_bytes:
        raise ProtocolError(f"request of {len(body)} bytes is over the limit of {limits.max_request_bytes}")
    split = len(body)
    if header_length is not None:
        try:
            split = int(header_length)
        except ValueError:
            raise ProtocolError(f"Inference-Header-Content-Length {header_length[:40]!r} is not a number") from None
        if not 0 <= split <= len(body):
            raise ProtocolError(f"Inference-Header-Content-Length {split} is outside the body's {len(body)} bytes")
    if split > limits.max_json_bytes:
        raise ProtocolError(
            f"a JSON part of {split} bytes is over the limit of {limits.max_json_bytes}: send large tensors as binary "
            "data (parameters.binary_data_size, the binary tensor data extension)"
        )
    try:
        document = json.loads(body[:split])
    except (ValueError, RecursionError) as err:
        raise ProtocolError(f"the request is not JSON: {str(err)[:200]}") from None
    if not isinstance(document, dict):
        raise ProtocolError("the request is not a JSON object")
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError("'inputs' must be a non-empty list")
    binary, offset = body[split:], 0
    arrays: dict[str, np.ndarray] = {}
    for number, entry in enumerate(inputs):
        name, array, used = _input(entry, number, binary, offset, limits)
        if name in arrays:
            raise ProtocolError(f"input {name!r} is given twice")
        arrays[name], offset = array, offset + used
    if offset != len(binary):
        raise ProtocolError(f"{len(binary) - offset} bytes of binary data follow the inputs that no input claims")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError("'id' must be a string")
    wanted, binary_outputs = _outputs(document.get("outputs"))
    parameters = document.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ProtocolError("'parameters' must be an object")
    return InferRequest(request_id, arrays, binary_outputs, bool(parameters.get("binary_data_output")), wanted)


def _input(entry: Any, number: int, binary: bytes, offset: int, limits: Limits) -> tuple[str, np.ndarray, int]:
    """One input's name, array and the binary bytes it took."""
    if not isinstance(entry, dict):
        raise ProtocolError(f"inputs[{number}] is not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"inputs[{number}] has no name")
    dtype, count = check_tensor(name, entry.get("datatype"), entry.get("shape"), limits)
    shape = entry["shape"]
    parameters = entry.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ProtocolError(f"input {name!r}: 'parameters' must be an object")
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(f"input {name!r}: binary_data_size must be a non-negative integer")
        if size != count * dtype.itemsize:
            raise ProtocolError(
                f"input {name!r}: binary_data_size {size} is not {count} {entry['datatype']} elements ({count * dtype.itemsize} bytes)"
            )
        if offset + size > len(binary):
            raise ProtocolError(
                f"input {name!r}: {size} bytes of binary data announced, {len(binary) - offset} left in the body"
            )
        raw = np.frombuffer(binary, dtype=dtype.newbyteorder("<"), count=count, offset=offset)
        return name, raw.astype(dtype, copy=True).reshape(shape), size
    if "data" not in entry:
        raise ProtocolError(f"input {name!r} has neither 'data' nor binary_data_size")
    return name, _from_json(name, entry["data"], dtype, shape, count), 0


def check_tensor(name: str, datatype: Any, shape: Any, limits: Limits) -> tuple[np.dtype, int]:
    """An input's datatype and shape checked (JSON's or gRPC's): its dtype and element count."""
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        known = ", ".join(DATATYPES)
        raise ProtocolError(f"input {name!r}: datatype {str(datatype)[:20]!r} is not one kiln takes ({known})")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise ProtocolError(f"input {name!r}: 'shape' must be a list of at most {MAX_RANK} sizes")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"input {name!r}: shape {str(shape)[:80]} has a size that is not a non-negative integer")
    count = math.prod(shape)  # Python integers: no overflow
    if count > limits.max_elements:
        raise ProtocolError(
            f"input {name!r}: shape {shape} has {count} elements, over the limit of {limits.max_elements}"
        )
    return DATATYPES[datatype], count


def from_raw(name: str, raw: bytes, dtype: np.dtype, shape: list[int], count: int) -> np.ndarray:
    """Little-endian bytes, row-major, as the input's array (their length checked)."""
    if len(raw) != count * dtype.itemsize:
        raise ProtocolError(
            f"input {name!r}: {len(raw)} bytes of data for {count} {dtype} elements ({count * dtype.itemsize} bytes)"
        )
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=True).reshape(shape)


def _from_json(name: str, data: Any, dtype: np.dtype, shape: list[int], count: int) -> np.ndarray:
    return from_values(name, _flatten(name, data, count), dtype, shape, count)


def from_values(name: str, flat: list[Any], dtype: np.dtype, shape: list[int], count: int) -> np.ndarray:
    """A flat list of values (JSON's ``data``, gRPC's typed contents) as the input's array."""
    if len(flat) != count:
        raise ProtocolError(f"input {name!r}: {len(flat)} values for shape {shape} ({count} elements)")
    if dtype.kind == "b":
        if not all(isinstance(v, bool) for v in flat):
            raise ProtocolError(f"input {name!r}: BOOL data must be true or false")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise ProtocolError(f"input {name!r}: data must be numbers")
    try:
        if dtype.kind in "iu":
            if not all(isinstance(v, int) or float(v).is_integer() for v in flat):
                raise ProtocolError(f"input {name!r}: {dtype} data must be integers")
            info = np.iinfo(dtype)
            if flat and (min(flat) < info.min or max(flat) > info.max):
                raise ProtocolError(f"input {name!r}: a value is outside {dtype}'s range")
        array = np.array(flat, dtype=dtype)
    except (OverflowError, ValueError) as err:
        raise ProtocolError(f"input {name!r}: data do not fit {dtype}: {err}") from None
    return array.reshape(shape)


def _flatten(name: str, data: Any, limit: int) -> list[Any]:
    """Nested lists (the protocol allows either form) as one flat list, without recursion, and
    no longer than ``limit`` + 1 (a longer list is wrong whatever it holds)."""
    if not isinstance(data, list):
        raise ProtocolError(f"input {name!r}: 'data' must be a list")
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) > MAX_RANK:
                    raise ProtocolError(f"input {name!r}: 'data' is nested deeper than {MAX_RANK}")
                stack.append(iter(item))
                break
            flat.append(item)
            if len(flat) > limit:
                return flat
        else:
            stack.pop()
    return flat


def _outputs(outputs: Any) -> tuple[list[str] | None, set[str]]:
    if outputs is None:
        return None, set()
    if not isinstance(outputs, list):
        raise ProtocolError("'outputs' must be a list")
    wanted, binary = [], set()
    for number, entry in enumerate(outputs):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ProtocolError(f"outputs[{number}] must be an object with a name")
        parameters = entry.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ProtocolError(f"output {entry['name']!r}: 'parameters' must be an object")
        wanted.append(entry["name"])
        if parameters.get("binary_data"):
            binary.add(entry["name"])
    return wanted, binary


def write_response(
    model: str, version: str, request: InferRequest, outputs: dict[str, np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers: JSON, or JSON then raw bytes (binary outputs)."""
    entries, blobs = [], []
    for name, array in outputs.items():
        array = np.ascontiguousarray(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if request.all_binary or name in request.binary_outputs:
            blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    document: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id is not None:
        document["id"] = request.id
    head = json.dumps(document, separators=(",", ":")).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream", HEADER: str(len(head))}
