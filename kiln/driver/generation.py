"""Text generation with a compiled decode step: the loop, the KV cache it carries, sampling.

A *decode step* is a decoder compiled as one generation step (``kiln.zoo.decoders`` writes them;
optimum-style exports have the same roles): the new tokens' ids ``[batch, new]``, the attention
mask ``[batch, total]`` and each layer's past keys and values ``[batch, kv_heads, past, head_dim]``
in, the logits ``[batch, new, vocab]`` and each layer's present keys and values (``past + new``
positions) out. Compiled with the past length declared as a range (``dims={"past": "0..511",
"total": "1..512"}``) its kernels take the past length at run time (``kiln.driver.spatial``), so
the whole loop — the prompt in one step (in steps of at most the ``new`` dim's range where the ids'
length is one; one token a step where it is the number 1), then one step per new token — runs on
that one compile: no compile per token.

    dims = {"past": "0..255", "new": "1..256", "total": "1..256", "batch": "1..4"}
    model = kiln.compile(decoders.export("llama"), dims=dims)
    tokens = kiln.generate(model, prompt_ids, max_new_tokens=32)                    # greedy
    for step in kiln.generate_stream(model, prompt_ids, 32, temperature=0.8, top_p=0.9, seed=1):
        ...                                                                          # [batch] ids per step

Sampling: ``temperature`` 0 is greedy (the first of equal maxima, as ``torch.argmax``); otherwise
logits / temperature, the ``top_k`` largest kept (0: all), then the smallest set of the most
likely whose probability reaches ``top_p``, drawn with NumPy's generator seeded by ``seed``. A
sequence that draws one of ``stop_tokens`` is finished: it keeps that token from then on, and the
loop ends when every sequence has. A batch of B prompts of one length ([B, tokens]) runs as one
step a token where B is one of the batch dim's size classes (``kiln.compile(..., size_classes=
{"batch": "1,4"})``, or ``batched`` after the compile), else as chunks of the classes. Prompts of
different lengths (a list of token lists) run as one batch per length, stepped together: each
step yields every prompt's token. A padded batch would give each shorter prompt's tokens shifted
positions (a decode step takes its positions from the cache's length, not from the mask), which a
model with learned positions does not forgive; the groups give each prompt what it gives alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import ArgumentError
from kiln.ir.types import TensorType


@dataclass(frozen=True)
class StepRoles:
    """Which of a decode step's inputs and outputs are which (by their names and types)."""

    ids: str
    mask: str | None
    past: tuple[str, ...]
    logits: str
    present: tuple[str, ...]
    cache: tuple[tuple[int | str, ...], ...]  # each past input's shape (its past axis: 2)


def roles(model: Any) -> StepRoles:
    """The roles of ``model``'s inputs and outputs: the integer input named like ``ids`` (or the
    first [batch, new] integer input), the one named like ``mask``, the float rank-4 inputs (the
    past keys and values, in order), the output named like ``logits`` (else the first) and the
    float rank-4 outputs (the present keys and values, in the pasts' order). ArgumentError naming
    what is missing where ``model`` is not a decode step."""
    signature = model.signature
    integers = [v for v in signature.inputs if _tensor(v) and not v.type.dtype.is_float and v.type.rank == 2]
    ids = next((v for v in integers if "id" in v.name.lower()), integers[0] if integers else None)
    mask = next((v for v in integers if "mask" in v.name.lower() and v is not ids), None)
    past = [v for v in signature.inputs if _tensor(v) and v.type.dtype.is_float and v.type.rank == 4]
    outputs = [v for v in signature.outputs if _tensor(v)]
    logits = next((v for v in outputs if "logit" in v.name.lower()), outputs[0] if outputs else None)
    present = [v for v in outputs if v is not logits and v.type.dtype.is_float and v.type.rank == 4]
    missing = [
        what
        for what, found in (("token ids [batch, new]", ids), ("logits", logits), ("past keys and values", past))
        if not found
    ]
    if not missing and len(present) != len(past):
        missing.append(f"as many present keys and values as past ones ({len(present)} vs {len(past)})")
    if missing:
        raise ArgumentError(f"not a decode step: no {', '.join(missing)} among its inputs and outputs")
    assert ids is not None and logits is not None
    return StepRoles(
        ids.name,
        mask.name if mask is not None else None,
        tuple(v.name for v in past),
        logits.name,
        tuple(v.name for v in present),
        tuple(tuple(v.type.shape) for v in past),
    )


def _tensor(value: Any) -> bool:
    return isinstance(value.type, TensorType) and value.type.shape is not None


def stream(
    model: Any,
    input_ids: Any,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop_tokens: Sequence[int] = (),
) -> Iterator[np.ndarray]:
    """Each generated step's token ids ([batch] int64), as soon as it is drawn (see the module)."""
    yield from _lockstep(model, _prompts(input_ids), max_new_tokens, temperature, top_k, top_p, seed, stop_tokens)


