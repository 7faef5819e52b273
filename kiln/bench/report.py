"""Reports of a benchmark run: terminal table, JSON, CSV, and an HTML page with plots."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from kiln.bench.loadgen import verdict_text
from kiln.output_files import ensure_folder, write_output_file

COLUMNS = (
    ("node", lambda r: node_of(r) or "-"),  # a fleet run's hardware class (this machine: "-")
    ("model", lambda r: r["model"]),
    ("backend", lambda r: r["backend"] + (f" ({r['simulated']})" if r.get("simulated") else "")),
    ("batch", lambda r: r["batch"]),
    ("scenario", lambda r: r["scenario"]),
    ("threads/inflight", lambda r: f"{r['threads']}/{r.get('inflight', '-')}"),
    ("compile s", lambda r: _num(r.get("compile_s"), 2)),  # cold: nothing cached, for every backend
    ("cached compile s", lambda r: _cached_compile(r)),
    ("load s", lambda r: _num(r.get("load_s"), 3)),
    ("first ms", lambda r: _num(r.get("first_run_ms"), 1)),
    ("p50 ms", lambda r: _num(r.get("latency_ms", {}).get("p50"), 2)),
    ("p90 ms", lambda r: _num(r.get("latency_ms", {}).get("p90"), 2)),
    ("p99 ms", lambda r: _num(r.get("latency_ms", {}).get("p99"), 2)),
    ("cv", lambda r: _cv(r)),
    ("samples/s", lambda r: _num(r.get("throughput"), 1)),
    ("peak MB", lambda r: _num(r.get("peak_rss_mb"), 0)),
    ("RSS MB/1k", lambda r: _num(r.get("rss_growth_mb_per_1k"), 2)),
    ("energy", lambda r: _energy(r)),
    ("vs reference", lambda r: _agreement(r)),
    ("device estimate", lambda r: _device_estimate(r)),
    ("LoadGen", lambda r: verdict_text(r.get("loadgen"))),
    ("status", lambda r: r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error', '')}"),
)


def _cached_compile(record: dict[str, Any]) -> str:
    """kiln's compile with its caches as they were (a plan-cache hit is marked)."""
    if record.get("compile_cached_s") is None:
        return "-"
    return f"{record['compile_cached_s']:.2f}" + (" (plan cache)" if record.get("plan_cache_hit") else "")


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


NOISY = "†"  # the marker of a row whose latency varied more than 10%: one explanation in notes()


def _cv(record: dict[str, Any]) -> str:
    stats = record.get("latency_ms", {})
    if "cv" not in stats:
        return "-"
    return f"{stats['cv']:.1%}" + (f" {NOISY}" if stats.get("noisy") else "")


def _energy(record: dict[str, Any]) -> str:
    energy = record.get("energy")
    if not energy:
        return "-"
    if "joules_per_inference" in energy:
        return f"{energy['joules_per_inference'] * 1e3:.1f} mJ"
    return "unavailable"


def _has_estimates(run: dict[str, Any]) -> bool:
    return any(r.get("fpga_estimates") for r in run["records"])


def _device_estimate(record: dict[str, Any]) -> str:
    """An FPGA design's estimated latency and resources on its part (kiln's analytical model)."""
    found = record.get("fpga_estimates")
    if not found:
        return "-"
    used = found["resources"]
    return (
        f"est. {found['latency_us']:.2f} us, II {found['interval_cycles']:,}, DSP {used['dsp']:,}, "
        f"BRAM {used['bram_18k']:,}, LUT {used['lut']:,} ({found['part']})"
    )


def _agreement(record: dict[str, Any]) -> str:
    agreement = record.get("agreement")
    if not agreement:
        return "-"
    if "error" in agreement:
        return agreement["error"]
    text = f"relL2 {agreement['rel_l2']:.1e}"
    if "top1_agreement" in agreement:
        text += f", top1 {agreement['top1_agreement']:.0%}"
    return text


TERMINAL = (
    "model",
    "backend",
    "batch",
    "scenario",
    "threads/inflight",
    "compile s",
    "first ms",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "cv",
    "samples/s",
    "peak MB",
    "vs reference",
    "LoadGen",
    "status",
)


