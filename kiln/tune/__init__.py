"""Autotuning: per matrix-multiply and convolution kernel, measure schedule candidates on this
machine and keep the fastest.

The search space per kernel (``candidates``): the engine's cache blocking (rows ``mc``, columns
``nc``, reduction depth ``kc``) and, for 3x3 stride-1 convolutions, the algorithm (Winograd
F(4x4,3x3), F(2x2,3x3) or im2col). The default schedule is always a candidate and stays the
fallback: a candidate that fails to build, crashes, times out or disagrees with the default's
output is counted and skipped, never fatal.

Each candidate runs in an isolated worker process (``kiln.tune.worker``) with a timeout, on a
one-node model of the kernel's exact shapes (weights random: timing does not depend on them).
Results go to the SQLite database (``kiln.driver.tuning_db``) keyed by (kernel key, target, kiln version),
so a second compile does no tuning; compiling reads the database and applies what it finds
(``kiln explain --profile`` shows each kernel's schedule as default / tuned / cached).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln.backends import parse
from kiln.driver import tuning_db as db
from kiln.errors import KilnError
from kiln.ir.graph import Graph, Node
from kiln.lower.lowering import kernel_key
from kiln.ops.registry import ops_with

TUNABLE = ops_with("tunable")
BLOCKINGS: list[dict[str, int]] = [
    {"kc": 128},
    {"kc": 512},
    {"mc": 96},
    {"mc": 384},
    {"nc": 256},
    {"nc": 512, "kc": 512},
    {"mc": 96, "nc": 256},
]


def winograd_applies(op: str, attrs: dict[str, Any], shapes: list[tuple[int, ...] | None]) -> bool:
    if op != "Conv" or shapes[1] is None or len(shapes[1]) != 4 or tuple(shapes[1][2:]) != (3, 3):
        return False
    return (
        all(v == 1 for v in attrs.get("strides") or [1, 1])
        and all(v == 1 for v in attrs.get("dilations") or [1, 1])
        and int(attrs.get("group", 1)) == 1
    )


def candidates(op: str, attrs: dict[str, Any], shapes: list[tuple[int, ...] | None]) -> list[dict[str, Any]]:
    """The default ({}) first, then alternatives."""
    found: list[dict[str, Any]] = [{}]
    if winograd_applies(op, attrs, shapes):
        for algorithm in ("winograd4", "winograd2", "im2col"):
            found.append({"algorithm": algorithm})
        found.append({"algorithm": "im2col", "kc": 512})
        found.append({"kc": 512})
    else:
        found.extend(BLOCKINGS)
    return found


@dataclass
class Task:
    """One kernel to tune: where it is in the model, and how to rebuild it alone."""

    key: str
    label: str
    spec: dict[str, Any]  # op, attrs, input shapes, which inputs are weights
    candidates: list[dict[str, Any]]
    count: int = 1  # kernels of the model with this key


@dataclass
class Outcome:
    task: Task
    choice: dict[str, Any]
    seconds: float
    default_seconds: float
    measured: int
    failures: list[str] = field(default_factory=list)
    cached: bool = False

    @property
    def speedup(self) -> float:
        return self.default_seconds / self.seconds if self.seconds > 0 else 1.0


def tasks_for(graph: Graph) -> list[Task]:
    """The tunable kernels of an optimized, static graph (anchors of fused groups included),
    one task per distinct key."""
    found: dict[str, Task] = {}
    for node in graph.nodes:
        anchor = node
        if node.domain == "kiln" and node.op == "Fused" and node.attrs.get("kind") == "epilogue":
            body = node.attrs["body"]
            inner = body.nodes[0]
            bindings = dict(zip(body.inputs, node.inputs))
            anchor = Node(
                inner.op,
                [None if v is None else bindings[v] for v in inner.inputs],
                list(inner.outputs),
                dict(inner.attrs),
                name=node.name,
            )
        if anchor.op not in TUNABLE or anchor.domain:
            continue
        shapes = [_shape(v) for v in anchor.inputs]
        if any(s is None for s in shapes[:2]) or any(
            v.type.dtype.short != "f32" for v in anchor.inputs if v is not None
        ):  # type: ignore[union-attr]
            continue
        constant = [v is not None and v in graph.constants for v in anchor.inputs]
        key = kernel_key(anchor.op, dict(anchor.attrs), shapes, constant)
        if key in found:
            found[key].count += 1
            continue
        spec = {"op": anchor.op, "attrs": _plain(anchor.attrs), "shapes": shapes, "constant": constant}
        found[key] = Task(key, node.label, spec, candidates(anchor.op, dict(anchor.attrs), shapes))
    return list(found.values())


def _shape(value: Any) -> tuple[int, ...] | None:
    if value is None or value.type.shape is None or not value.type.is_static:
        return None
    return tuple(int(d) for d in value.type.shape)


def _plain(attrs: Any) -> dict[str, Any]:
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in attrs.items()
        if isinstance(v, (int, float, str, list, tuple))
    }


def tune(
    graph: Graph,
    budget_s: float,
    progress: Callable[[int, int, Outcome | None, float], None] | None = None,
    runs: int = 10,
    timeout_s: float = 120.0,
    retune: bool = False,
    target: str = "cpu",
    measurer: Any = None,
) -> list[Outcome]:
    """Tune every kernel of ``graph`` (optimized, static shapes) within ``budget_s`` seconds of
    wall time; kernels already in the database are skipped (unless ``retune``). ``progress(done,
    total, last outcome, best speed-up so far)`` is called after each kernel. ``measurer``: where
    candidates are measured (default: a worker process here; ``kiln.tune.remote.ClusterMeasurer``:
    nodes of a Ray cluster of the target's hardware class)."""
    from kiln.tune.worker import Measurer

    described = parse(target)
    if described.backend == "gpu":
        raise KilnError(
            f"autotuning target {target!r} is not supported: the gpu target's block sizes would be measured on a "
            "CUDA device (none here, and the interpreter's times say nothing of a GPU's); its kernels use the "
            "schedule's defaults"
        )
    scope = repr(described)  # results are kept per target (TargetError for an unknown one)
    tasks = tasks_for(graph)
    for task in tasks:
        task.spec["target"] = target
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + budget_s
    best_speedup = 1.0
    with measurer if measurer is not None else Measurer(timeout_s) as measurer:
        for done, task in enumerate(tasks, 1):
            stored = None if retune else db.best(task.key, scope)
            if stored is not None:
                outcome = Outcome(task, stored, 0.0, 0.0, 0, cached=True)
            elif time.monotonic() >= deadline:
                break
            else:
                outcome = _search(task, measurer, runs, deadline)
                if outcome is None:  # even the default schedule failed here: nothing to record
                    if progress is not None:
                        progress(done, len(tasks), None, best_speedup)
                    continue
                db.TUNED_HERE.add(task.key)
                db.record(
                    task.key,
                    outcome.choice,
                    outcome.seconds,
                    outcome.default_seconds,
                    outcome.measured,
                    len(outcome.failures),
                    task.label,
                    scope,
                )
                best_speedup = max(best_speedup, outcome.speedup)
            outcomes.append(outcome)
            if progress is not None:
                progress(done, len(tasks), outcome, best_speedup)
    return outcomes


MIN_GAIN = 0.03  # a candidate must beat the default by at least this much, and by the noise measured


def _search(task: Task, measurer: Any, runs: int, deadline: float) -> Outcome | None:
    """Measure the default, then the alternatives while time remains, then the default again. The
    best alternative is kept only when it beats the default by more than the measured noise (the
    runs' spread, and how far the default's two measurements disagree: a default slowed by another
    process once must not make an alternative look 78x faster); otherwise the default stays.
    None: the default itself could not be measured (nothing recorded)."""
    results: list[tuple[float, dict[str, Any], float]] = []
    failures: list[str] = []
    reference = None
    for candidate in task.candidates:
        if time.monotonic() >= deadline and results:
            break
        try:
            seconds, output, noise = measurer.measure(task.spec, candidate, runs)
        except Exception as err:  # build failure, crash, timeout: logged and skipped
            failures.append(f"{candidate}: {err}")
            if not candidate:
                return None  # the default itself fails: no reference to compare candidates with
            continue
        if reference is None:
            reference = output
        elif not _agrees(output, reference):
            failures.append(f"{candidate}: output differs from the default schedule's")
            continue
        results.append((seconds, candidate, noise))
    if not results:
        return None
    measured = len(results) + len(failures)
    first, _, default_noise = next(r for r in results if not r[1])
    default_seconds, drift = first, 0.0
    if len(results) > 1:  # the default once more, after the alternatives
        try:
            again, _, again_noise = measurer.measure(task.spec, {}, runs)
            default_seconds = min(first, again)
            drift = abs(first - again) / default_seconds if default_seconds > 0 else 0.0
            default_noise = max(default_noise, again_noise)
        except Exception as err:
            failures.append(f"the default, measured again: {err}")
    seconds, choice, noise = min(results, key=lambda r: r[0])
    margin = max(MIN_GAIN, 2 * (default_noise + noise), drift)
    if choice and seconds >= default_seconds * (1 - margin):  # not beyond the noise: keep the default
        seconds, choice = default_seconds, {}
    return Outcome(task, choice, min(seconds, default_seconds), default_seconds, measured, failures)


def _agrees(a: Any, b: Any) -> bool:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and float(np.linalg.norm(a - b)) <= 1e-4 * max(float(np.linalg.norm(b)), 1e-30)
