"""A study's report: its first screen answers which backend wins at which parameters, by how
much, at what accuracy and memory; the curves, knees, breaking points, scaling, Pareto front,
memory and kiln's own breakdown follow, each figure under the command that reproduces it."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from kiln.bench import analysis
from kiln.bench.report import figure_png, machine_line

COLOURS = ("#dd8452", "#4c72b0", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _where(record: dict[str, Any]) -> str:
    flight = f", {record.get('inflight')} in flight" if record["scenario"] != "single-stream" else ""
    return f"batch {record['batch']}, {record['threads']} thread(s), {record['scenario']}{flight}"


def answers(records: list[dict[str, Any]]) -> list[str]:
    """The first screen's sentences (HTML), per model and objective."""
    lines = []
    for found in analysis.winners(records):
        objective, ranked = found["objective"], found["ranked"]
        top = ranked[0]["record"]
        text = (
            f"<b>{_esc(found['model'])}</b>, {objective}: <b>{_esc(ranked[0]['variant'])}</b> at "
            f"{_esc(_where(top))}: {analysis.figure_text(top, objective)}"
        )
        rivals = [row for row in ranked[1:] if row["variant"].split()[0] != ranked[0]["variant"].split()[0]]
        if rivals:
            other = rivals[0]["record"]
            text += (
                f", {analysis.margin(top, other, objective):.2f}x the best other backend "
                f"({_esc(rivals[0]['variant'])}: {analysis.figure_text(other, objective)} at {_esc(_where(other))})"
            )
        text += f"; accuracy {_esc(analysis.accuracy_text(top))}; peak memory {top.get('peak_rss_mb', 0):.0f} MB"
        lines.append(f"{text}<div class=cmd>{_esc(top.get('reproduce', ''))}</div>")
    return lines


def _best_table(records: list[dict[str, Any]]) -> str:
    """One row per model and backend variant: its best point for each objective (figure,
    configuration, the command that measures it again), its accuracy and peak memory there."""
    by_variant: dict[tuple[str, str], dict[str, Any]] = {}
    for row in analysis.best(records):
        by_variant.setdefault((row["model"], row["variant"]), {})[row["objective"]] = row["record"]
    energy = any(found.get("throughput per watt") for found in by_variant.values())
    objectives = [o for o in analysis.OBJECTIVES if energy or o != "throughput per watt"]
    rows, missing = [], []
    for (model, variant), found in sorted(by_variant.items()):
        if not any(found.values()):
            missing.append(f"{model} / {variant}: {_why_not(records, model, variant)}")
            continue
        cells = []
        for objective in objectives:
            record = found.get(objective)
            cells.append(
                "<td class=l>-</td>"
                if record is None
                else f"<td class=l><b>{analysis.figure_text(record, objective)}</b><br>{_esc(_where(record))}"
                f"<div class=cmd>{_esc(record.get('reproduce', ''))}</div></td>"
            )
        top = found.get("throughput") or next(r for r in found.values() if r)
        rows.append(
            f"<tr><td class=l>{_esc(model)}</td><td class=l>{_esc(variant)}</td>{''.join(cells)}"
            f"<td class=l>{_esc(analysis.accuracy_text(top))}</td><td>{top.get('peak_rss_mb', 0):.0f}</td>"
            f"<td>{_cold_compile(records, model, variant)}</td></tr>"
        )
    head = "".join(f"<th>best {o}</th>" for o in objectives)
    note = "" if energy else f"<p>throughput per watt: {_esc(_energy_reason(records))}</p>"
    skipped = "".join(f"<li>{_esc(line)}</li>" for line in missing)
    return (
        f"<table><tr><th>model</th><th>backend</th>{head}<th>accuracy (at best throughput)</th><th>peak MB</th>"
        "<th>compile s (cold)</th></tr>"
        + "".join(rows)
        + "</table>"
        + note
        + (f"<p>not measured:</p><ul>{skipped}</ul>" if skipped else "")
    )


def _cold_compile(records: list[dict[str, Any]], model: str, variant: str) -> str:
    """The variant's compile with nothing cached (a study's first point of it; kiln's later
    points compile with warm caches and say so)."""
    for record in records:
        if record["model"] == model and analysis.label(record) == variant and analysis.ok(record):
            if not record.get("compile_warm") and record.get("compile_s") is not None:
                return f"{record['compile_s']:.1f} (batch {record['batch']})"
    return "-"


