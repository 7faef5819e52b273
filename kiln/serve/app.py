"""The HTTP side of ``kiln serve``: the Open Inference Protocol's REST endpoints on Starlette.

``/v2/health/live|ready``, ``/v2`` (server metadata), ``/v2/models/{m}[/versions/{v}]`` (model
metadata) and ``.../ready``, ``POST .../infer`` (JSON or the binary tensor data extension), the
repository extension (``POST /v2/repository/index``, ``.../models/{m}/load|unload``: a new version
loads beside the one serving, which serves until the new one is ready), and ``GET /metrics``.

Every answer carries the request's id (``X-Request-ID``, echoed or made) and is logged as one
JSON line (logger ``kiln.serve.access``). Errors are JSON ``{"error": reason}``: 400 for a request
the protocol or the model's signature does not allow, 401 without the bearer token (when the
server has one), 404 for a model it does not have, 413 for a body over the limit, 503 (with
Retry-After) for a full queue or a model not ready, 504 past the per-request timeout, 500 only for
a kiln bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kiln.driver.variants import plans_compiled
from kiln.errors import ArgumentError, ExecutionError, InputError, KilnError
from kiln.ir.types import TensorType
from kiln.serve.batcher import Batcher, QueueFull
from kiln.serve.metrics import Metrics
from kiln.serve.protocol import HEADER, Failure, Limits, ProtocolError, read_request, write_response
from kiln.serve.repository import Loaded, Repository
from kiln.version import __version__

GRPC_GRACE_S = 30
access = logging.getLogger("kiln.serve.access")
log = logging.getLogger("kiln.serve")


@dataclass
class Settings:
    """How the server batches, limits and guards requests."""

    max_queue_delay_ms: float = 0.0  # (requests that arrive while a batch runs join the next one anyway)
    max_batch: int = 8
    max_queue: int = 256
    timeout_s: float = 60.0
    token: str | None = None
    limits: Limits | None = None
    grpc_port: int | None = None  # the gRPC service's port (0: a free one; None: no gRPC)
    latency_target_ms: float | None = None  # adaptive batching: batches sized to the measured curve
    calibrate: bool = True  # measure each model's compute time per batch size when it loads


class Service:
    """The repository's models, their batchers and the metrics, behind the routes."""

    def __init__(self, repository: Repository, settings: Settings) -> None:
        self.repository, self.settings = repository, settings
        self.limits = settings.limits or Limits()
        self.metrics = Metrics()
        self.batchers: dict[tuple[str, str, int], Batcher] = {}  # (model, version, id of the kiln model)
        self.compiled_at_start = plans_compiled()
        self.grpc_port: int | None = None  # bound, once the server started

    def model(self, name: str, version: str | None) -> Loaded:
        loaded = self.repository.loaded.get(name)
        if loaded is None:
            raise Failure(404, f"no model {name!r} is loaded (the repository index lists what can be)")
        if version is not None and version != loaded.version:
            raise Failure(404, f"model {name!r} serves version {loaded.version}, not {version!r}")
        return loaded

    def batcher(self, loaded: Loaded) -> Batcher:
        key = (loaded.name, loaded.version, id(loaded.model))
        found = self.batchers.get(key)
        if found is None:
            metrics = self.metrics

            def observe(rows: int, compute: float) -> None:
                metrics.executions.labels(loaded.name, loaded.version).inc()
                metrics.inferences.labels(loaded.name, loaded.version).inc(rows)
                metrics.batch.labels(loaded.name).observe(rows)
                metrics.compiles.set(plans_compiled() - self.compiled_at_start)

            delay = self.settings.max_queue_delay_ms / 1e3
            target = self.settings.latency_target_ms
            found = Batcher(
                loaded.model, delay, self.settings.max_batch, self.settings.max_queue, observe,
                None if target is None else target / 1e3,
            )  # fmt: skip
            for old in [k for k in self.batchers if k[0] == loaded.name]:  # a version replaced: its batcher ends
                self.batchers.pop(old).retire()  # once the requests it holds are answered
            self.batchers[key] = found
        return found

    def prepare(self, loaded: Loaded) -> None:
        """The model's batcher made now, and its compute time per batch size measured (on this
        thread: call it before serving, or off the event loop)."""
        batcher = self.batcher(loaded)
        before = plans_compiled()
        if batcher.prepare_joins():
            log.info("%s: requests of different lengths join (lengths %s)", loaded.name, batcher.ragged.classes)
        if self.settings.calibrate and not batcher.calibrated:
            if batcher.calibrate(lambda rows: sample_feeds(loaded.model, batcher.symbol, rows)):
                costs = ", ".join(f"{rows}: {1e3 * cost:.1f} ms" for rows, cost in sorted(batcher.costs.items()))
                log.info("%s: compute per batch size %s; requests join up to %d", loaded.name, costs, batcher.limit())
        self.compiled_at_start += plans_compiled() - before  # (loading compiles; serving must not)

    def ready(self, name: str, version: str | None) -> Loaded:
        """The model serving ``name`` (and ``version``, if given), ready (503 otherwise)."""
        loaded = self.model(name, version)
        if not loaded.ready:
            raise Failure(503, f"model {name!r} is not ready: {loaded.error}", {"retry-after": "5"})
        return loaded

    async def run(
        self, loaded: Loaded, inputs: dict[str, np.ndarray], wanted: list[str] | None
    ) -> dict[str, np.ndarray]:
        """One request's outputs (``wanted`` of them, all if None) through the model's batcher,
        within the timeout; its queue and compute times observed. REST and gRPC both come here."""
        batcher = self.batcher(loaded)
        self.metrics.queued.labels(loaded.name).set(len(batcher.queue))
        async with asyncio.timeout(self.settings.timeout_s):  # (no task of its own, as wait_for makes)
            outputs, timing = await batcher.infer(inputs)
        if wanted:
            unknown = [n for n in wanted if n not in outputs]
            if unknown:
                raise ProtocolError(f"no output {unknown[0]!r}; the model's outputs are {sorted(outputs)}")
            outputs = {n: outputs[n] for n in wanted}
        self.metrics.latency.labels(loaded.name, "queue").observe(timing.queue)
        self.metrics.latency.labels(loaded.name, "compute").observe(timing.compute)
        self.metrics.requests.labels(loaded.name, loaded.version).inc()
        return outputs

    async def infer(self, request: Request, name: str, version: str | None) -> Response:
        loaded = self.ready(name, version)
        body = await _body(request, self.limits.max_request_bytes)
        parsed = read_request(body, request.headers.get(HEADER), self.limits)
        outputs = await self.run(loaded, parsed.inputs, parsed.wanted)
        content, headers = write_response(loaded.name, loaded.version, parsed, outputs)
        return Response(content, headers=headers)


