"""A decoder's decode step with its KV cache as inputs and outputs (issue 52's starting point): how kiln
compiles it, and whether it takes the past length at run time.

Tiny random-weight decoders (``kiln.zoo.decoders``: GPT-2, Llama- and Qwen2-like, 2 layers, 64 wide)
wrapped so one call is one generation step: token ids [batch, 1], the attention mask [batch, total],
each layer's past keys and values [batch, kv_heads, past, head_dim] -> logits and the present keys and
values [batch, kv_heads, total, head_dim], total = past + 1. Exported with ``batch``, ``past`` and
``total`` symbolic, compiled with the declared ranges, then run at several past lengths against
onnxruntime on the same file.

    python benchmarks/decode_step.py [--models gpt2,llama,qwen2] [--exporters torchscript,dynamo]
                                     [--max-past 128] [--lengths 1,7,33,128] [--time 200]

Prints, per model and past length: the relative L2 against onnxruntime and the route that served it,
then the compile's seconds and how many kernel integers it read from the lowering's own size
expressions or fitted to lowered bindings, the plans compiled after ``kiln.compile`` returned (a generation loop needs 0: the past length
taken at run time) and why kiln refused the run-time sizes (``run_time_refused``). ``--time N``: per
length, the median and p90 microseconds of a step on that one compile, on a compile for exactly
that length, and on onnxruntime (batch 1 only: the exact compile binds batch 1). Not a test: no
pass/fail (tests/zoo/test_decoders.py is).
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,llama,qwen2")
    parser.add_argument("--exporters", default="torchscript,dynamo")
    parser.add_argument("--max-past", type=int, default=128)
    parser.add_argument("--lengths", default="1,7,33,128")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--time", type=int, default=0, help="calls timed per engine and length (0: none)")
    args = parser.parse_args()
    import numpy as np
    import onnxruntime

    import kiln
    from kiln.driver import extents
    from kiln.driver.variants import plans_compiled
    from kiln.zoo import decoders

    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            try:
                path = decoders.export(name, exporter=exporter)
            except Exception as err:  # an exporter's failure is a row, not the end of the run
                print(f"{name} ({exporter}): export failed: {type(err).__name__}: {str(err)[:200]}")
                continue
            dims = {
                "past": (1, args.max_past),
                "new": (1, 16),
                "total": (2, args.max_past + 1),
                "batch": (1, max(2, args.batch)),
            }
            found = extents.sizes_found()
            started = time.perf_counter()
            model = kiln.compile(str(path), dims=dims)
            took = time.perf_counter() - started
            after = extents.sizes_found()
            read, fitted = (after[k] - found[k] for k in ("read", "fitted"))
            print(f"{name} ({exporter}): compiled in {took:.1f} s; kernel sizes read {read}, fitted {fitted}")
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            outputs = decoders.names(name)[1]
            before = plans_compiled()
            for past in (int(n) for n in args.lengths.split(",")):
                feeds = decoders.inputs(name, past=past, batch=args.batch)
                got, want = model.run(feeds), session.run(None, feeds)
                error = max(np.linalg.norm(np.asarray(got[n]) - w) / np.linalg.norm(w) for n, w in zip(outputs, want))
                route = getattr(getattr(model, "route", None), "name", "?")
                timing = _timed(kiln, str(path), model, session, feeds, args.time) if args.time else ""
                print(f"{name} ({exporter}) past {past:>4}: relative L2 {error:.1e}, route {route}{timing}")
            print(f"{name} ({exporter}): plans compiled after kiln.compile: {plans_compiled() - before}")
            print(f"{name} ({exporter}): run-time sizes refused: {getattr(model, 'run_time_refused', {})}")
    return 0


def _timed(kiln, path: str, model, session, feeds: dict, calls: int) -> str:  # type: ignore[no-untyped-def]
    """Median and p90 microseconds per step of: the one compile for every length (``model``), a
    compile for exactly this length (what the step cost before: one per generated token), and
    onnxruntime; timed in alternating blocks of 10 calls so drift touches all three."""
    import numpy as np

    exact = kiln.compile(path, dims={"past": feeds["past_0"].shape[2], "total": feeds["mask"].shape[1], "batch": 1})
    engines = {"ranges": lambda: model.run(feeds), "exact": lambda: exact.run(feeds)}
    engines["onnxruntime"] = lambda: session.run(None, feeds)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for run in engines.values():
        run()
    for _ in range(max(1, calls // 10)):
        for key, run in engines.items():
            for _ in range(10):
                started = time.perf_counter()
                run()
                times[key].append((time.perf_counter() - started) * 1e6)
    parts = [f"{k} {np.median(v):.0f}/{np.percentile(v, 90):.0f}" for k, v in times.items()]
    return "; us p50/p90: " + ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
