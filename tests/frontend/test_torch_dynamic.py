"""torch.compile(dynamic=True) on conv nets: dynamo's symbolic dims (a flattened H*W included)
become declared ranges, and one kiln library serves every size in them (kernels take the sizes
at run time): no C compile after the first call."""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch")

import kiln.torch_backend  # noqa: E402,F401
from kiln.driver.native import NativeModel  # noqa: E402

nn = torch.nn


class FlattenedPlanes(nn.Module):
    """A stride-2 convolution whose planes are flattened (B, C, H'*W': a product of two sizes),
    normalized over the flattened dim, viewed back to (B, C, H', W'), pooled and scaled by H'*W'
    (a size used as a number)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.down = nn.Conv2d(4, 8, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.down(torch.relu(self.conv(x))))
        flat = y.flatten(2).softmax(-1)
        return flat.view(y.shape).mean(dim=(2, 3)) * flat.shape[-1]


def image(batch: int, size: int) -> torch.Tensor:
    rng = np.random.default_rng(batch * 1000 + size)
    return torch.from_numpy(rng.standard_normal((batch, 3, size, size)).astype(np.float32))


@pytest.fixture
def builds(monkeypatch):  # type: ignore[no-untyped-def]
    """Every library kiln builds (a variant kept), as a list that grows."""
    built: list[tuple] = []
    keep = NativeModel._keep

    def counted(self, key, executable):  # type: ignore[no-untyped-def]
        built.append(key)
        return keep(self, key, executable)

    monkeypatch.setattr(NativeModel, "_keep", counted)
    return built


def run(compiled, module, sizes) -> None:  # type: ignore[no-untyped-def]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for batch, size in sizes:
            x = image(batch, size)
            got, want = compiled(x), module(x)
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{(batch, size)}")


def dynamic_planes():  # type: ignore[no-untyped-def]
    """A fresh FlattenedPlanes and its torch.compile(dynamic=True) with kiln (dynamo's caches reset)."""
    torch._dynamo.reset()
    module = FlattenedPlanes().eval()
    return module, torch.compile(module, backend="kiln", dynamic=True)


def messages(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records]


def test_a_flattened_height_times_width_builds_one_library(caplog, builds):
    """dynamic=True: after the first call, sizes 6..37 at several batches build nothing, and each
    equals eager (the H'*W' product, the view back and the scale read the sizes at run time)."""
    module, compiled = dynamic_planes()
    with caplog.at_level(logging.INFO, logger="kiln"):
        run(compiled, module, [(2, 8)])
        first = len(builds)
        run(compiled, module, [(3, 10), (5, 6), (2, 13), (4, 37), (2, 21)])
    assert first >= 1 and len(builds) == first, builds  # nothing built after the first call
    said = messages(caplog)
    assert any("kernels take the sizes at run time" in m for m in said), said
    assert any("no upper bound" in m and "64" in m for m in said), said  # the default range, said


def test_a_size_beyond_the_default_range_widens_it_once(caplog, builds):
    """An unbounded dim serves up to max(2 x its first size, 64); a larger call builds once for a
    range that doubles, and sizes inside that range build nothing more."""
    module, compiled = dynamic_planes()
    with caplog.at_level(logging.INFO, logger="kiln"):
        run(compiled, module, [(2, 8)])
        first = len(builds)
        run(compiled, module, [(2, 70)])
        widened = len(builds)
        run(compiled, module, [(2, 100), (3, 9), (2, 140)])
    assert widened > first and len(builds) == widened, builds
    assert any("serves 2..140" in m or "serves 3..140" in m for m in messages(caplog)), messages(caplog)


def test_mark_dynamic_bounds_are_the_declared_range(caplog, builds):
    """torch._dynamo.mark_dynamic(x, d, min=, max=) is the range kiln declares: no default is
    chosen, and every size in it runs from the first build."""
    torch._dynamo.reset()
    module = FlattenedPlanes().eval()
    compiled = torch.compile(module, backend="kiln")
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        for size in (12, 30, 7, 40):
            x = image(2, size)
            for d in (2, 3):
                torch._dynamo.mark_dynamic(x, d, min=6, max=40)
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-4, atol=1e-4)
            if size == 12:
                first = len(builds)
    assert len(builds) == first, builds
    said = messages(caplog)
    assert not any("no upper bound" in m for m in said), said
    assert any("kernels take the sizes at run time" in m and "(6, 40)" in m for m in said), said


SCALE = 2.0  # a module global float: dynamo passes it (and math.pi) as a 0-d tensor under dynamic=True


class GeluNew(nn.Module):
    """GPT-2/ALBERT's tanh GELU: math.sqrt(2.0 / math.pi), and a global float the caller may change."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3))) * SCALE


def test_python_floats_dynamo_passes_as_tensors_are_folded_and_guarded():
    """They were a symbolic float (``sqrt(2.0 / zuf0)``) kiln has no conversion for, so the whole
    graph ran eagerly; now kiln folds their values, and a call with another value runs eagerly."""
    global SCALE
    import torch._dynamo

    torch._dynamo.reset()
    model = GeluNew().eval()
    compiled = torch.compile(model, backend="kiln", dynamic=True, options={"fallback": False})
    x = torch.randn(3, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "runs eagerly" would be an error here
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(x[:2]), model(x[:2]), rtol=1e-5, atol=1e-5)
    try:
        SCALE = 3.0  # the folded value no longer holds: the guard runs the graph eagerly
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    finally:
        SCALE = 2.0
