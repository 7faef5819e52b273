"""Reproducers for kiln bugs: when compiling fails with an error that is not a ``KilnError`` (an
internal invariant broke), the graph, the pipeline configuration and the traceback are written to
a folder, and ``python -m kiln.driver.repro DIR`` replays exactly that compile.

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

from kiln.driver.artifact import pack_tensors, unpack_tensors
from kiln.driver.options import CompileOptions
from kiln.driver.pipeline import compile_plan
from kiln.integrity import cache_folder_or_private
from kiln.ir.parser import parse_graph
from kiln.ir.printer import print_graph, tensor_data
from kiln.lower.target import Target
from kiln.passes import specialize
from kiln.version import __version__


def folder() -> Path:
    return cache_folder_or_private("repro", keep=True)


def write(
    graph: Any, options: CompileOptions, dims: dict[str, int], error: BaseException, stage: str, target: Target
) -> Path:
    text = print_graph(graph)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = folder() / f"{time.strftime('%Y%m%d-%H%M%S')}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "graph.txt").write_text(text)
    numeric, strings, names = pack_tensors(tensor_data(graph))
    (path / "tensors.npz").write_bytes(numeric)
    (path / "strings.json").write_bytes(strings)
    config = {
        "level": options.level,
        "disabled": sorted(options.disabled),
        "dims": dims,
        "target": target.name,
        "stage": stage,
        "kiln": __version__,
        "tensor_names": names,
        "debug": options.debug,
        "tuned": options.tuned,
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "error.txt").write_text("".join(traceback.format_exception(error)))
    return path


def replay(path: str | os.PathLike) -> int:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    strings = path / "strings.json"
    data = unpack_tensors(
        (path / "tensors.npz").read_bytes(), strings.read_bytes() if strings.exists() else b"", config["tensor_names"]
    )
    graph = parse_graph((path / "graph.txt").read_text(), data)
    # only settings that change what kiln compiles (its CompileOptions): a reproducer from someone
    # else never picks the C compiler or where caches live
    options = CompileOptions(
        level=int(config["level"]),
        disabled=frozenset(str(d) for d in config.get("disabled", [])),
        debug=bool(config.get("debug", False)),
        tuned=bool(config.get("tuned", True)),
        plan_cache=False,
    )
    target = str(config.get("target", "cpu"))
    print(
        f"replaying a kiln {config['kiln']} compile for {target} (-O{options.level}, dims {config['dims']}), "
        f"failed at: {config['stage']}"
    )
    compile_plan(specialize(graph, config["dims"]), target, options)
    print("compiled without error: the bug does not reproduce with this kiln")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m kiln.driver.repro DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(replay(sys.argv[1]))