def terminal_table(run: dict[str, Any]) -> Table:
    """The key columns of the rows that ran (the HTML and JSON carry all of them); unavailable
    backends are one line each per reason in ``notes``."""
    fleet = any(node_of(r) for r in run["records"])
    shown = {*TERMINAL, *(["node"] if fleet else []), *(["device estimate"] if _has_estimates(run) else [])}
    columns = [(name, fn) for name, fn in COLUMNS if name in shown]
    table = Table(title=f"kiln bench {run['run_id']}", show_lines=False)
    for name, _ in columns:
        table.add_column(name, overflow="fold", max_width=48 if name == "status" else None)
    for record in ran(run):
        table.add_row(*(str(fn(record)) for _, fn in columns))
    return table


def ran(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of jobs that ran (ok, or failed while running): not the unavailable backends."""
    return [r for r in run["records"] if r["status"] != "unavailable"]


def unavailable(run: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Unavailable backends grouped by reason: [(reason, [backend, ...])], one entry per reason."""
    groups: dict[str, set[str]] = {}
    for record in run["records"]:
        if record["status"] == "unavailable":
            groups.setdefault(str(record.get("error", "")), set()).add(record["backend"])
    return sorted(((reason, sorted(names)) for reason, names in groups.items()), key=lambda item: item[1])


def _short(text: str, limit: int = 140) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def notes(run: dict[str, Any]) -> list[str]:
    """Warnings a reader must see next to the numbers."""
    lines = [f"unavailable: {', '.join(names)}: {_short(reason)}" for reason, names in unavailable(run)]
    noisy = [r for r in run["records"] if r.get("latency_ms", {}).get("noisy")]
    if noisy:
        worst = max(r["latency_ms"]["cv"] for r in noisy)
        lines.append(
            f"{NOISY} {len(noisy)} row(s) with latency CV > 10% (up to {worst:.0%}): the machine was noisy "
            "while they ran; compare them with care or run again"
        )
    for record in run["records"]:
        growth = record.get("rss_growth_mb_per_1k")
        if growth is not None and growth > 1.0 and record.get("iterations", 0) >= 200:
            lines.append(
                f"{record['backend']} / {record['model']}: RSS grows {growth:.1f} MB per 1k inferences: leak suspected"
            )
    short = sorted({r["backend"] for r in run["records"] if r.get("latency_ms", {}).get("too_few", {}).get("p99")})
    if short:
        lines.append(f"p99 not reported for {', '.join(short)}: fewer than 100 samples (run longer: --duration)")
    unknown = sorted({r["backend"] for r in run["records"] if r.get("rss_growth_note")})
    if unknown:
        lines.append(
            f"RSS growth not estimated for {', '.join(unknown)}: run too short (kiln bench --soak N checks for leaks)"
        )
    energies = {
        r.get("energy", {}).get("unavailable") for r in run["records"] if r.get("energy", {}).get("unavailable")
    }
    lines.extend(f"energy unavailable: {reason}" for reason in sorted(energies))
    invalid = [r for r in run["records"] if (r.get("loadgen") or {}).get("result") == "INVALID"]
    if invalid:
        failed = sorted({name for r in invalid for name in r["loadgen"].get("failed", [])})
        lines.append(
            f"LoadGen: INVALID on {len(invalid)} row(s) ({', '.join(failed) or 'see its log'}). INVALID is LoadGen's "
            "word for a run too short for a result MLPerf would accept (its minimum duration and query count, and "
            "early stopping's confidence that the percentile it reports holds): the latencies measured are still "
            "what the row says; a longer --duration gives LoadGen the queries it needs for VALID"
        )
    for record in run["records"]:
        native = record.get("native_latency_ms")
        if native:
            lines.append(
                f"{record['backend']} / {record['model']}: from C, no Python in the loop: p50 {native['p50']:.3f} ms, "
                f"p90 {native['p90']:.3f} ms ({native['calls']} calls); the same calls through Python (ctypes), "
                f"alternating: p50 {native['python_p50']:.3f} ms ({1e3 * (native['python_p50'] - native['p50']):+.0f} us)"
            )
    if run.get("interrupted"):
        lines.append("the run was interrupted: only finished jobs are reported")
    return lines


def write_json(run: dict[str, Any], path: Path) -> None:
    write_output_file(path, json.dumps(run, indent=1, default=str), "results file")


def write_csv(run: dict[str, Any], path: Path) -> None:
    rows = [_flatten(r) for r in run["records"]]
    fields = sorted({k for row in rows for k in row})
    handle = io.StringIO(newline="")
    writer = csv.DictWriter(handle, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_output_file(path, handle.getvalue(), "results file")


def _flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        elif isinstance(value, list):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


# -- plots -------------------------------------------------------------------------------------------


def figure_png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def plots(run: dict[str, Any]) -> dict[str, str]:
    """Named PNGs (base64): latency per backend with p10-p90 bars, throughput vs batch, latency
    CDFs, compile times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ok = [r for r in run["records"] if r["status"] == "ok" and r.get("latency_ms", {}).get("n")]
    images: dict[str, str] = {}
    if not ok:
        return images
    models = sorted({r["model"] for r in ok})
    backends = sorted({r["backend"] for r in ok})
    single = [r for r in ok if r["scenario"] == "single-stream"]
    if single:
        figure, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
        for axis, model in zip(axes[0], models):
            rows = [r for r in single if r["model"] == model]
            batch = min((r["batch"] for r in rows), default=1)
            rows = [r for r in rows if r["batch"] == batch]
            names = [r["backend"] for r in rows]
            p50 = np.array([r["latency_ms"]["p50"] for r in rows])
            low = p50 - np.array([r["latency_ms"]["min"] for r in rows])
            high = np.array([r["latency_ms"]["p90"] or r["latency_ms"]["max"] for r in rows]) - p50
            axis.bar(names, p50, yerr=[low, high], capsize=4, color="#4c72b0")
            axis.set_title(f"{model} (batch {batch})")
            axis.set_ylabel("latency ms (p50; bars: min..p90, or max with < 10 samples)")
            axis.tick_params(axis="x", rotation=30)
        images["latency"] = figure_png(figure)
        figure, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
        for axis, model in zip(axes[0], models):
            for record in (r for r in single if r["model"] == model):
                quantiles = record["latency_ms"]["percentiles"]
                where = f" @ {node_of(record)}" if node_of(record) else ""
                label = f"{record['backend']} b{record['batch']}{where}"
                axis.plot(quantiles, np.linspace(0, 1, len(quantiles)), label=label)
            axis.set_xscale("log")
            axis.set_title(f"{model}: latency CDF")
            axis.set_xlabel("ms (log scale)")
            axis.set_ylabel("fraction of requests")
            axis.legend(fontsize=7)
        images["latency_cdf"] = figure_png(figure)
    batches = sorted({r["batch"] for r in ok})
    if len(batches) > 1:
        figure, axis = plt.subplots(figsize=(6, 3.6))
        for backend in backends:
            for model in models:
                points = sorted(
                    (r["batch"], r["throughput"])
                    for r in ok
                    if r["backend"] == backend and r["model"] == model and r.get("throughput")
                )
                if len(points) > 1:
                    axis.plot(*zip(*points), marker="o", label=f"{backend} / {model}")
        axis.set_xlabel("batch")
        axis.set_ylabel("samples / s")
        axis.set_title("throughput vs batch")
        axis.legend(fontsize=7)
        images["throughput"] = figure_png(figure)
    compiled = [r for r in ok if r.get("compile_s") is not None]
    if compiled:
        figure, axis = plt.subplots(figsize=(max(6, 0.5 * len(compiled)), 3.6))
        labels = [f"{r['backend']}\n{r['model']}" for r in compiled]
        axis.bar(range(len(compiled)), [r["compile_s"] for r in compiled], color="#dd8452")
        axis.set_xticks(range(len(compiled)), labels, rotation=60, fontsize=7)
        axis.set_ylabel("compile s")
        axis.set_title("compile time")
        images["compile"] = figure_png(figure)
    return images


# -- the summary: per model (and per node of a fleet), each backend relative to the fastest ------------


def node_of(record: dict[str, Any]) -> str:
    """The hardware a record ran on: a fleet node's label, or "" on one machine."""
    return str(record.get("node", {}).get("label", "")) if isinstance(record.get("node"), dict) else ""


def summary(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One group per (node, model, batch, scenario) that has latencies, fastest first; each row a
    backend's p50, its ratio to the group's fastest, its agreement with the reference, the noise
    marker and (where LoadGen ran the scenario) its verdict."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in run["records"]:
        if record["status"] == "ok" and record.get("latency_ms", {}).get("p50"):
            key = (node_of(record), record["model"], record["scenario"], record["batch"])
            groups.setdefault(key, []).append(record)
    result = []
    for (node, model, scenario, batch), records in sorted(
        groups.items(), key=lambda item: (item[0][0], item[0][1], item[0][2] != "single-stream", item[0][2], item[0][3])
    ):
        # offline measures throughput (its latencies are queueing): compared as ms per sample
        offline = scenario == "offline" and all(r.get("throughput") for r in records)

        def cost(r: dict[str, Any]) -> float:
            return 1e3 / r["throughput"] if offline else r["latency_ms"]["p50"]

        records = sorted(records, key=cost)
        fastest = cost(records[0])
        rows = [
            {
                "backend": r["backend"],
                "p50_ms": cost(r),
                "vs_fastest": cost(r) / fastest,
                "agreement": _agreement(r),
                "noisy": bool(r["latency_ms"].get("noisy")),
                "verdict": verdict_text(r.get("loadgen")) if r.get("loadgen") else None,
            }
            for r in records
        ]
        metric = "ms per sample (1 / throughput)" if offline else "p50 ms"
        result.append(
            {"node": node, "model": model, "scenario": scenario, "batch": batch, "rows": rows, "metric": metric}
        )
    return result


def _summary_plot(groups: list[dict[str, Any]]) -> str | None:
    """Per group, horizontal bars of latency relative to the fastest (kiln's rows in orange)."""
    groups = [g for g in groups if g["scenario"] == "single-stream"] or groups
    if not groups:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tallest = max(len(g["rows"]) for g in groups)
    figure, axes = plt.subplots(1, len(groups), figsize=(3.3 * len(groups), 0.8 + 0.28 * tallest), squeeze=False)
    for axis, group in zip(axes[0], groups):
        rows = list(reversed(group["rows"]))  # fastest on top
        colors = ["#dd8452" if r["backend"].startswith(("kiln", "torch.compile-kiln")) else "#4c72b0" for r in rows]
        axis.barh([r["backend"] for r in rows], [r["vs_fastest"] for r in rows], color=colors)
        axis.axvline(1.0, color="#444", linewidth=0.8)
        title = f"{group['model']} b{group['batch']}" + (f" @ {group['node']}" if group["node"] else "")
        axis.set_title(title, fontsize=9)
        axis.set_xlabel(
            "/ fastest (" + ("throughput" if group["scenario"] == "offline" else "p50 latency") + ")", fontsize=8
        )
        axis.tick_params(labelsize=7)
        for y, row in enumerate(rows):
            axis.text(row["vs_fastest"], y, f" {row['vs_fastest']:.2f}x", va="center", fontsize=7)
        axis.set_xlim(0, max(r["vs_fastest"] for r in rows) * 1.3)
    figure.tight_layout()
    return figure_png(figure)


def _summary_tables(groups: list[dict[str, Any]]) -> str:
    parts = []
    for group in groups:
        title = f"{group['model']}, batch {group['batch']}, {group['scenario']}" + (
            f", on {group['node']}" if group["node"] else ""
        )
        verdicts = any(r["verdict"] for r in group["rows"])
        head = (
            f"<tr><th>backend</th><th>{html.escape(group['metric'])}</th><th>x fastest</th><th>agreement</th>"
            + ("<th>LoadGen</th>" if verdicts else "")
            + "</tr>"
        )
        body = "".join(
            f"<tr><td class=l>{html.escape(r['backend'])}{(' ' + NOISY) if r['noisy'] else ''}</td>"
            f"<td>{r['p50_ms']:.2f}</td><td>{r['vs_fastest']:.2f}</td><td>{html.escape(r['agreement'])}</td>"
            + (f"<td>{html.escape(str(r['verdict'] or '-'))}</td>" if verdicts else "")
            + "</tr>"
            for r in group["rows"]
        )
        parts.append(f"<div class=group><h3>{html.escape(title)}</h3><table>{head}{body}</table></div>")
    return "".join(parts)


def machine_line(machine: dict[str, Any], threads: int | None = None) -> str:
    """The machine in one line (HTML), and the threads every backend had where one count was used."""
    flags = ", ".join(machine.get("flags", []))
    return (
        f"{html.escape(str(machine.get('cpu', '?')))} ({html.escape(flags)}), {machine.get('usable_cpus', '?')} usable CPUs, "
        f"{machine.get('memory_gb', '?')} GB, {html.escape(str(machine.get('os', '?')))}"
        + (f"; {threads} thread(s) per backend" if threads is not None else "")
    )


def _nodes_table(run: dict[str, Any]) -> str:
    nodes: dict[str, dict[str, Any]] = {}
    for record in run["records"]:
        node = record.get("node")
        if isinstance(node, dict) and node.get("label"):
            nodes.setdefault(node["label"], node)
    if not nodes:
        return ""
    rows = "".join(
        f"<tr><td class=l>{html.escape(label)}</td><td class=l>{html.escape(str(n.get('cpu', '?')))}</td>"
        f"<td class=l>{html.escape(', '.join(n.get('flags', [])))}</td><td>{n.get('cpus', '?')}</td>"
        f"<td class=l>{html.escape(str(n.get('gpu') or '-'))}</td><td class=l>{html.escape(str(n.get('fingerprint', '')))}</td></tr>"
        for label, n in sorted(nodes.items())
    )
    return (
        "<table class=nodes><tr><th>node</th><th>CPU</th><th>ISA</th><th>CPUs</th><th>GPUs</th>"
        f"<th>fingerprint</th></tr>{rows}</table>"
    )


def write_html(run: dict[str, Any], path: Path) -> None:
    """The page, first screen first: the machine, then per model each backend relative to the
    fastest (plot and table, agreement beside it), the unavailable backends one line per reason,
    one explanation for the noise marker; then latency distributions and the full details."""
    images = plots(run)
    groups = summary(run)
    overview = _summary_plot(groups)
    details = ran(run)
    fleet = any(node_of(r) for r in run["records"])
    columns = [(name, fn) for name, fn in COLUMNS if fleet or name != "node"]
    header = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(fn(r)))}</td>" for _, fn in columns) + "</tr>" for r in details
    )
    missing = "".join(
        f'<li><b>{html.escape(", ".join(names))}</b>: <span title="{html.escape(reason)}">{html.escape(_short(reason))}</span></li>'
        for reason, names in unavailable(run)
    )
    other_notes = [line for line in notes(run) if not line.startswith("unavailable: ")]
    remarks = "".join(f"<li>{html.escape(line)}</li>" for line in other_notes)
    distribution = images.pop("latency_cdf", None)
    figures = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,{data}"><figcaption>{name}</figcaption></figure>'
        for name, data in images.items()
    )
    machine = html.escape(json.dumps(run["machine"], indent=1))
    config = html.escape(json.dumps(run["config"], indent=1))
    overview_html = (
        f'<img class=overview alt="summary" src="data:image/png;base64,{overview}">'
        if overview
        else "<p>no backend ran successfully</p>"
    )
    distribution_html = (
        f'<img alt="latency distributions" src="data:image/png;base64,{distribution}">' if distribution else "<p>-</p>"
    )
    write_output_file(
        path,
        f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kiln bench {run["run_id"]}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.2em 2em; color: #222; }}
h1 {{ font-size: 1.4em; margin: 0 0 .2em 0; }} h2 {{ font-size: 1.15em; margin: 1em 0 .3em 0; }} h3 {{ font-size: .95em; margin: .2em 0; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
td.l {{ text-align: left; }}
th {{ background: #f0f0f0; }}
.machine {{ color: #444; margin: 0 0 .6em 0; }}
.groups {{ display: flex; flex-wrap: wrap; gap: 1.2em; }}
.overview {{ max-width: 100%; display: block; margin: .3em 0; }}
ul {{ margin: .3em 0; padding-left: 1.3em; font-size: 13px; }}
figure {{ display: inline-block; margin: 1em; }}
img {{ max-width: 100%; }}
pre {{ background: #f7f7f7; padding: 1em; font-size: 12px; }}
</style></head><body>
<h1>kiln bench — run {run["run_id"]}</h1>
<p class=machine>{run["created"]} · {machine_line(run["machine"], run["config"]["threads"])}</p>
{_nodes_table(run)}
<h2>Summary: latency relative to the fastest backend (lower is better)</h2>
{overview_html}
<ul>{missing and f"<li>not run here:</li><ul>{missing}</ul>"}{remarks}</ul>
<div class=groups>{_summary_tables(groups)}</div>
<h2>Latency distributions</h2>{distribution_html}
<h2>Details</h2>
<table><tr>{header}</tr>{rows}</table>
<h2>More plots</h2>{figures or "<p>no successful runs to plot</p>"}
<h2>Machine</h2><pre>{machine}</pre>
<h2>Configuration</h2><pre>{config}</pre>
</body></html>
""",
        "report",
    )


def write_all(run: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    ensure_folder(out_dir, "report folder", parents=True)
    paths = {"json": out_dir / "results.json", "csv": out_dir / "results.csv", "html": out_dir / "report.html"}
    write_json(run, paths["json"])
    write_csv(run, paths["csv"])
    write_html(run, paths["html"])
    return paths
