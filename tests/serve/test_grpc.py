"""The protocol's gRPC service (``inference.GRPCInferenceService``) beside the HTTP endpoints: the
same models and batchers, raw and typed tensor contents, statuses with reasons."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

import kiln
from kiln.serve.app import Settings
from kiln.serve.grpc_messages import MESSAGES, METHODS, SERVICE
from kiln.serve.repository import Repository
from kiln.serve.server import Running
from tests.runtime.test_sizes import small_cnn
from tests.serve.test_serve import SCALE, images

grpc = pytest.importorskip("grpc", reason="grpcio (the 'serve' extra) carries the gRPC service")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import onnx

    root = tmp_path_factory.mktemp("grpc")
    (root / "cnn" / "3").mkdir(parents=True)
    onnx.save(small_cnn(), root / "cnn" / "3" / "model.onnx")
    repository = Repository(root)
    repository.load_all()
    running = Running(repository, Settings(grpc_port=0, max_queue_delay_ms=30))
    channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    calls = {
        method: channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=MESSAGES[request].SerializeToString,
            response_deserializer=MESSAGES[response].FromString,
        )
        for method, (request, response) in METHODS.items()
    }
    calls["port"] = running.grpc_port  # (for clients of their own: tritonclient's)
    yield calls
    channel.close()
    running.stop()


def request(x: np.ndarray, raw: bool = True, request_id: str = "") -> object:
    message = MESSAGES["ModelInferRequest"](model_name="cnn", id=request_id)
    for name, array in (("x", x), ("scale", SCALE)):
        tensor = message.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
        if raw:
            message.raw_input_contents.append(array.tobytes())
        else:
            tensor.contents.fp32_contents.extend(array.reshape(-1).tolist())
    return message


def test_health_metadata_and_inference_with_raw_and_typed_contents(served):
    reference = kiln.compile(small_cnn(), target="reference")
    assert served["ServerLive"](MESSAGES["ServerLiveRequest"]()).live
    assert served["ModelReady"](MESSAGES["ModelReadyRequest"](name="cnn")).ready
    assert not served["ModelReady"](MESSAGES["ModelReadyRequest"](name="cnn", version="2")).ready
    metadata = served["ModelMetadata"](MESSAGES["ModelMetadataRequest"](name="cnn"))
    assert list(metadata.inputs[0].shape) == [-1, 3, 6, 6] and list(metadata.versions) == ["3"]
    for raw in (True, False):
        x = images(3, seed=int(raw))
        answer = served["ModelInfer"](request(x, raw, request_id="g1"))
        assert answer.id == "g1" and answer.model_version == "3" and list(answer.outputs[0].shape) == [3, 5]
        got = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(3, 5)
        np.testing.assert_allclose(got, reference.run({"x": x, "scale": SCALE})["y"], rtol=1e-5, atol=1e-5)


def test_concurrent_grpc_calls_share_the_batcher(served):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda seed: served["ModelInfer"](request(images(1, seed))), range(12)))
    assert all(len(a.raw_output_contents[0]) == 5 * 4 for a in answers)


def test_bad_calls_get_statuses_with_reasons(served):
    cases = [
        (MESSAGES["ModelInferRequest"](model_name="nobody"), grpc.StatusCode.NOT_FOUND, "no model"),
        (MESSAGES["ModelInferRequest"](model_name="cnn"), grpc.StatusCode.INVALID_ARGUMENT, "no inputs"),
    ]
    short = request(images(1))
    short.raw_input_contents[0] = b"\0" * 10  # type: ignore[attr-defined]
    cases.append((short, grpc.StatusCode.INVALID_ARGUMENT, "bytes of data"))
    huge = MESSAGES["ModelInferRequest"](model_name="cnn")
    huge.inputs.add(name="x", datatype="FP32", shape=[1 << 20, 1 << 20, 3])
    cases.append((huge, grpc.StatusCode.INVALID_ARGUMENT, "over the limit"))
    wrong = request(images(1))
    wrong.inputs[0].datatype = "FP64"  # type: ignore[attr-defined]
    cases.append((wrong, grpc.StatusCode.INVALID_ARGUMENT, "bytes of data"))
    for message, code, reason in cases:
        with pytest.raises(grpc.RpcError) as caught:
            served["ModelInfer"](message)
        assert caught.value.code() == code and reason in caught.value.details(), caught.value.details()
    assert served["ModelInfer"](request(images(2))).outputs[0].shape == [2, 5]


def test_tritonclient_grpc_talks_to_the_service(served):
    """The protocol's own gRPC client (tritonclient.grpc: its generated stubs, not kiln's
    descriptor) on the same port: health, metadata, inference with binary contents, an error
    status with its reason."""
    tritongrpc = pytest.importorskip("tritonclient.grpc", reason="tritonclient's gRPC side (the 'serve' extra)")
    from tritonclient.utils import InferenceServerException

    client = tritongrpc.InferenceServerClient(f"127.0.0.1:{served['port']}")
    try:
        assert client.is_server_live() and client.is_model_ready("cnn")
        metadata = client.get_model_metadata("cnn", as_json=True)
        assert metadata["inputs"][0]["shape"] == ["-1", "3", "6", "6"] and metadata["versions"] == ["3"]
        x = images(2, seed=7)
        inputs = [
            tritongrpc.InferInput("x", list(x.shape), "FP32"),
            tritongrpc.InferInput("scale", list(SCALE.shape), "FP32"),
        ]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(SCALE)
        result = client.infer("cnn", inputs, request_id="t1")
        want = kiln.compile(small_cnn(), target="reference").run({"x": x, "scale": SCALE})["y"]
        np.testing.assert_allclose(result.as_numpy("y"), want, rtol=1e-5, atol=1e-5)
        assert result.get_response().id == "t1"
        with pytest.raises(InferenceServerException, match="no model"):
            client.infer("nobody", inputs)
    finally:
        client.close()
