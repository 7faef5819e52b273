"""Where a decode step's time goes at two cache lengths: a zoo decoder's shapes cut to a few layers
(and a small vocabulary), one new token after ``past`` cached ones, compiled per length with
kernel timers (``kiln.driver.profile``), the slowest kernels listed with what they compute.

    python benchmarks/decode_profile.py [--model llama-1b] [--layers 2] [--vocab 2048]
                                        [--pasts 128,576] [--precision int4-weights] [--top 12] [--batch 1]
                                        [--new 1]

Prints per past length the median ms of a step and the slowest kernels (µs per step, kind, the
graph nodes they compute): how attention and the cache grow with the context beside the weight
products that do not. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--pasts", default="128,576")
    parser.add_argument("--precision", default="int4-weights")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new", type=int, default=1, help="tokens a step takes (a prompt's: --pasts 0 --new 512)")
    args = parser.parse_args()
    from kiln.driver.options import CompileOptions
    from kiln.driver.profile import profile_graph
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.specialize import specialize
    from kiln.zoo import decoders

    base = decoders.get(args.model)
    layers = "n_layer" if "n_layer" in base.config else "num_hidden_layers"
    vocab = "vocab_size"
    name = f"{args.model}-{args.layers}l"
    config = {**base.config, layers: args.layers, vocab: args.vocab}
    decoders.DECODERS[name] = decoders.Decoder(name, base.config_class, base.model_class, config)
    graph = import_onnx(str(decoders.export(name)))
    options = CompileOptions.from_env(precision=args.precision)
    print(f"{args.model}'s shapes, {args.layers} layers, vocabulary {args.vocab}, {args.precision}")
    for past in (int(p) for p in args.pasts.split(",")):
        bound = specialize(graph, {"batch": args.batch, "new": args.new, "past": past, "total": past + args.new})
        found = profile_graph(bound, runs=args.runs, options=options)
        print(f"past {past}: a step {found.run_seconds * 1e3:.2f} ms (median of {args.runs})")
        for timed in sorted(found.kernels, key=lambda t: -t.seconds)[: args.top]:
            print(f"  {timed.seconds * 1e6:8.1f} µs  {timed.kernel.kind:<16} {', '.join(timed.kernel.sources)[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
