"""``kiln.memory.one_copy``: a packed weight equal to one another compile in this process still
holds (a size class declared beside another packs the same weights) is that one, never a second
copy; arrays that differ anywhere, or that nothing holds any more, are not matched."""

from __future__ import annotations

import gc

import numpy as np

from kiln.memory import ONE_COPY_MIN, one_copy


def test_an_equal_array_still_held_is_returned_and_others_are_not():
    count = ONE_COPY_MIN // 4 + 16
    first = one_copy(np.arange(count, dtype=np.float32))
    again = one_copy(np.arange(count, dtype=np.float32))
    assert again is first
    changed = np.arange(count, dtype=np.float32)
    changed[count // 2 + 1] += 1  # (not in the sampled bytes' every position: compared whole)
    assert one_copy(changed) is changed
    assert one_copy(first.view(np.int32)) is not first  # another dtype: never the same weight
    small = np.zeros(8, np.float32)
    assert one_copy(small) is small and one_copy(np.zeros(8, np.float32)) is not small
    kept = id(first)
    del first, again
    gc.collect()
    fresh = np.arange(count, dtype=np.float32)
    assert one_copy(fresh) is fresh, kept  # (the earlier one went: nothing to share)
