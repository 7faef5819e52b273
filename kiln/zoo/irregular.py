"""The seeds' "irregular architectures": a GCN on a synthetic graph and a DLRM-style recommender."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def synthetic_graph(nodes: int, edges_per_node: int, seed: int) -> np.ndarray:
    """Symmetrically normalized adjacency D^-1/2 (A + I) D^-1/2 of a random graph (dense)."""
    rng = np.random.default_rng(seed)
    adjacency = np.eye(nodes, dtype=np.float32)
    for source in range(nodes):
        for target in rng.choice(nodes, size=edges_per_node, replace=False):
            adjacency[source, target] = adjacency[target, source] = 1.0
    degree = adjacency.sum(axis=1)
    scale = 1.0 / np.sqrt(degree)
    return (adjacency * scale[:, None] * scale[None, :]).astype(np.float32)


class GCN(nn.Module):
    """Two graph-convolution layers (Kipf & Welling): softmax(A relu(A X W1) W2)."""

    def __init__(self, adjacency: np.ndarray, features: int = 128, hidden: int = 64, classes: int = 16) -> None:
        super().__init__()
        self.register_buffer("adjacency", torch.from_numpy(adjacency))
        self.layer1 = nn.Linear(features, hidden)
        self.layer2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.adjacency @ self.layer1(x))
        return torch.log_softmax(self.adjacency @ self.layer2(hidden), dim=-1)


class DLRM(nn.Module):
    """DLRM-style: bottom MLP on dense features, embedding lookups for sparse ones, pairwise dot
    interactions, top MLP with a sigmoid click probability."""

    def __init__(self, dense: int = 13, tables: int = 8, rows: int = 10000, dim: int = 32) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.embeddings = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 64), nn.ReLU(), nn.Linear(64, 1))
        count = tables + 1
        rows_index, cols_index = np.tril_indices(count, -1)
        self.register_buffer("pair_rows", torch.from_numpy(rows_index.astype(np.int64)))
        self.register_buffer("pair_cols", torch.from_numpy(cols_index.astype(np.int64)))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom(dense)
        vectors = [bottom] + [table(sparse[:, i]) for i, table in enumerate(self.embeddings)]
        stacked = torch.stack(vectors, dim=1)  # [batch, tables + 1, dim]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        return torch.sigmoid(self.top(torch.cat([bottom, dots], dim=1)))
