"""``kiln check MODEL --dim NAME=LOW..HIGH``: the program a user gets, checked at its declared
ranges. The model is compiled as ``kiln.compile(MODEL, dims=ranges)`` compiles it (the same
routes: size classes, padding, run-time sizes), then run at each range's low end, middle and high
end (all dims together, and each dim at its ends with the others in the middle) on random inputs
against kiln's reference interpreter on the same inputs. Each binding says the route that served it
(``kiln.driver.routes``: run-time sizes, padded, size classes, compiled, value-specialized, and the
routes that refused it, with their reasons), whether it ran natively, whether it compiled after
``kiln.compile`` returned (a per-size compile), how far it was from the reference, and any error,
naming the binding."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kiln.zoo import check as zoo_check

TOLERANCE = 1e-4  # relative L2 against the reference interpreter


def bindings(ranges: dict[str, tuple[int, int]], fixed: dict[str, int]) -> list[dict[str, int]]:
    """All dims at their low ends, middles and high ends, then each dim at its ends with the others
    in the middle (a zero-size end is kept: it is in the range)."""
    middle = {name: (low + high) // 2 for name, (low, high) in ranges.items()}
    found: list[dict[str, int]] = []
    for pick in (0, None, 1):
        found.append({name: (bounds[pick] if pick is not None else middle[name]) for name, bounds in ranges.items()})
    for name, (low, high) in ranges.items():
        for end in (low, high):
            found.append({**middle, name: end})
    unique = []
    for binding in found:
        binding = {**fixed, **binding}
        if binding not in unique:
            unique.append(binding)
    return unique


def random_feeds(signature: Any, binding: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Random inputs of the model's inputs at ``binding`` (a dim it does not bind is an error)."""
    from kiln.errors import ArgumentError
    from kiln.ir.types import TensorType, random_tensor

    rng = np.random.default_rng(seed)
    feeds = {}
    for value in signature.inputs:
        if not isinstance(value.type, TensorType) or value.type.shape is None:
            raise ArgumentError(f"input {value.name!r} has no tensor shape to make inputs for")
        shape = []
        for dim in value.type.shape:
            if isinstance(dim, str) and dim not in binding:
                raise ArgumentError(f"input {value.name!r}: dim {dim!r} has no size; give --dim {dim}=LOW..HIGH")
            shape.append(binding[dim] if isinstance(dim, str) else dim)
        if value.type.dtype.is_float or value.type.dtype.numpy.kind == "b":
            feeds[value.name] = random_tensor(value.type.dtype, shape, rng)
        else:  # 0 and 1: a token, a mask, a position or a type id any model takes
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(value.type.dtype.numpy)
    return feeds


def relative_l2(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, expected in want.items():
        actual = np.asarray(got.get(name))
        expected = np.asarray(expected)
        if actual.shape != expected.shape:
            return float("inf")
        if expected.dtype.kind not in "fc":
            worst = max(worst, 0.0 if np.array_equal(actual, expected) else float("inf"))
            continue
        if not np.array_equal(np.isnan(actual), np.isnan(expected)):
            return float("inf")
        worst = max(worst, zoo_check.relative_l2(np.nan_to_num(actual, nan=0.0), np.nan_to_num(expected, nan=0.0)))
    return worst


def _fails(reference: Any, feeds: dict[str, np.ndarray] | None) -> bool:
    """Whether the reference interpreter fails on these inputs too (the model's own limit)."""
    if feeds is None:
        return False
    try:
        reference.run(feeds)
    except Exception:
        return True
    return False


def verdict(row: dict[str, Any]) -> str:
    if row.get("error"):
        # the reference fails there too: the model cannot run that size (fixed position tables...)
        return "fails in the reference too" if row.get("reference_fails") else "error"
    if row["rel_l2"] > TOLERANCE:
        return "mismatch"
    if not row["native"]:
        return "not native"
    return "per-size compile" if row["compiled"] else "ok"


def check_ranges(path: str, ranges: dict[str, str], fixed: dict[str, int], target: str) -> dict[str, Any]:
    """The compile at ``ranges`` and one row per binding (see the module's note)."""
    import kiln
    from kiln.driver.sizes import parse_range
    from kiln.driver.variants import plans_compiled
    from kiln.errors import ArgumentError, KilnError
    from kiln.lower.target import TargetError

    parsed = {name: parse_range(name, value) for name, value in ranges.items()}
    report: dict[str, Any] = {"ranges": {k: list(v) for k, v in parsed.items()}, "target": target, "bindings": []}
    started = time.perf_counter()
    try:
        model = kiln.compile(path, target=target, dims={**ranges, **fixed})
    except (ArgumentError, TargetError):
        raise  # the question was wrong (a dim the model lacks, no such target): exit 2, not a finding
    except KilnError as err:
        report["compile_error"] = f"{type(err).__name__}: {err}"
        return report
    report["compile_s"] = time.perf_counter() - started
    missing = sorted(
        {d for v in model.signature.inputs for d in (getattr(v.type, "shape", None) or ()) if isinstance(d, str)}
        - set(parsed)
        - set(fixed)
    )
    if missing:
        raise ArgumentError(f"no size for dim(s) {', '.join(missing)}: give each a range, e.g. --dim {missing[0]}=1..8")
    reference = kiln.compile(path, target="reference")
    for number, binding in enumerate(bindings(parsed, fixed)):
        row: dict[str, Any] = {"dims": binding, "compiled": 0, "native": False, "rel_l2": float("inf")}
        report["bindings"].append(row)
        feeds = None
        try:
            feeds = random_feeds(model.signature, binding, seed=number)
            before, started = plans_compiled(), time.perf_counter()
            got = model.run(feeds)
            row["seconds"] = time.perf_counter() - started
            row["compiled"] = plans_compiled() - before
            row["native"] = bool(model.is_native)
            route = getattr(model, "route", None)  # how the binding was served (kiln.driver.routes)
            if route is not None:
                row["route"] = route.as_dict()
            row["rel_l2"] = relative_l2(got, reference.run(feeds))
        except Exception as err:  # a kiln bug as much as a refusal: the binding's row says which
            row["error"] = f"{type(err).__name__}: {str(err)[:400]}"
            row["reference_fails"] = _fails(reference, feeds)
        row["verdict"] = verdict(row)
    return report


def exit_code(report: dict[str, Any], strict: bool) -> int:
    """1 when a binding failed or disagreed (with ``strict``: also one that compiled per size or
    did not run natively), else 0."""
    if report.get("compile_error"):
        return 1
    # a size the model itself cannot run (the reference fails too) is a range to fix: a failure too
    bad = {"error", "mismatch", "fails in the reference too"} | (
        {"per-size compile", "not native"} if strict else set()
    )
    return 1 if any(row["verdict"] in bad for row in report["bindings"]) else 0
