"""``kiln explain``'s sizes section: how each symbolic input dim of a model runs every size in its
range (size classes, padded lengths, kernels that take the sizes at run time) or why each new
size compiles."""

from __future__ import annotations

import click
from rich.markup import escape

from kiln.cli_support import out
from kiln.errors import KilnError


def inside_ranges(sizes: dict, given: tuple[str, ...]) -> dict[str, int]:
    """A ranged dim no --dim binds is shown at its range's low end, never outside the range."""
    bound = {item.partition("=")[0] for item in given}
    return {
        name: max(int(size["range"][0]), 1) for name, size in sizes.items() if size.get("range") and name not in bound
    }


def dim_sizes(graph, ranges: dict[str, str]) -> dict:  # type: ignore[no-untyped-def]
    """Per symbolic input dim: its declared range, and its size classes when it is
    sample-parallel (the first such dim is the one chunked), else why each size compiles."""
    from kiln.driver.sizes import MAX_CLASS, MAX_DIM, default_classes, padded_classes, parse_range
    from kiln.passes.batching import Parallel, sample_parallel
    from kiln.passes.padding import Padding, paddable

    found = sample_parallel(graph)
    unknown = set(ranges) - set(found)
    if unknown:
        raise click.BadParameter(
            f"{', '.join(sorted(unknown))} is not a symbolic input dim (its dims: {', '.join(found) or 'none'})",
            param_hint="--dim",
        )
    parsed = {name: parse_range(name, value) for name, value in ranges.items()}
    chunked = next((name for name, how in found.items() if isinstance(how, Parallel)), None)
    report = {}
    for name, how in found.items():
        bounds = parsed.get(name)
        report[name] = {
            "range": list(bounds) if bounds else None,
            "sample_parallel": isinstance(how, Parallel),
            "classes": list(default_classes(bounds or (1, MAX_DIM))) if name == chunked else None,
            "guards": list(how.guards) if isinstance(how, Parallel) else [],
            "reason": ""
            if name == chunked
            else (str(how) if not isinstance(how, Parallel) else "another dim is chunked"),
            "padded": None,
        }
        if name != chunked and bounds and bounds[1] <= MAX_CLASS:  # a declared range: may it pad?
            padding = paddable(graph, name, bounds[0], bounds[1])
            if isinstance(padding, Padding):
                report[name].update(padded=list(padded_classes(bounds)), masks=len(padding.masks), reason="")
            else:
                report[name]["reason"] += f"; does not pad: {padding}"
    return report


def run_time_kernels(graph, sizes: dict, binding: dict, target, options, progress) -> None:  # type: ignore[no-untyped-def]
    """For a padded dim on a target whose kernels can take it at run time: each kernel of the
    library (at the binding's other dims), and whether its sizes are run-time values."""
    from kiln.driver import extents
    from kiln.passes.padding import pad, paddable

    if target.backend != "cpu":
        return
    if "run-time-dims" not in options.disabled:
        run_time_dims(graph, sizes, binding, target, options, progress)
    if "run-time-length" in options.disabled:
        return
    for name, found in sizes.items():
        lengths = extents.samples(*found["range"]) if found.get("padded") else None
        if not lengths:
            continue
        padded = pad(graph, paddable(graph, name, *found["range"]))  # type: ignore[arg-type]
        others = {k: v for k, v in binding.items() if k != name}
        others.update({k: (s["range"] or [1])[0] or 1 for k, s in sizes.items() if k != name and k not in others})
        report: dict = {"lowered": list(lengths), "floor": min(lengths), "refused": "", "kernels": []}
        try:
            with progress(f"lowering at {name} = {', '.join(map(str, lengths))} (kernel sizes as functions of {name})"):
                length = extents.RunTimeLength(name, lengths, padded.inputs[-1].name)
                state = extents.run_time_kernels(padded, others, length, target, options)
        except extents.NotAffine as err:
            report["refused"] = str(err)
        else:
            for kernels in state.segments:
                report["kernels"] += [
                    {"kernel": k.name, "kind": k.kind, "computes": k.sources[0], "run_time": k.length is not None}
                    for k in kernels
                ]
        found["run_time"] = report