def sample_feeds(model: Any, symbol: str | None, rows: int) -> dict[str, np.ndarray] | None:
    """Inputs of ``rows`` samples for measuring ``model`` (random floats, zeros elsewhere), or None
    where another symbolic dim leaves a shape unknown."""
    rng = np.random.default_rng(rows)
    feeds = {}
    for value in model.signature.inputs:
        kind = value.type
        if not isinstance(kind, TensorType) or kind.shape is None:
            return None
        shape = [rows if d == symbol else d for d in kind.shape]
        if not all(isinstance(d, int) for d in shape):
            return None
        dtype = kind.dtype.numpy
        feeds[value.name] = rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    return feeds


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Failure(413, f"request of {declared} bytes is over the limit of {limit}")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Failure(413, f"request over the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _reason(err: BaseException) -> tuple[int, str, dict[str, str]]:
    """The HTTP status, the reason and extra headers of a request that failed with ``err``."""
    if isinstance(err, Failure):
        return err.status, err.reason, err.headers
    if isinstance(err, QueueFull):
        return 503, str(err), {"retry-after": "1"}
    if isinstance(err, asyncio.TimeoutError):
        return 504, "the request took longer than the server's timeout", {}
    if isinstance(err, (ProtocolError, InputError, ArgumentError)):
        return 400, str(err), {}
    if isinstance(err, ExecutionError):  # a node failed on the request's values (an index out of range)
        return 400, f"{type(err).__name__}: {err}", {}
    if isinstance(err, KilnError):
        return 500, f"{type(err).__name__}: {err}", {}
    return 500, f"kiln bug: {type(err).__name__}: {err}", {}


def build_app(
    repository: Repository, settings: Settings | None = None, host: str = "127.0.0.1", on_ready: Any = None
) -> Starlette:
    """The Starlette application serving ``repository`` (its models loaded already), with the gRPC
    service on ``host`` in the same event loop when ``settings.grpc_port`` is set (``app.state.service``);
    ``on_ready()`` is called once its startup (each model's batch sizes measured) is done."""
    service = Service(repository, settings or Settings())

    async def handle(request: Request, work: Any, model: str | None = None) -> Response:
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        started = time.perf_counter()
        try:
            _authorize(request, service.settings.token)
            response = await work()
        except BaseException as err:  # every failure is an answer: nothing reaches the worker
            if isinstance(err, asyncio.CancelledError):
                raise
            status, reason, headers = _reason(err)
            if status == 500:
                log.exception("request %s failed", request_id)
            if model is not None:
                service.metrics.failures.labels(model, _kind(status)).inc()
            response = JSONResponse({"error": reason}, status_code=status, headers=headers)
        response.headers["x-request-id"] = request_id
        elapsed = time.perf_counter() - started
        if model is not None and response.status_code == 200:
            service.metrics.latency.labels(model, "total").observe(elapsed)
        if access.isEnabledFor(logging.INFO):  # (the line is not even made when nobody reads it)
            record = {
                "id": request_id,
                "method": request.method,
                "path": request.url.path,
                "status": response.status_code,
            }
            access.info(json.dumps({**record, "ms": round(elapsed * 1e3, 3)}))
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        grpc = None
        for loaded in list(service.repository.loaded.values()):
            if loaded.ready:
                await asyncio.get_running_loop().run_in_executor(None, service.prepare, loaded)
        if service.settings.grpc_port is not None:
            from kiln.serve.grpc_service import grpc_server

            grpc, service.grpc_port = grpc_server(service, host, service.settings.grpc_port)
            await grpc.start()
            log.info("the gRPC service listens on %s:%d", host, service.grpc_port)
        if on_ready is not None:
            on_ready()
        yield
        if grpc is not None:
            await grpc.stop(GRPC_GRACE_S)  # the calls in flight answered first
        _close(service)  # after the server stopped taking requests and the last one was answered

    app = Starlette(routes=_routes(service, handle), lifespan=lifespan)
    app.state.service = service
    return app


def _routes(service: Service, handle: Any) -> list[Route]:

    def ok(document: Any = None) -> Any:
        async def work() -> Response:
            return JSONResponse(document() if callable(document) else (document or {}))

        return work

    async def live(request: Request) -> Response:
        return await handle(request, ok({"live": True}))

    async def ready(request: Request) -> Response:
        return await handle(request, ok({"ready": True}))

    async def server(request: Request) -> Response:
        extensions = ["binary_tensor_data", "model_repository", "statistics"]
        return await handle(request, ok({"name": "kiln", "version": __version__, "extensions": extensions}))

    async def metadata(request: Request) -> Response:
        name, version = request.path_params["model"], request.path_params.get("version")
        return await handle(request, ok(lambda: service.model(name, version).metadata()), name)

    async def model_ready(request: Request) -> Response:
        name, version = request.path_params["model"], request.path_params.get("version")

        async def work() -> Response:
            loaded = service.model(name, version)
            if not loaded.ready:
                raise Failure(503, f"model {name!r} is not ready: {loaded.error}")
            return JSONResponse({"name": name, "ready": True})

        return await handle(request, work, name)

    async def infer(request: Request) -> Response:
        name, version = request.path_params["model"], request.path_params.get("version")
        return await handle(request, lambda: service.infer(request, name, version), name)

    async def metrics(request: Request) -> Response:
        async def work() -> Response:
            service.metrics.compiles.set(plans_compiled() - service.compiled_at_start)
            content, kind = service.metrics.text()
            return Response(content, media_type=kind)

        return await handle(request, work)

    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    return [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server),
        Route(model, metadata),
        Route(versioned, metadata),
        Route(f"{model}/ready", model_ready),
        Route(f"{versioned}/ready", model_ready),
        Route(f"{model}/infer", infer, methods=["POST"]),
        Route(f"{versioned}/infer", infer, methods=["POST"]),
        *_repository_routes(service, handle),
        Route("/metrics", metrics),
    ]


