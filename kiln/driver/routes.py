"""How a run at one binding of the symbolic dims is served: one chooser, routes in a fixed order.

A compiled model (``kiln.driver.native.NativeModel``) may serve a binding in five ways; the chooser
tries them in this order and takes the first that can serve it:

1. ``run-time sizes``: one compile whose kernels take the ranged dims at run time (a dims vector
   as their last input; ``kiln.driver.spatial``);
2. ``padded``: a paddable dim's length padded up to a compiled length (or taken at run time by the
   padded graph's kernels), the outputs cut back (``kiln.passes.padding``);
3. ``size classes``: a sample-parallel dim's size run as chunks of its compiled size classes, joined
   (``kiln.passes.batching``), where the batching proof's guards hold at this binding;
4. ``compiled``: the variant compiled for exactly this binding, ahead (a size class, the binding
   ``kiln.compile`` was given) or now (a per-size compile: logged once, counted by
   ``kiln.driver.variants.plans_compiled``);
5. ``value-specialized``: shapes that depend on small inputs' values, compiled for those values.

Each route that does not take the binding says why (its refusal); the run's ``Route`` keeps the
route taken and the refusals before it (``NativeModel.route``, and per route the number of runs it
served, ``NativeModel.routes_taken``), which ``kiln check`` prints per binding. A route found
unusable while serving (a binding whose kernels do not lower apart: ``NotAffine``) is turned off for
the model, with its reason, and the chooser goes on to the next one: an internal refusal never
reaches the user.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kiln.driver import extents
from kiln.driver.sizes import check_ranges
from kiln.driver.variants import plans_compiled
from kiln.errors import ArgumentError, InputError, KilnError, ResourceError
from kiln.passes.batching import Parallel
from kiln.passes.specialize import input_dims

log = logging.getLogger("kiln")

ROUTES = ("run-time sizes", "padded", "size classes", "compiled", "value-specialized")


@dataclass(frozen=True)
class Route:
    """The route one run took: its name (one of ``ROUTES``), what it did (``detail``), whether
    the run compiled a plan for its binding (a per-size compile), and the routes before it that
    did not take the binding, each with its reason."""

    name: str
    detail: str
    compiled: bool = False
    refused: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.name,
            "detail": self.detail,
            "compiled": self.compiled,
            "refused": [{"route": route, "reason": reason} for route, reason in self.refused],
        }

    def line(self) -> str:
        """One line for people: the route, what it did and the first refusal's reason."""
        text = f"{self.name}: {self.detail}"
        return f"{text} ({self.refused[0][0]}: {self.refused[0][1]})" if self.refused else text


def serve(model: Any, inputs: list[Any], name_binding: bool = True) -> list[Any]:
    """Run ``inputs`` on ``model`` by the first route that serves their binding (the module's note);
    the route taken is recorded on the model. A failure that is not the caller's (a shape the model
    has no meaning for at this binding, a compile that fails there) names the binding
    (``name_binding``: the user's run, not a derived model's padded one)."""
    dims = {} if model.static else input_dims(model.signature, dict(zip(model.input_names, inputs)))
    if model.ranges:
        check_ranges(dims, model.ranges)
    if not name_binding or not dims:
        return _serve(model, dims, inputs)
    try:
        return _serve(model, dims, inputs)
    except (InputError, ResourceError, ArgumentError):
        raise  # the caller's inputs or the machine's limits: they say what they are
    except KilnError as err:
        text = err.args[0] if err.args and isinstance(err.args[0], str) else None
        named = text is not None and all(f"{k!r}: {v}" in text or f"{k}={v}" in text for k, v in dims.items())
        if text is not None and not named:  # (a message that names the dims already stays as it is)
            binding = ", ".join(f"{name}={size}" for name, size in sorted(dims.items()))
            err.args = (f"at {binding}: {text}", *err.args[1:])
        raise


def _serve(model: Any, dims: dict[str, int], inputs: list[Any]) -> list[Any]:
    refused: list[tuple[str, str]] = []
    before = plans_compiled()
    for route in (_run_time_sizes, _padded, _size_classes, _compiled):
        served = route(model, dims, inputs, refused)
        if served is not None:
            break
    outputs, name, detail = served  # (_compiled always serves)
    if name == "compiled":
        detail = detail if not dims else ("compiled for this size now" if plans_compiled() > before else detail)
    model.route = Route(name, detail, plans_compiled() > before, tuple(refused))
    model.routes_taken[name] = model.routes_taken.get(name, 0) + 1
    return outputs


Served = tuple[list[Any], str, str]  # the outputs, the route's name and what it did


def _run_time_sizes(model: Any, dims: dict[str, int], inputs: list[Any], refused: list) -> Served | None:
    inner = model.dims_model
    if inner is None:
        why = "; ".join(f"{dim}: {reason}" for dim, reason in sorted(model.run_time_refused.items()))
        refused.append(("run-time sizes", why or "no ranged dim is taken by the kernels at run time"))
        return None
    try:
        outputs = inner.execute(inputs)
    except extents.NotAffine as err:  # a size class that does not lower apart: this route is off from now on
        log.info("kernels cannot take the sizes at run time at %s (%s); each new size compiles", dims, err)
        for name, _, _ in inner.spatial.ranged:
            model.run_time_refused[name] = str(err)
        model.dims_model = None
        refused.append(("run-time sizes", str(err)))
        return None
    model.ran_too(inner)
    ranged = ", ".join(name for name, _, _ in inner.spatial.ranged)
    return outputs, "run-time sizes", f"{ranged} taken by the kernels at run time"


