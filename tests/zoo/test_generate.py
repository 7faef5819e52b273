"""Generation on a compiled decode step (kiln.generate, issue 52): greedy generation gives token
for token what ``transformers.generate`` gives on the same random weights for GPT-2, Llama- and
Qwen2-like decoders, with no compile after ``kiln.compile`` for any prompt length or number of new
tokens in the declared context; sampling is seeded; bad arguments are named errors."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.driver.generation import pick, roles
from kiln.driver.variants import plans_compiled
from kiln.errors import ArgumentError
from kiln.zoo import decoders

torch = pytest.importorskip("torch", reason="torch (the 'zoo' extra) exports the decoders")
pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")
pytest.importorskip("onnxscript", reason="onnxscript (the 'zoo' extra) is the dynamo exporter's backend")

CONTEXT = {"past": "0..40", "new": "1..41", "total": "1..41", "batch": "1..2"}


def compiled(name: str, exporter: str, generation: bool = False):  # type: ignore[no-untyped-def]
    return kiln.compile(str(decoders.export(name, exporter=exporter)), dims=CONTEXT, generation=generation)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "exporter"), [("gpt2", "torchscript"), ("llama", "dynamo"), ("qwen2", "torchscript")])
def test_greedy_generation_matches_transformers_token_for_token(name, exporter, monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    model = compiled(name, exporter, generation=True)  # (its logits at the last position only)
    hf = decoders.build(name).model
    compiles = plans_compiled()
    rng = np.random.default_rng(11)
    for batch, prompt, new in ((1, 5, 12), (2, 3, 9), (1, 1, 20)):
        ids = rng.integers(0, decoders.get(name).vocab, (batch, prompt)).astype(np.int64)
        with torch.no_grad():
            want = hf.generate(
                torch.from_numpy(ids),
                attention_mask=torch.ones_like(torch.from_numpy(ids)),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            ).numpy()
        got = kiln.generate(model, ids, max_new_tokens=new)
        assert got.shape == want.shape and np.array_equal(got, want), (
            f"{name} at {batch}x{prompt}+{new}:\n{got}\n{want}"
        )
    assert plans_compiled() == compiles, "a prompt length or a new token compiled after kiln.compile returned"


@pytest.mark.slow
def test_sampling_is_seeded_and_stops_at_stop_tokens(monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    model = compiled("gpt2", "torchscript")
    ids = np.array([[5, 17, 99]], np.int64)
    first = kiln.generate(model, ids, 10, temperature=0.9, top_k=40, top_p=0.95, seed=3)
    again = kiln.generate(model, ids, 10, temperature=0.9, top_k=40, top_p=0.95, seed=3)
    assert np.array_equal(first, again) and first.shape == (1, 13)
    stop = int(first[0, 5])  # the third token drawn: generation ends there
    stopped = kiln.generate(model, ids, 10, temperature=0.9, top_k=40, top_p=0.95, seed=3, stop_tokens=[stop])
    assert np.array_equal(stopped[0], first[0, : list(first[0, 3:]).index(stop) + 4])
    steps = list(kiln.generate_stream(model, ids, 4))
    assert len(steps) == 4 and all(s.shape == (1,) for s in steps)
    with pytest.raises(ArgumentError, match="compiled for at most 40"):
        kiln.generate(model, np.zeros((1, 30), np.int64), 12)
    with pytest.raises(ArgumentError, match="max_new_tokens"):
        kiln.generate(model, ids, 0)
    with pytest.raises(ArgumentError, match="top_p"):
        kiln.generate(model, ids, 3, temperature=1.0, top_p=0.0)


@pytest.mark.slow
def test_the_prompt_runs_in_one_step_and_a_step_per_token_after(monkeypatch):
    """With ``new`` declared, a prompt of 17 tokens is one step (then one per token); declared
    shorter, the prompt runs in steps of at most its range's end; the tokens are the same."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    ids = np.random.default_rng(5).integers(0, decoders.get("llama").vocab, (1, 17)).astype(np.int64)
    found = {}
    for new in ("1..41", "1..8"):
        model = kiln.compile(str(decoders.export("llama", exporter="dynamo")), dims={**CONTEXT, "new": new})
        calls = []
        run = model.run
        model.run = lambda feeds, outputs=None, run=run: calls.append(feeds["ids"].shape[1]) or run(feeds, outputs)
        found[new] = kiln.generate(model, ids, 4)
        assert calls == ([17] if new == "1..41" else [8, 8, 1]) + [1, 1, 1], calls
    assert np.array_equal(found["1..41"], found["1..8"])


