"""Small models of the sizes an FPGA holds on chip (the fpga target's zoo; they run on every
target): hls4ml's jet-tagging MLP, an MNIST-size CNN and one transformer encoder block.

- ``jet-mlp``: 16 -> 64 -> 32 -> 32 -> 5 with ReLU and a softmax (the LHC jet-tagging network
  hls4ml's tutorials use), inputs [batch, 16];
- ``mnist-cnn``: conv 3x3 (8) -> ReLU -> max-pool 2 -> conv 3x3 (16) -> ReLU -> max-pool 2 ->
  dense 10 -> softmax on [batch, 1, 28, 28];
- ``transformer-block``: a pre-norm encoder block (LayerNorm, 2-head self-attention, LayerNorm,
  GELU MLP 32 -> 64 -> 32, residuals) on [batch, 8, 32].

Random weights from a fixed seed, as every zoo model.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch
from torch import nn


def jet_mlp(options: dict[str, Any]) -> nn.Module:
    torch.manual_seed(options.get("seed", 0))
    sizes = [16, 64, 32, 32]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 5), nn.Softmax(-1)).eval()


def mnist_cnn(options: dict[str, Any]) -> nn.Module:
    torch.manual_seed(options.get("seed", 0))
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, 10),
        nn.Softmax(-1),
    ).eval()


class TransformerBlock(nn.Module):
    """Pre-norm encoder block, attention spelled out (matmul, scale, softmax, matmul)."""

    def __init__(self, width: int = 32, heads: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.heads, self.scale = heads, 1.0 / math.sqrt(width // heads)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        head = width // self.heads
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, head).transpose(1, 2) for t in (q, k, v))
        scores = torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1)
        attended = (scores @ v).transpose(1, 2).reshape(batch, seq, width)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


def transformer_block(options: dict[str, Any]) -> nn.Module:
    torch.manual_seed(options.get("seed", 0))
    return TransformerBlock().eval()


SHAPES = {"jet-mlp": (16,), "mnist-cnn": (1, 28, 28), "transformer-block": (8, 32)}


def inputs_of(name: str):
    def make(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {"x": rng.standard_normal((options.get("batch", 1), *SHAPES[name])).astype(np.float32)}

    return make
