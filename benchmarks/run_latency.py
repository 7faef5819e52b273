"""Median latency of ``model.run`` for zoo models compiled by the kiln on ``sys.path`` (an A/B of
two kiln trees: run it under each, alternately, on an idle machine).

    python benchmarks/run_latency.py mobilenet_v2 gcn --runs 200 --threads 2
    PYTHONPATH=/path/to/other/kiln python benchmarks/run_latency.py mobilenet_v2 gcn

Prints one JSON line per model: compile seconds, median and p90 run milliseconds, the ISA."""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    import kiln
    from kiln import zoo
    from kiln.backends import parse

    for name in args.models:
        path = str(zoo.onnx_path(name))
        feeds = zoo.example_inputs(name)
        start = time.perf_counter()
        model = kiln.compile(path, dims=_dims(feeds, path), threads=args.threads)
        compile_s = time.perf_counter() - start
        for _ in range(10):
            model.run(feeds)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            model.run(feeds)
            times.append(time.perf_counter() - start)
        times.sort()
        print(
            json.dumps(
                {
                    "model": name,
                    "kiln": kiln.__file__,
                    "isa": parse("cpu").summary if hasattr(parse("cpu"), "summary") else parse("cpu").isa,
                    "compile_s": round(compile_s, 2),
                    "p50_ms": round(statistics.median(times) * 1e3, 3),
                    "p90_ms": round(times[int(0.9 * len(times))] * 1e3, 3),
                }
            ),
            flush=True,
        )


def _dims(feeds: dict, path: str) -> dict[str, int]:
    """The example inputs' binding of the model's symbolic dims (compiled ahead: runs only run)."""
    from kiln.frontend import to_graph
    from kiln.passes.specialize import input_dims

    return input_dims(to_graph(path), feeds)


if __name__ == "__main__":
    main()
