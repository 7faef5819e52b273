"""The Open Inference Protocol's gRPC messages (package ``inference``), built from a descriptor
written here in code, so that no generated file and no protocol compiler is needed.

The message names, field names and field numbers are the protocol's (KServe's
``grpc_predict_v2.proto``): any client of ``inference.GRPCInferenceService`` talks to kiln's server.
``MESSAGES`` maps each name to its Python class (``MESSAGES["ModelInferRequest"]()``).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"
F = descriptor_pb2.FieldDescriptorProto
STRING, BOOL, INT64, INT32, UINT32, UINT64, FLOAT, DOUBLE, BYTES, MESSAGE = (
    F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_INT64, F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FLOAT, F.TYPE_DOUBLE,
    F.TYPE_BYTES, F.TYPE_MESSAGE,
)  # fmt: skip
ONE, MANY = F.LABEL_OPTIONAL, F.LABEL_REPEATED

# (name, number, type, label, message type name for MESSAGE fields)
Field = tuple[str, int, int, int, str | None]


def _fields(message: Any, fields: list[Field]) -> None:
    for name, number, kind, label, type_name in fields:
        field = message.field.add(name=name, number=number, type=kind, label=label)
        if type_name is not None:
            field.type_name = type_name


def _message(file: Any, name: str, fields: list[Field], parent: Any = None) -> Any:
    message = (parent.nested_type if parent is not None else file.message_type).add(name=name)
    _fields(message, fields)
    return message


def _parameters_map(message: Any, number: int, path: str) -> None:
    """``map<string, InferParameter> parameters = number`` (a map is a repeated nested entry) on
    the message whose full name is ``path``."""
    entry = message.nested_type.add(name="ParametersEntry")
    entry.options.map_entry = True
    _fields(entry, [("key", 1, STRING, ONE, None), ("value", 2, MESSAGE, ONE, f".{PACKAGE}.InferParameter")])
    _fields(message, [("parameters", number, MESSAGE, MANY, f".{PACKAGE}.{path}.ParametersEntry")])


def _tensor(message: Any, path: str, with_contents: bool = True) -> None:
    _fields(
        message, [("name", 1, STRING, ONE, None), ("datatype", 2, STRING, ONE, None), ("shape", 3, INT64, MANY, None)]
    )
    _parameters_map(message, 4, path)
    if with_contents:
        _fields(message, [("contents", 5, MESSAGE, ONE, f".{PACKAGE}.InferTensorContents")])


def _file() -> Any:
    file = descriptor_pb2.FileDescriptorProto(name="kiln/inference.proto", package=PACKAGE, syntax="proto3")
    for name in ("ServerLiveRequest", "ServerReadyRequest", "ServerMetadataRequest"):
        _message(file, name, [])
    _message(file, "ServerLiveResponse", [("live", 1, BOOL, ONE, None)])
    _message(file, "ServerReadyResponse", [("ready", 1, BOOL, ONE, None)])
    for name in ("ModelReadyRequest", "ModelMetadataRequest"):
        _message(file, name, [("name", 1, STRING, ONE, None), ("version", 2, STRING, ONE, None)])
    _message(file, "ModelReadyResponse", [("ready", 1, BOOL, ONE, None)])
    _message(file, "ServerMetadataResponse", [("name", 1, STRING, ONE, None), ("version", 2, STRING, ONE, None), ("extensions", 3, STRING, MANY, None)])  # fmt: skip
    metadata = _message(file, "ModelMetadataResponse", [])
    tensor = _message(file, "TensorMetadata", [], metadata)
    _fields(
        tensor, [("name", 1, STRING, ONE, None), ("datatype", 2, STRING, ONE, None), ("shape", 3, INT64, MANY, None)]
    )
    described = f".{PACKAGE}.ModelMetadataResponse.TensorMetadata"
    _fields(metadata, [("name", 1, STRING, ONE, None), ("versions", 2, STRING, MANY, None), ("platform", 3, STRING, ONE, None),
                       ("inputs", 4, MESSAGE, MANY, described), ("outputs", 5, MESSAGE, MANY, described)])  # fmt: skip
    request = _message(file, "ModelInferRequest", [])
    _tensor(_message(file, "InferInputTensor", [], request), "ModelInferRequest.InferInputTensor")
    wanted = _message(file, "InferRequestedOutputTensor", [("name", 1, STRING, ONE, None)], request)
    _parameters_map(wanted, 2, "ModelInferRequest.InferRequestedOutputTensor")
    _fields(
        request,
        [("model_name", 1, STRING, ONE, None), ("model_version", 2, STRING, ONE, None), ("id", 3, STRING, ONE, None)],
    )
    _parameters_map(request, 4, "ModelInferRequest")
    _fields(request, [("inputs", 5, MESSAGE, MANY, f".{PACKAGE}.ModelInferRequest.InferInputTensor"),
                      ("outputs", 6, MESSAGE, MANY, f".{PACKAGE}.ModelInferRequest.InferRequestedOutputTensor"),
                      ("raw_input_contents", 7, BYTES, MANY, None)])  # fmt: skip
    response = _message(file, "ModelInferResponse", [])
    _tensor(_message(file, "InferOutputTensor", [], response), "ModelInferResponse.InferOutputTensor")
    _fields(
        response,
        [("model_name", 1, STRING, ONE, None), ("model_version", 2, STRING, ONE, None), ("id", 3, STRING, ONE, None)],
    )
    _parameters_map(response, 4, "ModelInferResponse")
    _fields(response, [("outputs", 5, MESSAGE, MANY, f".{PACKAGE}.ModelInferResponse.InferOutputTensor"),
                       ("raw_output_contents", 6, BYTES, MANY, None)])  # fmt: skip
    parameter = _message(file, "InferParameter", [])
    parameter.oneof_decl.add(name="parameter_choice")
    for name, number, kind in (("bool_param", 1, BOOL), ("int64_param", 2, INT64), ("string_param", 3, STRING)):
        parameter.field.add(name=name, number=number, type=kind, label=ONE, oneof_index=0)
    _message(file, "InferTensorContents", [
        ("bool_contents", 1, BOOL, MANY, None), ("int_contents", 2, INT32, MANY, None), ("int64_contents", 3, INT64, MANY, None),
        ("uint_contents", 4, UINT32, MANY, None), ("uint64_contents", 5, UINT64, MANY, None),
        ("fp32_contents", 6, FLOAT, MANY, None), ("fp64_contents", 7, DOUBLE, MANY, None), ("bytes_contents", 8, BYTES, MANY, None),
    ])  # fmt: skip
    return file


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    found = pool.FindFileByName("kiln/inference.proto")
    return {name: message_factory.GetMessageClass(kind) for name, kind in found.message_types_by_name.items()}


MESSAGES = _classes()

# the service's methods: name -> (request message, response message)
METHODS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
}
