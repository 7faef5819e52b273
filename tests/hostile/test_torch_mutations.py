"""The second hostile probe (issue 26), through torch.compile(backend="kiln"): a graph that writes
its inputs (an in-place op, a buffer counter, a write through a view, BatchNorm's running
statistics) writes them exactly once per call, whether kiln compiles it or falls back to eager;
integer remainders at their edges match eager instead of killing the process."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="the torch.compile cases need torch (the zoo extra)")
import kiln.torch_backend  # noqa: E402,F401  (backend="kiln")

# -- 1. torch.compile: a graph's writes to its inputs happen exactly once --------------------------


class InPlaceOnInput(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


class CountsCalls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count += 1
        return x * self.count


class WritesThroughAView(torch.nn.Module):
    def forward(self, x):
        x[:, :2].add_(10)
        return x.sum(dim=1)


def _compiled_by_kiln(module):
    """torch.compile with kiln, asserting no graph fell back to eager."""
    torch._dynamo.reset()
    return torch.compile(module, backend="kiln", options={"fallback": False})


def test_an_in_place_op_on_an_input_is_applied_once():
    x = torch.randn(3, 4)
    want_x, want_y = x.clone(), None
    eager = want_x.clone()
    want_y = InPlaceOnInput()(eager)
    with torch.no_grad():
        got_y = _compiled_by_kiln(InPlaceOnInput())(x)
    torch.testing.assert_close(x, eager)  # the input doubled once, not four times
    torch.testing.assert_close(got_y, want_y)


def test_a_write_through_a_view_of_an_input_is_applied_once():
    x = torch.randn(3, 5)
    eager = x.clone()
    want = WritesThroughAView()(eager)
    with torch.no_grad():
        got = _compiled_by_kiln(WritesThroughAView())(x)
    torch.testing.assert_close(x, eager)
    torch.testing.assert_close(got, want)


def test_a_buffer_counter_counts_each_call_once_and_is_read_fresh_every_call():
    module, twin = CountsCalls(), CountsCalls()
    compiled = _compiled_by_kiln(module)
    with torch.no_grad():
        for _ in range(3):
            got = compiled(torch.ones(2))
            want = twin(torch.ones(2))
            torch.testing.assert_close(got, want)  # x * 1, x * 2, x * 3: never a folded stale count
    assert module.count.item() == 3.0


def test_batchnorm_in_train_mode_updates_its_statistics_once_per_call():
    torch.manual_seed(0)
    layer, twin = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="kiln")  # batch statistics: kiln's eager fallback (named)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(2):
            x = torch.randn(8, 4)
            torch.testing.assert_close(compiled(x), twin(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layer.running_mean, twin.running_mean, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(layer.running_var, twin.running_var, rtol=1e-4, atol=1e-6)
    assert int(layer.num_batches_tracked) == 2


def test_a_mutating_graph_kiln_cannot_convert_falls_back_and_still_writes_once():
    class Unconvertible(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return torch.special.bessel_j0(x)

    x = torch.zeros(4)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="bessel_j0"):
        got = torch.compile(Unconvertible(), backend="kiln")(x)
    torch.testing.assert_close(x, torch.ones(4))
    torch.testing.assert_close(got, torch.special.bessel_j0(torch.ones(4)))


def test_torch_remainder_and_fmod_at_the_integer_edges_match_eager():
    a = torch.tensor([-(2**31), -(2**31), 7, -7], dtype=torch.int32)
    b = torch.tensor([-1, -1, 2, -3], dtype=torch.int32)

    def f(a, b):
        return torch.remainder(a, b), torch.fmod(a, b)

    torch._dynamo.reset()
    got = torch.compile(f, backend="kiln", options={"fallback": False})(a, b)
    for g, w in zip(got, f(a, b)):
        torch.testing.assert_close(g, w)


def test_kiln_compile_of_a_module_writing_its_state_refuses_instead_of_returning_its_writes():
    """Through torch.export the writes are extra outputs of the program: returning them as the
    model's outputs (or folding the buffer) would be a wrong answer; kiln names them instead."""
    import kiln

    for module in (CountsCalls(), InPlaceOnInput()):
        with pytest.raises(kiln.KilnError, match="in place"):
            kiln.compile(module, example_inputs=(torch.ones(2, 3),))
