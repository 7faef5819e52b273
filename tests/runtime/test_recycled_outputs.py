"""Large outputs' memory is reused once the caller let go of it (``executable.Recycled``): a decode
loop's present KV cache, fresh every step, cost a page fault per 4 KB it wrote. An output still held
(the array, a view of it, a reshape) is never handed out again."""

from __future__ import annotations

import numpy as np
from onnx import helper

import kiln
from kiln.runtime.executable import LARGE_OUTPUT, Recycled
from tests.helpers import FLOAT, make_model


def doubled():  # [256, 512] float32: 512 KB, a large output
    return make_model(
        [helper.make_node("Add", ["x", "x"], ["y"])], [("x", FLOAT, [256, 512])], [("y", FLOAT, [256, 512])]
    )


def test_a_dropped_output_is_reused_and_a_held_one_never_is():
    model = kiln.compile(doubled())
    x = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    first = model.run({"x": x})["y"]
    where = first.__array_interface__["data"][0]
    kept = first[3:7]  # a view keeps it held
    del first
    second = model.run({"x": x + 1})["y"]
    assert second.__array_interface__["data"][0] != where  # held through the view: not reused
    np.testing.assert_array_equal(kept, 2 * x[3:7])  # and not overwritten
    del kept
    third = model.run({"x": x + 2})["y"]  # now nothing holds the first: its memory again
    assert third.__array_interface__["data"][0] == where
    np.testing.assert_array_equal(third, 2 * (x + 2))
    np.testing.assert_array_equal(second, 2 * (x + 1))  # the second, still held, untouched


def test_small_outputs_are_plain_allocations_and_the_kept_count_is_bounded():
    pool = Recycled()
    small = pool.take(16, np.dtype(np.float32))
    assert small.size == 16 and not pool.kept  # (malloc reuses small ones itself)
    size = LARGE_OUTPUT // 4
    held = [pool.take(size, np.dtype(np.float32)) for _ in range(70)]  # every one held: all distinct
    assert len({a.__array_interface__["data"][0] for a in held}) == 70
    assert len(pool.kept[(size, "<f4")]) == 64  # the ones past the bound are not tracked
    first = held[0].__array_interface__["data"][0]
    del held
    assert pool.take(size, np.dtype(np.float32)).__array_interface__["data"][0] == first


def test_an_output_known_zero_past_what_was_written_is_laid_out_where_it_is():
    """``written`` zeroes what an earlier run left past this run's extent; ``laid_in_place`` then
    gives the array as ``lay_out`` would (dense first, the rest zero) without a copy, and nothing
    where the extent is unknown, the array is not the start of a kept one, or it is too small."""
    from kiln.driver.extents import lay_out

    pool = Recycled()
    size = LARGE_OUTPUT // 4
    shape = (4, size // 8)  # a capacity of half the kept array

    def run(count: int, value: float) -> np.ndarray:
        out = pool.take(size, np.dtype(np.float32))
        out[:count] = value  # what a run computing ``count`` elements writes
        pool.written(out, count)
        return out[:count]

    first = run(300, 1.0)
    assert pool.laid_in_place(first, shape) is not None
    where = first.__array_interface__["data"][0]
    del first
    second = run(100, 2.0)  # the same memory again: 100..300 was the first run's, zeroed now
    assert second.__array_interface__["data"][0] == where
    laid = pool.laid_in_place(second, shape)
    np.testing.assert_array_equal(laid, lay_out(second, shape))
    assert laid.__array_interface__["data"][0] == where  # read where it is: no copy
    assert pool.laid_in_place(second[1:], shape) is None  # not the start of the kept array
    assert pool.laid_in_place(second, (4, size)) is None  # larger than the kept array
    again = pool.take(size, np.dtype(np.float32))  # taken (its extent unknown until a run says)
    assert pool.laid_in_place(again[:10], shape) is None
