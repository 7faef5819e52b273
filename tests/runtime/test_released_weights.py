"""A decode step compiled from its file with declared ranges keeps only its packed weights: the
source graph (every float32 weight) is let go of once its route's plans are compiled, the
analyses' refusals it keeps hold no frames (which held the graph), and running it at any size in
the ranges — a prompt with an empty cache (past 0) and the token steps after — never reads the
model file again: sizes come from the dims program, or (a binding it defers) a weightless copy of
the graph."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.driver import plan_cache

pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")


def copied_model(tmp_path, monkeypatch, cache: str = "1"):  # type: ignore[no-untyped-def]
    """(the zoo's llama decode step, a copy of its folder's file under ``tmp_path``) with a plan
    cache of the test's own (the session's zoo cache is read; nothing of this test stays), or none
    (``cache`` "0": the generation bench's compiles)."""
    from kiln.zoo import decoders

    exported = decoders.export("llama")
    folder = tmp_path / "model"
    shutil.copytree(exported.parent, folder)
    plan_cache.wait()
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_PLAN_CACHE", cache)
    return exported, folder / exported.name


@pytest.mark.parametrize("cache", ["1", "0"])  # (without the plan cache: the file is read again if ever needed)
def test_a_decode_steps_model_lets_go_of_its_source_weights_and_never_reads_them_again(tmp_path, monkeypatch, cache):
    from kiln.driver.routes import dim_routes

    exported, copied = copied_model(tmp_path, monkeypatch, cache)
    dims = {"past": "0..40", "new": "1..41", "total": "1..41", "batch": "1..1"}
    model = kiln.compile(str(copied), dims=dims, generation=True)
    assert model.dims_model is not None
    for held in (model, model.dims_model):
        assert held.compilation.source.graph is None and not held.signature.constants
    shapes = model.dims_model.compilation.shapes_graph
    stubs = [a for a in shapes.constants.values() if a.ndim and a.strides == (0,) * a.ndim]
    assert stubs and all(a.size > 1 for a in stubs)  # (the products' weights: no memory)
    refusals = [r for r in (model.proven or {}).values() if isinstance(r, Exception)]
    assert all(r.__traceback__ is None for r in refusals)

    def never(*_):
        raise AssertionError("the model file was read again")

    for held in (model, model.dims_model):
        monkeypatch.setattr(held.compilation.source, "loader", never)
    assert dim_routes(model)["past"][0] == "run-time dims"  # (asking how it runs reads nothing back)
    want = kiln.compile(str(exported), dims=dims, generation=True)
    for prompt in ([5, 17, 99], list(range(1, 30))):
        got = kiln.generate(model, [prompt], max_new_tokens=4)
        np.testing.assert_array_equal(got, kiln.generate(want, [prompt], max_new_tokens=4))
    plan_cache.wait()


def test_a_batch_class_declared_after_compiling_lets_go_of_the_source_graph_again(tmp_path, monkeypatch):
    """``generation.batched`` declares a batch class after the compile let go of the source graph:
    the graph comes back for that compile (the plan cache's copy) and is let go of again after,
    not held beside the packed weights from then on."""
    from kiln.driver import generation
    from kiln.zoo import decoders

    exported, copied = copied_model(tmp_path, monkeypatch)
    dims = {"past": "0..40", "new": "1..41", "total": "1..41", "batch": "1..3"}
    model = kiln.compile(str(copied), dims=dims, generation=True)
    assert model.compilation.source.graph is None
    reads = []
    loader = model.compilation.source.loader
    monkeypatch.setattr(model.compilation.source, "loader", lambda: reads.append(1) or loader())
    assert generation.batched(model, 3).size_classes["batch"] == (1, 3)
    assert reads == [1]
    for held in (model, model.dims_model):
        assert held.compilation.source.graph is None and not held.signature.constants
    prompts = np.random.default_rng(2).integers(0, decoders.get("llama").vocab, (3, 4))
    want = kiln.compile(str(exported), dims=dims, generation=True)
    np.testing.assert_array_equal(kiln.generate(model, prompts, 5), kiln.generate(want, prompts, 5))
    plan_cache.wait()


def test_size_classes_given_to_compile_are_compiled_before_the_source_graph_goes(tmp_path, monkeypatch):
    """``kiln.compile(..., size_classes=...)`` compiles each class with the rest, from the graph it
    imported: nothing is read back afterwards (declaring the class later reads the graph again,
    beside the packed weights already held: a 1B decoder's fp32 class of 4 ran out of memory)."""
    from kiln.zoo import decoders

    exported, copied = copied_model(tmp_path, monkeypatch)
    dims = {"past": "0..40", "new": "1..41", "total": "1..41", "batch": "1..3"}
    model = kiln.compile(str(copied), dims=dims, generation=True, size_classes={"batch": "1,3"})
    assert model.size_classes["batch"] == (1, 3) and model.compilation.source.graph is None

    def never(*_):
        raise AssertionError("the source graph was read again")

    for held in (model, model.dims_model):
        monkeypatch.setattr(held.compilation.source, "loader", never)
    prompts = np.random.default_rng(3).integers(0, decoders.get("llama").vocab, (3, 4))
    want = kiln.compile(str(exported), dims=dims, generation=True)
    np.testing.assert_array_equal(kiln.generate(model, prompts, 5), kiln.generate(want, prompts, 5))
    plan_cache.wait()
