"""Large aligned buffers for weights, plan-cache blobs and arenas: one place that allocates them.

(Asking for transparent huge pages here, ``madvise(MADV_HUGEPAGE)``, was measured on this project's
VMs: reading an 815 MB plan took 0.3-1.2 s with it and 0.2-0.8 s without, in alternating runs; the
first touch of memory the VM's host has not backed yet dominates either way. Nor for a decode
step streaming its weights: llama-1b fp32 with its 5.5 GB of packed weights on huge pages
(private anonymous maps; shared ones are shmem, never huge) ran 93-161 ms a token against
95-165 without, in alternating runs on a Zen 4 VM whose memory moves between ~30 and ~50 GB/s —
the memory, not the TLB, is the limit. Not used.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import mmap
import threading
import weakref
from typing import Any

import numpy as np

BIG = 16 << 20  # bytes of weights from which a compile or load hands its freed heap back


def return_freed(collect: bool = False) -> None:
    """Hand the heap memory the process freed back to the OS (glibc's ``malloc_trim``): a compile's
    folded and unpacked copies of the weights, freed, otherwise stay in the process's RSS (glibc
    keeps freed blocks below its adaptive mmap threshold, up to 32 MB each, for reuse). A few
    milliseconds; nothing where the C library is not glibc. ``collect``: the garbage collector
    first (an imported model's structures are freed in cycles)."""
    if collect:
        gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():  # type: ignore[no-untyped-def]
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def drop_mapped_pages(array: Any) -> None:
    """Let the pages of an array that maps a file leave the process's RSS (``MADV_DONTNEED``):
    they stay in the page cache, and a later read faults them back in from there. For arrays read
    once and kept only in case (a source graph read back from the plan cache to be saved): a big
    model's weights otherwise count twice in the RSS, as its packed copies and as these. Nothing
    for an array that maps no file, or where the system has no such advice."""
    base = array
    while base is not None and not isinstance(base, mmap.mmap):  # views, then NumPy's memoryview of the map
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    if isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        try:
            base.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):  # closed, or the system refuses: the pages just stay
            pass


def empty_aligned(nbytes: int, alignment: int = 64) -> np.ndarray:
    """``nbytes`` uninitialised bytes (a uint8 array) starting on an ``alignment``-byte boundary;
    freed when the last view of it goes."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    shift = (-raw.ctypes.data) % alignment
    return raw[shift : shift + nbytes]


def aligned_copy(array: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``array`` starting on an ``alignment``-byte boundary."""
    result = empty_aligned(array.nbytes, alignment).view(array.dtype).reshape(array.shape)
    result[...] = array
    return result


ALIGNED_FROM = 1 << 20  # bytes from which a weight is moved to a 64-byte boundary where it arrives


def aligned_if_big(array: np.ndarray) -> np.ndarray:
    """``array``, or, where it holds ``ALIGNED_FROM`` bytes or more of numbers and is not already
    C-contiguous on a 64-byte boundary, its copy there: the runtime binds every weight aligned,
    and copies one that is not beside the original its holder keeps (a file's bytes; NumPy's
    large blocks are 16-byte aligned)."""
    if array.nbytes < ALIGNED_FROM or array.dtype.kind not in "biuf":
        return array
    if array.flags.c_contiguous and array.ctypes.data % 64 == 0:
        return array
    return aligned_copy(array)


def content_key(array: np.ndarray) -> tuple:
    """A C-contiguous array's dtype, shape and 64 of its bytes sampled across it: equal arrays have
    equal keys (the candidates under one key are then compared whole: ``same_bytes``)."""
    raw = array.reshape(-1).view(np.uint8)
    return (array.dtype.str, array.shape, raw[:: max(1, raw.size // 64)][:64].tobytes())


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous arrays of one key (``content_key``) hold the same bytes."""
    return a is b or np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


ONE_COPY_MIN = 1 << 16  # bytes: below this, a second copy costs less than comparing


def one_copy(array: np.ndarray) -> np.ndarray:
    """``array``, or an equal array (dtype, shape, every byte) made earlier in this process and
    still held: each size class of a model compiles its own plan and packs the same weights (the
    packing does not depend on the batch), so a class declared after others takes their packed
    copies as each of its own is made — never all of them beside the ones held (a 1B decoder's
    fp32 class of 4 ran out of 24 GB that way). Matched by content, never by name."""
    if array.nbytes < ONE_COPY_MIN or not array.flags.c_contiguous:
        return array
    key = content_key(array)
    with _held_lock:
        held = [ref for ref in _held.get(key, []) if ref() is not None]
        for ref in held:
            candidate = ref()
            if candidate is not None and same_bytes(candidate, array):
                _held[key] = held
                return candidate
        _held[key] = [*held, weakref.ref(array)]
        if len(_held) > 2 * _held_pruned[0] + 64:  # keys whose arrays all went: dropped now and then
            for stale in [k for k, refs in _held.items() if all(r() is None for r in refs)]:
                del _held[stale]
            _held_pruned[0] = len(_held)
        return array


_held: dict[tuple, list[weakref.ref]] = {}
_held_lock = threading.Lock()
_held_pruned = [0]