def _why_not(records: list[dict[str, Any]], model: str, variant: str) -> str:
    reasons = sorted(
        {
            " ".join(str(r.get("error", r["status"])).split())[:140]
            for r in records
            if r["model"] == model and analysis.label(r) == variant
        }
    )
    return "; ".join(reasons) or "no point"


def _energy_reason(records: list[dict[str, Any]]) -> str:
    for record in records:
        reason = (record.get("energy") or {}).get("unavailable")
        if reason:
            return f"energy not measured: {reason}"
    return "energy not measured (single-stream points meter it where RAPL or NVML can be read)"


def _curves_table(curves: list[analysis.Curve]) -> str:
    rows = []
    for curve in curves:
        if not curve.points and curve.ended is None:
            continue
        batches = ", ".join(str(p["batch"]) for p in curve.points) or "-"
        peak = max((analysis.throughput(p) for p in curve.points), default=0.0)
        events = (curve.breaking or {}).get("events", {})
        cells = "".join(f"<td class=l>{_esc(_event(events.get(k)))}</td>" for k in ("plateau", "tail", "ended"))
        first = f"batch {curve.breaking['batch']}" if curve.breaking else "none"
        rows.append(
            f"<tr><td class=l>{_esc(curve.model)}</td><td class=l>{_esc(curve.name)}</td>"
            f"<td>{_esc(batches)}</td><td>{peak:.1f}</td>"
            f"<td>{curve.knee if curve.knee is not None else 'none'}</td><td><b>{first}</b></td>{cells}</tr>"
        )
    return (
        "<table><tr><th>model</th><th>curve</th><th>batches measured</th><th>peak samples/s</th>"
        "<th>knee (batch)</th><th>breaking point</th><th>per-sample latency stops improving</th>"
        "<th>tail over the bound</th><th>sweep ended</th></tr>" + "".join(rows) + "</table>"
    )


def _event(event: dict[str, Any] | None) -> str:
    return "-" if event is None else f"batch {event['batch']}: {event['reason']}"


def _scaling_table(records: list[dict[str, Any]]) -> str:
    rows = analysis.scaling(records)
    if not rows:
        return "<p>no thread sweep with a one-thread point</p>"
    body = "".join(
        f"<tr><td class=l>{_esc(r['model'])}</td><td class=l>{_esc(r['variant'])}</td><td>{r['batch']}</td>"
        f"<td>{r['threads']}</td><td>{r['p50_ms']:.2f}</td><td>{r['speedup']:.2f}x</td><td>{r['efficiency']:.0%}</td>"
        f"<td>{r['knee_threads'] if r['knee_threads'] is not None else '-'}</td></tr>"
        for r in rows
    )
    return (
        "<table><tr><th>model</th><th>backend</th><th>batch</th><th>threads</th><th>p50 ms</th>"
        f"<th>speedup vs 1 thread</th><th>parallel efficiency</th><th>knee (threads; 3 counts or more)</th></tr>"
        f"{body}</table>"
    )


def _failures(records: list[dict[str, Any]]) -> str:
    rows = [r for r in records if r["status"] not in ("ok",) and r["scenario"] != "breakdown"]
    if not rows:
        return "<p>every point ran</p>"
    grouped: dict[tuple, list[str]] = {}
    for record in rows:
        reason = " ".join(str(record.get("error", "")).split())[:160]
        key = (record["model"], record["backend"], record["status"], reason)
        grouped.setdefault(key, []).append(f"b{record['batch']}/t{record['threads']}")
    body = "".join(
        f"<tr><td class=l>{_esc(m)}</td><td class=l>{_esc(b)}</td><td class=l>{_esc(s)}</td>"
        f"<td class=l>{_esc(', '.join(where))}</td><td class=l>{_esc(reason)}</td></tr>"
        for (m, b, s, reason), where in sorted(grouped.items())
    )
    return (
        "<table><tr><th>model</th><th>backend</th><th>status</th><th>points</th><th>why</th></tr>" + body + "</table>"
    )


