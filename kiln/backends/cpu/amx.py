"""The AMX-BF16 tile product (``amx.c``) from Python: built for this machine, run only after the
OS granted AMX (``features.request_amx``). ``tile_product`` is what the bf16 engine path builds on
and what the tests check against NumPy."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from kiln.backends.cpu import features, toolchain
from kiln.errors import KilnError

SOURCE = Path(__file__).with_name("amx.c")


def available() -> str:
    """ "" when AMX-BF16 tile products run here, else why not."""
    if "amx-bf16" not in features.precision_paths()["bf16"]:
        return "this CPU has no AMX-BF16 (no amx_tile and amx_bf16 flags)"
    granted, reason = features.request_amx()
    return "" if granted else reason


def pair_layout(b: np.ndarray) -> np.ndarray:
    """B (K x 16 bfloat16 bits as uint16) in the tile unit's pair layout [K/2][16][2]."""
    k, n = b.shape
    return np.ascontiguousarray(b.reshape(k // 2, 2, n).transpose(0, 2, 1)).reshape(-1)


def tile_product(a_bits: np.ndarray, b_bits: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """C += A . B on the AMX tiles: A 16 x K and B K x 16 as bfloat16 bit patterns (uint16), K a
    multiple of 32; C 16 x 16 float32 (zeros when None). KilnError where AMX is unavailable."""
    from kiln.backends.cpu import host

    reason = available()
    if reason:
        raise KilnError(f"AMX tile product unavailable: {reason}")
    a_bits = np.ascontiguousarray(a_bits, dtype=np.uint16)
    rows, k = a_bits.shape
    if rows != 16 or b_bits.shape != (k, 16) or k % 32:
        raise KilnError(
            f"AMX tile product needs A 16 x K and B K x 16 with K a multiple of 32, got {a_bits.shape}, {b_bits.shape}"
        )
    c = np.zeros((16, 16), np.float32) if c is None else np.ascontiguousarray(c, dtype=np.float32).copy()
    library = ctypes.CDLL(str(toolchain.build(SOURCE.read_text(), host())))
    function = library.kiln_amx_bf16_tile
    function.restype = None
    function.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
    ]
    pairs = pair_layout(np.asarray(b_bits, dtype=np.uint16))
    function(a_bits.ctypes.data, k, pairs.ctypes.data, c.ctypes.data, 16, k)
    return c
