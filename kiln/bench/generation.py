"""Text generation measured, kiln against the engines a user could pick (``kiln bench --scenario
generate``, ``benchmarks/generate.py``): time to first token at each prompt length, time per output
token (its p50 and p90) and tokens/s over the new tokens, peak memory, compiles while generating,
and the bandwidth line (each engine's tokens/s as a fraction of the machine's measured memory
bandwidth over the bytes a token reads).

Every engine runs the same random weights (``kiln.zoo.decoders``: a Hugging Face config, a fixed
seed; nothing is downloaded), greedy, batch 1, each (model, engine) in a process of its own (its
peak RSS is its own; no plan cache: its compiles are its own; the peak of a row that compiles
is its run's, the compile's beside it, as each peer converts its model in a process of its own). kiln (fp32), kiln-int8-weights and
kiln-int4-weights (``precision="int8-weights"``, ``"int4-weights"``: their bounds over the int8
bytes, over 4-bit codes and a float32 scale per 32): the decode-step ONNX compiled once
for the context (``past``, ``new`` and ``total`` ranges), ``kiln.generate_stream``'s loop, the
prompt in one step. onnxruntime: the same ONNX file through the same loop (the step's cost is the
engine's; the loop is kiln's). transformers: eager ``generate`` with its own cache, each token
stamped by a streamer. The peers through their own loops (``kiln.bench.gen_peers``:
ONNX Runtime GenAI's builder int4, OpenVINO GenAI int8/int4, llama.cpp Q8_0/Q4_0), each bound over
its weights file's bytes, rows that say "not installed" where their package is absent. kiln's rows
also report the loop's own time a token (the per-token Python cost). Each prompt's bound is over
the read bandwidth measured while its tokens came (``kiln.bench.bandwidth.TokenClock``: a read after
every 16th token, in a process of its own, its time left out of the stamps; the median), a shared
machine's bandwidth moving by 2x within minutes; the reads before and after the row's process are
kept beside it (``bandwidth_around_gb_s``). Each engine's
tokens are compared with the first engine's (greedy: the same weights give the same tokens, up to
near-ties).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from kiln.bench.bandwidth import TokenClock, read_bandwidth, stamper
from kiln.bench.gen_peers import PEERS, run_peer, token_timings
from kiln.errors import KilnError
from kiln.lower.engine import WEIGHT_FORMATS

# engine -> kiln's precision
KILN_ENGINES = {
    "kiln": "fp32",
    "kiln-int8-weights": "int8-weights",
    "kiln-int4-weights": "int4-weights",
    # (a prompt's rows in bfloat16: where the CPU has AVX512_BF16 or AMX; elsewhere the row says why not)
    "kiln-int8-weights-bf16": "int8-weights-bf16",
    "kiln-int4-weights-bf16": "int4-weights-bf16",
    # (a prompt's rows quantized to int8 per row as they run: where the target's int8 code has VNNI or AMX-INT8)
    "kiln-int8-weights-a8": "int8-weights-a8",
    "kiln-int4-weights-a8": "int4-weights-a8",
}
ACCURACY = "weights-accuracy"  # a row of its own: the narrow precisions against fp32 on a fixed token stream
NARROW = ("int8-weights", "int4-weights")  # fed one token a step (decode's rows)
PROMPT_NARROW = ("int8-weights-a8", "int4-weights-a8")  # fed as one prompt (a prompt's rows in int8)


def context_dims(name: str, prompt: int, new_tokens: int, batch: int = 1) -> dict[str, str]:
    """The ranges one compile serves a prompt of up to ``prompt`` tokens and ``new_tokens`` after it
    with: the capacity lowers every range's end at once, so ``past``'s end plus ``new``'s must fit
    the model's position table."""
    import transformers

    from kiln.zoo import decoders

    decoder = decoders.get(name)
    config = getattr(transformers, decoder.config_class)(**decoder.config)  # (its defaults too)
    table = int(getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", 1 << 20))
    context = prompt + new_tokens
    if context > table:
        raise SystemExit(f"{name}: a context of {context} is past its position table ({table})")
    new = max(1, min(prompt, table - (context - 1)))
    return {"past": f"0..{context - 1}", "new": f"1..{new}", "total": f"1..{context}", "batch": f"1..{batch}"}


def prompts_for(name: str, lengths: list[int], batch: int = 1) -> dict[int, Any]:
    """A seeded prompt of each length, ``batch`` of them ([batch, length] ids)."""
    import numpy as np

    from kiln.zoo import decoders

    vocab = decoders.get(name).vocab
    return {n: np.random.default_rng(n).integers(0, vocab, (batch, n)).astype(np.int64) for n in lengths}


def _timed_stream(model: Any, ids: Any, new_tokens: int, clock: Any = None) -> tuple[float, float, list[int], list[float], float]:  # fmt: skip
    """(seconds to the first token, seconds per token after it, the tokens, the p50 and p90 of
    the gaps between tokens, the loop's own seconds per token: a gap less its step's ``run``) of
    kiln's loop, its tokens stamped by ``clock`` (a ``TokenClock``) where given."""
    import numpy as np

    from kiln.driver import generation

    stamp = stamper(clock)
    with generation.run_seconds(model) as inside:
        started = time.perf_counter()
        stamps, tokens = [], []
        for token in generation.stream(model, ids, new_tokens):
            stamps.append(stamp())
            tokens.append(int(token[0]))
    gaps = np.diff(stamps) if len(stamps) > 1 else np.zeros(1)
    spread = [float(np.percentile(gaps, 50)), float(np.percentile(gaps, 90))]
    steps = len(stamps) - 1
    loop = (stamps[-1] - stamps[0] - sum(inside[len(inside) - steps :])) / steps if steps else 0.0
    return stamps[0] - started, (stamps[-1] - stamps[0]) / max(1, steps), tokens, spread, loop


class _Session:
    """An onnxruntime session with the two things kiln's generation loop reads: ``signature`` (the
    compiled model's) and ``run``."""

    def __init__(self, path: str, signature: Any, threads: int) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.signature, self.ranges = signature, {}
        self.names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, Any], outputs: Any = None) -> dict[str, Any]:
        return dict(zip(self.names, self.session.run(None, feeds)))


