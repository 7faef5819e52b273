"""Tiny random-weight versions of the architectures users bring, exported the way current PyTorch
does (``torch.onnx.export(dynamo=True)``, opset 18): BERT-, GPT-, Llama-family decoders, vision
transformers, CNNs and speech. Each is a real ``transformers`` model class built from a small
config (2 layers, width 32-64), so the graph has the architecture's own spelling of attention,
normalization, rotary embeddings, gated MLPs, relative positions and masks, at a size that exports
and compiles in seconds. Used by the tests (every one must compile with no host fallback and match
eager PyTorch) and by ``kiln zoo arch``.

``export(name)`` -> path of the cached ONNX file; ``inputs(name)`` -> its example feeds;
``eager(name, feeds)`` -> PyTorch's own outputs for the same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError

RECIPE = 1  # bump when the export procedure changes
SEQ = 16  # tokens per example
IMAGE = 32  # pixels per side
SAMPLES = 1600  # audio samples

_DECODER = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
_VISION = {"image_size": IMAGE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}


@dataclass(frozen=True)
class Architecture:
    name: str
    model_class: str  # in transformers
    config_class: str
    config: dict[str, Any] = field(default_factory=dict)
    inputs: str = "tokens"  # tokens | pixels | audio
    family: str = ""


def _arch(name: str, model: str, config: str, inputs: str, family: str, **kwargs: Any) -> Architecture:
    return Architecture(name, model, config, kwargs, inputs, family)


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in [
        # encoders
        _arch("bert", "BertModel", "BertConfig", "tokens", "encoder", intermediate_size=128, **_DECODER),
        _arch("roberta", "RobertaModel", "RobertaConfig", "tokens", "encoder", intermediate_size=128, **_DECODER),
        _arch(
            "deberta-v2",
            "DebertaV2Model",
            "DebertaV2Config",
            "tokens",
            "encoder",
            intermediate_size=128,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            max_relative_positions=32,
            position_buckets=8,
            **_DECODER,
        ),
        _arch(
            "albert",
            "AlbertModel",
            "AlbertConfig",
            "tokens",
            "encoder",
            intermediate_size=128,
            embedding_size=32,
            **_DECODER,
        ),
        _arch(
            "electra",
            "ElectraModel",
            "ElectraConfig",
            "tokens",
            "encoder",
            intermediate_size=128,
            embedding_size=32,
            **_DECODER,
        ),
        _arch(
            "xlm-roberta", "XLMRobertaModel", "XLMRobertaConfig", "tokens", "encoder", intermediate_size=128, **_DECODER
        ),
        _arch(
            "roformer",
            "RoFormerModel",
            "RoFormerConfig",
            "tokens",
            "encoder",
            intermediate_size=128,
            embedding_size=64,
            **_DECODER,
        ),
        _arch("ernie", "ErnieModel", "ErnieConfig", "tokens", "encoder", intermediate_size=128, **_DECODER),
        _arch(
            "mpnet",
            "MPNetModel",
            "MPNetConfig",
            "tokens",
            "encoder",
            intermediate_size=128,
            **_DECODER,
        ),
        _arch(
            "clip-text",
            "CLIPTextModel",
            "CLIPTextConfig",
            "tokens",
            "encoder",
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
        ),
        _arch(
            "t5-encoder",
            "T5EncoderModel",
            "T5Config",
            "tokens",
            "encoder",
            vocab_size=256,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=32,
        ),
        _arch(  # encoder-decoder: the decoder's inputs are the tokens shifted right (ScatterND)
            "bart",
            "BartModel",
            "BartConfig",
            "tokens",
            "encoder-decoder",
            vocab_size=256,
            d_model=64,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=64,
        ),
        _arch(
            "distilbert",
            "DistilBertModel",
            "DistilBertConfig",
            "tokens",
            "encoder",
            vocab_size=256,
            dim=64,
            n_layers=2,
            n_heads=4,
            hidden_dim=128,
        ),
        # decoders
        _arch("gpt2", "GPT2Model", "GPT2Config", "tokens", "decoder", vocab_size=256, n_embd=64, n_layer=2, n_head=4),
        _arch(
            "gptj",
            "GPTJModel",
            "GPTJConfig",
            "tokens",
            "decoder",
            vocab_size=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            rotary_dim=8,
        ),
        _arch(
            "gpt-neo",
            "GPTNeoModel",
            "GPTNeoConfig",
            "tokens",
            "decoder",
            vocab_size=256,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=8,
        ),
        _arch(
            "opt",
            "OPTModel",
            "OPTConfig",
            "tokens",
            "decoder",
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=128,
            word_embed_proj_dim=64,
        ),
        _arch(
            "bloom",
            "BloomModel",
            "BloomConfig",
            "tokens",
            "decoder",
            vocab_size=256,
            hidden_size=64,
            n_layer=2,
            n_head=4,
        ),
        _arch("falcon", "FalconModel", "FalconConfig", "tokens", "decoder", **_DECODER),
        _arch(
            "llama",
            "LlamaModel",
            "LlamaConfig",
            "tokens",
            "decoder",
            intermediate_size=128,
            num_key_value_heads=2,
            **_DECODER,
        ),
        _arch(
            "mistral",
            "MistralModel",
            "MistralConfig",
            "tokens",
            "decoder",
            intermediate_size=128,
            num_key_value_heads=2,
            sliding_window=8,
            **_DECODER,
        ),
        _arch(
            "qwen2",
            "Qwen2Model",
            "Qwen2Config",
            "tokens",
            "decoder",
            intermediate_size=128,
            num_key_value_heads=2,
            **_DECODER,
        ),
        _arch(
            "gemma",
            "GemmaModel",
            "GemmaConfig",
            "tokens",
            "decoder",
            intermediate_size=128,
            num_key_value_heads=1,
            head_dim=16,
            **_DECODER,
        ),
        _arch("phi", "PhiModel", "PhiConfig", "tokens", "decoder", intermediate_size=128, **_DECODER),
        # vision transformers
        _arch("vit", "ViTModel", "ViTConfig", "pixels", "vision", intermediate_size=128, patch_size=8, **_VISION),
        _arch("deit", "DeiTModel", "DeiTConfig", "pixels", "vision", intermediate_size=128, patch_size=8, **_VISION),
        _arch(
            "beit",
            "BeitModel",
            "BeitConfig",
            "pixels",
            "vision",
            intermediate_size=128,
            patch_size=8,
            use_relative_position_bias=True,
            vocab_size=256,
            **_VISION,
        ),
        _arch(
            "swin",
            "SwinModel",
            "SwinConfig",
            "pixels",
            "vision",
            image_size=IMAGE,
            patch_size=2,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 4],
            window_size=4,
        ),
        # CNNs and hybrids
        _arch(
            "convnext",
            "ConvNextModel",
            "ConvNextConfig",
            "pixels",
            "cnn",
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_stages=2,
        ),
        _arch(
            "convnextv2",
            "ConvNextV2Model",
            "ConvNextV2Config",
            "pixels",
            "cnn",
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_stages=2,
        ),
        _arch(
            "resnet",
            "ResNetModel",
            "ResNetConfig",
            "pixels",
            "cnn",
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            layer_type="bottleneck",
        ),
        _arch(
            "mobilevit",
            "MobileViTModel",
            "MobileViTConfig",
            "pixels",
            "cnn",
            image_size=IMAGE,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
        ),
        _arch(
            "segformer",
            "SegformerModel",
            "SegformerConfig",
            "pixels",
            "cnn",
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            num_attention_heads=[1, 2],
            patch_sizes=[7, 3],
            strides=[4, 2],
            mlp_ratios=[2, 2],
        ),
        # speech
        _arch(
            "wav2vec2",
            "Wav2Vec2Model",
            "Wav2Vec2Config",
            "audio",
            "speech",
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            conv_dim=(32, 32),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            feat_extract_norm="layer",
            do_stable_layer_norm=True,
        ),
    ]
}


def get(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise KilnError(f"unknown architecture {name!r}; available: {', '.join(ARCHITECTURES)}") from None


def _first_output(model: Any, kind: str) -> Any:
    """``model`` as a module with named positional inputs and one plain tensor output (its first)."""
    import torch

    class Tokens(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]

    class Pixels(Tokens):
        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return self.model(pixel_values=pixel_values)[0]

    class Audio(Tokens):
        def forward(self, input_values: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return self.model(input_values=input_values)[0]

    return {"tokens": Tokens, "pixels": Pixels, "audio": Audio}[kind]()


def build(name: str, seed: int = 0) -> Any:
    """The eval-mode torch module of ``name`` (random weights from ``seed``)."""
    import torch
    import transformers

    arch = get(name)
    torch.manual_seed(seed)
    model_class = getattr(transformers, arch.model_class)
    try:  # scaled_dot_product_attention where the architecture has it: transformers' default
        model = model_class(getattr(transformers, arch.config_class)(**arch.config, attn_implementation="sdpa"))
    except ValueError:  # "does not support an attention implementation through ... sdpa"
        torch.manual_seed(seed)
        model = model_class(getattr(transformers, arch.config_class)(**arch.config, attn_implementation="eager"))
    _randomize_norms(model, seed)
    return _first_output(model, arch.inputs).eval()


def _randomize_norms(model: Any, seed: int) -> None:
    """transformers initializes norm scales to 1 and biases to 0 (some to 0 scale): make them random
    so a wrong gamma/beta handling shows in the outputs."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            kind = type(module).__name__
            if "Norm" not in kind:
                continue
            for attr, (low, high) in (("weight", (0.5, 1.5)), ("bias", (-0.1, 0.1))):
                tensor = getattr(module, attr, None)
                if isinstance(tensor, torch.Tensor) and tensor.dtype.is_floating_point:
                    tensor.copy_(torch.rand(tensor.shape, generator=generator) * (high - low) + low)
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.running_var is not None:
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)