def test_pick_keeps_only_the_top_k_and_the_nucleus():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    assert pick(logits, 0.0, 0, 1.0, rng).tolist() == [0]
    drawn = {int(pick(logits, 1.0, 2, 1.0, rng)[0]) for _ in range(200)}
    assert drawn == {0, 1}  # top-2: never 2 or 3, both of the two drawn
    drawn = {int(pick(logits, 1.0, 0, 0.7, rng)[0]) for _ in range(200)}
    assert drawn == {0, 1}  # the smallest set reaching 0.7: 0.5 + 0.3


def test_a_model_that_is_no_decode_step_is_a_named_error():
    class NotAStep:
        signature = kiln.compile.__globals__  # (anything without the roles)

    from kiln.ir.graph import Graph, Value
    from kiln.ir.types import DType, TensorType

    x = Value("x", TensorType(DType.FLOAT32, (1, 4)))
    NotAStep.signature = Graph(inputs=(x,), outputs=(x,), nodes=(), constants={})  # type: ignore[assignment]
    with pytest.raises(ArgumentError, match="not a decode step"):
        roles(NotAStep())


@pytest.mark.slow
def test_kiln_generate_reports_the_tokens_and_steps_it_ran(monkeypatch):
    """``kiln generate llama --json``: the prompt (seeded ids) and its greedy continuation, the same
    tokens ``kiln.generate`` gives; one step for the prompt, one per token after the first."""
    import json

    from click.testing import CliRunner

    from kiln.cli import main

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    args = ["generate", "llama", "--prompt-tokens", "5", "--new-tokens", "4", "--exporter", "dynamo", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert (report["steps"], report["new_tokens"], report["prompt_tokens"]) == (4, 4, 5)
    tokens = np.array(report["tokens"], np.int64)
    model = kiln.compile(str(decoders.export("llama", exporter="dynamo")), dims=CONTEXT)
    assert np.array_equal(tokens, kiln.generate(model, tokens[:, :5], 4))
    assert report["time_to_first_token_s"] > 0 and report["warm_up_s"] > 0


def test_kiln_generate_takes_prompts_of_different_lengths(monkeypatch):
    """``--prompt-tokens 3,6``: one prompt of each length, their tokens ``kiln.generate`` gives the
    list; a length that is no positive integer, or several with --batch, is a usage error (exit 2)."""
    import json

    from click.testing import CliRunner

    from kiln.cli import main

    args = ["generate", "llama", "--prompt-tokens", "3,6", "--new-tokens", "3", "--exporter", "dynamo", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["prompt_tokens"] == [3, 6] and [len(t) for t in report["tokens"]] == [6, 9]
    model = kiln.compile(str(decoders.export("llama", exporter="dynamo")), dims=CONTEXT)
    prompts = [np.array(t[:n], np.int64) for t, n in zip(report["tokens"], (3, 6))]
    assert all(np.array_equal(t, g) for t, g in zip(report["tokens"], kiln.generate(model, prompts, 3)))
    for bad in (["--prompt-tokens", "3,x"], ["--prompt-tokens", "0"], ["--prompt-tokens", "3,6", "--batch", "2"]):
        result = CliRunner().invoke(main, ["generate", "llama", *bad, "--new-tokens", "2"])
        assert result.exit_code == 2, result.output


@pytest.mark.slow
@pytest.mark.parametrize(("name", "exporter"), [("gpt2", "torchscript"), ("llama", "dynamo")])
@pytest.mark.parametrize(("precision", "path", "bound"), [("int8-weights", "w8", 3e-2), ("int4-weights", "w4", 0.3)])
def test_weight_only_steps_stay_near_fp32_and_generate_with_no_compile(name, exporter, precision, path, bound, monkeypatch):  # fmt: skip
    """``precision="int8-weights"`` (``"int4-weights"``): every constant product of the decode step
    on the weight-only int8 (int4) path; the prompt's logits within the weights' rounding of fp32's
    (rel. L2 < 3e-2 at 8 bits, < 0.3 at 4), and generation compiles nothing after
    ``kiln.compile``, any prompt length, any number of tokens."""
    from kiln.lower.kir import kernel_precision

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    step = str(decoders.export(name, exporter=exporter))
    fp32 = kiln.compile(step, dims=CONTEXT)
    narrow = kiln.compile(step, dims=CONTEXT, precision=precision)
    found = roles(narrow)
    ids = np.random.default_rng(3).integers(0, decoders.get(name).vocab, (2, 6)).astype(np.int64)
    feeds = {found.ids: ids, **({found.mask: np.ones_like(ids)} if found.mask else {})}
    feeds.update({p: np.zeros((2, s[1], 0, s[3]), np.float32) for p, s in zip(found.past, found.cache)})
    want, got = fp32.run(feeds)[found.logits], narrow.run(feeds)[found.logits]
    assert 1e-6 < np.linalg.norm(got - want) / np.linalg.norm(want) < bound
    kernels = [k for plan in narrow.plans for step in plan.steps for k in getattr(step, "kernels", [])]
    assert path in {kernel_precision(kernel) for kernel in kernels}
    compiles = plans_compiled()
    tokens = kiln.generate(narrow, ids[:1, :3], 12)
    assert tokens.shape == (1, 15) and int(tokens.max()) < decoders.get(name).vocab
    assert plans_compiled() == compiles


def test_kiln_compile_of_a_decode_step_at_int8_weights_says_what_it_could_not_measure(tmp_path):
    """Random inputs do not run a decode step (its dims are related: total = past + new): the
    accuracy line says it was not measured, and the compile succeeds with its artifact."""
    from click.testing import CliRunner

    from kiln.cli import main

    path = str(decoders.export("gpt2"))
    out = tmp_path / "step.kiln"
    args = ["compile", path, "--precision", "int8-weights", "-o", str(out)]
    for dim in ("past=0..15", "new=1..4", "total=1..16", "batch=1..1"):
        args += ["--dim", dim]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "int8-weights" in result.output and "not measured" in result.output and out.is_file()


@pytest.mark.slow
def test_a_present_cache_read_in_place_as_the_next_past_gives_the_same_tokens(monkeypatch):
    """Every output recycled (the threshold at 0 bytes, as GPT-2 124M's caches are above it): each
    step's present KV cache is the next step's past, read where it is, not copied; greedy tokens are
    still transformers' own, and the in-place layout was used. (The dense layout: with the cache
    updated in place, tests/runtime/test_cache_in_place.py, the present is the past's own buffer.)"""
    from kiln.driver.options import CompileOptions
    from kiln.runtime import executable

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    monkeypatch.setattr(executable, "LARGE_OUTPUT", 0)
    used = []
    real = executable.Recycled.laid_in_place

    def spy(self, array, shape):  # type: ignore[no-untyped-def]
        found = real(self, array, shape)
        used.append(found is not None)
        return found

    monkeypatch.setattr(executable.Recycled, "laid_in_place", spy)
    dense = CompileOptions.from_env(disabled={"cache-in-place"})
    model = kiln.compile(
        str(decoders.export("gpt2")), dims={**CONTEXT, "past": "0..63", "total": "1..64"}, options=dense
    )
    hf = decoders.build("gpt2").model
    ids = np.random.default_rng(21).integers(0, decoders.get("gpt2").vocab, (1, 6)).astype(np.int64)
    with torch.no_grad():
        want = hf.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                           max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0).numpy()  # fmt: skip
    assert np.array_equal(kiln.generate(model, ids, 20), want)
    assert any(used), "no past was read in place"


@pytest.mark.slow
def test_a_batch_class_of_its_own_runs_every_step_from_the_dims_program(monkeypatch):
    """A batch of 4 declared as a size class of its own (``generation.batched``, as ``kiln generate
    --batch`` and the bench do) is one step a token, not four: its variant's
    sizes at every cache length come from the dims program fitted over both classes (no graph
    specialized per step, which cost more than the step), and its tokens are transformers' own."""
    from kiln.driver import generation, spatial

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    model = kiln.compile(str(decoders.export("llama", exporter="dynamo")), dims={**CONTEXT, "batch": "1..4"})
    assert generation.batched(model, 4) is model and model.size_classes["batch"] == (1, 4)
    compiles = plans_compiled()
    assert generation.batched(model, 4) is model and plans_compiled() == compiles  # (a class already)
    with pytest.raises(ArgumentError, match="compiled for 1..4"):
        generation.batched(model, 5)
    program = model.dims_model.spatial.program
    assert program is not None and program.fixed and len(program.classes) == 1, program
    specialized = []
    real = spatial.dim_values
    monkeypatch.setattr(spatial, "dim_values", lambda g, n, dims: specialized.append(dict(dims)) or real(g, n, dims))
    steps = []
    run = model.run
    model.run = lambda feeds, outputs=None, run=run: steps.append(feeds["ids"].shape) or run(feeds, outputs)
    ids = np.random.default_rng(8).integers(0, decoders.get("llama").vocab, (4, 5)).astype(np.int64)
    got = kiln.generate(model, ids, 12)
    hf = decoders.build("llama").model
    with torch.no_grad():
        want = hf.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                           max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0).numpy()  # fmt: skip
    assert np.array_equal(got, want), f"\n{got}\n{want}"
    assert steps == [(4, 5)] + [(4, 1)] * 11, steps
    assert not specialized, specialized  # (the empty cache's prompt too: its sizes are exact expressions)


