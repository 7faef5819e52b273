"""``laid.LaidInputs``: the buffers inputs are laid out in at their capacity are kept between
calls, keeping ``lay_out``'s contract (the data dense in the first elements, the rest zero)."""

from __future__ import annotations

import numpy as np

from kiln.driver.extents import lay_out
from kiln.driver.laid import LaidInputs


def test_a_kept_buffer_is_what_a_fresh_one_would_be_after_longer_and_shorter_calls():
    pool = LaidInputs()
    capacity = (2, 8, 3)
    for length in (5, 8, 2, 2, 7, 1):  # growing, then shrinking: what a longer call left is zeroed
        array = np.random.default_rng(length).standard_normal((2, length, 3)).astype(np.float32)
        laid, taken = pool.lay([array], [capacity])
        np.testing.assert_array_equal(laid[0], lay_out(array, capacity))
        pool.give_back(taken)
    assert len(pool.free) == 1  # one set of buffers served every call


def test_concurrent_calls_take_buffers_of_their_own_and_outputs_never_alias_them():
    pool = LaidInputs()
    first, taken_first = pool.lay([np.ones((1, 2), np.float32)], [(1, 4)])
    second, taken_second = pool.lay([np.full((1, 3), 2.0, np.float32)], [(1, 4)])
    assert first[0] is not second[0] and first[0][0, 0] == 1.0  # the second call did not write the first's
    pool.give_back(taken_first)
    pool.give_back(taken_second)

    class Identity:  # an executable whose output is its input's memory
        def run(self, inputs):  # type: ignore[no-untyped-def]
            return [inputs[0]]

    outputs = pool.run(Identity(), [np.ones((1, 2), np.float32)], [(1, 4)], np.zeros(1), [(1, 2)])
    pool.run(Identity(), [np.full((1, 2), 5.0, np.float32)], [(1, 4)], np.zeros(1), [(1, 2)])
    np.testing.assert_array_equal(outputs[0], np.ones((1, 2), np.float32))  # not overwritten by the next call
