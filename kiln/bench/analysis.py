"""What a study's points say, computed from them: scaling curves, their knees, breaking points,
speedup over one thread, the best configuration per backend and objective, the Pareto front.

Definitions (the report prints them beside the figures):

* a **curve** is one backend variant's sweep over batch at fixed threads, scenario and requests in
  flight; its points are throughput (samples/s) and per-sample latency (p50 / batch; offline:
  1 / throughput);
* its **knee** is Kneedle's (Satopää et al., 2011): on log2(batch) and throughput both scaled to
  [0, 1], the batch farthest above the chord from the first point to the last; no knee when the
  curve never rises 5% of its range above the chord (it grows as fast at the end as at the start);
* its **breaking point** is the first batch where per-sample latency stops improving by more than
  5% over the batch before it, the tail latency (p99, or the maximum where fewer than 100 samples
  give no p99) crosses the bound, or the sweep ended (out of memory, timed out);
* **speedup** over one thread is throughput(t) / throughput(1) at the same batch; parallel
  efficiency is speedup / t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

KNEE_MIN = 0.05  # a knee must rise this far (of the curve's range) above the chord
IMPROVES = 0.05  # per-sample latency must improve by more than this to keep the sweep going


def ok(record: dict[str, Any]) -> bool:
    return record.get("status") == "ok" and bool(record.get("latency_ms", {}).get("p50"))


def per_sample_ms(record: dict[str, Any]) -> float:
    if record["scenario"] == "offline" and record.get("throughput"):
        return 1e3 / record["throughput"]
    return record["latency_ms"]["p50"] / record["batch"]


def throughput(record: dict[str, Any]) -> float:
    """Samples per second: what the scenario measured, else one stream's batch / p50."""
    return float(record.get("throughput") or 1e3 * record["batch"] / record["latency_ms"]["p50"])


def tail_ms(record: dict[str, Any]) -> tuple[float, str]:
    """The tail latency and what it is: p99, or the maximum when there were too few samples."""
    stats = record["latency_ms"]
    if stats.get("p99") is not None:
        return float(stats["p99"]), "p99"
    return float(stats.get("max") or stats["p50"]), "max"


def label(record: dict[str, Any]) -> str:
    """A backend variant as the report names it: its bench name and precision."""
    return f"{record.get('base_backend', record['backend'])} {record.get('precision', 'fp32')}"


@dataclass
class Curve:
    model: str
    variant: str  # "kiln int8"
    backend: str  # the bench backend (kiln-int8)
    threads: int
    scenario: str
    inflight: int
    points: list[dict[str, Any]] = field(default_factory=list)  # ok records, batch upward
    ended: dict[str, Any] | None = None  # the record that ended the sweep (oom, timeout)
    knee: int | None = None
    breaking: dict[str, Any] | None = None  # {"batch", "reason"}

    @property
    def name(self) -> str:
        flight = f", {self.inflight} in flight" if self.scenario != "single-stream" else ""
        return f"{self.variant}, {self.threads} thread(s){flight}"


def curves(records: list[dict[str, Any]], latency_bound_ms: float) -> list[Curve]:
    found: dict[tuple, Curve] = {}
    for record in sorted(records, key=lambda r: r["batch"]):
        if record["scenario"] == "breakdown":
            continue
        inflight = 1 if record["scenario"] == "single-stream" else int(record.get("inflight_requested") or 1)
        key = (record["model"], label(record), record["threads"], record["scenario"], inflight)
        curve = found.setdefault(key, Curve(*key[:2], record["backend"], key[2], key[3], key[4]))
        if ok(record):
            curve.points.append(record)
        elif record["status"] in ("oom", "timeout", "skipped") and curve.ended is None:
            curve.ended = record
    for curve in found.values():
        curve.knee = knee([p["batch"] for p in curve.points], [throughput(p) for p in curve.points])
        curve.breaking = breaking_point(curve, latency_bound_ms)
    return sorted(found.values(), key=lambda c: (c.model, c.variant, c.scenario, c.inflight, c.threads))


def knee(xs: list[float], ys: list[float]) -> int | None:
    """Kneedle's knee of an increasing, concave-ish curve (x on a log2 scale), or None."""
    if len(xs) < 3:
        return None
    lx = [math.log2(x) for x in xs]
    x0, x1, y0, y1 = lx[0], lx[-1], min(ys), max(ys)
    if x1 == x0 or y1 == y0:
        return None
    scaled = [((x - x0) / (x1 - x0), (y - y0) / (y1 - y0)) for x, y in zip(lx, ys)]
    rise = [y - x for x, y in scaled]
    best = max(range(len(rise)), key=lambda i: rise[i])
    return int(xs[best]) if rise[best] > KNEE_MIN else None


def breaking_point(curve: Curve, bound_ms: float) -> dict[str, Any] | None:
    """The first of the curve's three events (``events`` keeps each one's batch and reason):
    per-sample latency stops improving, the tail crosses the bound, the sweep ended."""
    events: dict[str, dict[str, Any]] = {}
    previous = None
    for point in curve.points:
        tail, which = tail_ms(point)
        if tail > bound_ms and "tail" not in events:
            events["tail"] = {"batch": point["batch"], "reason": f"{which} {tail:.1f} ms > the {bound_ms:g} ms bound"}
        if previous is not None and "plateau" not in events:
            gain = 1 - per_sample_ms(point) / per_sample_ms(previous)
            if gain <= IMPROVES:
                events["plateau"] = {
                    "batch": point["batch"],
                    "reason": f"per-sample latency {_change(gain)} from batch {previous['batch']} "
                    f"(needs > {IMPROVES:.0%} better)",
                }
        previous = point
    if curve.ended is not None:
        status = curve.ended["status"]
        reasons = {"oom": "out of memory", "timeout": "timed out"}
        reason = reasons.get(status) or str(curve.ended.get("error", status)).removeprefix("not run: ")
        events["ended"] = {"batch": curve.ended["batch"], "reason": reason}
    if not events:
        return None
    first = min(events.values(), key=lambda event: event["batch"])
    return {**first, "events": events}


