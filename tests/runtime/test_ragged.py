"""Requests of different lengths as one batch (``kiln.driver.ragged``): each sample has its own
valid length, so a joined run gives each request what it gets alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.driver.ragged import NotRagged, Ragged
from kiln.driver.variants import plans_compiled
from tests.helpers import FLOAT, make_model
from tests.runtime.test_padded_lengths import attention_model, feeds, reference


def test_requests_of_different_lengths_run_as_one_batch_each_getting_its_own_answer():
    """Lengths 5, 13, 40 and 1 (a request of 3 samples among them) in one run at the class 40,
    with a key mask of their own: every output matches the request's own reference, cut to its
    length; the classes compiled by ``warm`` serve it with no compile."""
    model = kiln.compile(attention_model(), dims={"seq": (1, 40), "batch": (1, 8)})
    ragged = Ragged(model)
    assert ragged.warm() == len(ragged.classes) * len(ragged.inner.chunking().classes)
    requests = [feeds(1, 5, 1), feeds(2, 13, 2), feeds(1, 40, 3), feeds(3, 1, 4)]
    before = plans_compiled()
    answers = ragged.run(requests)
    assert plans_compiled() == before
    for request, answer in zip(requests, answers):
        for got, want in zip(answer.values(), reference(request["x"], request["mask"])):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_each_sample_is_masked_at_its_own_length():
    """The same joined inputs with every sample's valid length the longest: the shorter requests'
    padding then reaches their keys and mean, and their answers change (the per-sample masks are
    what keeps them right)."""
    model = kiln.compile(attention_model(), dims={"seq": (1, 16), "batch": (1, 4)})
    ragged = Ragged(model)
    short, long = feeds(1, 3, 7), feeds(1, 16, 8)
    right = ragged.run([short, long])[0]["pooled"]
    padded = {k: np.concatenate([np.pad(short[k], [(0, 0), (0, 13)] + [(0, 0)] * (short[k].ndim - 2)), long[k]])
              for k in ("x", "mask")}  # fmt: skip
    padded["mask"][0, 3:] = 1  # (a mask of ones over the padding: only kiln's masks hide it)
    wrong = ragged.inner.execute([padded["x"], padded["mask"], np.array([16, 16], np.int64)])
    assert not np.allclose(wrong[1][0], right[0], atol=1e-3)
    np.testing.assert_allclose(right[0], reference(short["x"], short["mask"])[1][0], rtol=1e-4, atol=1e-4)


def heads_folded_into_the_batch() -> onnx.ModelProto:
    """Attention over x [batch, seq, 4] as two heads of 2 folded into the batch ([2*batch, seq, 2]):
    the scores a padded length must mask have no dim that is the batch."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["length"]),
        helper.make_node("Concat", ["minus_one", "length", "two"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "split"], ["split_heads"]),  # [batch, seq, 2, 2]
        helper.make_node("Transpose", ["split_heads"], ["by_head"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["by_head", "target"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["keys"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["heads", "keys"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "heads"], ["y"]),
    ]
    weights = {
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "minus_one": np.array([-1], np.int64),
        "split": np.array([0, 0, 2, 2], np.int64),
    }
    return make_model(nodes, [("x", FLOAT, ["batch", "seq", 4])], [("y", FLOAT, None)], weights, opset=18)


def test_a_model_whose_masks_cannot_see_the_batch_says_why():
    model = kiln.compile(heads_folded_into_the_batch(), dims={"seq": (1, 16), "batch": (1, 4)})
    with pytest.raises(NotRagged) as found:
        model.ragged()
    assert "no one dim batch" in str(found.value), found.value
    unpadded = kiln.compile(attention_model(), dims={"batch": (1, 4)})  # no length range: nothing pads
    with pytest.raises(NotRagged, match="pads"):
        unpadded.ragged()
