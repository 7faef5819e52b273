"""Decoders as ONNX Runtime GenAI's model builder writes them (``MatMulNBits``, ``GroupQueryAttention``
with rotary and packed QKV, the simplified norms: ``kiln.frontend.contrib``), compiled by kiln as
generation models: at fp32, greedy generation gives ``transformers.generate``'s tokens on the same
random weights, token for token, with no compile after ``kiln.compile``; at int4, a prompt's and a
decode step's logits are onnxruntime's on the same file. Skipped where the builder (the
``peers-genai`` extra: ``make peers-genai``) is not installed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import kiln
from kiln.driver.generation import roles
from kiln.driver.variants import plans_compiled

pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("onnxruntime_genai") is None,
        reason="onnxruntime-genai (its model builder) is not installed: make peers-genai",
    ),
]
CONTEXT = {"past_sequence_length": "0..40", "sequence_length": "1..41", "total_sequence_length": "1..41", "batch_size": "1..2"}  # fmt: skip


def builder_model(name: str, precision: str):  # type: ignore[no-untyped-def]
    from kiln.bench.gen_peers import genai_folder
    from kiln.zoo import decoders

    path = genai_folder(name, threads=1, precision=precision) / "model.onnx"
    depth = decoders.get(name).head_dim  # (the builder names the head size: a range of one size)
    return path, kiln.compile(str(path), dims={**CONTEXT, "kv_cache_dim": f"{depth}..{depth}"})


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_the_builders_fp32_model_generates_transformers_tokens(name, monkeypatch):
    import torch

    from kiln.zoo import decoders

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    _, model = builder_model(name, "fp32")
    hf = decoders.build(name).model
    compiles = plans_compiled()
    rng = np.random.default_rng(5)
    for batch, prompt, new in ((1, 5, 12), (2, 3, 9)):
        ids = rng.integers(0, decoders.get(name).vocab, (batch, prompt)).astype(np.int64)
        with torch.no_grad():
            want = hf.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                               max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0).numpy()  # fmt: skip
        got = kiln.generate(model, ids, max_new_tokens=new)
        assert np.array_equal(got, want), f"{name} {batch}x{prompt}+{new}:\n{got}\n{want}"
    assert plans_compiled() == compiles, "a prompt length or a new token compiled after kiln.compile returned"


def test_the_builders_int4_model_gives_onnxruntimes_logits(monkeypatch):
    import onnxruntime as ort

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    path, model = builder_model("llama", "int4")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    found = roles(model)
    ids = np.random.default_rng(6).integers(0, 256, (1, 7)).astype(np.int64)
    cache = {p: np.zeros((1, s[1], 0, 16), np.float32) for p, s in zip(found.past, found.cache)}
    for step in (ids[:, :6], ids[:, 6:]):  # a prompt, then a decode step after it
        total = 6 if step.shape[1] == 6 else 7
        feeds = {found.ids: step, found.mask: np.ones((1, total), np.int64), **cache}
        got, want = model.run(feeds), dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        logits = want[found.logits]
        # MatMulNBits at accuracy level 4 quantizes onnxruntime's activations to int8; kiln's
        # products of the dequantized weights are float32: near, not equal
        assert np.linalg.norm(got[found.logits] - logits) <= 3e-2 * np.linalg.norm(logits)
        cache = {p: got[q] for p, q in zip(found.past, found.present)}