def test_the_dims_program_gives_an_empty_caches_sizes_as_specializing_does(monkeypatch):
    """A prompt's step has past 0: the program gives that binding's sizes (an input of 0, and the
    expressions of the inputs it names, exact) equal to the graph's own specialized there, so a
    prompt of a new length specializes nothing (at 1B that took ~70 ms before its first token)."""
    from kiln.driver import spatial

    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    for name, exporter in (("llama", "dynamo"), ("gpt2", "torchscript")):
        model = compiled(name, exporter, generation=True)
        route, graph = model.dims_model.spatial, model.dims_model.compilation.shapes_graph
        for batch, new in ((1, 1), (1, 7), (1, 23), (1, 41)):  # (batch 1: the one class inside 1..2)
            dims = {"batch": batch, "new": new, "past": 0, "total": new}
            got = route.program(dims)
            assert got is not None, (name, dims)
            assert got.tolist() == spatial.dim_values(graph, route.names, dims).tolist(), (name, dims)


@pytest.mark.slow
def test_prompts_of_different_lengths_each_get_what_they_get_alone(monkeypatch):
    """A list of prompts of different lengths runs as one batch per length, stepped together: each
    prompt's tokens are those it gets alone (GPT-2: learned positions, which a padded batch would
    shift), prompts of one length those of their own batch; stop tokens and seeds hold."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    model = compiled("gpt2", "torchscript", generation=True)
    rng = np.random.default_rng(31)
    vocab = decoders.get("gpt2").vocab
    prompts = [rng.integers(0, vocab, n).astype(np.int64) for n in (5, 2, 9, 2)]
    got = kiln.generate(model, prompts, max_new_tokens=8)
    assert isinstance(got, list) and [len(g) for g in got] == [13, 10, 17, 10]
    for prompt, tokens in zip(prompts[:3], got):
        assert np.array_equal(tokens, kiln.generate(model, prompt[None], 8)[0])
    pair = kiln.generate(model, np.stack([prompts[1], prompts[3]]), 8)
    assert np.array_equal(np.stack([got[1], got[3]]), pair)
    steps = list(kiln.generate_stream(model, prompts, 8))
    assert len(steps) == 8 and all(s.shape == (4,) for s in steps)
    assert np.array_equal(np.stack(steps, axis=1), np.stack([g[-8:] for g in got]))
    stop = int(got[2][9])  # the third prompt's first new token: it stops at once and keeps it
    stopped = kiln.generate(model, prompts, max_new_tokens=8, stop_tokens=[stop])
    assert np.all(stopped[2][9:] == stop)
    sampled = [kiln.generate(model, prompts, 6, temperature=0.9, top_k=20, seed=3) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*sampled))
    with pytest.raises(ArgumentError, match="input_ids"):
        kiln.generate(model, [[1, 2], []], 4)
