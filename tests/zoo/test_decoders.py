"""Decoders' decode steps (kiln.zoo.decoders: GPT-2, Llama- and Qwen2-like, the KV cache as inputs
and outputs) from both exporters, compiled once with the past length, the mask's length and the
batch declared: every past length runs on that one compile (no compile per generated token),
batch 2 as chunks of the batch's classes, matching onnxruntime on the same file."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.driver.variants import plans_compiled
from kiln.zoo import decoders

pytest.importorskip("torch", reason="torch (the 'zoo' extra) exports the models")
pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")
pytest.importorskip("onnxscript", reason="onnxscript (the 'zoo' extra) is the dynamo exporter's backend")
onnxruntime = pytest.importorskip("onnxruntime", reason="the steps are checked against onnxruntime")

CASES = [("gpt2", "torchscript"), ("llama", "dynamo"), ("qwen2", "torchscript")]
STEPS = [(1, 1), (2, 7), (1, 64), (2, 33), (1, 2)]  # (batch, past)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_a_decode_step_runs_every_past_length_on_one_compile(name, exporter, monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    path = str(decoders.export(name, exporter=exporter))
    model = kiln.compile(path, dims={"past": "1..64", "new": "1..16", "total": "2..65", "batch": "1..2"})
    assert not model.run_time_refused, model.run_time_refused
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    outputs = decoders.names(name)[1]
    compiled = plans_compiled()
    for batch, past in STEPS:
        feeds = decoders.inputs(name, past=past, batch=batch)
        got, want = model.run(feeds), session.run(None, feeds)
        for output, expected in zip(outputs, want):
            error = np.linalg.norm(np.asarray(got[output]) - expected) / np.linalg.norm(expected)
            assert error < 1e-5, f"{name} {output} at batch {batch}, past {past}: relative L2 {error:.1e}"
        assert model.route.name == "run-time sizes", model.route
    assert plans_compiled() == compiled, "a past length compiled after kiln.compile returned"


@pytest.mark.slow
def test_a_mask_shorter_than_the_cache_is_a_named_error(monkeypatch):
    """The mask must cover the cache and the new token (total >= past + 1): shorter, the step's
    gather reads past it — an error that names the node and the binding, never a crash."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    model = kiln.compile(
        str(decoders.export("gpt2")), dims={"past": "1..64", "new": "1..16", "total": "2..65", "batch": "1..2"}
    )
    feeds = decoders.inputs("gpt2", past=10, batch=2)
    feeds["mask"] = np.ones((2, 5), np.int64)
    with pytest.raises(kiln.KilnError, match="past=10, total=5"):
        model.run(feeds)