def _repository_routes(service: Service, handle: Any) -> list[Route]:
    """The repository extension: the index, and loading or unloading a model by name."""
    repo = service.repository

    async def index(request: Request) -> Response:
        async def work() -> Response:
            return JSONResponse(repo.index())

        return await handle(request, work)

    async def load(request: Request) -> Response:
        name = request.path_params["model"]

        async def work() -> Response:
            loaded = await asyncio.get_running_loop().run_in_executor(None, repo.load, name)
            if not loaded.ready:
                raise Failure(400, f"model {name!r} failed to load: {loaded.error}")
            await asyncio.get_running_loop().run_in_executor(None, service.prepare, loaded)
            return JSONResponse({})

        return await handle(request, work, name)

    async def unload(request: Request) -> Response:
        name = request.path_params["model"]

        async def work() -> Response:
            repo.unload(name)
            return JSONResponse({})

        return await handle(request, work, name)

    return [
        Route("/v2/repository/index", index, methods=["POST"]),
        Route("/v2/repository/models/{model}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", unload, methods=["POST"]),
    ]


def _authorize(request: Request, token: str | None) -> None:
    if token is None or request.url.path.startswith("/v2/health/"):
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise Failure(401, "a bearer token is required (Authorization: Bearer ...)", {"www-authenticate": "Bearer"})


def _kind(status: int) -> str:
    return {
        400: "bad_request",
        401: "unauthorized",
        404: "not_found",
        413: "too_large",
        503: "busy",
        504: "timeout",
    }.get(status, "internal")


def _close(service: Service) -> None:
    for batcher in service.batchers.values():
        batcher.close()
