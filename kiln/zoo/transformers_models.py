"""Transformer seed models from transformers configs (offline, random init, fixed seed)."""

from __future__ import annotations

from typing import Any

import torch


class _HiddenStates(torch.nn.Module):
    """Returns only last_hidden_state, so the export has one plain tensor output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def build_bert(options: dict[str, Any]) -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(options.get("seed", 0))
    config = BertConfig(attn_implementation=options.get("attention", "eager"))
    return _HiddenStates(BertModel(config, add_pooling_layer=False)).eval()


def build_gpt2(options: dict[str, Any]) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(options.get("seed", 0))
    config = GPT2Config(attn_implementation=options.get("attention", "eager"))
    return _HiddenStates(GPT2Model(config)).eval()
