"""One benchmark row measured in a process of its own (``SCRIPT --one ARG``), with no plan cache, so
each row's compiles are its own: the helper the per-architecture benchmarks share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def measured_alone(
    script: str, one: str, timeout: float, row: dict[str, Any], extra: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    """The last JSON line ``script --one ONE [EXTRA...]`` prints, or ``row`` with ``error`` saying why none."""
    env = {**os.environ, "KILN_PLAN_CACHE": "0"}  # every plan compiled here (exports stay cached)
    command = [sys.executable, script, "--one", one, *extra]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {timeout:.0f} s"}
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    return json.loads(line) if line else {**row, "error": done.stderr[-400:]}


def append_row(path: str | None, row: dict[str, Any]) -> None:
    """One JSON line per row, appended (``--json``)."""
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(row, default=str) + "\n")
