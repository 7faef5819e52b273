"""A decode step's KV cache updated in place (``kiln.passes.cache_in_place``, ``kiln.driver.laid``):
on the run-time dims route each step writes its new rows into the past's buffer and gives that buffer
back as the present, which the next step reads where it lies. The tokens are the copied route's (and
an artifact's); a present the caller still holds, or a buffer of the caller's own, is never written;
a present read by anything but an attention's K or V stays a Concat."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.driver import laid
from kiln.driver.generation import roles
from kiln.driver.options import CompileOptions
from kiln.frontend.onnx import import_onnx
from kiln.passes import cache_in_place
from kiln.zoo import decoders

pytest.importorskip("torch", reason="torch (the 'zoo' extra) exports the decoders")
pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")

CONTEXT = {"past": "0..40", "new": "1..41", "total": "1..41", "batch": "1..2"}


def compiled(name: str, in_place: bool = True, classes: str | None = None):  # type: ignore[no-untyped-def]
    options = CompileOptions.from_env(disabled=frozenset() if in_place else {"cache-in-place"})
    size_classes = {"batch": classes} if classes else None
    path = str(decoders.export(name))
    return kiln.compile(path, dims=CONTEXT, options=options, generation=True, size_classes=size_classes)


@pytest.fixture(scope="module")
def gpt2():  # type: ignore[no-untyped-def]
    return compiled("gpt2"), compiled("gpt2", in_place=False)


def counted(monkeypatch) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """How often a boxed past was read where it lies (``owned``) or copied into a run's own buffer."""
    calls = {"owned": 0, "copied": 0}
    real = laid.LaidInputs._owned

    def spy(self, array, layout):  # type: ignore[no-untyped-def]
        found = real(self, array, layout)
        calls["owned" if found is not None else "copied"] += 1
        return found

    monkeypatch.setattr(laid.LaidInputs, "_owned", spy)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_steps_write_into_the_past_and_give_the_copied_routes_tokens(name, gpt2, monkeypatch, tmp_path):
    in_place, copied = gpt2 if name == "gpt2" else (compiled(name), compiled(name, in_place=False))
    rng = np.random.default_rng(5)
    for batch, prompt, new in ((2, 3, 9), (1, 6, 14)):  # (a batch of 2: chunks of the class 1, copied)
        ids = rng.integers(0, decoders.get(name).vocab, (batch, prompt)).astype(np.int64)
        want = kiln.generate(copied, ids, new)
        calls = counted(monkeypatch)
        assert np.array_equal(kiln.generate(in_place, ids, new), want), (name, batch, prompt)
    layers = len(cache_in_place.cache_pairs(import_onnx(str(decoders.export(name)))))
    assert layers >= 4 and all(e.updates for e in in_place.dims_model.executables())
    assert calls["copied"] == layers, calls  # the empty cache, once per layer
    assert calls["owned"] == (new - 1) * layers, calls  # every later step: no row of the cache moved
    assert not any(e.updates for e in copied.dims_model.executables())
    if name == "gpt2":  # an artifact lays its caches out as the compile did
        in_place.save(str(tmp_path / "step.kiln"))
        loaded = kiln.load(str(tmp_path / "step.kiln"))
        assert np.array_equal(kiln.generate(loaded, ids, new), want)


def step(model, token: int, past: list, length: int):  # type: ignore[no-untyped-def]
    found = roles(model)
    feeds = {found.ids: np.full((1, 1), token, np.int64), found.mask: np.ones((1, length + 1), np.int64)}
    feeds.update(zip(found.past, past))
    out = model.run(feeds)
    return out[found.logits], [out[name] for name in found.present]


def empty(model) -> list:  # type: ignore[no-untyped-def]
    found = roles(model)
    return [np.zeros((1, s[1], 0, s[3]), np.float32) for s in found.cache]


@pytest.mark.slow
def test_a_batch_class_of_its_own_updates_its_cache_in_place_too(monkeypatch):
    """A batch of 2 compiled as a size class (one step a token, its cache laid out at batch 2's
    capacity): every step after the first reads its past in place, the tokens the copied route's."""
    in_place, copied = compiled("llama", classes="1,2"), compiled("llama", in_place=False, classes="1,2")
    ids = np.random.default_rng(8).integers(0, decoders.get("llama").vocab, (2, 4)).astype(np.int64)
    want = kiln.generate(copied, ids, 10)
    calls = counted(monkeypatch)
    assert np.array_equal(kiln.generate(in_place, ids, 10), want)
    layers = len(roles(in_place).past)
    assert calls == {"owned": 9 * layers, "copied": layers}, calls
    assert any(2 in {layout[0] for layout in e.boxed.values()} for e in in_place.dims_model.executables())


