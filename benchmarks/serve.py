"""kiln served over the Open Inference Protocol against kiln in-process, on loopback: what the
server costs per request, and what dynamic batching gives under load.

For each model (a zoo model's ONNX file, its batch declared 1..MAX_BATCH as ``kiln serve`` declares
it), in one run:
- single-stream at batch 1, in-process (``kiln.compile`` of the same file in this process) and
  served (binary tensors) in alternating rounds, so the machine's slow stretches fall on both;
- in-process throughput at each batch size (the best one is the offline target's reference);
- served: ``kiln serve FILE`` in its own process (the client is this process: a keep-alive
  connection per client: the bench's ``ServedSession``), single-stream with JSON, then
  offline throughput with CLIENTS concurrent clients sending
  batch-1 requests (the server joins them) and the mean batch it ran (its /metrics);
- LoadGen's Server scenario against the served model, with dynamic batching (``--max-batch 8
  --latency-target-ms T``) and without (``--max-batch 1``: a server of its own), at a ladder of
  rates (fractions of the in-process batch-1 capacity, climbing until a rate is INVALID): the
  highest VALID rate of each. LoadGen judges the 90th percentile against T (4x the in-process
  p50 by default, ``--target-factor``; a 99th-percentile verdict needs ~660 queries a rate, minutes for BERT on two
  cores), and each rate's p99 is reported beside it.

    python benchmarks/serve.py --models resnet50,bert-base [--seconds 8] [--clients 8] [--ladder-seconds 15]

Two cores: the server, the model's threads and the client share them (no other machine here).
Not a test: prints a table and JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

from kiln.bench.backends.served_backend import ServedSession  # the bench's keep-alive protocol client

MAX_BATCH = 8
EXTRA: list[str] = []  # more kiln serve arguments


def percentiles(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def timed(call, seconds: float) -> list[float]:  # type: ignore[no-untyped-def]
    for _ in range(5):
        call()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def in_process(model, feeds, seconds: float) -> dict:  # type: ignore[no-untyped-def]
    """Throughput of the in-process model at each batch size (samples per second)."""
    throughput = {}
    for batch in (1, 2, 4, 8):
        runs = timed(lambda b=batch: model.run(feeds(b)), seconds / 2)
        throughput[batch] = batch * 1e3 / statistics.median(runs)
    return {"throughput": throughput}


def single_stream(model, client: ServedSession, feeds, seconds: float, rounds: int = 4) -> dict:  # type: ignore[no-untyped-def]
    """Batch-1 latency in-process and served (binary), in alternating rounds, so a slow stretch of
    the machine falls on both (this VM has them)."""
    local: list[float] = []
    remote: list[float] = []
    for _ in range(rounds):
        local += timed(lambda: model.run(feeds(1)), seconds / rounds)
        remote += timed(lambda: client.run(feeds(1)), seconds / rounds)
    return {"in_process": percentiles(local), "binary": percentiles(remote)}


def start_server(path: str, *extra: str, max_batch: int = MAX_BATCH) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "kiln", "serve", path, "--port", "0", "--max-batch", str(max_batch),
               "--threads", "2", "--log-level", "warning", *extra]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    for line in server.stderr:  # type: ignore[union-attr]
        if line.startswith("serving on "):
            threading.Thread(target=server.stderr.read, daemon=True).start()  # type: ignore[union-attr]
            return server, line.split()[2]
    raise RuntimeError("kiln serve did not start")


def json_infer(url: str, name: str, feeds: dict[str, np.ndarray]) -> dict:
    """One request with JSON tensors (the binary ones go through the bench's ServedSession)."""
    kinds = {"float32": "FP32", "int64": "INT64"}
    inputs = [{"name": k, "shape": list(a.shape), "datatype": kinds[a.dtype.name], "data": a.reshape(-1).tolist()}
              for k, a in feeds.items()]  # fmt: skip
    request = urllib.request.Request(
        f"{url}/v2/models/{name}/infer", json.dumps({"inputs": inputs}).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def served(url: str, name: str, feeds, seconds: float, clients: int) -> dict:  # type: ignore[no-untyped-def]
    as_json = percentiles(timed(lambda: json_infer(url, name, feeds(1)), seconds / 2))
    before = _batches(url)
    done, stop = [], time.perf_counter() + seconds

    def load() -> None:
        own, count = ServedSession(url, name), 0
        while time.perf_counter() < stop:
            own.run(feeds(1))
            count += 1
        done.append(count)

    threads = [threading.Thread(target=load) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    throughput = sum(done) / (time.perf_counter() - started)
    after = _batches(url)
    runs = after.get("+Inf", 0) - before.get("+Inf", 0)
    return {"json": as_json, "throughput": throughput, "mean_batch": sum(done) / max(runs, 1)}


def _batches(url: str) -> dict[str, float]:
    metrics = urllib.request.urlopen(f"{url}/metrics", timeout=60).read().decode()
    found = {}
    for line in metrics.splitlines():
        if line.startswith("kiln_batch_size_bucket"):
            found[line.split('le="')[1].split('"')[0]] = float(line.split()[-1])
    return found


LADDER = (0.5, 0.65, 0.8, 0.95, 1.1, 1.25, 1.4)  # rates tried, as fractions of the in-process batch-1 capacity


def ladder(url: str, name: str, feeds, p50_ms: float, target_ms: float, seconds: float) -> dict:  # type: ignore[no-untyped-def]
    """LoadGen's Server scenario at rising rates until one is INVALID: each rate's verdict, p90
    and p99 (ms), and the highest VALID rate."""
    from kiln.bench.loadgen import run_scenario

    client, steps, best = ServedSession(url, name), [], 0.0
    for fraction in LADDER:
        rate = fraction * 1e3 / p50_ms
        long_enough = max(seconds, 120 / rate)  # LoadGen's early stopping at p90 wants ~100 queries
        found = run_scenario(client.run, [feeds(1)], "server", long_enough, 1, inflight=16,
                             expected_latency_s=p50_ms / 1e3, rate=rate, target_latency_ms=target_ms,
                             percentile=0.9)  # fmt: skip
        latency = found["latency_ms"]
        verdict = found["loadgen"]["result"]
        steps.append({"rate": round(rate, 2), "result": verdict, "p90": latency.get("p90"),
                      "p99": latency.get("p99"), "queries": found["iterations"],
                      "why": found["loadgen"]["why"][:2]})  # fmt: skip
        print(json.dumps({"ladder": name, **steps[-1]}), flush=True)
        if verdict != "VALID":
            break
        best = rate
    return {"steps": steps, "best_valid_qps": best, "target_ms": target_ms}


def server_scenario(path: str, name: str, feeds, p50_ms: float, args) -> dict:  # type: ignore[no-untyped-def]
    """The ladder with dynamic batching and without, each server in its own process."""
    target = args.target_ms or args.target_factor * p50_ms
    found = {}
    for label, extra, max_batch in (("batching", ("--latency-target-ms", f"{target:g}"), MAX_BATCH),
                                    ("no batching", (), 1)):  # fmt: skip
        server, url = start_server(path, *extra, max_batch=max_batch)
        try:
            found[label] = ladder(url, name, feeds, p50_ms, target, args.ladder_seconds)
            found[label]["mean_batch"] = _mean_batch(url)
        finally:
            server.terminate()
            server.wait(60)
    return found


def _mean_batch(url: str) -> float:
    metrics = urllib.request.urlopen(f"{url}/metrics", timeout=60).read().decode()
    total = count = 0.0
    for line in metrics.splitlines():
        if line.startswith("kiln_batch_size_sum"):
            total += float(line.split()[-1])
        elif line.startswith("kiln_batch_size_count"):
            count += float(line.split()[-1])
    return total / count if count else 0.0


def feeds_of(model: str):  # type: ignore[no-untyped-def]
    from kiln import zoo

    one = {k: np.asarray(v) for k, v in zoo.example_inputs(model, batch=1).items()}
    return lambda batch: {k: np.repeat(v, batch, axis=0) for k, v in one.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert-base")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--ladder-seconds", type=float, default=15.0, help="LoadGen's Server run at each rate")
    parser.add_argument(
        "--target-ms", type=float, default=None, help="the Server's latency bound (default: --target-factor x p50)"
    )
    parser.add_argument("--target-factor", type=float, default=4.0)
    parser.add_argument("--no-ladder", action="store_true", help="skip LoadGen's Server scenario")
    args = parser.parse_args()
    from kiln import zoo
    from kiln.bench.machine import fingerprint

    print(json.dumps({"cpu": fingerprint().get("cpu"), "clients": args.clients}))
    rows = []
    import kiln

    for model in args.models.split(","):
        path, feeds = str(zoo.onnx_path(model)), feeds_of(model)
        local_model = kiln.compile(path, dims={"batch": f"1..{MAX_BATCH}"}, threads=2)
        server, url = start_server(path)
        try:
            name = zoo.onnx_path(model).stem
            stream = single_stream(local_model, ServedSession(url, name), feeds, 2 * args.seconds)
            remote = served(url, name, feeds, args.seconds, args.clients)
        finally:
            server.terminate()
            server.wait(60)
        local = in_process(local_model, feeds, args.seconds)
        best = max(local["throughput"].values())
        local["p50"], local["p90"] = stream["in_process"]
        scenario = None if args.no_ladder else server_scenario(path, name, feeds, local["p50"], args)
        remote["binary"] = stream["binary"]
        row = {"model": model, "in_process": local, "served": remote,
               "served_minus_in_process_ms": remote["binary"][0] - local["p50"],
               "offline_vs_best_batch": remote["throughput"] / best, "server_scenario": scenario}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        f"{'model':12} {'in-proc p50':>11} {'served bin p50':>14} {'+ms':>6} {'json p50':>9} {'offline/s':>9} {'mean batch':>10} {'best batch/s':>12} {'ratio':>6}"
    )
    for r in rows:
        local, remote = r["in_process"], r["served"]
        print(f"{r['model']:12} {local['p50']:11.2f} {remote['binary'][0]:14.2f} {r['served_minus_in_process_ms']:6.2f} "
              f"{remote['json'][0]:9.2f} {remote['throughput']:9.1f} {remote['mean_batch']:10.2f} {max(local['throughput'].values()):12.1f} {r['offline_vs_best_batch']:6.2f}")  # fmt: skip
    for r in rows:
        for label, found in (r["server_scenario"] or {}).items():
            last = [s for s in found["steps"] if s["result"] == "VALID"][-1:] or [{}]
            print(f"{r['model']:12} Server scenario, {label:11}: highest VALID {found['best_valid_qps']:.2f} q/s "
                  f"(p90 {last[0].get('p90')} p99 {last[0].get('p99')} ms, target {found['target_ms']:.0f} ms, "
                  f"mean batch {found['mean_batch']:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
