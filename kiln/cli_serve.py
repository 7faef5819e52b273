"""``kiln serve``: compiled models behind the Open Inference Protocol (``kiln.serve``)."""

from __future__ import annotations

import logging

import click

from kiln.cli_support import console, split_ranges


@click.command("serve")
@click.argument("repository", type=click.Path(exists=True))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="HTTP port (0: a free one)."
)
@click.option(
    "--max-queue-delay-ms", default=0.0, show_default=True, type=click.FloatRange(0, 10_000),
    help="How long a request may wait for others to join its batch. Requests that arrive while a batch runs join "
    "the next one whatever this is (0: no wait when the model is idle, so a lone request pays nothing).",
)  # fmt: skip
@click.option(
    "--max-batch",
    default=8,
    show_default=True,
    type=click.IntRange(1, 4096),
    help="Samples per joined batch (and an ONNX file's batch range 1..N).",
)
@click.option(
    "--max-queue",
    default=256,
    show_default=True,
    type=click.IntRange(1),
    help="Waiting requests per model before HTTP 503.",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.001),
    help="Seconds a request may take (HTTP 504 after).",
)
@click.option(
    "--max-request-mb", default=64.0, show_default=True, type=click.FloatRange(0.001), help="Largest request body."
)
@click.option(
    "--max-elements",
    default=1 << 26,
    show_default=True,
    type=click.IntRange(1),
    help="Largest tensor a request may declare, in elements.",
)
@click.option(
    "--token", envvar="KILN_SERVE_TOKEN", help="Require 'Authorization: Bearer TOKEN' (also KILN_SERVE_TOKEN)."
)
@click.option(
    "--trust-artifacts", is_flag=True,
    help="Load .kiln artifacts' native code as it is (default: generate it again from their IR, which needs a C compiler).",
)  # fmt: skip
@click.option(
    "--threads", default=0, show_default=True, help="Threads per model run (0: every CPU this process may use)."
)
@click.option(
    "--latency-target-ms", type=click.FloatRange(0.001),
    help="Adaptive batching: size batches (and the wait for company) from the model's measured compute time per "
    "batch size so that a request's latency holds this target.",
)  # fmt: skip
@click.option(
    "--runtime", type=click.Choice(["kiln", "onnxruntime"]), default="kiln", show_default=True,
    help="What runs the models: kiln, or onnxruntime behind the same server (a peer to compare with).",
)  # fmt: skip
@click.option("--ray", "on_ray", is_flag=True, help="Serve as a Ray Serve deployment (replicas on a Ray cluster).")
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="With --ray: replicas (the least, with --max-replicas).",
)
@click.option("--max-replicas", type=click.IntRange(1), help="With --ray: autoscale between --replicas and this many.")
@click.option("--ray-address", help="With --ray: the cluster to join (default: a local Ray started for this server).")
@click.option(
    "--spin",
    type=click.IntRange(0),
    help="Pause instructions a pool thread spins before it sleeps (kiln.compile's spin).",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    help="Serve the protocol's gRPC service on this port too (0: a free one).",
)
@click.option(
    "--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True
)
@click.option(
    "--dim", "dims", multiple=True, metavar="NAME=LOW..HIGH",
    help="A declared range for .onnx models compiled at load (repeatable; a model without that dim ignores it): "
    "--dim seq=1..128 lets requests of different lengths join one batch.",
)  # fmt: skip
def serve(repository: str, host: str, port: int, max_queue_delay_ms: float, max_batch: int, max_queue: int, timeout_s: float,
          max_request_mb: float, max_elements: int, token: str | None, trust_artifacts: bool, threads: int,
          latency_target_ms: float | None, runtime: str, on_ray: bool, replicas: int, max_replicas: int | None, ray_address: str | None,
          spin: int | None, grpc_port: int | None, log_level: str, dims: tuple[str, ...]) -> None:  # fmt: skip
    """Serve REPOSITORY over the Open Inference Protocol (KServe v2, REST).

    REPOSITORY is a folder of NAME/VERSION/model.kiln (or model.onnx, compiled when it loads) or
    one MODEL.kiln / MODEL.onnx. Requests for a model whose batch kiln proved sample-parallel are
    joined into batches (up to --max-batch samples, waiting at most --max-queue-delay-ms); /metrics
    speaks Prometheus. Binds 127.0.0.1 unless told otherwise; SIGTERM answers the requests in flight,
    then stops.

    \b
    curl localhost:8000/v2/models/NAME
    curl -d '{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}' \\
         localhost:8000/v2/models/NAME/infer
    """
    from kiln.serve.app import Settings
    from kiln.serve.protocol import Limits
    from kiln.serve.repository import Repository
    from kiln.serve.server import serve_forever

    logging.getLogger("kiln.serve").setLevel(log_level.upper())
    logging.getLogger("kiln.serve.access").setLevel(log_level.upper())
    ranges, rest = split_ranges(dims)
    if rest:
        raise click.BadParameter(f"expected NAME=LOW..HIGH, got {rest[0]!r}", param_hint="--dim")
    repo = Repository(
        repository, trust=trust_artifacts, max_batch=max_batch, threads=threads, spin=spin, runtime=runtime,
        dims=ranges,
    )  # fmt: skip
    limits = Limits(int(max_request_mb * (1 << 20)), max_elements)
    settings = Settings(
        max_queue_delay_ms, max_batch, max_queue, timeout_s, token, limits, grpc_port, latency_target_ms
    )

    def announce(url: str) -> None:
        grpc = "" if grpc_port is None else f"; gRPC on port {grpc_port or 'chosen at start'}"
        console.print(f"serving on {url} (the Open Inference Protocol, REST; /metrics{grpc})")

    if on_ray:
        from kiln.serve import ray_serve

        if grpc_port is not None:
            raise click.UsageError("--grpc-port is not served through Ray Serve's proxy: leave it out with --ray")
        options = {
            "trust": trust_artifacts,
            "max_batch": max_batch,
            "threads": threads,
            "spin": spin,
            "runtime": runtime,
            "dims": ranges,
        }
        app = ray_serve.deployment(str(repo.root.resolve()), options, settings, replicas, max_replicas)
        with console.status("starting Ray Serve and its replicas (each loads the repository)..."):
            ray_serve.run(app, host, port, ray_address)
        announce(f"http://{host}:{port}")
        ray_serve.wait_then_stop()
        return
    from kiln.serve.server import bind

    sock = bind(host, port)  # (a port in use is said before the models compile, not after)
    with console.status("loading models..."):
        repo.load_all()
    for entry in repo.loaded.values():
        state = "ready" if entry.ready else f"[red]not ready[/]: {entry.error}"
        console.print(f"{entry.name} (version {entry.version}, {entry.path.name}): {state}")
    if not repo.loaded:
        console.print(
            "[yellow]no model found[/] (NAME/VERSION/model.kiln or model.onnx): the repository index stays empty"
        )
    serve_forever(repo, settings, host, port, log_level, announce, sock)
