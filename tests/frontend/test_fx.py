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
    with torch.no_grad(), pytest.raises(Exception, match="bessel_j0") as refused:
        torch.compile(module, backend="kiln", options={"fallback": False})(x)
    assert str(refused.value).count("kiln cannot compile this graph") == 1  # said once, not wrapped again


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


def _compiles(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records if r.name == "kiln.torch_backend" and "compiles" in r.getMessage()]


def _convnet() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()


def test_dims_dynamo_marks_dynamic_become_kiln_symbolic_dims(caplog):
    """dynamic=True: one kiln model whose batch is a symbol serves every batch size (dynamo also
    hands BatchNorm's eps as a 0-d tensor here: it is a weight, folded). Height and width are
    symbols too (the flattened features are their product, computed from the input's shape)."""
    import logging

    import kiln.torch_backend  # noqa: F401

    torch._dynamo.reset()
    module = _convnet()
    compiled = torch.compile(module, backend="kiln", dynamic=True)
    with caplog.at_level(logging.INFO, logger="kiln.torch_backend"), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for batch in (2, 5, 7):  # (dynamo specializes 1, and duck-sizes a 3 with the channels)
            x = r(batch, 3, 8, 8, seed=batch)
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-4, atol=1e-5)
    compiles = _compiles(caplog)
    assert len(compiles) == 1, compiles
    assert compiles[0].count("'s") == 3 and ", 3, 's" in compiles[0], compiles[0]  # [s.., 3, s.., s..]


class _FlattenedPlanes(nn.Module):
    """A convolution whose planes are flattened (B, C, H*W: a product of two symbols) and
    normalized over the flattened dim, then pooled through a view back to (B, C, H, W)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        flat = y.flatten(2).softmax(-1)  # (B, 4, H*W)
        return flat.view(y.shape).mean(dim=(2, 3)) * flat.shape[-1]  # H*W as a number too


def test_a_flattened_height_times_width_stays_symbolic(caplog):
    """dynamic=True on a net that flattens H*W: one kiln graph whose batch, height and width are
    all symbols (the view's sizes computed from the input's shape), right at every size."""
    import logging

    import kiln.torch_backend  # noqa: F401

    torch._dynamo.reset()
    module = _FlattenedPlanes().eval()
    compiled = torch.compile(module, backend="kiln", dynamic=True)
    with caplog.at_level(logging.INFO, logger="kiln.torch_backend"), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for batch, size in ((2, 8), (3, 10), (5, 6), (2, 13)):
            x = r(batch, 3, size, size, seed=size)
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-4, atol=1e-5)
    compiles = _compiles(caplog)
    assert len(compiles) == 1, compiles
    assert compiles[0].count("'s") == 3, compiles[0]  # batch, height, width: [s.., 3, s.., s..]


def test_automatic_dynamic_shapes_recompile_once_as_symbolic(caplog):
    """Without dynamic=True, dynamo compiles the first batch static and, when it changes, the graph
    again with the batch dynamic: two kiln compiles for four batch sizes, the second symbolic."""
    import logging

    import kiln.torch_backend  # noqa: F401

    torch._dynamo.reset()
    module = _convnet()
    compiled = torch.compile(module, backend="kiln")
    with caplog.at_level(logging.INFO, logger="kiln.torch_backend"), torch.no_grad():
        for batch in (4, 3, 2, 6):
            x = r(batch, 3, 8, 8, seed=batch)
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-4, atol=1e-5)
    compiles = _compiles(caplog)
    assert len(compiles) == 2, compiles
    assert "[4, 3, 8, 8]" in compiles[0] and "'s" in compiles[1], compiles


def test_a_dynamic_sequence_length_through_attention(caplog):
    """mark_dynamic on a transformer layer's sequence axis: views split and merge heads around
    the symbol; every length gives eager's result from one compile."""
    import logging

    import kiln.torch_backend  # noqa: F401

    torch._dynamo.reset()
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    compiled = torch.compile(layer, backend="kiln")
    with caplog.at_level(logging.INFO, logger="kiln.torch_backend"), torch.no_grad():
        for length in (7, 5, 12):
            x = r(2, length, 16, seed=length)
            torch._dynamo.mark_dynamic(x, 1)
            np.testing.assert_allclose(compiled(x).numpy(), layer(x).numpy(), rtol=1e-4, atol=1e-4)
    compiles = _compiles(caplog)
    assert len(compiles) == 1 and "[2, 's" in compiles[0], compiles


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