def inputs(name: str, seed: int = 0, batch: int = 1, seq: int = SEQ, image: int = IMAGE) -> dict[str, np.ndarray]:
    """Example feeds; token models get a padding mask that differs per sample (the first sample's
    last 3 positions, the others' last ``k % seq`` for sample k), so the mask must reach attention."""
    arch = get(name)
    rng = np.random.default_rng(seed)
    if arch.inputs == "pixels":
        return {"pixel_values": rng.standard_normal((batch, 3, image, image)).astype(np.float32)}
    if arch.inputs == "audio":
        return {"input_values": rng.standard_normal((batch, SAMPLES)).astype(np.float32)}
    ids = rng.integers(0, 256, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    for row in range(batch):
        padded = min(seq - 1, 3 if row == 0 else row % seq)  # every row keeps one token
        if padded:
            mask[row, -padded:] = 0
    return {"input_ids": ids, "attention_mask": mask}


# added for issue 49's suite of symbolic sizes (benchmarks/dynamic_architectures.py,
# tests/zoo/test_dynamic_architectures.py); the fixed-size test covers the others
SIZES_SUITE = (
    "albert",
    "electra",
    "xlm-roberta",
    "roformer",
    "ernie",
    "mpnet",
    "clip-text",
    "t5-encoder",
    "convnextv2",
    "bart",
)

DYNAMIC_AXES = {  # symbolic dims of a dynamic export, per input kind
    "tokens": {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
    "pixels": {"pixel_values": {0: "batch", 2: "height", 3: "width"}},
    "audio": {"input_values": {0: "batch", 1: "samples"}},
}


def eager(name: str, feeds: dict[str, np.ndarray], seed: int = 0) -> np.ndarray:
    import torch

    module = build(name, seed)
    with torch.no_grad():
        return module(*(torch.from_numpy(v) for v in feeds.values())).numpy()


def _key(name: str) -> str:
    import torch
    import transformers

    arch = get(name)
    recipe = {
        "arch": arch.name,
        "model": arch.model_class,
        "config": arch.config,
        "recipe": RECIPE,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:12]


def export(
    name: str, progress: Callable[[str], None] | None = None, exporter: str = "dynamo", dynamic: bool = False
) -> Path:
    """Path of ``name``'s export, made once into the zoo cache: ``exporter`` "dynamo" (opset 18) or
    "torchscript" (opset 17); ``dynamic``: symbolic batch and sequence length (image: batch, height
    and width; audio: batch and samples), named as in ``DYNAMIC_AXES``."""
    from kiln import zoo

    if exporter not in ("dynamo", "torchscript"):
        raise KilnError(f"unknown exporter {exporter!r}; choose dynamo or torchscript")
    opset = 18 if exporter == "dynamo" else 17
    suffix = ("" if exporter == "dynamo" else "-ts") + ("-dyn" if dynamic else "")
    path = zoo.cache_dir() / "arch" / f"{name}{suffix}-{_key(name)}.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"exporting architecture {name} ({exporter}, opset {opset}); cached at {path}")
    axes = {**DYNAMIC_AXES[get(name).inputs], "output": {0: "batch"}} if dynamic else None
    example = inputs(name, batch=2) if dynamic else inputs(name)  # batch 2: no exporter specializes it to 1
    zoo.export_module(build(name), example, path, opset, axes, ("output",), exporter=exporter)
    os.utime(path)
    return path