@pytest.mark.slow
def test_a_present_still_held_is_never_written_by_a_later_step(gpt2, monkeypatch):
    in_place, copied = gpt2
    calls = counted(monkeypatch)
    _, first = step(in_place, 3, empty(in_place), 0)
    _, second = step(in_place, 5, first, 1)  # read where it lies: the same buffer
    assert second[0].base is first[0].base and calls["owned"] > 0
    kept = [p.copy() for p in second]
    logits, third = step(in_place, 9, first, 1)  # `second` is still held: this step copies
    assert all(np.array_equal(p, k) for p, k in zip(second, kept)), "a held present was written"
    assert third[0].base is not second[0].base
    want_logits, want = step(copied, 9, step(copied, 3, empty(copied), 0)[1], 1)
    assert np.array_equal(logits, want_logits) and all(np.array_equal(a, b) for a, b in zip(third, want))


@pytest.mark.slow
def test_a_buffer_of_the_callers_own_is_never_written(gpt2):
    in_place, copied = gpt2
    _, first = step(copied, 3, empty(copied), 0)
    layout = next(iter(in_place.dims_model.executables())).boxed
    shape = next(iter(layout.values()))
    own = [np.full((1, *shape[1:]), 7.0, np.float32) for _ in first]
    for buffer, present in zip(own, first):
        buffer[:, :, :1] = present
    before = [b.copy() for b in own]
    logits, _ = step(in_place, 5, [b[:, :, :1] for b in own], 1)
    assert all(np.array_equal(b, w) for b, w in zip(own, before)), "the caller's buffer was written"
    assert np.array_equal(logits, step(copied, 5, first, 1)[0])


def cache_graph(extra_reader: bool):  # type: ignore[no-untyped-def]
    """past [1, 2, p, 4] joined with new rows: the present an output, read by a ReduceSum too or not."""
    nodes = [helper.make_node("Concat", ["past", "new"], ["present"], axis=2)]
    outputs = [helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, 2, "t", 4])]
    if extra_reader:
        nodes.append(helper.make_node("ReduceSum", ["present"], ["sum"], keepdims=0))
        outputs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, []))
    inputs = [
        helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, "p", 4]),
        helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 2, 1, 4]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "cache", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)]
    )
    return import_onnx(model)


@pytest.mark.parametrize("extra_reader", [False, True])
def test_a_present_read_by_anything_but_attention_stays_a_concat(extra_reader):
    graph = cache_graph(extra_reader)
    pairs = cache_in_place.cache_pairs(graph)
    assert [(past.name, node.op) for past, node in pairs] == [("past", "Concat")]
    rewritten = cache_in_place.in_place(graph, {"past": (1, 2, 9, 4)})
    ops = [n.op for n in rewritten.nodes if n.outputs[0].name == "present"]
    if extra_reader:  # a ReduceSum reads the present densely: no layout for it
        assert ops == ["Concat"] and cache_in_place.cache_roles(rewritten) == ({}, {})
    else:  # read by nothing but the caller: laid out in place, given back
        assert ops == ["CacheAppend"] and cache_in_place.cache_roles(rewritten) == ({0: (1, 2, 9, 4)}, {0: 0})


@pytest.mark.slow
def test_the_c_library_of_a_decode_step_lays_its_cache_out_densely(tmp_path):
    """``kiln.emit_c`` of a decode step whose Python route updates its cache in place: the library
    (which lays every input out densely) gets the dense plan, and computes what Python does."""
    from tests.runtime.test_emit_c import programs, run_c

    model = kiln.compile(str(decoders.export("llama", exporter="dynamo")), dims={"batch": 1})
    folder = tmp_path / "step"
    kiln.emit_c(model, folder, {"batch": 1}, extents={"past": (1, 40), "new": (1, 8), "total": (2, 48)})
    assert all(e.updates for e in model.dims_model.executables())  # (Python's own route: in place)
    feeds = decoders.inputs("llama", past=5, new=2)
    want = model.run(feeds)
    shapes = ",".join("x".join(str(d) for d in np.shape(a)) for a in [*feeds.values(), *want.values()])
    binary = programs(folder, tmp_path)[0]
    got = run_c(binary, folder, model, feeds, tmp_path, shapes=shapes)
    for name, array in zip(want, got):
        np.testing.assert_array_equal(array, np.asarray(want[name]).reshape(-1), err_msg=name)
