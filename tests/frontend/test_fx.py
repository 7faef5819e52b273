"""PyTorch straight to kiln's IR: the core-ATen conversion table checked entry by entry against eager
PyTorch (through torch.export), and torch.compile(backend="kiln") with graph breaks and fallbacks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch")

import kiln  # noqa: E402
from kiln.frontend.fx import CONVERTERS, UnsupportedFxOp, import_exported  # noqa: E402

nn = torch.nn
F = torch.nn.functional


class Lambda(nn.Module):
    def __init__(self, function) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.function = function

    def forward(self, *args):  # type: ignore[no-untyped-def]
        return self.function(*args)


def r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32))


# (name, module, inputs): each exercises the ATen ops named in its id after torch's decompositions
CASES = [
    (
        "conv-bn-relu",
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, stride=2), nn.BatchNorm2d(8), nn.ReLU()),
        (r(2, 3, 9, 9),),
    ),
    ("grouped-dilated-conv", nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4), (r(1, 8, 7, 7),)),
    ("conv-transpose", nn.ConvTranspose2d(4, 3, 3, stride=2), (r(1, 4, 5, 5),)),
    (
        "maxpool-avgpool-adaptive",
        nn.Sequential(nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1)),
        (r(1, 3, 16, 16),),
    ),
    ("linear-gelu-layernorm", nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)), (r(4, 16),)),
    (
        "gelu-tanh-silu-hardswish",
        Lambda(lambda x: F.gelu(x, approximate="tanh") + F.silu(x) + F.hardswish(x)),
        (r(3, 7),),
    ),
    ("softmax-logsoftmax", Lambda(lambda x: F.softmax(x, -1) + F.log_softmax(x, 1)), (r(2, 5, 6),)),
    (
        "bmm-transpose-scale",
        Lambda(lambda a, b: torch.bmm(a, b.transpose(1, 2)) * 0.5 - 1),
        (r(2, 4, 8), r(2, 6, 8, seed=1)),
    ),
    (
        "sdpa",
        Lambda(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        (r(1, 2, 8, 16), r(1, 2, 8, 16, seed=1), r(1, 2, 8, 16, seed=2)),
    ),
    ("reductions", Lambda(lambda x: x.mean(1) + x.sum(1) + x.amax(1) - x.amin(1)), (r(3, 5, 4),)),
    (
        "views-permute-cat-split",
        Lambda(lambda x: torch.cat(x.reshape(2, 3, 4).permute(0, 2, 1).split([1, 2], dim=2)[::-1], 2)),
        (r(6, 4),),
    ),
    (
        "slice-select-unsqueeze-squeeze",
        Lambda(lambda x: x[:, 1:3].unsqueeze(0).squeeze(0)[:, 0] + x.select(1, 2)),
        (r(4, 5),),
    ),
    (
        "embedding-where-compare",
        Lambda(lambda i, x: torch.where(i[:, None] > 2, F.embedding(i, x), -x[:1])),
        (torch.tensor([0, 3, 5, 1]), r(6, 4)),
    ),
    (
        "clamp-pow-rsqrt-exp-log",
        Lambda(lambda x: torch.clamp(x, -1, 1) ** 2 + torch.rsqrt(x.abs() + 1) + torch.exp(-x.abs()).log1p()),
        (r(4, 4),),
    ),
    ("cast-arange-full", Lambda(lambda x: x + torch.arange(4).float() + torch.full((4,), 2.0)), (r(3, 4),)),
    ("pad-flatten", Lambda(lambda x: F.pad(x, (1, 2, 0, 1)).flatten(1)), (r(2, 3, 4),)),
    (
        "index-by-tensors",
        Lambda(lambda x, i, j: x[i, j]),
        (r(5, 6, 3), torch.tensor([[0], [4]]), torch.tensor([1, 5, 2])),
    ),
]


def relative_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm((got - want).ravel()) / max(1e-30, np.linalg.norm(want.ravel())))


@pytest.mark.parametrize(("name", "module", "inputs"), CASES, ids=[c[0] for c in CASES])
def test_the_conversion_table_matches_eager_pytorch(name, module, inputs):
    module = module.eval()
    with torch.no_grad():
        if any(isinstance(m, nn.BatchNorm2d) for m in module.modules()):
            module.train()(*inputs)  # running statistics that are not the identity
            module.eval()
        want = module(*inputs)
    graph = import_exported(torch.export.export(module, inputs))
    assert not any(n.op == "Constant" for n in graph.nodes)
    compiled = kiln.compile(graph)
    got = compiled.run({v.name: t.numpy() for v, t in zip(graph.inputs, inputs)})
    (result,) = got.values()
    assert relative_l2(np.asarray(result, np.float64), want.numpy().astype(np.float64)) <= 1e-5, name


def test_every_table_entry_names_a_core_aten_op_or_a_functional_copy():
    assert len(CONVERTERS) >= 100
    assert all(name.startswith("aten.") for name in CONVERTERS)


def test_an_op_with_no_conversion_is_named():
    module = Lambda(lambda x: torch.special.bessel_j0(x)).eval()
    with pytest.raises(UnsupportedFxOp, match="bessel_j0"):
        import_exported(torch.export.export(module, (r(3),)))


class WithBreak(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):  # type: ignore[no-untyped-def]
        h = torch.relu(self.a(x))
        print("a graph break")
        if h.sum() > 0:  # data-dependent control flow: another break
            h = h * 2
        return F.gelu(self.b(h))


def test_torch_compile_with_graph_breaks_compiles_each_piece(capsys):
    import kiln.torch_backend  # noqa: F401  (registers backend="kiln"; the entry point does too)

    torch._dynamo.reset()
    module = WithBreak().eval()
    x = r(3, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no piece may fall back
        got = torch.compile(module, backend="kiln")(x)
        want = module(x)
    assert "a graph break" in capsys.readouterr().out
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_an_unconvertible_op_falls_back_to_eager_by_name_or_fails_when_asked():
    import kiln.torch_backend  # noqa: F401

    module = Lambda(lambda x: torch.special.bessel_j0(x) + 1).eval()
    x = r(5)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="bessel_j0"):
        got = torch.compile(module, backend="kiln")(x)
    np.testing.assert_allclose(got.numpy(), module(x).numpy(), rtol=1e-6)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="bessel_j0"):
        torch.compile(module, backend="kiln", options={"fallback": False})(x)


def test_a_new_batch_size_compiles_again_and_stays_right():
    import kiln.torch_backend  # noqa: F401

    torch._dynamo.reset()
    module = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)
    ).eval()
    compiled = torch.compile(module, backend="kiln")
    with torch.no_grad():
        for batch in (1, 3, 2):
            x = r(batch, 3, 8, 8, seed=batch)
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-4, atol=1e-5)


def test_the_entry_point_makes_backend_kiln_known_without_importing_kiln():
    import subprocess
    import sys
    from importlib.metadata import entry_points

    if not any(e.name == "kiln" for e in entry_points(group="torch_dynamo_backends")):
        pytest.skip("kiln is not installed with its entry points here (pip install -e . registers them)")
    script = (
        "import sys, torch\n"
        "m = torch.nn.Linear(4, 3).eval()\n"
        "x = torch.randn(2, 4)\n"
        "with torch.no_grad():\n"
        "    y = torch.compile(m, backend='kiln')(x)\n"
        "assert 'kiln.torch_backend' in sys.modules\n"
        "assert torch.allclose(y, m(x), atol=1e-6)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]
