"""A decode step's KV cache updated in place against copied each step (``kiln.passes.cache_in_place``):
ms a step through the run-time dims route (the one compile ``kiln.generate`` runs on) after prompts of
a few lengths, with the in-place update on and off (``cache-in-place`` disabled: the present dense at
its sizes, every cached row copied into it each step).

    python benchmarks/kv_cache.py [--model llama-1b] [--layers 2] [--vocab 2048] [--context 640]
                                  [--prompts 8,576] [--steps 32] [--batch 1,4] [--precision int4-weights-a8]

A zoo decoder's shapes cut to ``--layers`` layers and a small vocabulary, compiled with the context's
ranges (and the batches as size classes), run by ``kiln.generate_stream``; per setting, batch and
prompt: the median and p90 of the model's own seconds a step over ``--steps`` tokens (the prompt's
step left out), then the ratio copied / in place. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--context", type=int, default=640)
    parser.add_argument("--prompts", default="8,576")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", default="1,4")
    parser.add_argument("--precision", default="int4-weights-a8")
    args = parser.parse_args()
    import numpy as np

    import kiln
    from kiln.driver.generation import run_seconds
    from kiln.driver.options import CompileOptions
    from kiln.zoo import decoders

    base = decoders.get(args.model)
    layers = "n_layer" if "n_layer" in base.config else "num_hidden_layers"
    name = f"{args.model}-{args.layers}l"
    config = {**base.config, layers: args.layers, "vocab_size": args.vocab}
    decoders.DECODERS[name] = decoders.Decoder(name, base.config_class, base.model_class, config)
    path = str(decoders.export(name))
    batches = [int(b) for b in args.batch.split(",")]
    prompts = [int(p) for p in args.prompts.split(",")]
    c = args.context
    dims = {"past": f"0..{c - 1}", "new": f"1..{c}", "total": f"1..{c}", "batch": f"1..{max(batches)}"}
    print(f"{args.model}'s shapes, {args.layers} layers, vocabulary {args.vocab}, {args.precision}, context {c}")
    medians: dict[tuple, float] = {}
    for setting, disabled in (("in place", frozenset()), ("copied", frozenset({"cache-in-place"}))):
        options = CompileOptions.from_env(precision=args.precision, disabled=disabled)
        classes = {"batch": ",".join(str(b) for b in sorted({1, *batches}))}
        model = kiln.compile(path, dims=dims, options=options, generation=True, size_classes=classes)
        for batch in batches:
            for prompt in prompts:
                ids = np.random.default_rng(prompt).integers(0, args.vocab, (batch, prompt)).astype(np.int64)
                with run_seconds(model) as seconds:
                    for _ in kiln.generate_stream(model, ids, args.steps + 1):
                        pass
                steps = np.asarray(seconds[1:]) * 1e3  # (the prompt's step left out)
                medians[setting, batch, prompt] = float(np.median(steps))
                print(
                    f"  {setting:<9} batch {batch} prompt {prompt:>4}: {np.median(steps):7.2f} ms a step "
                    f"(p90 {np.percentile(steps, 90):7.2f})"
                )
    for batch in batches:
        for prompt in prompts:
            ratio = medians["copied", batch, prompt] / medians["in place", batch, prompt]
            print(f"batch {batch} prompt {prompt}: copied / in place = {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
