"""Content digests of constants (what the plan cache and CSE key on) and kiln's large buffers."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from kiln.integrity import CHUNK
from kiln.ir.graph import array_digest
from kiln.memory import aligned_copy, empty_aligned


def test_equal_content_equal_digest_and_any_change_shows() -> None:
    rng = np.random.default_rng(0)
    big = rng.standard_normal((5 * CHUNK) // 4 + 3).astype(np.float32)  # chunked on the hashing threads
    small = big[:1000].copy()
    for array in (big, small):
        other = array.copy()
        assert array_digest(array) == array_digest(other)
        other[-1] += 1.0  # the last byte of the last chunk counts
        assert array_digest(array) != array_digest(other)
        other = array.copy()
        other[0] += 1.0
        assert array_digest(array) != array_digest(other)
    # dtype and shape are part of the name
    assert array_digest(small) != array_digest(small.view(np.int32))
    assert array_digest(small) != array_digest(small.reshape(10, 100))


def test_a_transposed_weight_is_hashed_without_a_copy() -> None:
    weight = np.random.default_rng(1).standard_normal((2048, 4096)).astype(np.float32)  # 32 MB
    view = weight.T
    tracemalloc.start()
    try:
        digest = array_digest(view)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"hashing a transposed view allocated {peak} bytes"
    assert digest == array_digest(weight.copy().T)  # same values, same layout
    changed = weight.copy()
    changed[7, 9] = 0.5
    assert digest != array_digest(changed.T)
    # a layout no axis order makes contiguous (a strided slice) is still hashed by value
    strided = weight[::2, ::3]
    assert array_digest(strided) == array_digest(weight.copy()[::2, ::3])


@pytest.mark.parametrize("nbytes", [1, 1000, (4 << 20) + 17])
@pytest.mark.parametrize("alignment", [16, 64])
def test_large_buffers_are_aligned_and_writable(nbytes: int, alignment: int) -> None:
    buffer = empty_aligned(nbytes, alignment)
    assert buffer.dtype == np.uint8 and buffer.shape == (nbytes,)
    assert buffer.ctypes.data % alignment == 0
    buffer[:] = 7  # every byte is ours
    assert int(buffer[-1]) == 7 and int(buffer[0]) == 7
    source = np.arange(nbytes // 4 + 1, dtype=np.float32).reshape(-1, 1)
    copy = aligned_copy(source, alignment)
    assert copy.ctypes.data % alignment == 0 and copy.flags.c_contiguous
    np.testing.assert_array_equal(copy, source)