def _transfers_table(records: list[dict[str, Any]]) -> str:
    """Host-device data movement per point where the backend timed it (kiln's gpu target)."""
    timed = [r for r in records if r.get("transfers")]
    if not timed:
        return "<p>host-device transfers: no point in this study timed them (kiln's gpu target does).</p>"
    body = "".join(
        f"<tr><td class=l>{_esc(r['model'])}</td><td class=l>{_esc(r['backend'])}"
        f"{' (' + _esc(r['simulated']) + ')' if r.get('simulated') else ''}</td><td>{r['batch']}</td>"
        f"<td>{r['transfers']['upload_ms']:.3f}</td><td>{r['transfers']['compute_ms']:.3f}</td>"
        f"<td>{r['transfers']['download_ms']:.3f}</td></tr>"
        for r in timed
    )
    return (
        "<p>host-device transfers per run (the gpu target's own timers):</p><table><tr><th>model</th>"
        "<th>backend</th><th>batch</th><th>host to device ms</th><th>kernels ms</th><th>device to host ms</th></tr>"
        f"{body}</table>"
    )


def _breakdown_table(breakdowns: list[dict[str, Any]]) -> str:
    ran = [b for b in breakdowns if b.get("ms_by_kind")]
    if not ran:
        failed = [b for b in breakdowns if b.get("error")]
        return "<p>" + (_esc(failed[0]["error"]) if failed else "no kiln breakdown in this study") + "</p>"
    kinds = sorted({k for b in ran for k in b["ms_by_kind"]})
    head = "".join(f"<th>{_esc(k)} ms</th>" for k in kinds)
    body = "".join(
        f"<tr><td class=l>{_esc(b['model'])}</td><td class=l>{_esc(b['backend'])}</td><td>{b['batch']}</td>"
        + "".join(f"<td>{b['ms_by_kind'].get(k, 0.0):.2f}</td>" for k in kinds)
        + f"<td>{b.get('arena_mb', 0):.1f}</td><td>{b.get('weights_mb', 0):.1f}</td></tr>"
        for b in sorted(ran, key=lambda b: (b["model"], b["backend"], b["batch"]))
    )
    return (
        f"<table><tr><th>model</th><th>kiln variant</th><th>batch</th>{head}<th>arena MB</th><th>weights MB</th></tr>"
        f"{body}</table>"
    )


# -- plots --------------------------------------------------------------------------------------------


def _colour_of(names: list[str]) -> dict[str, str]:
    return {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(sorted(set(names)))}


