"""``kiln generate``: text generation on a compiled decode step, timed (``kiln.driver.generation``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from kiln.cli_support import console, json_option, out
from kiln.lower.engine import WEIGHT_FORMATS


@click.command("generate")
@click.argument("model")
@click.option(
    "--prompt-tokens",
    default="16",
    show_default=True,
    help="Prompt length (random ids); several, comma-separated: one prompt of each length (a batch of prompts "
    "of different lengths, one step per length a token).",
)
@click.option("--new-tokens", default=32, show_default=True, type=click.IntRange(1), help="Tokens to generate.")
@click.option(
    "--batch",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Prompts at once (one step a token: the batch is compiled as a size class of its own).",
)
@click.option(
    "--context", default=None, type=click.IntRange(2), help="Longest past the compile serves [prompt + new tokens]."
)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0), help="0: greedy.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0), help="Keep the k most likely (0: all).")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True), help="Nucleus.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seeds the prompt's ids and the sampling.")
@click.option(
    "--exporter", default="torchscript", show_default=True, type=click.Choice(["torchscript", "dynamo"]),
    help="For a zoo decoder name: which ONNX exporter writes its decode step.",
)  # fmt: skip
@click.option(
    "--precision", default="fp32", show_default=True,
    type=click.Choice(["fp32", *WEIGHT_FORMATS, "bf16", "auto"]),
    help="Of the matrix products: int8-weights stores their weights as int8 (per output column), a quarter of "
    "the bytes each token reads; int4-weights as 4-bit codes with a scale per group of 32 (-g128: 128; -asym: "
    "an offset per group too), about a sixth; bf16 where the CPU has it.",
)  # fmt: skip
@json_option("the tokens and the timings")
def generate_command(
    model: str,
    prompt_tokens: str,
    new_tokens: int,
    batch: int,
    context: int | None,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    exporter: str,
    precision: str,
    as_json: bool,
) -> None:
    """Generate NEW_TOKENS after a random prompt with MODEL: a decode step (.onnx whose inputs are
    the token ids, the attention mask and each layer's past keys and values, its outputs the
    logits and the present ones; dims ``past``, ``new`` and ``total``), or a zoo decoder (gpt2, llama,
    qwen2: tiny random weights). Compiled once for every past length up to the context, then
    timed after a warm-up generation: time to first token (the prompt in one step), time per output token,
    tokens/s, and the Python loop's share of each step."""
    import kiln
    from kiln.driver import generation
    from kiln.zoo import decoders

    lengths = _lengths(prompt_tokens, batch)  # (several: one prompt each, --batch left at 1)
    path = Path(model)
    if not path.is_file():
        path = decoders.export(decoders.get(model).name, exporter=exporter)
    longest = context or max(lengths) + new_tokens
    dims = _context_dims(longest, batch)
    started = time.perf_counter()
    classes = {"batch": f"1,{batch}"} if batch > 1 else None  # (the batch as one step a token)
    compiled = kiln.compile(str(path), dims=dims, precision=precision, generation=True, size_classes=classes)
    compile_s = time.perf_counter() - started
    vocab = _vocab(compiled)
    ids = _random_prompts(lengths, batch, vocab, seed)
    started = time.perf_counter()
    for _ in generation.stream(compiled, ids, min(2, new_tokens)):  # warm: the first calls load and fault in
        pass
    warm_up_s = time.perf_counter() - started
    stamps: list[float] = []
    with generation.run_seconds(compiled) as running:
        started = time.perf_counter()
        steps = []
        for token in generation.stream(compiled, ids, new_tokens, temperature, top_k, top_p, seed):
            steps.append(token)
            stamps.append(time.perf_counter())
    total = stamps[-1] - started if stamps else 0.0
    first = stamps[0] - started if stamps else 0.0
    per_token = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    report = {
        "model": str(path),
        "batch": len(lengths) if len(lengths) > 1 else batch,
        "precision": compiled.precision,
        "prompt_tokens": lengths[0] if len(lengths) == 1 else lengths,
        "new_tokens": len(steps),
        "compile_s": compile_s,
        "warm_up_s": warm_up_s,  # a first generation of 2 tokens, not timed below
        "time_to_first_token_s": first,
        "time_per_output_token_ms": per_token * 1e3,
        "tokens_per_s": len(steps[0]) * (len(steps) - 1) / (stamps[-1] - stamps[0])
        if len(stamps) > 1
        else float("nan"),
        "python_share": max(0.0, 1.0 - sum(running) / total) if total else float("nan"),
        "steps": len(running),  # the prompt's steps and one per token after the first
        "tokens": [np.concatenate([p, s]).tolist() for p, s in zip(ids, np.stack(steps, axis=1))],
    }
    if as_json:
        out.print_json(json.dumps(report))
        return
    console.print(
        f"compiled {path.name} ({compiled.precision}) for every past length up to {longest - 1} in {compile_s:.1f} s"
    )
    out.print(
        f"time to first token {first * 1e3:.1f} ms ({prompt_tokens} prompt tokens), "
        f"{report['time_per_output_token_ms']:.2f} ms per output token, {report['tokens_per_s']:.1f} tokens/s, "
        f"the Python loop {100 * report['python_share']:.0f}% of the time"
    )
    for row in report["tokens"]:
        out.print(" ".join(map(str, row)))


def _random_prompts(lengths: list[int], batch: int, vocab: int, seed: int) -> Any:
    """Seeded ids: [batch, length] for one length, else a list of one prompt of each length."""
    rng = np.random.default_rng(seed)
    if len(lengths) > 1:
        return [rng.integers(0, vocab, length).astype(np.int64) for length in lengths]
    return rng.integers(0, vocab, (batch, lengths[0])).astype(np.int64)


def _lengths(text: str, batch: int) -> list[int]:
    """``--prompt-tokens``' lengths (a usage error where one is not a positive integer, or several
    are given with ``--batch``)."""
    try:
        lengths = [int(part) for part in text.split(",")]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise click.BadParameter(f"positive integers, comma-separated; got {text!r}", param_hint="--prompt-tokens")
    if len(lengths) > 1 and batch > 1:
        raise click.BadParameter("several prompt lengths are one prompt each: leave --batch at 1", param_hint="--batch")
    return lengths


def _vocab(compiled) -> int:  # type: ignore[no-untyped-def]
    from kiln.driver.generation import roles

    logits = next(v for v in compiled.signature.outputs if v.name == roles(compiled).logits)
    vocab = logits.type.shape[-1]
    return vocab if isinstance(vocab, int) else 2


def _context_dims(longest: int, batch: int) -> dict[str, str]:
    """The ranges one compile serves every past length up to ``longest`` with."""
    return {
        "past": f"0..{longest - 1}",
        "new": f"1..{longest}",
        "total": f"1..{longest}",
        "batch": f"1..{max(batch, 2)}",
    }