def _transformers(name: str, prompts: dict[int, Any], new_tokens: int, threads: int) -> dict[str, Any]:
    """transformers' eager ``generate`` with its own cache, each new token stamped by a streamer
    (TTFT: the prompt's forward and its token)."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    from kiln.zoo import decoders

    torch.set_num_threads(threads)
    model = decoders.build(name).model

    class Stamps(BaseStreamer):  # type: ignore[misc]
        def __init__(self, clock: Any) -> None:
            self.stamp, self.stamps, self.prompt = clock.stamp, [], True

        def put(self, value: Any) -> None:
            if self.prompt:  # (the first call gives the prompt back)
                self.prompt = False
                return
            self.stamps.append(self.stamp())

        def end(self) -> None:
            pass

    rows = {}
    with torch.no_grad(), TokenClock(threads) as clock:  # (the bound read between its tokens)
        for length, ids in prompts.items():
            tensor = torch.from_numpy(ids)
            model(tensor)  # warm
            streamer = Stamps(clock)
            started = time.perf_counter()
            out = model.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, streamer=streamer)  # fmt: skip
            rows[length] = token_timings(
                streamer.stamps[0] - started, streamer.stamps, out[0, ids.shape[1] :].tolist(), clock
            )
    return rows


def measure(name: str, engine: str, prompt_lengths: list[int], new_tokens: int, threads: int, batch: int = 1) -> dict[str, Any]:  # fmt: skip
    """One (model, engine) in this process, ``batch`` prompts of each length at once."""
    import kiln
    from kiln.bench.metrics import peak_rss_bytes, release_freed_memory, reset_peak
    from kiln.zoo import decoders

    row: dict[str, Any] = {"model": name, "engine": engine, "threads": threads, "batch": batch}
    if engine == ACCURACY:
        if batch > 1:
            row["error"] = "measured at batch 1 (the same stream, whatever the batch)"
            return row
        row.update(weights_accuracy(name, max(prompt_lengths), threads))
        return row
    if engine in PEERS:
        row.update(run_peer(engine, name, prompts_for(name, prompt_lengths, batch), new_tokens, threads))
        if "error" in row:
            return row
        row["peak_rss_mb"] = peak_rss_bytes() / 1e6
        return row
    if engine not in (*KILN_ENGINES, "onnxruntime", "transformers"):
        row["error"] = f"unknown engine; known: {', '.join(ENGINES)}"
        return row
    prompts = prompts_for(name, prompt_lengths, batch)
    if engine == "transformers":
        row["prompts"] = _transformers(name, prompts, new_tokens, threads)
        row["peak_rss_mb"] = peak_rss_bytes() / 1e6
        return row
    path = str(decoders.export(name))
    dims = context_dims(name, max(prompt_lengths), new_tokens, batch)
    phases = reset_peak()  # (the compile's peak apart from the run's: a peer converts in a process of its own)
    started = time.perf_counter()
    precision = KILN_ENGINES.get(engine, "fp32")
    try:
        # (a batch of prompts as one step a token: a size class of its own, compiled with the rest)
        classes = {"batch": f"1,{batch}"} if batch > 1 and engine in KILN_ENGINES else None
        compiled = kiln.compile(path, dims=dims, threads=threads, precision=precision, generation=True,
                                size_classes=classes)  # fmt: skip
    except KilnError as err:  # (a precision this machine cannot run: the row says why)
        row["error"] = str(err)
        return row
    row["compile_s"], row["dims"], row["precision"] = time.perf_counter() - started, dims, compiled.precision
    ours = engine in KILN_ENGINES
    model = compiled if ours else _Session(path, compiled.signature, threads)
    if not ours:
        model.ranges = dict(compiled.ranges)  # (the loop reads the context and the prompt's step from them)
        del compiled
    else:
        from kiln.driver.routes import dim_routes

        row["routes"] = {k: route for k, (route, _) in dim_routes(compiled).items()}
        row["size_classes"] = {k: list(v) for k, v in compiled.size_classes.items()}
    if phases:  # the run's own peak from here: what the compile freed handed back first
        row["peak_compile_mb"] = peak_rss_bytes() / 1e6
        release_freed_memory()
        reset_peak()
    from kiln.driver.variants import plans_compiled

    row["prompts"] = {}
    with TokenClock(threads) as clock:  # (the bound read between its tokens)
        for length, ids in prompts.items():
            _timed_stream(model, ids, 2)  # warm: the first calls fault the weights in
            before = plans_compiled()
            first, per_token, tokens, spread, loop = _timed_stream(model, ids, new_tokens, clock)
            row["prompts"][length] = {"ttft_s": first, "tpot_s": per_token, "tokens": tokens, "tpot_p50_p90_s": spread,
                                      "loop_s": loop, **clock.lap()}  # fmt: skip
            row["prompts"][length]["compiles"] = plans_compiled() - before  # (0: one compile served it all)
    row["peak_rss_mb"] = peak_rss_bytes() / 1e6
    return row


def weights_accuracy(name: str, length: int, threads: int) -> dict[str, Any]:
    """int8-weights and int4-weights against fp32 on a fixed token stream (the seeded prompt of
    ``length`` tokens, fed one token a step as a generation loop feeds its new tokens, every
    step's logits): the relative L2 of the logits, how often each predicts fp32's next token, and
    each one's perplexity of the stream's own next tokens. One token a step is what decode runs
    (int4: its row's activations quantized to int8 per group at run time, gemm_w4.c); the ``-a8``
    forms take the stream as one prompt (its rows quantized to int8 per row, gemm_wa8.c; absent
    where the CPU has no int8 dot product; int8-weights-a8's decode rows are quantized so too, a
    row's products bit for bit its prompt's)."""
    import tempfile

    import numpy as np

    ids = prompts_for(name, [length])[length]
    logits = {}
    with tempfile.TemporaryDirectory(prefix="kiln-logits-") as folder:
        for precision in (
            "fp32",
            *NARROW,
            *PROMPT_NARROW,
        ):  # each compile in a process of its own: one 1B model's memory at a time
            where = os.path.join(folder, f"{precision}.npy")
            command = [sys.executable, "-m", "kiln.bench.generation", "--logits", f"{name}:{precision}:{length}:{where}", "--threads", str(threads)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0 and precision in PROMPT_NARROW and "is not available" in done.stderr:
                continue  # (no int8 dot product for this CPU: the row says so by the missing entry)
            if done.returncode != 0:
                return {"error": f"{precision} stream: {done.stderr[-300:] or f'exit {done.returncode}'}"}
            logits[precision] = np.load(where).astype(np.float64)

    def perplexity(values: np.ndarray) -> float:
        shifted = values[:-1] - values[:-1].max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(np.exp(-log_p[np.arange(length - 1), ids[0, 1:]].mean()))

    fp32 = logits["fp32"]
    found: dict[str, Any] = {"tokens": length, "perplexity_fp32": perplexity(fp32)}
    for precision in (*NARROW, *PROMPT_NARROW):
        if precision not in logits:
            continue
        narrow = logits[precision]
        found[precision] = {"logits_rel_l2": float(np.linalg.norm(narrow - fp32) / np.linalg.norm(fp32)),
                            "same_next_token": float((narrow.argmax(axis=1) == fp32.argmax(axis=1)).mean()),
                            "perplexity": perplexity(narrow)}  # fmt: skip
    return found


def stream_logits(name: str, precision: str, length: int, threads: int) -> Any:
    """Every step's logits [length, vocab] (float32) of ``name`` at ``precision`` fed its seeded
    ``length``-token stream one token a step, or, for a precision whose prompt rows have a format
    of their own (``-a8``, ``-bf16``), as one prompt (every position's logits of one step)."""
    import numpy as np

    import kiln
    from kiln.driver.generation import roles
    from kiln.zoo import decoders

    whole = precision in WEIGHT_FORMATS and bool(WEIGHT_FORMATS[precision][3])
    dims = {"past": f"0..{length - 1}", "new": f"1..{length if whole else 1}", "total": f"1..{length}", "batch": "1..1"}
    ids = prompts_for(name, [length])[length]
    model = kiln.compile(str(decoders.export(name)), dims=dims, threads=threads, precision=precision)
    found = roles(model)
    cache = [np.zeros((1, s[1], 0, s[3]), np.float32) for s in found.cache]
    if whole:
        feeds = {found.ids: ids, **dict(zip(found.past, cache))}
        if found.mask:
            feeds[found.mask] = np.ones((1, length), ids.dtype)
        return np.asarray(model.run(feeds)[found.logits])[0]
    steps = np.empty((length, decoders.get(name).vocab), np.float32)
    for at in range(length):
        feeds = {found.ids: ids[:, at : at + 1], **dict(zip(found.past, cache))}
        if found.mask:
            feeds[found.mask] = np.ones((1, at + 1), ids.dtype)
        out = model.run(feeds)
        steps[at] = np.asarray(out[found.logits])[0, -1]
        cache = [out[p] for p in found.present]
    return steps


WIDTHS = {"fp32": 4, "int8": 1, "int4": 0.5625}  # bytes a matrix element a token reads, by storage
# kiln's precision -> its storage (a weight format's bits)
ROW_BYTES = {name: f"int{form[0]}" for name, form in WEIGHT_FORMATS.items()}


def weight_bytes(name: str) -> dict[str, int]:
    """The bytes of weights a decode step reads (every parameter once; the tied embedding once), by
    storage, from one build of the model: fp32; ``int8``, the matrices (every 2-D parameter) at one
    byte an element, as ``--precision int8-weights`` stores the products' weights (its per-column
    scales and an embedding table's few rows a token reads are left out); ``int4``, at 4 bits and a
    float16 scale per block of 32 (0.5625 bytes an element: ``--precision int4-weights``, as
    llama.cpp's Q4_0)."""
    import torch
    import transformers

    from kiln.zoo import decoders

    decoder = decoders.get(name)
    with torch.device("meta"):  # (shapes only: a 1B model's 5 GB built here had stayed in the bench's RSS)
        model = getattr(transformers, decoder.model_class)(
            getattr(transformers, decoder.config_class)(**decoder.config)
        )
    shapes = [(p.numel(), p.dim()) for p in model.parameters()]
    return {key: int(sum(n * (width if dim == 2 else 4) for n, dim in shapes)) for key, width in WIDTHS.items()}


def cache_elements(name: str) -> int:
    """Elements of the KV cache a position holds: layers x (K and V) x KV heads x head depth."""
    import transformers

    from kiln.zoo import decoders

    decoder = decoders.get(name)
    config = getattr(transformers, decoder.config_class)(**decoder.config)
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    depth = getattr(config, "head_dim", None) or hidden // heads
    return int(layers * 2 * (getattr(config, "num_key_value_heads", None) or heads) * depth)


def _spread(found: dict[str, Any]) -> str:
    spread = found.get("tpot_p50_p90_s")
    return f"p50/p90 {spread[0] * 1e3:.2f}/{spread[1] * 1e3:.2f} ms" if spread else ""


ENGINES = [*KILN_ENGINES, ACCURACY, "onnxruntime", "transformers", *PEERS]
DEFAULT_MODELS = ("gpt2-124m",)


def measured_alone(name: str, engine: str, prompts: list[int], new_tokens: int, threads: int, timeout: float, batch: int = 1) -> dict[str, Any]:  # fmt: skip
    """``measure`` in a process of its own (no plan cache); the row, or one with ``error`` saying why none."""
    row: dict[str, Any] = {"model": name, "engine": engine}
    command = [sys.executable, "-m", "kiln.bench.generation", "--one", f"{name}:{engine}",
               "--prompts", ",".join(map(str, prompts)), "--new-tokens", str(new_tokens), "--threads", str(threads), "--batch", str(batch)]  # fmt: skip
    env = {**os.environ, "KILN_PLAN_CACHE": "0"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {timeout:.0f} s"}
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    return json.loads(line) if line else {**row, "error": done.stderr[-400:] or f"exit {done.returncode}"}


def run_generation(models: list[str], engines: list[str], prompts: list[int], new_tokens: int, threads: int,
                   timeout: float, say: Any = print, batch: int = 1) -> list[dict[str, Any]]:  # fmt: skip
    """Every (model, engine) measured alone, with the bandwidth line's figures; ``say`` gets each
    row's lines as they come. Each prompt's bound is over the reads between its tokens; the read
    bandwidth is measured beside each row too (before and after it), the larger the bound of a
    row without its own readings."""
    bandwidth, how = read_bandwidth(threads=threads)
    say(f"memory bandwidth (read, {threads} thread(s), {how}): {bandwidth:.1f} GB/s")
    rows = []
    for name in models:
        found_bytes = weight_bytes(name)
        weights, weights8, weights4 = found_bytes["fp32"], found_bytes["int8"], found_bytes["int4"]
        cached = cache_elements(name)
        say(f"{name}: {weights / 1e6:.0f} MB of fp32 weights per token, bound {bandwidth * 1e9 / weights:.1f} tokens/s; "
            f"int8 weights {weights8 / 1e6:.0f} MB, {bandwidth * 1e9 / weights8:.1f} tokens/s; "
            f"int4 {weights4 / 1e6:.0f} MB, {bandwidth * 1e9 / weights4:.1f} tokens/s; "
            f"its KV cache {cached * 4 / 1e3:.0f} kB a position in float32")  # fmt: skip
        reference: dict[str, list[int]] = {}
        for engine in engines:
            before = read_bandwidth(rounds=3, threads=threads)[0]
            row = measured_alone(name, engine, prompts, new_tokens, threads, timeout, batch)
            after = read_bandwidth(rounds=3, threads=threads)[0]
            storage = ROW_BYTES.get(KILN_ENGINES.get(engine, ""), "fp32")  # (a peer's: its weights file)
            row_bytes = row.get("weight_bytes") or found_bytes[storage]
            # (each step reads the cache too: its mean past over the timed steps, each sequence's)
            element = row.get("cache_element_bytes", 4)  # (kiln's, onnxruntime's, transformers': float32)
            for length, found in (row.get("prompts") or {}).items():
                past = int(length) + new_tokens / 2
                found["cache_bytes"] = int(cached * element * past * row.get("batch", batch))
            row.update(
                {
                    "bandwidth_gb_s": max(before, after),
                    "bandwidth_around_gb_s": [before, after],
                    "weight_bytes": row_bytes,
                }
            )
            for length, found in (row.get("prompts") or {}).items():
                found["same_tokens"] = reference.setdefault(str(length), found["tokens"]) == found["tokens"]
            rows.append(row)
            for line in row_lines(row):
                say(line)
    return rows


def _prompt(row: dict[str, Any], length: Any) -> str:
    """A prompt length, with the batch when several prompts run at once (``128 x4``)."""
    return f"{length} x{row['batch']}" if row.get("batch", 1) > 1 else str(length)


def _bandwidth(row: dict[str, Any], found: dict[str, Any]) -> float:
    """A prompt's bound's bandwidth: the median of the readings between its tokens, else (a row
    without them) the larger of the readings before and after its process."""
    return found.get("bandwidth_gb_s") or row["bandwidth_gb_s"]


def row_rates(row: dict[str, Any], found: dict[str, Any]) -> tuple[float, float]:
    """(tokens/s over the batch's rows, steps/s as a fraction of the bound: one step reads the
    weights once, whatever the batch, and each sequence's cache)."""
    steps = 1 / found["tpot_s"]
    return steps * row.get("batch", 1), steps * (row["weight_bytes"] + found.get("cache_bytes", 0)) / (
        _bandwidth(row, found) * 1e9
    )


def row_lines(row: dict[str, Any]) -> list[str]:
    """A row as the table's lines (one per prompt length; an error or the accuracy row in one)."""
    engine = row["engine"]
    if row.get("error"):
        return [f"{engine:<20} {str(row['error'])[:200]}"]
    if engine == ACCURACY:
        parts = [f"{p}: logits rel. L2 {row[p]['logits_rel_l2']:.2e}, fp32's next token {100 * row[p]['same_next_token']:.1f}%, "
                 f"perplexity {row[p]['perplexity']:.1f}" for p in (*NARROW, *PROMPT_NARROW) if p in row]  # fmt: skip
        return [
            f"{engine:<20} on {row['tokens']} fixed tokens (fp32 perplexity {row['perplexity_fp32']:.1f}): "
            + "; ".join(parts)
        ]
    lines = []
    for length, found in row["prompts"].items():
        rate, share = row_rates(row, found)
        lines.append(f"{engine:<20} prompt {_prompt(row, length):>5}: TTFT {found['ttft_s'] * 1e3:8.1f} ms, {found['tpot_s'] * 1e3:7.2f} ms/token "
                     f"{_spread(found)}, {rate:6.1f} tokens/s ({share:.2f} of its bound at {_bandwidth(row, found):.1f} GB/s, {found.get('cache_bytes', 0) / 1e6:.0f} MB of cache a step), peak {_peak(row)} MB, "
                     f"same tokens {found.get('same_tokens', '-')}, compiles {found.get('compiles', '-')}{_loop(found)}")  # fmt: skip
    return lines


def _peak(row: dict[str, Any]) -> str:
    """A row's peak RSS in MB, the compile's beside it where it compiled (its own peak, apart)."""
    compiled = f" (compile {row['peak_compile_mb']:,.0f})" if "peak_compile_mb" in row else ""
    return f"{row.get('peak_rss_mb', 0):,.0f}{compiled}"


def _loop(found: dict[str, Any]) -> str:
    """kiln's loop's own time a token (a step's gap less its run), where measured."""
    return f", loop {found['loop_s'] * 1e6:.0f} µs/token" if "loop_s" in found else ""


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the report's table."""
    lines = ["| model | engine | prompt | TTFT ms | ms / token (p50 / p90) | tokens/s | of its bound at GB/s | peak RSS MB | same tokens | compiles | loop µs / token |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        if row.get("error") or row["engine"] == ACCURACY:
            lines.append(
                f"| {row['model']} | {row['engine']} | "
                + " | ".join([row_lines(row)[0][21:].strip()] + [""] * 8)
                + " |"
            )
            continue
        for length, found in row["prompts"].items():
            rate, share = row_rates(row, found)
            given = found.get("tpot_p50_p90_s")
            spread = f"{given[0] * 1e3:.2f} / {given[1] * 1e3:.2f}" if given else "- / -"
            loop = f"{found['loop_s'] * 1e6:.0f}" if "loop_s" in found else "-"  # (kiln's loop only)
            lines.append(f"| {row['model']} | {row['engine']} | {_prompt(row, length)} | {found['ttft_s'] * 1e3:.1f} | {found['tpot_s'] * 1e3:.2f} "
                         f"({spread}) | {rate:.1f} | {share:.2f} at {_bandwidth(row, found):.1f} | {_peak(row)} | "
                         f"{found.get('same_tokens', '-')} | {found.get('compiles', '-')} | {loop} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--prompts", default="128,512")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="prompts generated at once")
    parser.add_argument("--json", help="append one JSON line per row here")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--logits", help=argparse.SUPPRESS)  # name:precision:length:file (weights_accuracy's child)
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.prompts.split(",")]
    if args.logits:
        import numpy as np

        name, precision, length, where = args.logits.split(":", 3)
        np.save(where, stream_logits(name, precision, int(length), args.threads))
        return 0
    if args.one:
        name, engine = args.one.split(":")
        print(
            json.dumps(measure(name, engine, lengths, args.new_tokens, args.threads, args.batch), default=str),
            flush=True,
        )
        return 0
    rows = run_generation(args.models.split(","), args.engines.split(","), lengths, args.new_tokens, args.threads, args.timeout, batch=args.batch)  # fmt: skip
    if args.json:
        with open(args.json, "a") as handle:
            for row in rows:
                handle.write(json.dumps(row, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
