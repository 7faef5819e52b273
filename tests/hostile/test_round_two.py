"""The second hostile probe (issue 26): each class it found, tested as a class. State-mutating
torch graphs, integer edge values, the cache's trust boundary, artifacts that lie, arguments and
run-time values, files that are not files, and artifacts built for a CPU that lacks an extension.
Every case failed (a wrong answer, a crash, a hang, data loss or "kiln bug") before its fix."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from tests.helpers import make_model

torch = pytest.importorskip("torch", reason="the torch.compile cases need torch (the zoo extra)")
import kiln.torch_backend  # noqa: E402  (backend="kiln")

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


# -- 2. integer division-like ops at their edges: never SIGFPE ----------------------------------------

INTEGER_EDGES = [(np.int32, TensorProto.INT32), (np.int64, TensorProto.INT64)]


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype,code", INTEGER_EDGES, ids=["int32", "int64"])
def test_integer_mod_of_the_most_negative_value_by_minus_one_or_zero_is_zero(target, dtype, code, fmod):
    model = make_model(
        [helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
        [("a", code, [6]), ("b", code, [6])],
        [("y", code, [6])],
    )
    low = np.iinfo(dtype).min
    a = np.array([low, low, 7, -7, low + 1, 9], dtype)
    b = np.array([-1, 0, 0, -1, -1, -4], dtype)
    got = kiln.compile(model, target=target).run({"a": a, "b": b})["y"]
    want = kiln.compile(model, target="reference").run({"a": a, "b": b})["y"]
    np.testing.assert_array_equal(got, want)
    assert list(got[:5]) == [0, 0, 0, 0, 0]


def test_torch_remainder_and_fmod_at_the_integer_edges_match_eager():
    a = torch.tensor([-(2**31), -(2**31), 7, -7], dtype=torch.int32)
    b = torch.tensor([-1, -1, 2, -3], dtype=torch.int32)

    def f(a, b):
        return torch.remainder(a, b), torch.fmod(a, b)

    torch._dynamo.reset()
    got = torch.compile(f, backend="kiln", options={"fallback": False})(a, b)
    for g, w in zip(got, f(a, b)):
        torch.testing.assert_close(g, w)


def test_the_kernel_ir_defines_integer_division_by_zero_and_minus_one():
    from kiln.lower.kir_interpreter import BINARY

    assert BINARY["/"](7, 0) == 0 and BINARY["%"](7, 0) == 0
    assert BINARY["%"](-(2**63), -1) == 0
    assert BINARY["/"](-7, 2) == -3 and BINARY["%"](-7, 2) == -1
