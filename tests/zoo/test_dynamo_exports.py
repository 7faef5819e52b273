"""Transformers as current PyTorch exports them (torch.onnx.export(dynamo=True), opset 18, the default
sdpa attention): tiny random-weight configs compile with one attention kernel per layer, no host
fallback, and match the reference."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch (the 'zoo' extra) exports the models")
pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the models")
pytest.importorskip("onnxscript", reason="onnxscript (the 'zoo' extra) is the dynamo exporter's backend")

import torch

import kiln
from kiln.zoo.transformers_models import _HiddenStates


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=97, n_positions=64, attn_implementation="sdpa")
        return _HiddenStates(GPT2Model(config)).eval()
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128, vocab_size=97,
        attn_implementation="sdpa",
    )  # fmt: skip
    return _HiddenStates(BertModel(config, add_pooling_layer=False)).eval()


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_a_dynamo_export_gets_one_attention_kernel_per_layer_and_no_fallback(kind, tmp_path):
    module = tiny(kind)
    ids = torch.randint(0, 97, (1, 16))
    mask = torch.ones((1, 16), dtype=torch.int64)
    mask[0, 12:] = 0  # padding: masked keys
    with torch.no_grad():
        program = torch.onnx.export(
            module, (ids, mask), input_names=["input_ids", "attention_mask"], opset_version=18, dynamo=True
        )
    program.save(str(tmp_path / "m.onnx"), external_data=False)
    compiled = kiln.compile(str(tmp_path / "m.onnx"))
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    got = np.asarray(next(iter(compiled.run(feeds).values())), np.float64)
    with torch.no_grad():
        want = module(ids, mask).numpy().astype(np.float64)
    assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want)
    kernels = [k.kind for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
    assert compiled.is_native, [(f.node.label, f.reason) for p in compiled.plans for f in p.fallbacks]
    assert kernels.count("attention") == 2, kernels  # one per layer: the scores never leave the kernel
