"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService`` on its own port, in
the same process and event loop as the HTTP endpoints (the same models, batchers and metrics).

Inputs come as typed ``contents`` or as ``raw_input_contents`` (little-endian, row-major, one entry
per input in order); outputs go back as ``raw_output_contents``, as the protocol's clients expect.
A request the protocol or the model does not allow is ``INVALID_ARGUMENT`` with the reason; an
unknown model ``NOT_FOUND``; a full queue or a model not ready ``UNAVAILABLE``; past the timeout
``DEADLINE_EXCEEDED``; a kiln bug ``INTERNAL``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any

import numpy as np

from kiln.errors import ArgumentError, ExecutionError, InputError
from kiln.serve.batcher import QueueFull
from kiln.serve.grpc_messages import MESSAGES, METHODS, SERVICE
from kiln.serve.protocol import Failure, ProtocolError, check_tensor, datatype_of, from_raw, from_values
from kiln.version import __version__

log = logging.getLogger("kiln.serve")

# the typed contents field of each datatype
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}  # fmt: skip


def inputs_of(request: Any, limits: Any) -> dict[str, np.ndarray]:
    """A ModelInferRequest's inputs as arrays, checked as the JSON ones are."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    if not request.inputs:
        raise ProtocolError("the request has no inputs")
    arrays: dict[str, np.ndarray] = {}
    for number, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name or name in arrays:
            raise ProtocolError(f"inputs[{number}] has no name, or one given twice")
        dtype, count = check_tensor(name, tensor.datatype, list(tensor.shape), limits)
        if raw:
            arrays[name] = from_raw(name, raw[number], dtype, list(tensor.shape), count)
        else:
            field = CONTENTS.get(tensor.datatype)
            if field is None:
                raise ProtocolError(f"input {name!r}: {tensor.datatype} data come as raw_input_contents only")
            values = getattr(tensor.contents, field)
            if len(values) > count:
                raise ProtocolError(f"input {name!r}: {len(values)} values for {count} elements")
            arrays[name] = from_values(name, list(values), dtype, list(tensor.shape), count)
    return arrays


class Handlers:
    """The service's methods over a ``kiln.serve.app.Service``."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return MESSAGES["ServerLiveResponse"](live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return MESSAGES["ServerReadyResponse"](ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        extensions = ["binary_tensor_data", "model_repository"]
        return MESSAGES["ServerMetadataResponse"](name="kiln", version=__version__, extensions=extensions)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        loaded = self.service.repository.loaded.get(request.name)
        ready = loaded is not None and loaded.ready and request.version in ("", loaded.version)
        return MESSAGES["ModelReadyResponse"](ready=ready)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        document = await self._guarded(context, request.name, lambda: self._metadata(request))
        return document

    async def _metadata(self, request: Any) -> Any:
        document = self.service.model(request.name, request.version or None).metadata()
        answer = MESSAGES["ModelMetadataResponse"](
            name=document["name"], versions=document["versions"], platform=document["platform"]
        )
        for kind in ("inputs", "outputs"):
            for tensor in document.get(kind, []):
                getattr(answer, kind).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return answer

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        answer = await self._guarded(context, request.model_name, lambda: self._infer(request))
        self.service.metrics.latency.labels(request.model_name, "total").observe(time.perf_counter() - started)
        return answer

    async def _infer(self, request: Any) -> Any:
        service = self.service
        loaded = service.ready(request.model_name, request.model_version or None)
        inputs = inputs_of(request, service.limits)
        outputs = await service.run(loaded, inputs, [o.name for o in request.outputs])
        answer = MESSAGES["ModelInferResponse"](model_name=loaded.name, model_version=loaded.version, id=request.id)
        for name, array in outputs.items():
            array = np.ascontiguousarray(array)
            answer.outputs.add(name=name, datatype=datatype_of(array.dtype), shape=list(array.shape))
            answer.raw_output_contents.append(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
        return answer

    async def _guarded(self, context: Any, model: str, work: Any) -> Any:
        """``work()``'s answer, or the call aborted with the status and reason of its failure."""
        import grpc

        token = self.service.settings.token
        if token is not None:
            given = dict(context.invocation_metadata()).get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required (authorization metadata)"
                )
        try:
            return await work()
        except Exception as err:
            code, reason = _status(err)
            self.service.metrics.failures.labels(model, code.name.lower()).inc()
            if code is grpc.StatusCode.INTERNAL:
                log.exception("gRPC call for %s failed", model)
            await context.abort(code, reason)


def _status(err: Exception) -> tuple[Any, str]:
    import grpc

    if isinstance(err, Failure):
        codes = {404: grpc.StatusCode.NOT_FOUND, 503: grpc.StatusCode.UNAVAILABLE, 401: grpc.StatusCode.UNAUTHENTICATED}
        return codes.get(err.status, grpc.StatusCode.INVALID_ARGUMENT), err.reason
    if isinstance(err, QueueFull):
        return grpc.StatusCode.UNAVAILABLE, str(err)
    if isinstance(err, asyncio.TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "the request took longer than the server's timeout"
    if isinstance(err, (ProtocolError, InputError, ArgumentError, ExecutionError)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(err)
    return grpc.StatusCode.INTERNAL, f"kiln bug: {type(err).__name__}: {err}"


def grpc_server(service: Any, host: str, port: int) -> tuple[Any, int]:
    """A ``grpc.aio`` server of the service on ``host``:``port`` (0: a free port), not started;
    and the port it binds."""
    import grpc

    handlers = Handlers(service)
    methods = {}
    for method, (request, response) in METHODS.items():
        methods[method] = grpc.unary_unary_rpc_method_handler(
            getattr(handlers, method),
            request_deserializer=MESSAGES[request].FromString,
            response_serializer=MESSAGES[response].SerializeToString,
        )
    limit = service.limits.max_request_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, methods)])
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise ArgumentError(f"cannot listen for gRPC on {host}:{port}")
    return server, bound
