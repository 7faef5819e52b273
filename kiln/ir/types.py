"""Value types of the graph IR: element dtypes, symbolic dims, tensor/sequence/optional types.

A dim is an ``int`` (static) or a ``str`` naming a symbol (``batch``, ``seq``). Dims that no rule can
express (data-dependent sizes such as NonZero's count) get a fresh symbol named after the node that
produced them, so every type is printable and every symbol can be bound at run time.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from kiln.ir.dims import canonical, is_dim_text
from kiln.ir.sized import SizedInt

Dim = int | str
Shape = tuple[Dim, ...]

_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a symbol; any other dim is an expression (kiln.ir.dims)


class DType(enum.Enum):
    """Element types, with their ONNX TensorProto code, short IR name and NumPy dtype."""

    FLOAT32 = (1, "f32", np.dtype(np.float32))
    UINT8 = (2, "u8", np.dtype(np.uint8))
    INT8 = (3, "i8", np.dtype(np.int8))
    UINT16 = (4, "u16", np.dtype(np.uint16))
    INT16 = (5, "i16", np.dtype(np.int16))
    INT32 = (6, "i32", np.dtype(np.int32))
    INT64 = (7, "i64", np.dtype(np.int64))
    STRING = (8, "str", np.dtype(object))
    BOOL = (9, "bool", np.dtype(np.bool_))
    FLOAT16 = (10, "f16", np.dtype(np.float16))
    FLOAT64 = (11, "f64", np.dtype(np.float64))
    UINT32 = (12, "u32", np.dtype(np.uint32))
    UINT64 = (13, "u64", np.dtype(np.uint64))
    COMPLEX64 = (14, "c64", np.dtype(np.complex64))
    COMPLEX128 = (15, "c128", np.dtype(np.complex128))
    BFLOAT16 = (16, "bf16", np.dtype(ml_dtypes.bfloat16))
    FLOAT8E4M3FN = (17, "f8e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn))
    FLOAT8E4M3FNUZ = (18, "f8e4m3fnuz", np.dtype(ml_dtypes.float8_e4m3fnuz))
    FLOAT8E5M2 = (19, "f8e5m2", np.dtype(ml_dtypes.float8_e5m2))
    FLOAT8E5M2FNUZ = (20, "f8e5m2fnuz", np.dtype(ml_dtypes.float8_e5m2fnuz))
    UINT4 = (21, "u4", np.dtype(ml_dtypes.uint4))
    INT4 = (22, "i4", np.dtype(ml_dtypes.int4))
    FLOAT4E2M1 = (23, "f4e2m1", np.dtype(ml_dtypes.float4_e2m1fn))
    FLOAT8E8M0 = (24, "f8e8m0", np.dtype(ml_dtypes.float8_e8m0fnu))
    UINT2 = (25, "u2", np.dtype(ml_dtypes.uint2))
    INT2 = (26, "i2", np.dtype(ml_dtypes.int2))

    def __init__(self, onnx_code: int, short: str, numpy_dtype: np.dtype) -> None:
        self.onnx_code = onnx_code
        self.short = short
        self.numpy = numpy_dtype

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_integer(self) -> bool:
        return self in _INTEGERS

    @staticmethod
    def from_onnx(code: int) -> DType:
        try:
            return _BY_CODE[code]
        except KeyError:
            raise ValueError(f"unknown ONNX element type code {code}") from None

    @staticmethod
    def from_short(short: str) -> DType:
        try:
            return _BY_SHORT[short]
        except KeyError:
            raise ValueError(f"unknown dtype {short!r}; known: {', '.join(_BY_SHORT)}") from None

    @staticmethod
    def from_numpy(dtype: np.dtype | type) -> DType:
        dtype = np.dtype(dtype)
        if dtype.kind in "OUS":
            return DType.STRING
        try:
            return _BY_NUMPY[dtype]
        except KeyError:
            raise ValueError(f"NumPy dtype {dtype} has no kiln equivalent") from None


_BY_CODE = {d.onnx_code: d for d in DType}
_BY_SHORT = {d.short: d for d in DType}
_BY_NUMPY = {d.numpy: d for d in DType if d is not DType.STRING}
_FLOATS = frozenset(d for d in DType if d.short.startswith(("f", "bf")))
_INTEGERS = frozenset(d for d in DType if d.short.startswith(("i", "u")))


def check_dim(dim: Dim) -> Dim:
    """Return ``dim`` if it is a valid dim (non-negative int or symbol name), else raise ValueError."""
    if isinstance(dim, bool):
        raise ValueError(f"invalid dim {dim!r}")
    if isinstance(dim, (int, np.integer)):
        if dim < 0:
            raise ValueError(f"negative dim {dim}")
        return dim if isinstance(dim, SizedInt) else int(dim)  # (a size keeps its expression)
    if isinstance(dim, str) and (_SYMBOL.match(dim) or is_dim_text(dim)):
        return dim
    raise ValueError(f"invalid dim {dim!r}: expected a non-negative int or a symbol name")


@dataclass(frozen=True)
class TensorType:
    """A tensor of ``dtype``; ``shape`` is None when even the rank is unknown."""

    dtype: DType
    shape: Shape | None

    def __post_init__(self) -> None:
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(check_dim(d) for d in self.shape))

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.dtype.short}[...]"
        return f"{self.dtype.short}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class SequenceType:
    """An ONNX sequence of tensors whose element type is ``elem``."""

    elem: Type

    def __str__(self) -> str:
        return f"seq<{self.elem}>"


@dataclass(frozen=True)
class OptionalType:
    """An ONNX optional holding a value of type ``elem`` or nothing."""

    elem: Type

    def __str__(self) -> str:
        return f"opt<{self.elem}>"


Type = TensorType | SequenceType | OptionalType


def tensor(dtype: DType, *shape: Dim) -> TensorType:
    """Shorthand: ``tensor(DType.FLOAT32, "batch", 768)``."""
    return TensorType(dtype, tuple(shape))


def parse_type(text: str) -> Type:
    """Parse a type in the printer's syntax: ``f32[batch,768]``, ``i64[]``, ``f32[...]``, ``seq<f32[3]>``."""
    text = text.strip()
    for prefix, cls in (("seq<", SequenceType), ("opt<", OptionalType)):
        if text.startswith(prefix):
            if not text.endswith(">"):
                raise ValueError(f"malformed type {text!r}")
            return cls(parse_type(text[len(prefix) : -1]))
    match = re.fullmatch(r"([a-z0-9]+)\[(.*)\]", text)
    if not match:
        raise ValueError(f"malformed type {text!r}: expected e.g. f32[1,3,224,224]")
    dtype = DType.from_short(match.group(1))
    body = match.group(2).strip()
    if body == "...":
        return TensorType(dtype, None)
    if not body:
        return TensorType(dtype, ())
    dims: list[Dim] = []
    for part in split_dims(body):
        part = part.strip()
        dims.append(int(part) if re.fullmatch(r"\d+", part) else canonical(part))
    return TensorType(dtype, tuple(dims))


def split_dims(body: str) -> list[str]:
    """A type's dims text split at its top-level commas (``min(seq,512)`` is one dim)."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(body):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(body[start:index])
            start = index + 1
    parts.append(body[start:])
    return parts


def random_tensor(dtype: DType, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """Random data of a kiln DType: normal floats, 0/1 booleans, small non-negative integers."""
    if dtype.is_float:
        return rng.standard_normal(shape).astype(dtype.numpy)
    if dtype is DType.BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 10, size=shape).astype(dtype.numpy)