def _change(gain: float) -> str:
    return f"{gain:.0%} better" if gain >= 0 else f"{-gain:.0%} worse"


def scaling(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model, variant, scenario and batch with a one-thread point: each thread count's
    speedup over it and parallel efficiency."""
    rows = []
    groups: dict[tuple, dict[int, dict[str, Any]]] = {}
    for record in filter(ok, records):
        key = (record["model"], label(record), record["scenario"], record["batch"])
        groups.setdefault(key, {})[record["threads"]] = record
    for (model, variant, scenario, batch), by_threads in sorted(groups.items()):
        one = by_threads.get(1)
        if one is None or len(by_threads) < 2:
            continue
        counts = sorted(by_threads)
        bend = knee(counts, [throughput(by_threads[t]) for t in counts])  # needs 3 thread counts or more
        for threads, record in sorted(by_threads.items()):
            speedup = throughput(record) / throughput(one)
            rows.append(
                {
                    "model": model,
                    "variant": variant,
                    "scenario": scenario,
                    "batch": batch,
                    "threads": threads,
                    "p50_ms": record["latency_ms"]["p50"],
                    "speedup": speedup,
                    "efficiency": speedup / threads,
                    "knee_threads": bend,
                }
            )
    return rows


OBJECTIVES = ("latency", "throughput", "throughput per watt")


def samples_per_joule(record: dict[str, Any]) -> float | None:
    joules = (record.get("energy") or {}).get("joules_per_inference")
    return record["batch"] / joules if joules else None


def score(record: dict[str, Any], objective: str) -> float | None:
    """Higher is better: -p50 (latency: single-stream only), samples/s, samples per joule."""
    if objective == "latency":
        return -record["latency_ms"]["p50"] if record["scenario"] == "single-stream" else None
    if objective == "throughput":
        return throughput(record)
    return samples_per_joule(record)


def best(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model, backend variant and objective: the best point (None where nothing measured it)."""
    rows = []
    variants = sorted({(r["model"], label(r)) for r in records if r["scenario"] != "breakdown"})
    for model, variant in variants:
        mine = [r for r in records if r["model"] == model and label(r) == variant and ok(r)]
        for objective in OBJECTIVES:
            scored = [(score(r, objective), r) for r in mine]
            scored = [(s, r) for s, r in scored if s is not None]
            top = max(scored, key=lambda item: item[0])[1] if scored else None
            rows.append({"model": model, "variant": variant, "objective": objective, "record": top})
    return rows


def figure_text(record: dict[str, Any], objective: str) -> str:
    """The point's figure for the objective, with its unit."""
    if objective == "latency":
        return f"p50 {record['latency_ms']['p50']:.2f} ms"
    if objective == "throughput":
        return f"{throughput(record):.1f} samples/s"
    return f"{samples_per_joule(record):.1f} samples/J"


def winners(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and objective: the best point of all, and the best of every other backend
    variant (its margin is the winner's lead over the runner-up)."""
    found = []
    rows = best(records)
    for model in sorted({r["model"] for r in records if r["scenario"] != "breakdown"}):
        for objective in OBJECTIVES:
            ranked = [row for row in rows if row["model"] == model and row["objective"] == objective]
            ranked = [row for row in ranked if row["record"] is not None]
            ranked.sort(key=lambda row: -score(row["record"], objective))  # type: ignore[operator]
            if ranked:
                found.append({"model": model, "objective": objective, "ranked": ranked})
    return found


def margin(winner: dict[str, Any], other: dict[str, Any], objective: str) -> float:
    """How many times better the winner is (latency: other's p50 / winner's)."""
    a, b = score(winner, objective), score(other, objective)
    if objective == "latency":
        return b / a  # both negative
    return a / b if b else math.inf  # type: ignore[operator]


def pareto(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other point beats on both per-query p50 latency and throughput."""
    points = [r for r in records if ok(r) and r["scenario"] == "single-stream"]
    front = []
    for record in points:
        latency, rate = record["latency_ms"]["p50"], throughput(record)
        dominated = any(
            o["latency_ms"]["p50"] <= latency
            and throughput(o) >= rate
            and (o["latency_ms"]["p50"] < latency or throughput(o) > rate)
            for o in points
        )
        if not dominated:
            front.append(record)
    return sorted(front, key=lambda r: r["latency_ms"]["p50"])


def accuracy_text(record: dict[str, Any]) -> str:
    """The point's accuracy: top-1 on the data set when measured, else agreement with kiln's
    reference interpreter (relative L2, top-1 agreement)."""
    measured = record.get("accuracy") or {}
    if measured.get("top1") is not None:
        return f"top-1 {measured['top1']:.2%} on {measured.get('images', '?')} images"
    agreement = record.get("agreement") or {}
    if "rel_l2" in agreement:
        text = f"relL2 {agreement['rel_l2']:.1e}"
        if "top1_agreement" in agreement:
            text += f", top-1 agreement {agreement['top1_agreement']:.0%}"
        return text + " vs the fp32 reference"
    return "not measured"