def _padded(model: Any, dims: dict[str, int], inputs: list[Any], refused: list) -> Served | None:
    for _ in range(2):  # once more at compiled lengths if the lengths may not be taken at run time after all
        padder = model.padder() if dims else None
        if padder is None or padder.symbol not in dims:
            refused.append(("padded", "no ranged dim pads" if dims else "no symbolic dim"))
            return None
        length = dims[padder.symbol]
        size = padder.class_for(length)
        inner = model.padded()
        try:
            outputs = inner.execute(padder.pad(inputs, length, size))
        except extents.NotAffine as err:  # a binding first seen now does not lower apart
            if not padder.samples:
                raise
            model.compiled_lengths(padder, err)
            continue
        model.ran_too(inner)
        how = "taken by the kernels at run time" if padder.samples else f"padded to {size}"
        return padder.cut(outputs, length), "padded", f"{padder.symbol} {length} {how}"
    refused.append(("padded", f"{padder.symbol}: the lengths do not lower apart"))
    return None


def _size_classes(model: Any, dims: dict[str, int], inputs: list[Any], refused: list) -> Served | None:
    if not dims:
        return None
    if model.has_variant(dims):  # compiled already (a class, or this size before): it runs whole
        return None
    chunking = model.chunking()
    if chunking is None:
        refused.append(("size classes", _why_not_chunked(model)))
        return None
    size = dims.get(chunking.symbol, 0)
    if size <= 0 or size in chunking.classes:
        return None
    if not chunking.holds(dims):
        guards = ", ".join(f"{g} == 0" for g in chunking.parallel.guards)
        refused.append(("size classes", f"{chunking.symbol} is sample-parallel only where {guards}"))
        return None
    parts = chunking.chunks(size)
    results = []
    for part, chunk in zip(parts, chunking.split(inputs, parts)):
        executable = model.variant({**dims, chunking.symbol: part})
        if not executable.native:  # shapes that depend on values: the whole run compiles as before
            refused.append(("size classes", "a chunk's shapes depend on input values"))
            return _compiled(model, dims, inputs, refused, values=False)
        model.note_ran(executable)
        results.append(model.run_executable(executable, chunk))
    chunks = "+".join(map(str, parts))
    return chunking.join(results), "size classes", f"{chunking.symbol} {size} as chunks {chunks}"


def _why_not_chunked(model: Any) -> str:
    if "size-classes" in model.options.disabled:
        return "size classes disabled"
    found = model.sample_parallel()
    reasons = [f"{dim}: {why}" for dim, why in sorted(found.items()) if not isinstance(why, Parallel)]
    return "; ".join(reasons) or "no dim is sample-parallel"


def _compiled(model: Any, dims: dict[str, int], inputs: list[Any], refused: list, values: bool = True) -> Served:
    executable = model.variant(dims)
    name, detail = "compiled", ("the one variant" if not dims else "a variant compiled before")
    if values and not executable.native:
        # shapes or attributes that depend on small inputs' values: specialize on them
        candidate = model.value_variant(dims, inputs)
        if candidate is not None and (candidate.plan.is_native or not candidate.plan.whole_graph_reason):
            refused.append(("compiled", "shapes depend on input values"))
            executable, name, detail = candidate, "value-specialized", "compiled for these input values"
    model.note_ran(executable)
    return model.run_executable(executable, inputs), name, detail


def dim_routes(model: Any) -> dict[str, tuple[str, str]]:
    """Per symbolic dim of ``model`` (a ``NativeModel`` with declared ranges): the route that serves
    its sizes (``chunked``, ``run-time length``, ``padded``, ``run-time dims`` or ``per-size
    compile``) and a sentence saying so, with the refusals that put it there (``kiln compile``
    prints them; benchmarks record them)."""
    chunking, padder = model.chunking(), model.padder()
    dims_model = getattr(model, "dims_model", None)
    found: dict[str, tuple[str, str]] = {}
    for symbol, proof in model.sample_parallel().items():
        low, high = model.ranges.get(symbol, (None, None))
        bounds = (
            f"{low}..{high}" if low is not None else f"no range declared: any size; --dim {symbol}=LOW..HIGH bounds it"
        )
        refused = model.run_time_refused.get(symbol)
        if isinstance(proof, Parallel) and chunking is not None and chunking.symbol == symbol:
            saved = sorted({dims[symbol] for dims, _ in model.bindings() if symbol in dims})
            classes = ", ".join(map(str, [c for c in chunking.classes if c in saved] or saved))
            found[symbol] = ("chunked", f"({bounds}): sample-parallel; every size runs from the size classes {classes}")
        elif padder is not None and padder.symbol == symbol and padder.samples:
            lowered = ", ".join(map(str, padder.samples))
            found[symbol] = (
                "run-time length",
                f"({bounds}): run-time length; one library per batch class whose kernels take the length at run "
                f"time (lowered at {lowered}; lengths below {padder.floor} run at {padder.floor}, masked)",
            )
        elif padder is not None and padder.symbol == symbol:
            said = f" (kernels cannot take it at run time: {refused})" if refused else ""
            found[symbol] = (
                "padded",
                f"({bounds}): pads; every length runs at the smallest compiled length that holds it: "
                f"{', '.join(map(str, padder.classes))}{said}",
            )
        elif dims_model is not None and symbol in dims_model.spatial.symbols:
            found[symbol] = (
                "run-time dims",
                f"({bounds}): run-time dims; one library per batch class whose kernels read every layer's size "
                "from the call's dims vector (no compile for any size in the ranges)",
            )
        else:
            why = proof if not isinstance(proof, Parallel) else "another dim is chunked"
            said = f"; kernels cannot take it at run time: {refused}" if refused else ""
            found[symbol] = (
                "per-size compile",
                f"({bounds}): each new size compiles on first use (not sample-parallel: {why}{said})",
            )
    return found
