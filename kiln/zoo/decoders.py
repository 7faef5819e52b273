"""Decoders' decode steps with their KV cache as inputs and outputs: one generation step as a model.

A Hugging Face causal LM (random weights from a tiny config and a fixed seed) wrapped so one call
is one step: the new tokens ``ids`` [batch, new], the attention mask [batch, total] and each
layer's past keys and values [batch, kv_heads, past, head_dim] -> the logits [batch, new, vocab]
and each layer's present keys and values [batch, kv_heads, total, head_dim], total = past + new.
Exported with ``past``, ``new`` and ``total`` symbolic (and the batch), as a generation loop feeds
it: the prompt in one step (``new`` its length), then one token a step, the past length growing by
one each token, so a compiler that compiles per length compiles per token.

    path = decoders.export("gpt2", exporter="torchscript")
    feeds = decoders.inputs("gpt2", past=7)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError


@dataclass(frozen=True)
class Decoder:
    name: str
    config_class: str
    model_class: str
    config: dict[str, Any]

    @property
    def layers(self) -> int:
        return int(self.config.get("n_layer", self.config.get("num_hidden_layers", 2)))

    @property
    def kv_heads(self) -> int:
        heads = self.config.get("n_head", self.config.get("num_attention_heads"))
        return int(self.config.get("num_key_value_heads", heads))

    @property
    def head_dim(self) -> int:
        width = self.config.get("n_embd", self.config.get("hidden_size"))
        return int(width) // int(self.config.get("n_head", self.config.get("num_attention_heads")))

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])


_SMALL = {"vocab_size": 256, "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128}
DECODERS = {
    "gpt2": Decoder(
        "gpt2", "GPT2Config", "GPT2LMHeadModel", {"vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4}
    ),
    "llama": Decoder(
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        {**_SMALL, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512},
    ),
    "qwen2": Decoder(
        "qwen2",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {**_SMALL, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512},
    ),
    # full-size: GPT-2 (124M parameters) as released; random weights (nothing is downloaded)
    "gpt2-124m": Decoder(
        "gpt2-124m", "GPT2Config", "GPT2LMHeadModel", {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12}
    ),
    # Qwen2.5-0.5B's shapes (494M parameters, the embedding tied to the head; grouped-query attention,
    # 14 heads over 2 key/value heads); random weights. The position range is cut to 4,096 (a decode
    # step's rotary tables are computed, not stored: the cut changes no weight)
    "qwen2-0.5b": Decoder(
        "qwen2-0.5b",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            "vocab_size": 151936,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
        },
    ),
    # Llama-3.2-1B's shapes (1.24B parameters, the embedding tied to the head; grouped-query attention,
    # 32 heads over 8 key/value heads, SwiGLU of 8,192); random weights; the position range cut to
    # 4,096 and no rope scaling (neither changes a weight's shape or a token's bytes)
    "llama-1b": Decoder(
        "llama-1b",
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "vocab_size": 128256,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
            "rope_theta": 500000.0,
        },
    ),
}
RECIPE = 2  # bump when the wrapper or the export changes (the cache key)


def get(name: str) -> Decoder:
    if name not in DECODERS:
        raise KilnError(f"unknown decoder {name!r}; known: {', '.join(sorted(DECODERS))}")
    return DECODERS[name]


def build(name: str, seed: int = 0) -> Any:
    """The decode-step module of ``name`` (torch), random weights from ``seed``."""
    import torch
    import transformers
    from transformers.cache_utils import DynamicCache

    decoder = get(name)
    torch.manual_seed(seed)
    config = getattr(transformers, decoder.config_class)(**decoder.config)
    config._attn_implementation = "eager"
    model = getattr(transformers, decoder.model_class)(config).eval()

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def step(self, ids, mask, past):  # type: ignore[no-untyped-def]
            cache = DynamicCache()
            for i in range(decoder.layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    # forward takes each past tensor as a named parameter (past_0, past_1, ...), not *past: the
    # dynamo exporter maps dynamic axes by parameter name
    pasts = names(name)[0][2:]
    scope: dict[str, Any] = {}
    exec(
        f"def forward(self, ids, mask, {', '.join(pasts)}):\n    return self.step(ids, mask, ({', '.join(pasts)},))",
        scope,
    )
    Step.forward = scope["forward"]
    return Step().eval()


def names(name: str) -> tuple[list[str], list[str]]:
    """(input names, output names) of ``name``'s decode step."""
    count = 2 * get(name).layers
    return ["ids", "mask", *(f"past_{i}" for i in range(count))], ["logits", *(f"present_{i}" for i in range(count))]


def inputs(name: str, past: int, batch: int = 1, new: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds of one step at ``past`` cached positions (``new`` tokens each), mask all ones."""
    decoder = get(name)
    rng = np.random.default_rng(seed + 7919 * past + 31 * batch)
    feeds = {
        "ids": rng.integers(0, decoder.vocab, (batch, new)).astype(np.int64),
        "mask": np.ones((batch, past + new), np.int64),
    }
    for key in names(name)[0][2:]:
        shape = (batch, decoder.kv_heads, past, decoder.head_dim)
        feeds[key] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def export(name: str, exporter: str = "torchscript") -> Path:
    """Path of ``name``'s decode step as ONNX, made once into the zoo cache: ``past``, ``new`` and
    ``total`` symbolic (``batch`` too)."""
    import torch
    import transformers

    from kiln import zoo

    if exporter not in ("dynamo", "torchscript"):
        raise KilnError(f"unknown exporter {exporter!r}; choose dynamo or torchscript")
    decoder = get(name)
    recipe = [decoder.config, RECIPE, exporter, torch.__version__, transformers.__version__]
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:12]
    stem = f"{name}-step-{exporter}-{key}"
    path = zoo.cache_dir() / "decoders" / stem / f"{stem}.onnx"  # (a folder each: a model past 2 GB
    if path.exists():  # keeps its weights beside it as external-data files, named by the exporter)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    inputs_, outputs = names(name)
    axes: dict[str, dict[int, str]] = {
        "ids": {0: "batch", 1: "new"},
        "mask": {0: "batch", 1: "total"},
        "logits": {0: "batch", 1: "new"},
    }
    axes.update({n: {0: "batch", 2: "past"} for n in inputs_[2:]})
    axes.update({n: {0: "batch", 2: "total"} for n in outputs[1:]})
    example = inputs(name, past=5, batch=2, new=3)  # batch 2, past 5, 3 new: no exporter specializes them
    opset = 17 if exporter == "torchscript" else 18
    zoo.export_module(build(name), example, path, opset, axes, tuple(outputs), exporter=exporter)
    os.utime(path)
    return path
