"""torch.compile(dynamic=True) on a text encoder written the way transformers writes one under
dynamo: Linear layers over [batch, seq, hidden] (torch flattens those by integer sizes), a
padding mask looked up as ``mask[batch_idx, kv_idx]`` with aranges, ids and mask that dynamo
gives a batch symbol each. One kiln compile per dynamo graph serves every later size: the batch
proven sample-parallel, the sequence padded (issue 49)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch")

import kiln.torch_backend  # noqa: E402,F401
from kiln.driver.variants import plans_compiled  # noqa: E402

nn = torch.nn
F = torch.nn.functional


class Encoder(nn.Module):
    def __init__(self, vocab: int = 50, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(128, hidden)
        self.register_buffer("position_ids", torch.arange(128).expand(1, -1), persistent=False)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq = ids.shape
        x = self.tokens(ids) + self.positions(self.position_ids[:, :seq])
        # transformers' sdpa mask under dynamo: the padding mask read by index tensors
        batch_idx = torch.arange(batch)[:, None, None, None]
        q_idx = torch.arange(seq)[None, None, :, None]
        kv_idx = torch.arange(seq)[None, None, None, :]
        allowed = (q_idx >= 0) & mask.bool()[batch_idx, kv_idx]  # [batch, 1, seq, seq]
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.norm(x + self.out(attended.transpose(1, 2).reshape(batch, seq, -1)))


def feeds(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(batch * 100 + seq)
    ids = torch.from_numpy(rng.integers(0, 50, (batch, seq)))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for row in range(batch):  # a padding mask that differs per sample; every row keeps a token
        mask[row, seq - min(seq - 1, row % 3) :] = 0 if row % 3 else 1
    return ids, mask


def check(compiled, module, sizes) -> None:  # type: ignore[no-untyped-def]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for batch, seq in sizes:
            ids, mask = feeds(batch, seq)
            got, want = compiled(ids, mask), module(ids, mask)
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{(batch, seq)}")


def compiles_once(module: nn.Module, later: list[tuple[int, int]]) -> None:
    """``torch.compile(module, dynamic=True)`` with kiln (dynamo's caches reset): the first call at
    (2, 16) compiles, then every size in ``later`` matches eager and compiles no plan."""
    torch._dynamo.reset()
    compiled = torch.compile(module.eval(), backend="kiln", dynamic=True)
    check(compiled, module, [(2, 16)])
    compiled_so_far = plans_compiled()
    check(compiled, module, later)
    assert plans_compiled() == compiled_so_far, "a size compiled after the first call"


def test_an_encoder_compiles_once_per_dynamo_graph(monkeypatch):
    """After the first call at batch and length >= 2, sizes inside the ranges compile no plan:
    the Linears keep the batch and length symbolic (not specialized by torch's flattening), the
    ids' and the mask's batch are one symbol, the batch runs from size classes and the length
    pads."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    compiles_once(Encoder(), [(3, 7), (5, 13), (8, 64), (4, 31), (2, 2)])


class ExpandedMaskEncoder(Encoder):
    """The older spelling (transformers' ``_prepare_4d_attention_mask``): the key mask expanded
    over the queries, ``mask[:, None, None, :].expand(batch, 1, seq, seq)``."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq = ids.shape
        x = self.tokens(ids) + self.positions(self.position_ids[:, :seq])
        allowed = mask.bool()[:, None, None, :].expand(batch, 1, seq, seq)
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.norm(x + self.out(attended.transpose(1, 2).reshape(batch, seq, -1)))


def test_a_key_mask_expanded_over_the_queries_pads(monkeypatch):
    """The expanded query dim of the mask is padded too (each padded row a copy), so the length
    pads and later sizes compile nothing."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    compiles_once(ExpandedMaskEncoder(), [(3, 7), (5, 13), (8, 64), (4, 31)])


def test_inputs_held_equal_by_a_guard_still_run_when_they_differ(monkeypatch):
    """Two inputs whose batch dims were equal at the first call share kiln's symbol; a call where
    they differ is not run by that model (it compiles alone) and still matches eager."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    torch._dynamo.reset()

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.proj(x).sum(0) + self.proj(y).sum(0)

    module = Two().eval()
    compiled = torch.compile(module, backend="kiln", dynamic=True)
    rng = np.random.default_rng(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for first, second in [(3, 3), (4, 4), (5, 2), (2, 6)]:
            x = torch.from_numpy(rng.standard_normal((first, 8)).astype(np.float32))
            y = torch.from_numpy(rng.standard_normal((second, 8)).astype(np.float32))
            np.testing.assert_allclose(compiled(x, y).numpy(), module(x, y).numpy(), rtol=1e-4, atol=1e-4)


class Positions(nn.Module):
    """A buffer sliced to the length read from the input (``position_ids[:, :seq]``), an int
    arange times a float tensor (BLOOM's ALiBi: torch promotes to float) and a ``full_like`` in
    another dtype over symbolic sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(64.0).expand(1, -1) / 64, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        slopes = x.mean(-1, keepdim=True) * torch.arange(seq)  # float * int64
        ones = torch.full_like(x, 1, dtype=torch.int64)  # int64 over [batch, seq]
        return x + self.table[:, :seq] + slopes + ones


def test_sizes_read_from_inputs_stay_symbolic_in_slices_promotions_and_fills(monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    torch._dynamo.reset()
    module = Positions().eval()
    compiled = torch.compile(module, backend="kiln", dynamic=True)
    rng = np.random.default_rng(1)
    sizes = [(2, 16), (3, 7), (5, 40), (2, 2)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for i, (batch, seq) in enumerate(sizes):
            x = torch.from_numpy(rng.standard_normal((batch, seq)).astype(np.float32))
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-5, atol=1e-5)
            if i == 0:
                first = plans_compiled()
    assert plans_compiled() == first, "a size compiled after the first call"


def test_a_converter_that_reads_a_symbolic_size_as_a_number_is_caught(monkeypatch):
    """A conversion that fixes a trace's symbol to its example's number (``int(end)`` of a slice)
    would make a model for one size only: kiln notices the fixed symbol and compiles per size
    instead, so every size still matches."""
    from kiln.frontend import aten

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    real = aten.CONVERTERS["aten.slice_copy.Tensor"]

    def careless(fx, x, dim=0, start=None, end=None, step=1):  # type: ignore[no-untyped-def]
        return real(fx, x, dim, None if start is None else int(start), None if end is None else int(end), step)

    monkeypatch.setitem(aten.CONVERTERS, "aten.slice_copy.Tensor", careless)
    monkeypatch.setitem(aten.CONVERTERS, "aten.slice.Tensor", careless)
    torch._dynamo.reset()
    module = Positions().eval()
    compiled = torch.compile(module, backend="kiln", dynamic=True)
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for batch, seq in [(2, 16), (3, 7), (4, 33)]:
            x = torch.from_numpy(rng.standard_normal((batch, seq)).astype(np.float32))
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-5, atol=1e-5)


class Disentangled(nn.Module):
    """DeBERTa's spellings: integer distances divided as floats (``log(distance / 2)``: torch's
    true division), a table repeated once per sample (``repeat(batch, 1, 1)``) and heads folded
    into the batch (``[batch * 4, seq, seq]``: a dim that is 4 times a symbol)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq = x.shape[0], x.shape[1]
        positions = torch.arange(seq)
        distance = (positions[None, :] - positions[:, None]).abs() + 1  # int64 [seq, seq]
        bias = torch.log(distance / 2)  # float
        table = self.table.unsqueeze(0).repeat(batch, 1, 1)  # [batch, 8, 16]
        scores = (x @ table).unsqueeze(1).expand(batch, 4, seq, 16).reshape(batch * 4, seq, 16)
        mixed = scores @ scores.transpose(1, 2) + bias  # [batch*4, seq, seq]
        return mixed.softmax(-1).reshape(batch, 4, seq, seq).sum(1)


def test_integer_division_a_table_repeated_per_sample_and_folded_heads_stay_symbolic(monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    torch._dynamo.reset()
    module = Disentangled().eval()
    compiled = torch.compile(module, backend="kiln", dynamic=True)
    rng = np.random.default_rng(3)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for i, (batch, seq) in enumerate([(2, 5), (3, 7), (5, 2), (4, 11)]):
            x = torch.from_numpy(rng.standard_normal((batch, seq, 8)).astype(np.float32))
            np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-4, atol=1e-5)
            if i == 0:
                first = plans_compiled()
    assert plans_compiled() == first, "a size compiled after the first call"
