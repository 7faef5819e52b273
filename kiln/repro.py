"""Reproducers for kiln bugs: when compiling fails with an error that is not a ``KilnError`` (an
internal invariant broke), the graph, the pipeline configuration and the traceback are written to
a folder, and ``python -m kiln.repro DIR`` replays exactly that compile.

    DIR/graph.txt      the source graph in kiln's IR text form (names, types, attributes)
    DIR/tensors.npz    its numeric weights (plain .npy members: replaying unpickles nothing)
    DIR/strings.json   its string tensors
    DIR/config.json    -O level, bound dims, target, the stage that failed, kiln version, KILN_* env
    DIR/error.txt      the traceback
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kiln.runtime.artifact import pack_tensors, unpack_tensors


def folder() -> Path:
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    return Path(root) / "repro"


REPLAYED_SETTINGS = ("KILN_DISABLE", "KILN_TUNED", "KILN_DEBUG", "KILN_PLAN_CACHE")


def write(graph: Any, level: int, dims: dict[str, int], error: BaseException, stage: str) -> Path:
    from kiln import __version__
    from kiln.ir.printer import print_graph, tensor_data

    text = print_graph(graph)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = folder() / f"{time.strftime('%Y%m%d-%H%M%S')}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "graph.txt").write_text(text)
    numeric, strings, names = pack_tensors(tensor_data(graph))
    (path / "tensors.npz").write_bytes(numeric)
    (path / "strings.json").write_bytes(strings)
    config = {
        "level": level,
        "dims": dims,
        "target": "cpu",
        "stage": stage,
        "kiln": __version__,
        "tensor_names": names,
        "env": {k: v for k, v in os.environ.items() if k.startswith("KILN_") and k != "KILN_CACHE_DIR"},
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "error.txt").write_text("".join(traceback.format_exception(error)))
    return path


def replay(path: str | os.PathLike) -> int:
    from kiln.compiler import compile_plan
    from kiln.ir.parser import parse_graph
    from kiln.passes import specialize

    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    strings = path / "strings.json"
    data = unpack_tensors(
        (path / "tensors.npz").read_bytes(), strings.read_bytes() if strings.exists() else b"", config["tensor_names"]
    )
    graph = parse_graph((path / "graph.txt").read_text(), data)
    # only settings that change what kiln compiles: a reproducer from someone else must not pick
    # the C compiler (KILN_CC) or where caches live
    os.environ.update({k: str(v) for k, v in config.get("env", {}).items() if k in REPLAYED_SETTINGS})
    print(
        f"replaying a kiln {config['kiln']} compile (-O{config['level']}, dims {config['dims']}), failed at: {config['stage']}"
    )
    compile_plan(specialize(graph, config["dims"]), config["level"], build_library=True)
    print("compiled without error: the bug does not reproduce with this kiln")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m kiln.repro DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(replay(sys.argv[1]))
