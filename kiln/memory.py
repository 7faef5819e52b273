"""Large aligned buffers for weights, plan-cache blobs and arenas: one place that allocates them.

(Asking for transparent huge pages here, ``madvise(MADV_HUGEPAGE)``, was measured on this project's
VMs: reading an 815 MB plan took 0.3-1.2 s with it and 0.2-0.8 s without, in alternating runs; the
first touch of memory the VM's host has not backed yet dominates either way. Not used.)
"""

from __future__ import annotations

import numpy as np


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
