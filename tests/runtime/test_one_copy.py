"""``kiln.memory.one_copy``: a packed weight equal to one another compile in this process still
holds (a size class declared beside another packs the same weights) is that one, never a second
copy; arrays that differ anywhere, or that nothing holds any more, are not matched."""

from __future__ import annotations

import gc

import numpy as np

from kiln.memory import ALIGNED_FROM, ONE_COPY_MIN, one_copy


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


def test_a_weight_read_as_it_is_arrives_unaligned_and_is_held_once_aligned(monkeypatch):
    """An embedding table (a Gather's data: the plan reads it as it is) that the import hands over
    unaligned (a file's bytes) is made 64-byte aligned by the compile, the plan and its graph
    holding that one copy, and the runtime binds it without another (it had bound an aligned copy
    while the plan kept the original: a 1B decoder's 1 GB table held twice)."""
    import onnx

    import kiln
    from kiln.frontend import onnx as onnx_frontend
    from tests.helpers import make_model

    table = np.random.default_rng(0).standard_normal((ALIGNED_FROM // 256 + 8, 64)).astype(np.float32)
    model = make_model(
        [onnx.helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        [("ids", onnx.TensorProto.INT64, [3])],
        [("y", onnx.TensorProto.FLOAT, [3, 64])],
        {"table": table},
    )
    imported = onnx_frontend.array_from_tensor

    def unaligned(proto, folder=None):  # type: ignore[no-untyped-def]
        array = imported(proto, folder)
        if array.nbytes < ALIGNED_FROM:
            return array
        raw = np.empty(array.nbytes + 128, np.uint8)
        start = (-raw.ctypes.data) % 64 + 4  # (4 bytes past a 64-byte boundary)
        moved = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
        moved[...] = array
        return moved

    monkeypatch.setattr(onnx_frontend, "array_from_tensor", unaligned)
    compiled = kiln.compile(model)
    ids = np.array([0, 5, len(table) - 1])
    np.testing.assert_array_equal(compiled.run({"ids": ids})["y"], table[ids])
    (executable,) = compiled.executables()
    plan = executable.plan
    (big,) = [b for b, a in plan.constants.items() if a.nbytes >= ALIGNED_FROM]
    held = plan.constants[big]
    assert held.ctypes.data % 64 == 0
    assert executable.constant_views[big].ctypes.data == held.ctypes.data  # (bound where it lies)
    (kept,) = [a for a in plan.graph.constants.values() if a.nbytes >= ALIGNED_FROM]
    assert kept.ctypes.data == held.ctypes.data  # (the plan's graph holds no other copy)


def test_big_weights_come_from_the_import_64_byte_aligned():
    """The ONNX import moves a big weight's bytes to a 64-byte boundary (NumPy reads a tensor's raw
    bytes where the message keeps them, 16-byte aligned at best): eight of them, each of which
    would land unaligned three times in four, so a missing move cannot pass by chance."""
    from onnx import numpy_helper

    from kiln.frontend.onnx import array_from_tensor

    for extra in range(8):
        array = np.arange(ALIGNED_FROM // 4 + 4 * extra + 1, dtype=np.float32)
        got = array_from_tensor(numpy_helper.from_array(array, "w"))
        assert got.ctypes.data % 64 == 0
        np.testing.assert_array_equal(got, array)