def run_time_dims(graph, sizes: dict, binding: dict, target, options, progress) -> None:  # type: ignore[no-untyped-def]
    """Ranged dims that neither chunk nor pad (an image's height and width), when every dim is
    ranged or chunked: the route ``kiln compile`` takes (``kiln.driver.spatial``), lowered here
    the same way, each kernel listed with whether it reads the sizes at run time."""
    from kiln.driver import extents, spatial

    ranged = {
        name: tuple(s["range"]) for name, s in sizes.items() if s["range"] and not s["classes"] and not s["padded"]
    }
    if not ranged or any(not s["range"] and not s["classes"] for s in sizes.values()):
        return
    fixed = {k: v for k, v in binding.items() if k not in ranged}
    report: dict = {"dims": list(ranged), "lowered": [], "refused": "", "kernels": [], "program": False}
    try:
        with progress(f"lowering at several sizes of {', '.join(ranged)} (kernel sizes as terms of the model's dims)"):
            route = spatial.route_for(graph, ranged, fixed, set(sizes))  # type: ignore[arg-type]
            with_vector = spatial.with_dims_input(graph, route.names)
            state = spatial.run_time_dims_kernels(with_vector, fixed, route, target, options)
    except (extents.NotAffine, KilnError) as err:
        report["refused"] = str(err)
    else:
        report["lowered"] = [list(sample) for sample in route.samples]
        report["program"] = route.program is not None
        for kernels in state.segments:
            report["kernels"] += [
                {"kernel": k.name, "kind": k.kind, "computes": k.sources[0], "run_time": k.dims is not None}
                for k in kernels
            ]
    for name in ranged:
        sizes[name]["run_time_dims"] = report


def _show_run_time_dims(symbol: str, bounds: str, listing: dict, first: bool) -> None:
    together = " and ".join(listing["dims"])
    if listing["refused"]:
        out.print(
            f"sizes: {symbol} ({bounds}): kernels cannot take {together} at run time: {escape(listing['refused'])}"
        )
        out.print("  (each new size compiles on first use)")
        return
    if not first:
        out.print(f"sizes: {symbol} ({bounds}): with {listing['dims'][0]}, as above")
        return
    taking = [k for k in listing["kernels"] if k["run_time"]]
    vector = "a fitted program (microseconds)" if listing["program"] else "specializing the graph's shapes"
    out.print(
        f"sizes: {symbol} ({bounds}): kernels take {together} at run time: {len(taking)} of "
        f"{len(listing['kernels'])} kernels read the dims vector (fitted at {len(listing['lowered'])} sizes, checked at another, "
        f"capacity {'x'.join(map(str, listing['lowered'][0]))}); each new size's vector from {vector}; "
        "one library per batch class"
    )
    for k in listing["kernels"]:
        how = "run-time sizes" if k["run_time"] else "fixed sizes"
        out.print(f"  {k['kernel']:>6} {k['kind']:<24} {how:<14} {escape(k['computes'][:60])}")


def show_sizes(sizes: dict) -> None:
    """What ``kiln explain`` says of each symbolic input dim: how every size in its range runs."""
    for symbol, found_size in sizes.items():
        bounds = "{}..{}".format(*found_size["range"]) if found_size["range"] else "no range declared"
        if found_size["classes"]:
            classes = ", ".join(map(str, found_size["classes"]))
            where = (
                " where " + " and ".join(f"{g} == 0" for g in found_size["guards"]) if found_size.get("guards") else ""
            )
            out.print(
                f"sizes: {symbol} ({bounds}) is sample-parallel{escape(where)}: every kernel runs any size from the "
                f"size classes {classes} (a library per class, chunks joined; elsewhere a run compiles for its size)"
                if where
                else f"sizes: {symbol} ({bounds}) is sample-parallel: every kernel runs any size from the size classes "
                f"{classes} (a library per class, chunks joined)"
            )
        elif found_size.get("run_time_dims"):
            listing = found_size["run_time_dims"]
            _show_run_time_dims(symbol, bounds, listing, symbol == listing["dims"][0])
        elif found_size.get("run_time"):
            listing = found_size["run_time"]
            if listing.get("refused"):
                out.print(
                    f"sizes: {symbol} ({bounds}): kernels cannot take the length at run time: {listing['refused']}"
                )
            else:
                taking = [k for k in listing["kernels"] if k["run_time"]]
                out.print(
                    f"sizes: {symbol} ({bounds}) pads to a floor of {listing['floor']} and its kernels take the length at "
                    f"run time: {len(taking)} of {len(listing['kernels'])} kernels have run-time sizes (lowered at "
                    f"{', '.join(map(str, listing['lowered']))}), the others' do not depend on it; one library per batch class"
                )
                for k in listing["kernels"]:
                    how = "run-time sizes" if k["run_time"] else "fixed sizes"
                    out.print(f"  {k['kernel']:>6} {k['kind']:<14} {how:<14} {escape(k['computes'][:70])}")
        elif found_size.get("padded"):
            masks = found_size["masks"]
            out.print(
                f"sizes: {symbol} ({bounds}) pads: every length runs at the smallest of the compiled lengths "
                f"{', '.join(map(str, found_size['padded']))} that holds it ({masks} mask(s) keep padded positions "
                "out of valid ones; outputs cut back)"
            )
        else:
            out.print(f"sizes: {symbol} ({bounds}) compiles each new size: {escape(found_size['reason'])}")
