"""kiln's bf16 building blocks from Python, each built for this machine: the AMX-BF16 tile product
(``amx.c``, run only after the OS granted AMX: ``features.request_amx``) and the AVX-512-BF16
micro-kernel (``dpbf16.c``, the path without AMX). What the bf16 engine path builds on, and what
the tests check against NumPy."""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from kiln.backends.cpu import features, toolchain
from kiln.errors import KilnError

SOURCE = Path(__file__).with_name("amx.c")
DOT_SOURCE = Path(__file__).with_name("dpbf16.c")
DOT_ROWS, DOT_COLUMNS = 8, 32  # the micro-tile of dpbf16.c


@cache
def _function(source: Path, name: str, params: tuple[str, ...]) -> Any:
    """C function ``name`` of ``source`` built for this machine (once per process); params "p"
    (pointer) or "i" (int64), returning nothing."""
    from kiln.backends.cpu import host

    function = getattr(ctypes.CDLL(str(toolchain.build(source.read_text(), host()))), name)
    function.restype = None
    function.argtypes = [ctypes.c_void_p if p == "p" else ctypes.c_int64 for p in params]
    return function


def available() -> str:
    """ "" when AMX-BF16 tile products run here, else why not."""
    if "amx-bf16" not in features.precision_paths()["bf16"]:
        return "this CPU has no AMX-BF16 (no amx_tile and amx_bf16 flags)"
    granted, reason = features.request_amx()
    return "" if granted else reason


def pair_layout(b: np.ndarray) -> np.ndarray:
    """B (K x N bfloat16 bits as uint16) in k pairs, [K/2][N][2]: the AMX tile unit's layout (N =
    16) and the AVX-512-BF16 micro-kernel's (N = 32)."""
    k, n = b.shape
    return np.ascontiguousarray(b.reshape(k // 2, 2, n).transpose(0, 2, 1)).reshape(-1)


def tile_product(a_bits: np.ndarray, b_bits: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """C += A . B on the AMX tiles: A 16 x K and B K x 16 as bfloat16 bit patterns (uint16), K a
    multiple of 32; C 16 x 16 float32 (zeros when None). KilnError where AMX is unavailable."""
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
    function = _function(SOURCE, "kiln_amx_bf16_tile", ("p", "i", "p", "p", "i", "i"))
    pairs = pair_layout(np.asarray(b_bits, dtype=np.uint16))
    function(a_bits.ctypes.data, k, pairs.ctypes.data, c.ctypes.data, 16, k)
    return c


def dot_available() -> str:
    """ "" when the AVX-512-BF16 micro-kernel runs here, else why not."""
    if "avx512-bf16" not in features.precision_paths()["bf16"]:
        return "this CPU has no AVX-512-BF16 (no avx512_bf16 flag)"
    return ""


def pack_pairs_a(a_bits: np.ndarray) -> np.ndarray:
    """A (rows x K bf16 bits) as [K/2][rows] 32-bit words: each the bf16 pair (k even low, k odd high)."""
    rows, k = a_bits.shape
    pairs = np.ascontiguousarray(a_bits.T.reshape(k // 2, 2, rows).transpose(0, 2, 1))  # [K/2][rows][2]
    return pairs.view(np.uint32).reshape(k // 2, rows)


def dot_tile(a_bits: np.ndarray, b_bits: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """C += A . B with the AVX-512-BF16 micro-kernel: A 8 x K, B K x 32 (bf16 bit patterns), K even;
    C 8 x 32 float32 (zeros when None). KilnError where the CPU lacks AVX-512-BF16."""
    reason = dot_available()
    if reason:
        raise KilnError(f"AVX-512-BF16 micro-kernel unavailable: {reason}")
    a_bits = np.ascontiguousarray(a_bits, dtype=np.uint16)
    rows, k = a_bits.shape
    if rows != DOT_ROWS or b_bits.shape != (k, DOT_COLUMNS) or k % 2:
        raise KilnError(
            f"the bf16 micro-kernel needs A 8 x K and B K x 32 with K even, got {a_bits.shape}, {b_bits.shape}"
        )
    c = np.zeros((DOT_ROWS, DOT_COLUMNS), np.float32) if c is None else np.ascontiguousarray(c, dtype=np.float32).copy()
    function = _function(DOT_SOURCE, "kiln_dpbf16_tile", ("i", "p", "p", "p", "i"))
    a_pairs = pack_pairs_a(a_bits)
    b_pairs = pair_layout(np.asarray(b_bits, dtype=np.uint16))  # [K/2][32][2]
    function(k, a_pairs.ctypes.data, b_pairs.ctypes.data, c.ctypes.data, DOT_COLUMNS)
    return c
