"""Real data in CI: scikit-learn's ``load_digits`` (1,797 real 8x8 handwritten digits, shipped
inside the package) and two small models the zoo trains on it, deterministically, in seconds.

- the split: ``train_test_split(test_size=0.25, random_state=0, stratify=labels)``, 1,347
  training and 450 test images; pixels (0..16) scaled to [0, 1];
- ``digits-mlp``: 64 -> 64 -> ReLU -> 10, inputs [batch, 64];
- ``digits-cnn``: conv 3x3 (8) -> ReLU -> conv 3x3 (16) -> ReLU -> max-pool 2 -> dense 10, inputs
  [batch, 1, 8, 8];
- training: Adam, full-batch steps in a fixed order from ``torch.manual_seed(seed)``, one thread
  and deterministic algorithms (the same weights on every machine kiln's tests run on, up to the
  CPU's float rounding, which the accuracy bounds absorb).

The outputs are logits; top-1 on the test split is the accuracy (``test_split``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

STEPS = {"digits-mlp": 300, "digits-cnn": 150}  # full-batch Adam steps (about a second each model)
SHAPES = {"digits-mlp": (64,), "digits-cnn": (1, 8, 8)}


@lru_cache(maxsize=1)
def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)
    train_x, test_x, train_y, test_y = train_test_split(
        images, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    return train_x, test_x, train_y.astype(np.int64), test_y.astype(np.int64)


def test_split(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The 450 held-out images shaped for ``name``'s input, and their labels."""
    _, test_x, _, test_y = _split()
    return test_x.reshape(-1, *SHAPES[name]), test_y


def _module(name: str) -> Any:
    from torch import nn

    if name == "digits-mlp":
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 10),
    )


def trained(name: str, seed: int = 0) -> Any:
    """``name`` trained on the training split (eval mode)."""
    import torch

    train_x, _, train_y, _ = _split()
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        model = _module(name)
        x = torch.from_numpy(train_x.reshape(-1, *SHAPES[name]))
        y = torch.from_numpy(train_y)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(STEPS[name]):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return model.eval()


def builder(name: str):  # type: ignore[no-untyped-def]
    def build(options: dict[str, Any]) -> Any:
        return trained(name, options.get("seed", 0))

    return build


def inputs(name: str):  # type: ignore[no-untyped-def]
    def make(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
        """Real training images (never the test split: int8 and fpga calibrate on these), ``batch``
        of them, picked by ``seed``."""
        train_x, _, _, _ = _split()
        images = train_x.reshape(-1, *SHAPES[name])
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(images), size=options.get("batch", 1), replace=False)
        return {"x": np.ascontiguousarray(images[picks])}

    return make
