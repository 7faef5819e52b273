"""``torch.compile(model, backend="kiln", dynamic=True)`` on architectures kiln's zoo does not have
(issue 49): one kiln compile per graph dynamo hands over, and every later size served by it.

    python benchmarks/torch_compile_dynamic.py [--models roberta,gpt2,llama] [--json out.jsonl]

Per architecture, in a process of its own with no plan cache: the transformers module (random
weights) compiled with ``dynamic=True`` and called at growing and shrinking sizes (token models:
batch x length (1,16), (2,16), (3,7), (5,13), (8,64), (1,1), (4,31), (2,1), padding masks that
differ per sample; images: batch x height x width), each output compared with eager PyTorch. The
row: graphs dynamo made (it specializes sizes 0 and 1, so batch 1 and length 1 are graphs of
their own), kiln compiles (one per graph is the target), plans compiled at calls after a graph's
first (0 is the target: a size served without compiling), the slowest first call of a graph and
of any other call, and the worst relative L2 against eager. No failure is dropped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from own_process import append_row, measured_alone

TEXT_SIZES = [(1, 16), (2, 16), (3, 7), (5, 13), (8, 64), (1, 1), (4, 31), (2, 1)]
IMAGE_SIZES = [(1, 32, 32), (2, 32, 32), (3, 37, 37), (4, 64, 64), (2, 48, 48)]
DEFAULT_MODELS = "roberta,albert,electra,gpt2,opt,bloom,gpt-neo,llama,qwen2,t5-encoder"


class _Compiles(logging.Handler):
    """Counts kiln's graph compiles (the backend logs one line per graph it converts)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("kiln compiles a graph"):
            self.count += 1


def measure(name: str) -> dict[str, Any]:
    import numpy as np
    import torch

    import kiln.torch_backend  # noqa: F401  (registers the backend)
    from kiln.driver.variants import plans_compiled
    from kiln.zoo import architectures

    compiles = _Compiles()
    logger = logging.getLogger("kiln.torch_backend")
    logger.setLevel(logging.INFO)
    logger.addHandler(compiles)
    pixels = architectures.get(name).inputs == "pixels"
    module = architectures.build(name)
    compiled = torch.compile(module, backend="kiln", dynamic=True)
    calls, worst, graphs_seen = [], 0.0, 0
    for size in IMAGE_SIZES if pixels else TEXT_SIZES:
        if pixels:
            rng = np.random.default_rng(sum(size))
            feeds = {"pixel_values": rng.standard_normal((size[0], 3, size[1], size[2])).astype(np.float32)}
        else:
            feeds = architectures.inputs(name, batch=size[0], seq=size[1])
        args = [torch.from_numpy(v) for v in feeds.values()]
        plans, graphs, started = plans_compiled(), compiles.count, time.perf_counter()
        with torch.no_grad():
            try:
                got = compiled(*args)
            except Exception as err:
                calls.append({"size": size, "error": f"{type(err).__name__}: {str(err)[:200]}"})
                continue
            seconds = time.perf_counter() - started
            want = module(*args)
        error = float(torch.linalg.norm(got - want) / torch.linalg.norm(want))
        worst = max(worst, error)
        new_graph = compiles.count > graphs
        graphs_seen += new_graph
        calls.append(
            {
                "size": size,
                "seconds": seconds,
                "new_graph": new_graph,
                "plans": plans_compiled() - plans,
                "rel_l2": error,
            }
        )
    ran = [c for c in calls if "error" not in c]
    return {
        "model": name,
        "kiln_compiles": compiles.count,
        "graphs": graphs_seen,
        "plans_after_first_call": sum(c["plans"] for c in ran if not c["new_graph"]),
        "slowest_first_call_s": max((c["seconds"] for c in ran if c["new_graph"]), default=float("nan")),
        "slowest_other_call_s": max((c["seconds"] for c in ran if not c["new_graph"]), default=float("nan")),
        "worst_rel_l2": worst,
        "errors": [f"{c['size']}: {c['error']}" for c in calls if "error" in c],
        "calls": calls,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--json", help="append one JSON line per row here")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one), default=str), flush=True)
        return 0
    print(
        f"{'model':<12} {'kiln compiles':>13} {'plans after a first call':>24} {'first call s':>12} "
        f"{'other calls s':>13} {'worst rel L2':>12}  errors"
    )
    for name in args.models.split(","):
        row = measured_alone(__file__, name, args.timeout, {"model": name})
        compiles = f"{row.get('kiln_compiles', '-')} / {row.get('graphs', '-')} graphs"
        print(
            f"{name:<12} {compiles:>13} {row.get('plans_after_first_call', '-'):>24} "
            f"{row.get('slowest_first_call_s', float('nan')):>12.2f} {row.get('slowest_other_call_s', float('nan')):>13.2f} "
            f"{row.get('worst_rel_l2', float('nan')):>12.1e}  {row.get('error') or '; '.join(row.get('errors', []))[:300]}",
            flush=True,
        )
        append_row(args.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
