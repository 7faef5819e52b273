"""The server's Prometheus metrics (``GET /metrics``, text format), one registry per server.

Counts of requests (success, failure by reason), inferences (samples) and executions (model
runs: a joined batch is one), latency histograms per phase (queue: waiting for a batch; compute:
the model's run; total: the request as the server saw it), the batch-size histogram, and plans
compiled while serving (0 where the model's sizes are all served by its size classes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kiln_request_success", "Requests answered", ["model", "version"], registry=r)
        self.failures = Counter("kiln_request_failure", "Requests failed, by reason", ["model", "reason"], registry=r)
        self.inferences = Counter("kiln_inference_count", "Samples inferred", ["model", "version"], registry=r)
        self.executions = Counter(
            "kiln_execution_count", "Model runs (a joined batch is one)", ["model", "version"], registry=r
        )
        self.latency = Histogram(
            "kiln_request_duration_seconds",
            "Request latency by phase",
            ["model", "phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch = Histogram("kiln_batch_size", "Samples per model run", ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.compiles = Gauge("kiln_compiles_during_serving", "Plans compiled since the server started", registry=r)
        self.queued = Gauge("kiln_queue_length", "Requests waiting", ["model"], registry=r)

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