def _counting(monkeypatch, name: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Count the conversions of one table entry (a test then knows the path it covers was taken)."""
    import kiln.frontend.aten as aten

    calls: list[int] = []
    original = aten.CONVERTERS[name]

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setitem(aten.CONVERTERS, name, counted)
    return calls


@pytest.mark.parametrize(
    "norm_first, activation, masks",
    [(False, "relu", "none"), (True, "gelu", "none"), (False, "gelu", "causal"), (True, "relu", "padding")],
)
def test_the_transformer_encoder_fast_path_converts(monkeypatch, norm_first, activation, masks):
    """nn.TransformerEncoderLayer in eval mode without gradients runs one fused op
    (aten._transformer_encoder_layer_fwd); kiln writes it out, masks included."""
    import kiln.torch_backend  # noqa: F401

    calls = _counting(monkeypatch, "aten._transformer_encoder_layer_fwd.default")
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        16, 4, 32, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    x = r(2, 6, 16)
    kwargs: dict = {}
    if masks == "causal":
        kwargs["src_mask"] = nn.Transformer.generate_square_subsequent_mask(6)
        kwargs["is_causal"] = True
    elif masks == "padding":
        kwargs["src_key_padding_mask"] = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    compiled = torch.compile(layer, backend="kiln", options={"fallback": False})
    with torch.no_grad():
        expected = layer(x, **kwargs)
        got = compiled(x, **kwargs)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5)
    assert calls, "the fast path was not taken: this case covers nothing"


class Sdpa(nn.Module):
    def __init__(self, causal: bool = False, mask: torch.Tensor | None = None, scale: float | None = None) -> None:
        super().__init__()
        self.causal, self.mask, self.scale = causal, mask, scale

    def forward(self, q, k, v):  # type: ignore[no-untyped-def]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal, scale=self.scale)


SDPA_CASES = {
    "plain": {},
    "causal": {"causal": True},
    "float-mask": {"mask": r(10, 12, seed=5)},
    "bool-mask": {"mask": torch.from_numpy(np.random.default_rng(6).random((2, 1, 10, 12)) > 0.3)},
    "scale": {"scale": 0.3},
}


@pytest.mark.parametrize("case", SDPA_CASES)
def test_scaled_dot_product_attention_is_kilns_attention_kernel(case):
    """F.scaled_dot_product_attention (kept whole through torch's decompositions) compiles to one
    attention kernel, through torch.export and through torch.compile."""
    import kiln.torch_backend

    module = Sdpa(**SDPA_CASES[case])
    q, k, v = r(2, 3, 10, 16), r(2, 3, 12, 16, seed=1), r(2, 3, 12, 8, seed=2)
    if case == "causal":
        k, v = k[:, :, :10], v[:, :, :10]
    expected = module(q, k, v).numpy()
    model = kiln.compile(module, example_inputs=(q, k, v))
    kinds = [kernel.kind for plan in model.plans for step in plan.steps for kernel in getattr(step, "kernels", [])]
    assert kinds == ["attention"], kinds
    got = model.run({"input0": q.numpy(), "input1": k.numpy(), "input2": v.numpy()})
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kiln", options={"fallback": False})
    with torch.no_grad():
        np.testing.assert_allclose(compiled(q, k, v).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_causal_attention_with_a_dynamic_sequence_length(monkeypatch, caplog):
    """is_causal with the sequence symbolic: the mask is built from the scores' shape at run time."""
    import logging

    import kiln.torch_backend  # noqa: F401

    calls = _counting(monkeypatch, "aten._scaled_dot_product_flash_attention_for_cpu.default")
    torch._dynamo.reset()
    module = Sdpa(causal=True)
    compiled = torch.compile(module, backend="kiln", options={"fallback": False})
    with caplog.at_level(logging.INFO, logger="kiln.torch_backend"), torch.no_grad():
        for length in (6, 9, 4):
            q, k, v = (r(2, 2, length, 8, seed=length + i) for i in range(3))
            for t in (q, k, v):
                torch._dynamo.mark_dynamic(t, 2)
            np.testing.assert_allclose(compiled(q, k, v).numpy(), module(q, k, v).numpy(), rtol=1e-4, atol=1e-5)
    compiles = _compiles(caplog)
    assert calls and len(compiles) == 1 and "'s" in compiles[0], compiles
