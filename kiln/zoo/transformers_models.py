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
    config.num_hidden_layers = options.get("layers", config.num_hidden_layers)  # fewer: a reduced-size check
    return _HiddenStates(BertModel(config, add_pooling_layer=False)).eval()


def build_gpt2(options: dict[str, Any]) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(options.get("seed", 0))
    config = GPT2Config(attn_implementation=options.get("attention", "eager"))
    config.n_layer = options.get("layers", config.n_layer)  # fewer: a reduced-size check
    return _HiddenStates(GPT2Model(config)).eval()


class _Pixels(torch.nn.Module):
    """An image model's last_hidden_state (ViT: tokens; ConvNeXt/EfficientNet: the pooled features)."""

    def __init__(self, model: torch.nn.Module, pooled: bool = False) -> None:
        super().__init__()
        self.model = model
        self.pooled = pooled

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model(pixel_values=pixel_values)
        return out.pooler_output if self.pooled else out.last_hidden_state


def build_vit(options: dict[str, Any]) -> torch.nn.Module:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(options.get("seed", 0))
    config = ViTConfig(attn_implementation=options.get("attention", "sdpa"))  # ViT-Base/16, 224x224
    return _Pixels(ViTModel(config, add_pooling_layer=False)).eval()


def build_distilbert(options: dict[str, Any]) -> torch.nn.Module:
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(options.get("seed", 0))
    config = DistilBertConfig(attn_implementation=options.get("attention", "sdpa"))
    return _HiddenStates(DistilBertModel(config)).eval()


def build_llama(options: dict[str, Any]) -> torch.nn.Module:
    """A Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention (8 query heads
    sharing 2 key/value heads), SiLU-gated MLP; 6 layers of width 512."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(options.get("seed", 0))
    config = LlamaConfig(
        vocab_size=options.get("vocab", 32000),
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        attn_implementation=options.get("attention", "sdpa"),
    )
    return _HiddenStates(LlamaModel(config)).eval()


def build_convnext(options: dict[str, Any]) -> torch.nn.Module:
    from transformers import ConvNextConfig, ConvNextModel

    torch.manual_seed(options.get("seed", 0))
    return _Pixels(ConvNextModel(ConvNextConfig()), pooled=True).eval()  # ConvNeXt-T: depths 3,3,9,3


def build_efficientnet(options: dict[str, Any]) -> torch.nn.Module:
    from transformers import EfficientNetConfig, EfficientNetModel

    from kiln.zoo.cnn import calibrate_batchnorm

    torch.manual_seed(options.get("seed", 0))
    # transformers' default config is B7 (600x600); these are B0's coefficients
    config = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280)
    model = _Pixels(EfficientNetModel(config), pooled=True)
    for module in model.modules():  # transformers' init zeroes some BatchNorm scales: the output would be 0
        if isinstance(module, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(module.weight, 0.5, 1.5)
            torch.nn.init.normal_(module.bias, 0.0, 0.1)
    calibrate_batchnorm(model, seed=options.get("seed", 0))
    return model.eval()
