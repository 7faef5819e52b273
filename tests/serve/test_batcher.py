"""The batcher's choices: which models batch, and under a latency target, how large a batch and
how long a wait the measured compute times allow."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.serve.batcher import Batcher, batch_symbol
from tests.helpers import FLOAT, make_model
from tests.runtime.test_routes import count_scaled
from tests.runtime.test_sizes import small_cnn

pytest.importorskip("starlette", reason="the 'serve' extra")


def batcher(target_s: float | None = None, delay_s: float = 0.0) -> Batcher:
    model = kiln.compile(small_cnn(), dims={"batch": "1..16"})
    return Batcher(model, delay_s, 8, 16, lambda rows, seconds: None, target_s)


def test_a_proven_sample_parallel_batch_batches_and_others_do_not():
    assert batch_symbol(kiln.compile(small_cnn(), dims={"batch": "1..16"})) == "batch"
    assert batch_symbol(kiln.compile(count_scaled(), dims={"batch": "1..16"})) is None  # no sample is its own
    relu = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2, 3])], [("y", FLOAT, [2, 3])])
    assert batch_symbol(kiln.compile(relu)) is None  # no symbolic dim at all


def test_without_a_target_the_limit_is_max_batch_and_the_delay_as_configured():
    plain = batcher(delay_s=0.003)
    plain.costs = {1: 0.5}  # (measurements do not matter without a target)
    assert plain.limit() == 8 and plain.delay(8) == 0.003


def test_a_latency_target_sizes_batches_from_the_measured_curve():
    adaptive = batcher(target_s=0.010)
    assert adaptive.limit() == 1 and adaptive.delay(1) == 0.0  # nothing measured: one at a time, no wait
    adaptive.costs = {1: 0.002}
    assert adaptive.predicted(3) == pytest.approx(0.006)  # scaled by rows from the size below
    assert adaptive.limit() == 2  # 2 x 2 ms fits half of 10 ms, 3 x 2 ms does not
    assert adaptive.delay(2) == pytest.approx(0.001)  # the slack a batch of 2 leaves in 5 ms
    adaptive.costs = {1: 0.002, 4: 0.004}  # batches are cheaper per sample than one at a time
    assert adaptive.limit() == 5 and adaptive.delay(5) == pytest.approx(0.0)
    adaptive.costs = {1: 0.02}  # even one sample is over the target: still one at a time
    assert adaptive.limit() == 1 and adaptive.delay(1) == 0.0


def test_joined_requests_each_get_their_own_rows():
    import asyncio

    reference = kiln.compile(small_cnn(), target="reference")
    serving = batcher(delay_s=0.05)

    async def run() -> list:
        feeds = [{"x": np.random.default_rng(i).standard_normal((1 + i % 3, 3, 6, 6)).astype(np.float32),
                  "scale": np.array([0.5], np.float32)} for i in range(6)]  # fmt: skip
        answers = await asyncio.gather(*(serving.infer(f) for f in feeds))
        return list(zip(feeds, answers))

    results = asyncio.run(run())
    for feeds, (outputs, _) in results:
        np.testing.assert_allclose(outputs["y"], reference.run(feeds)["y"], rtol=1e-5, atol=1e-5)
    assert max(timing.batch for _, (_, timing) in results) > 1
    serving.close()


def test_a_retired_batcher_answers_what_it_holds_and_what_still_reaches_it():
    import asyncio

    reference = kiln.compile(small_cnn(), target="reference")
    feeds = {"x": np.ones((2, 3, 6, 6), np.float32), "scale": np.array([0.5], np.float32)}
    serving = batcher(delay_s=0.05)

    async def run() -> list:
        queued = asyncio.ensure_future(serving.infer(feeds))  # waits in the queue for company
        await asyncio.sleep(0.01)
        serving.retire()  # a newer version took its place
        late = await serving.infer(feeds)  # handed out just before: still answered
        answers = [await queued, late]
        await asyncio.sleep(0.01)
        assert serving.task is not None and serving.task.done()  # its worker ended by itself, the loop still running
        return answers

    for outputs, _ in asyncio.run(run()):
        np.testing.assert_allclose(outputs["y"], reference.run(feeds)["y"], rtol=1e-5, atol=1e-5)


def test_requests_of_different_lengths_join_and_each_gets_its_own_length_back():
    """A token model whose length pads: requests of lengths 3..29 queue together, run as joined
    batches (each sample its own valid length, compiled when the model loads), and each answer is
    the request's own at its own length; nothing compiles while serving."""
    import asyncio

    from kiln.driver.variants import plans_compiled
    from tests.runtime.test_padded_lengths import attention_model, feeds

    model = kiln.compile(attention_model(), dims={"seq": "1..32", "batch": "1..8"})
    serving = Batcher(model, 0.05, 8, 16, lambda rows, seconds: None)
    assert serving.prepare_joins() and serving.ragged is not None
    requests = [feeds(1 + i % 2, length, i) for i, length in enumerate((3, 17, 29, 8, 12))]
    before = plans_compiled()

    async def run() -> list:
        return await asyncio.gather(*(serving.infer(f) for f in requests))

    answers = asyncio.run(run())
    assert plans_compiled() == before
    assert max(timing.batch for _, timing in answers) > 2  # lengths joined (one length alone joins at most 2)
    for request, (outputs, _) in zip(requests, answers):
        alone = model.run(request)
        for name in alone:
            np.testing.assert_allclose(outputs[name], alone[name], rtol=1e-5, atol=1e-5)
    serving.close()


def test_whether_joining_pays_is_read_from_the_curve_measured_at_load():
    """A lone run slowed by the load around it (the moving average of batch 1 doubled) does not
    make batches of 2 look cheaper per sample: the limit stays what the curve measured at load
    says (batch 2 cost 1.9x a lone sample there: joining does not pay)."""
    serving = batcher()
    serving.costs, serving.curve, serving.calibrated = {1: 0.010, 2: 0.019}, {1: 0.010, 2: 0.019}, True
    assert serving.limit() == 1
    serving.costs[1] = 0.020  # served lone runs under load
    assert serving.limit() == 1
    serving.curve[2] = serving.costs[2] = 0.012  # where the curve says batches pay, they join
    assert serving.limit() == 2
