"""A generation model's logits at the last position only (``kiln.passes.last_position``, what
``kiln.compile(..., generation=True)`` runs): the head's product gathers its input's last position,
through whatever position-wise operations follow it (a softcap, a bias, a log-softmax), the output
keeps its name at [batch, 1, vocab] with the full model's last row in it; logits that mix positions
are left as they are. On the zoo's decoders (both exporters): the same last row and the same present
cache as the model compiled without it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.frontend.onnx import import_onnx
from kiln.ops.interpreter import Interpreter
from kiln.passes.last_position import last_position
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(3)
HIDDEN, VOCAB = 8, 12


def head_model(after: list, extra: dict | None = None):  # type: ignore[no-untyped-def]
    """x [b, s, 8] -> MatMul(W) -> the ``after`` nodes (reading "z", writing "logits") -> logits;
    a second output "h" reads x too."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), *after, helper.make_node("Relu", ["x"], ["h"])]
    constants = {"w": RNG.standard_normal((HIDDEN, VOCAB)).astype(np.float32), **(extra or {})}
    model = make_model(nodes, [("x", FLOAT, ["b", "s", HIDDEN])], [("logits", FLOAT, None), ("h", FLOAT, None)], constants)  # fmt: skip
    return import_onnx(model)


SOFTCAP = [
    helper.make_node("Add", ["z", "bias"], ["zb"]),
    helper.make_node("Div", ["zb", "cap"], ["zd"]),
    helper.make_node("Tanh", ["zd"], ["zt"]),
    helper.make_node("Mul", ["zt", "cap"], ["zc"]),
    helper.make_node("LogSoftmax", ["zc"], ["logits"], axis=-1),
]
CAP = {"bias": RNG.standard_normal(VOCAB).astype(np.float32), "cap": np.array(3.0, np.float32)}


@pytest.mark.parametrize(
    ("after", "extra"), [([helper.make_node("Identity", ["z"], ["logits"])], None), (SOFTCAP, CAP)]
)
def test_the_head_and_its_position_wise_tail_run_at_the_last_position(after, extra):
    before = head_model(after, extra)
    graph = last_position(before, "logits")
    x = RNG.standard_normal((2, 5, HIDDEN)).astype(np.float32)
    want_logits, want_h = Interpreter(before).run([x])
    got_logits, got_h = Interpreter(graph).run([x])
    assert graph.outputs[0].name == "logits" and graph.outputs[0].type.shape == ("b", 1, VOCAB)
    np.testing.assert_allclose(got_logits, want_logits[:, -1:], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_h, want_h)  # (the other output untouched)
    assert any(n.op == "Gather" for n in graph.nodes)


@pytest.mark.parametrize(
    "after, extra",
    [
        # a bias that differs by position: the positions mix into the output
        (
            [helper.make_node("Add", ["z", "by_position"], ["logits"])],
            {"by_position": np.ones((1, 5, VOCAB), np.float32)},
        ),
        # a softmax over the positions
        ([helper.make_node("Softmax", ["z"], ["logits"], axis=1)], None),
        # positions moved to the last axis
        ([helper.make_node("Transpose", ["z"], ["logits"], perm=[0, 2, 1])], None),
    ],
)
def test_logits_that_mix_positions_are_left_as_they_are(after, extra):
    before = head_model(after, extra)
    assert last_position(before, "logits") is before


def test_a_head_read_by_another_output_is_left_as_it_is():
    before = head_model([helper.make_node("Tanh", ["z"], ["logits"]), helper.make_node("Neg", ["z"], ["also"])])
    assert last_position(before, "logits") is before


@pytest.mark.slow
@pytest.mark.parametrize(("name", "exporter"), [("llama", "dynamo"), ("gpt2", "torchscript")])  # (qwen2: test_generate)
def test_a_decode_step_compiled_for_generation_gives_the_last_row_and_the_same_cache(name, exporter, monkeypatch):
    pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")
    from kiln.driver.generation import roles
    from kiln.zoo import decoders

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    path = str(decoders.export(name, exporter=exporter))
    dims = {"past": "0..40", "new": "1..41", "total": "1..41", "batch": "1..2"}
    full, last = kiln.compile(path, dims=dims), kiln.compile(path, dims=dims, generation=True)
    found = roles(last)
    assert next(v for v in last.signature.outputs if v.name == found.logits).type.shape[1:] == (1, decoders.get(name).vocab)  # fmt: skip
    for past, new in ((0, 7), (3, 1), (5, 4)):
        feeds = decoders.inputs(name, past=past, batch=2, new=new)
        want, got = full.run(feeds), last.run(feeds)
        np.testing.assert_allclose(got[found.logits], want[found.logits][:, -1:], rtol=1e-5, atol=1e-5)
        for key in found.present:
            np.testing.assert_array_equal(got[key], want[key])