def _curve_plots(curves: list[analysis.Curve], models: list[str]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = _colour_of([c.variant for c in curves])
    images = {}
    for title, value, ylabel in (
        ("throughput vs batch", analysis.throughput, "samples / s"),
        ("per-sample latency vs batch", analysis.per_sample_ms, "ms per sample (p50 / batch)"),
        ("peak memory vs batch", lambda r: r.get("peak_rss_mb") or 0.0, "peak RSS MB"),
    ):
        figure, axes = plt.subplots(1, len(models), figsize=(7.4 * len(models), 3.8), squeeze=False)
        for axis, model in zip(axes[0], models):
            for curve in (c for c in curves if c.model == model and len(c.points) > 0):
                xs = [p["batch"] for p in curve.points]
                ys = [value(p) for p in curve.points]
                style = "-" if curve.threads == max(c.threads for c in curves) else "--"
                axis.plot(xs, ys, style, marker="o", ms=3, color=colour[curve.variant], label=curve.name)
                if title.startswith("throughput") and curve.knee in xs:
                    k = xs.index(curve.knee)
                    axis.plot([xs[k]], [ys[k]], marker="D", ms=8, mfc="none", color=colour[curve.variant])
                if curve.breaking and curve.breaking["batch"] in xs:
                    k = xs.index(curve.breaking["batch"])
                    axis.plot([xs[k]], [ys[k]], marker="x", ms=9, color="#c00")
                if curve.ended is not None:
                    axis.axvline(curve.ended["batch"], color=colour[curve.variant], linestyle=":", linewidth=1)
            axis.set_xscale("log", base=2)
            axis.set_title(f"{model}: {title}", fontsize=10)
            axis.set_xlabel("batch (log2)")
            axis.set_ylabel(ylabel)
            axis.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figure.subplots_adjust(wspace=0.75)
        images[title] = figure_png(figure)
    return images


def _scaling_plot(records: list[dict[str, Any]]) -> str | None:
    rows = analysis.scaling(records)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    colour = _colour_of([r["variant"] for r in rows])
    figure, axes = plt.subplots(1, len(models), figsize=(7.4 * len(models), 3.6), squeeze=False)
    for axis, model in zip(axes[0], models):
        series: dict[tuple, list[tuple[int, float]]] = {}
        for row in (r for r in rows if r["model"] == model):
            series.setdefault((row["variant"], row["batch"]), []).append((row["threads"], row["speedup"]))
        for (variant, batch), values in sorted(series.items()):
            xs, ys = zip(*sorted(values))
            axis.plot(xs, ys, marker="o", ms=3, color=colour[variant], alpha=0.35 + 0.65 * (batch == 1), label=None)
        for variant in sorted({v for v, _ in series}):
            axis.plot([], [], color=colour[variant], label=variant)
        top = max(r["threads"] for r in rows)
        axis.plot([1, top], [1, top], color="#888", linestyle=":", label="ideal")
        axis.set_title(f"{model}: speedup vs 1 thread (every batch; batch 1 opaque)", fontsize=10)
        axis.set_xlabel("threads")
        axis.set_ylabel("throughput / throughput at 1 thread")
        axis.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure_png(figure)


def _pareto_plot(records: list[dict[str, Any]], models: list[str]) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    single = [r for r in records if analysis.ok(r) and r["scenario"] == "single-stream"]
    if not single:
        return None
    colour = _colour_of([analysis.label(r) for r in single])
    figure, axes = plt.subplots(1, len(models), figsize=(7.4 * len(models), 3.8), squeeze=False)
    for axis, model in zip(axes[0], models):
        mine = [r for r in single if r["model"] == model]
        for variant in sorted({analysis.label(r) for r in mine}):
            points = [r for r in mine if analysis.label(r) == variant]
            axis.scatter(
                [r["latency_ms"]["p50"] for r in points],
                [analysis.throughput(r) for r in points],
                s=[10 + 4 * r["threads"] ** 2 for r in points],
                color=colour[variant],
                label=variant,
                alpha=0.8,
            )
        front = analysis.pareto(mine)
        axis.plot(
            [r["latency_ms"]["p50"] for r in front],
            [analysis.throughput(r) for r in front],
            color="#222",
            linewidth=1,
            label="Pareto front",
        )
        for record in front:
            axis.annotate(
                f"b{record['batch']}/t{record['threads']}",
                (record["latency_ms"]["p50"], analysis.throughput(record)),
                fontsize=6,
            )
        axis.set_xscale("log")
        axis.set_title(f"{model}: latency vs throughput (marker size: threads)", fontsize=10)
        axis.set_xlabel("p50 ms per query (log)")
        axis.set_ylabel("samples / s")
        axis.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure_png(figure)


def write_study_html(run: dict[str, Any], path: Path, command: str) -> None:
    records = [r for r in run["records"] if r["scenario"] != "breakdown"]
    config = run["config"]["study"]
    curves = analysis.curves(records, float(config.get("latency_bound_ms", 100.0)))
    models = sorted({r["model"] for r in records}) or ["-"]
    images = _curve_plots(curves, models) if any(c.points for c in curves) else {}
    scaling = _scaling_plot(records)
    pareto = _pareto_plot(records, models)
    counts: dict[str, int] = {}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    first = "".join(f"<li>{line}</li>" for line in answers(records)) or "<li>no point ran</li>"

    def img(data: str | None, alt: str) -> str:
        if not data:
            return f"<p>{_esc(alt)}: not enough points to plot</p>"
        return f'<figure><img alt="{_esc(alt)}" src="data:image/png;base64,{data}"><div class=cmd>{_esc(command)}</div></figure>'

    interrupted = (
        "<p class=warn>the study was interrupted: run the same command to resume</p>" if run.get("interrupted") else ""
    )
    weights = _weights_section(records, config)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kiln study {_esc(run["run_id"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1em 1.6em; color: #222; }}
h1 {{ font-size: 1.35em; margin: 0 0 .2em 0; }} h2 {{ font-size: 1.1em; margin: 1em 0 .3em 0; }}
table {{ border-collapse: collapse; font-size: 12px; margin: .3em 0; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; vertical-align: top; }}
td.l {{ text-align: left; }} th {{ background: #f0f0f0; }}
.machine {{ color: #444; margin: 0 0 .4em 0; font-size: 13px; }}
.cmd {{ font-family: ui-monospace, monospace; font-size: 10.5px; color: #555; }}
ul.answers li {{ margin: .25em 0; font-size: 13.5px; }}
.warn {{ color: #a00; }} figure {{ margin: .6em 0; }} img {{ max-width: 100%; }}
pre {{ background: #f7f7f7; padding: .6em; font-size: 11px; }}
</style></head><body>
<h1>kiln study {_esc(run["run_id"])}</h1>
<p class=machine>{_esc(run["created"])} · {machine_line(run["machine"])} · {len(records)} point(s): {_esc(status)}</p>
<div class=cmd>{_esc(command)}</div>
{interrupted}
<h2>Answers</h2>
<ul class=answers>{first}</ul>
<h2>Best configuration per backend and objective</h2>
{_best_table(records)}
<h2>Curves: knees (diamonds) and breaking points (red crosses)</h2>
{img(images.get("throughput vs batch"), "throughput vs batch")}
{_curves_table(curves)}
<p class=cmd>{_esc(_definitions())}</p>
{img(images.get("per-sample latency vs batch"), "per-sample latency vs batch")}
<h2>Threads: speedup and parallel efficiency</h2>
{img(scaling, "speedup vs threads")}
{_scaling_table(records)}
<h2>Latency vs throughput: the Pareto front</h2>
{img(pareto, "Pareto")}
<h2>Memory and data movement</h2>
{img(images.get("peak memory vs batch"), "peak memory vs batch")}
<p>kiln's own breakdown of one inference (<span class=cmd>kiln explain MODEL --profile</span>'s per-kernel timers;
<i>copy</i> kernels are the layout conversions and concatenations the plan kept; <i>host</i> is the runtime
and any host fallback; the arena holds every intermediate tensor; weights as the kernels read them, packed):</p>
{_breakdown_table(run.get("breakdowns", []))}
{_transfers_table(records)}
{weights}
<h2>Points that did not run</h2>
{_failures(records)}
<h2>Machine and settings</h2>
<pre>{_esc(json.dumps(run["machine"], indent=1))}</pre>
<pre>{_esc(json.dumps(config, indent=1))}</pre>
</body></html>
"""
    from kiln.integrity import write_atomically

    write_atomically(path, page.encode())


def _definitions() -> str:
    """The analysis module's definitions, as plain text."""
    text = (analysis.__doc__ or "").split("Definitions", 1)[-1]
    return " ".join(text.replace("**", "").replace("* ", "").split())


def _weights_section(records: list[dict[str, Any]], config: dict[str, Any]) -> str:
    """User-supplied weights: each point's top-1 on the data set beside torchvision's published figure."""
    if not config.get("weights"):
        return ""
    from kiln.zoo.weights import PUBLISHED_TOP1

    rows = []
    for record in records:
        measured = (record.get("accuracy") or {}).get("top1")
        if record.get("model_given") not in config["weights"] or measured is None or not analysis.ok(record):
            continue
        published = PUBLISHED_TOP1.get(record["model_given"], {})
        text = ", ".join(f"{name} {value:.2f}%" for name, value in published.items()) or "none known"
        closest = min(published.values(), key=lambda v: abs(v - 100 * measured), default=None)
        delta = f"{100 * measured - closest:+.2f} pt" if closest is not None else "-"
        rows.append(
            f"<tr><td class=l>{_esc(record['model'])}</td><td class=l>{_esc(analysis.label(record))}</td>"
            f"<td>{_esc(_where(record))}</td><td>{100 * measured:.2f}% ({record['accuracy'].get('images')} images)</td>"
            f"<td class=l>{_esc(text)}</td><td>{delta}</td></tr>"
        )
    if not rows:
        return "<h2>Weights</h2><p>weights given, but no point measured top-1 (give --dataset)</p>"
    return (
        "<h2>Accuracy of the weights given, against torchvision's published top-1 (ImageNet-1k val)</h2>"
        "<table><tr><th>model</th><th>backend</th><th>point</th><th>top-1 here</th><th>published</th>"
        "<th>vs the closest</th></tr>" + "".join(rows) + "</table>"
    )