def _lockstep(
    model: Any,
    groups: list[tuple[np.ndarray, np.ndarray]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop_tokens: Sequence[int] = (),
) -> Iterator[np.ndarray]:
    """``stream`` over ``_prompts``' groups: each group's steps taken together, every prompt's
    token per step."""
    found = roles(model)
    _check_sampling(max_new_tokens, temperature, top_k, top_p)
    rng = np.random.default_rng(seed)
    stops = np.asarray(list(stop_tokens), np.int64)
    sampling = (temperature, top_k, top_p)
    if len(groups) == 1:
        yield from _stream(model, found, groups[0][1], max_new_tokens, sampling, rng, stops)
        return
    streams = [(rows, _stream(model, found, ids, max_new_tokens, sampling, rng, stops)) for rows, ids in groups]
    last = np.zeros(sum(len(rows) for rows, _ in groups), np.int64)
    for _ in range(max_new_tokens):  # (a group whose prompts all stopped keeps its last tokens)
        going = False
        for rows, tokens in streams:
            step = next(tokens, None)
            if step is not None:
                last[rows], going = step, True
        if not going:
            return
        yield last.copy()


def _stream(
    model: Any, found: StepRoles, ids: np.ndarray, max_new_tokens: int, sampling: tuple, rng: Any, stops: np.ndarray
) -> Iterator[np.ndarray]:
    """``stream`` for prompts of one length, ``ids`` [batch, tokens]."""
    temperature, top_k, top_p = sampling
    batch, prompt = ids.shape
    context = _context(model, found)
    if context is not None and prompt + max_new_tokens - 1 > context:
        raise ArgumentError(
            f"a prompt of {prompt} tokens and {max_new_tokens} new ones need a cache of "
            f"{prompt + max_new_tokens - 1} positions; the model was compiled for at most {context}"
        )
    ranges = getattr(model, "ranges", None)
    cache = [np.zeros(_cache_shape(shape, batch, ranges), np.float32) for shape in found.cache]
    done = np.zeros(batch, bool)
    logits = None
    chunk = _prefill_chunk(model, found)
    for position in range(0, prompt, chunk):  # the prompt, in as few steps as the model takes
        logits, cache = _step(model, found, ids[:, position : position + chunk], cache, position)
    for produced in range(max_new_tokens):
        assert logits is not None
        token = np.where(done, ids[:, -1], pick(logits[:, -1], temperature, top_k, top_p, rng))
        done |= np.isin(token, stops)
        ids = np.concatenate([ids, token[:, None]], axis=1)
        yield token
        if done.all() or produced == max_new_tokens - 1:
            return
        logits, cache = _step(model, found, token[:, None], cache, ids.shape[1] - 1)


def generate(model: Any, input_ids: Any, max_new_tokens: int, **sampling: Any) -> Any:
    """The prompt and the tokens generated after it, [batch, prompt + generated] (``stream``'s
    keyword arguments: temperature, top_k, top_p, seed, stop_tokens); prompts of different lengths
    give a list of each prompt's [prompt + generated]."""
    groups = _prompts(input_ids)
    steps = list(_lockstep(model, groups, max_new_tokens, **sampling))
    new = np.stack(steps, axis=1) if steps else np.zeros((sum(len(r) for r, _ in groups), 0), np.int64)
    if len(groups) == 1:
        return np.concatenate([groups[0][1], new], axis=1)
    prompts: dict[int, np.ndarray] = {}
    for rows, ids in groups:
        prompts.update(zip(rows.tolist(), ids))
    return [np.concatenate([prompts[i], new[i]]) for i in range(len(new))]


def pick(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> np.ndarray:
    """One token per row of ``logits`` [batch, vocab] (see the module's sampling rules)."""
    rows = np.asarray(logits, np.float64)
    if temperature <= 0:
        return rows.argmax(axis=1).astype(np.int64)
    scores = rows / temperature
    if 0 < top_k < scores.shape[1]:
        kth = np.partition(scores, -top_k, axis=1)[:, -top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-probs, axis=1, kind="stable")
        ranked = np.take_along_axis(probs, order, axis=1)
        before = np.cumsum(ranked, axis=1) - ranked  # the mass of the more likely ones
        ranked = np.where(before < top_p, ranked, 0.0)
        probs = np.zeros_like(probs)
        np.put_along_axis(probs, order, ranked, axis=1)
        probs /= probs.sum(axis=1, keepdims=True)
    draws = rng.random(len(probs))[:, None]
    return np.minimum((np.cumsum(probs, axis=1) < draws).sum(axis=1), probs.shape[1] - 1).astype(np.int64)


def _step(model: Any, found: StepRoles, tokens: np.ndarray, cache: list[np.ndarray], past: int) -> tuple:
    feeds: dict[str, np.ndarray] = {found.ids: np.ascontiguousarray(tokens, np.int64)}
    if found.mask is not None:
        feeds[found.mask] = np.ones((tokens.shape[0], past + tokens.shape[1]), np.int64)
    feeds.update(zip(found.past, cache))
    out = model.run(feeds)
    return np.asarray(out[found.logits]), [np.asarray(out[name]) for name in found.present]


def _prompt(input_ids: Any) -> np.ndarray:
    try:
        ids = np.asarray(input_ids)
    except ValueError:  # (nested lists NumPy cannot make an array of)
        raise ArgumentError("input_ids: a [batch, tokens] integer array, or a list of token lists") from None
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] < 1 or ids.dtype.kind not in "iu":
        raise ArgumentError(
            f"input_ids: a [batch, tokens] integer array of at least one token, got {ids.dtype}{list(ids.shape)}"
        )
    return ids.astype(np.int64)


def _prompts(input_ids: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """(the prompts' positions in the batch, their ids [n, tokens]) per prompt length, in order of
    first appearance: one group for a [batch, tokens] array, one per length for a list of prompts."""
    if isinstance(input_ids, (list, tuple)) and input_ids and all(np.ndim(p) == 1 for p in input_ids):
        lengths = [len(p) for p in input_ids]
        if len(set(lengths)) > 1:
            prompts = [_prompt(p)[0] for p in input_ids]
            order = list(dict.fromkeys(lengths))
            return [
                (
                    np.asarray([i for i, n in enumerate(lengths) if n == length]),
                    np.stack([p for p in prompts if len(p) == length]),
                )
                for length in order
            ]
    ids = _prompt(input_ids)
    return [(np.arange(len(ids)), ids)]


def _check_sampling(max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    if type(max_new_tokens) is not int or max_new_tokens < 1:
        raise ArgumentError(f"max_new_tokens: a positive integer, got {max_new_tokens!r}")
    if not temperature >= 0 or not 0 < top_p <= 1 or type(top_k) is not int or top_k < 0:
        raise ArgumentError(
            f"sampling: temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {temperature}, {top_p}, {top_k}"
        )


def _cache_shape(shape: tuple[int | str, ...], batch: int, ranges: Any = None) -> tuple[int, ...]:
    """An empty cache of the past input's shape: [batch, heads, 0, head_dim] (a symbol there is
    the one size its declared range allows: ONNX Runtime GenAI's builder names the head size)."""
    fixed = {k: int(r[0]) for k, r in (ranges or {}).items() if r[0] == r[1]}
    heads, depth = (fixed.get(d, d) if isinstance(d, str) else d for d in (shape[1], shape[3]))
    if not isinstance(heads, int) or not isinstance(depth, int):
        raise ArgumentError(
            f"a past input of shape {list(shape)}: its heads and head size must be numbers, or symbols "
            "declared with a range of one size (dims={'kv_cache_dim': '64..64'}, --dim kv_cache_dim=64..64)"
        )
    return (batch, heads, 0, depth)


def _prefill_chunk(model: Any, found: StepRoles) -> int:
    """How many prompt tokens one step takes: the ids' length where it is a number, the high end of
    its declared range where it is a symbol with one (else 1: a size with no range would compile)."""
    ids = next(v for v in model.signature.inputs if v.name == found.ids)
    length = ids.type.shape[1]
    if isinstance(length, int):
        return max(1, length)
    ranges = getattr(model, "ranges", None) or {}
    return int(ranges[length][1]) if isinstance(length, str) and length in ranges else 1


def _context(model: Any, found: StepRoles) -> int | None:
    """The longest past the model was compiled for (its past dim's declared range), None: unknown."""
    symbol = found.cache[0][2]
    ranges = getattr(model, "ranges", None) or {}
    return ranges[symbol][1] if isinstance(symbol, str) and symbol in ranges else None


@contextmanager
def run_seconds(model: Any) -> Iterator[list[float]]:
    """Inside, each ``model.run`` call's seconds appended to the list yielded (the model's share
    of a step; a gap between tokens less it is the loop's own); ``model.run`` restored after."""
    run, seconds = model.run, []

    def timed(feeds: Any, outputs: Any = None) -> Any:
        began = time.perf_counter()
        try:
            return run(feeds, outputs)
        finally:
            seconds.append(time.perf_counter() - began)

    model.run = timed
    try:
        yield seconds
    finally:
        del model.run  # (the class's own again)


__all__ = ["StepRoles", "generate", "pick", "roles", "run_seconds", "stream"]


def batched(model: Any, batch: int) -> Any:
    """``model`` with ``batch`` a size class of its own (``model.declare``), where its batch dim is
    chunked by size classes and ``batch`` is none of them: a batch of that many prompts then runs
    as one step a token (compiled now, once), not as chunks of smaller classes. The model's
    classes are kept; nothing where it has no such dim (or runs ``batch`` at one step already)."""
    found = roles(model)
    symbol = next((v.type.shape[0] for v in model.signature.inputs if v.name == found.ids), None)
    chunking = model.chunking() if batch > 1 and hasattr(model, "chunking") else None
    if chunking is None or chunking.symbol != symbol or batch in chunking.classes:
        return model
    low, high = model.ranges.get(symbol, (1, batch))
    if not low <= batch <= high:
        raise ArgumentError(f"a batch of {batch}: the model was compiled for {low}..{high} ({symbol})")
    ranges = {name: f"{lo}..{hi}" for name, (lo, hi) in model.ranges.items()}
    model.declare(ranges, {symbol: ",".join(str(size) for size in sorted({*chunking.classes, batch}))})
    return model
