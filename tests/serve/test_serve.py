"""``kiln serve``: the Open Inference Protocol over HTTP on a free loopback port, talked to with
tritonclient (the protocol's own client) and raw HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.serve.app import Settings
from kiln.serve.repository import Repository
from kiln.serve.server import Running
from tests.runtime.test_sizes import small_cnn

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] (the 'serve' extra's test client)")


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 6, 6)).astype(np.float32)


SCALE = np.array([0.5], np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    (root / "cnn" / "1").mkdir(parents=True)
    onnx.save(small_cnn(), root / "cnn" / "1" / "model.onnx")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not onnx at all")
    return root


@pytest.fixture(scope="module")
def server(repo):
    repository = Repository(repo, max_batch=8)
    repository.load_all()
    running = Running(repository, Settings(max_queue_delay_ms=30, max_batch=8))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def expected():
    reference = kiln.compile(small_cnn(), target="reference")
    return lambda x: reference.run({"x": x, "scale": SCALE})["y"]


def post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def infer_json(x: np.ndarray) -> bytes:
    inputs = [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()},
        {"name": "scale", "shape": [1], "datatype": "FP32", "data": [0.5]},
    ]
    return json.dumps({"id": "r1", "inputs": inputs}).encode()


def test_metadata_health_and_a_json_inference(server, expected):
    client = httpclient.InferenceServerClient(server.url[len("http://") :])
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("cnn") and not client.is_model_ready("broken")
    metadata = client.get_model_metadata("cnn")
    assert metadata["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 3, 6, 6]}
    assert metadata["parameters"]["ranges"] == {"batch": [1, 8]}
    x = images(3)
    status, answer = post(f"{server.url}/v2/models/cnn/infer", infer_json(x))
    assert status == 200 and answer["id"] == "r1" and answer["model_version"] == "1"
    (output,) = answer["outputs"]
    assert output["shape"] == [3, 5] and output["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(3, 5), expected(x), rtol=1e-5, atol=1e-5)


def test_binary_tensors_through_tritonclient(server, expected):
    client = httpclient.InferenceServerClient(server.url[len("http://") :])
    x = images(5, seed=1)
    inputs = [httpclient.InferInput("x", list(x.shape), "FP32"), httpclient.InferInput("scale", [1], "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=True)
    inputs[1].set_data_from_numpy(SCALE, binary_data=True)
    result = client.infer("cnn", inputs, outputs=[httpclient.InferRequestedOutput("y", binary_data=True)])
    np.testing.assert_allclose(result.as_numpy("y"), expected(x), rtol=1e-5, atol=1e-5)


def test_concurrent_requests_are_joined_into_batches_without_compiling(server, expected):
    def one(seed: int) -> tuple[np.ndarray, np.ndarray]:
        x = images(1 + seed % 3, seed)
        status, answer = post(f"{server.url}/v2/models/cnn/infer", infer_json(x))
        assert status == 200, answer
        return x, np.array(answer["outputs"][0]["data"], np.float32).reshape(x.shape[0], 5)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for x, y in results:  # each request got its own rows back
        np.testing.assert_allclose(y, expected(x), rtol=1e-5, atol=1e-5)
    metrics = urllib.request.urlopen(f"{server.url}/metrics", timeout=30).read().decode()
    executions = float(_metric(metrics, 'kiln_execution_count_total{model="cnn",version="1"}'))
    inferences = float(_metric(metrics, 'kiln_inference_count_total{model="cnn",version="1"}'))
    assert executions < inferences  # requests joined: fewer runs than samples
    assert float(_metric(metrics, "kiln_compiles_during_serving")) == 0
    assert 'kiln_request_duration_seconds_bucket{le="0.0005",model="cnn",phase="queue"}' in metrics


def _metric(text: str, name: str) -> str:
    return next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " "))


HOSTILE = [
    (b"{not json", {}, "not JSON"),
    (b"[1, 2]", {}, "not a JSON object"),
    (json.dumps({"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode(), {}, "nope"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 6, 6], "datatype": "FP64", "data": [0.0] * 108},
                            {"name": "scale", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode(), {}, "dtype"),
    (json.dumps({"inputs": [{"name": "x", "shape": [9, 3, 6, 6], "datatype": "FP32", "data": [0.0] * 972},
                            {"name": "scale", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode(), {}, "range"),
    (json.dumps({"inputs": [{"name": "x", "shape": [100000, 100000, 100000], "datatype": "FP32", "data": []}]}).encode(), {}, "limit"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 6, 6], "datatype": "FP32", "parameters": {"binary_data_size": 432}}]}).encode() + b"\0" * 100,
     {"Inference-Header-Content-Length": "-"}, "not a number"),
    (json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]}]}).encode(), {}, "nested"),
    (json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "INT8", "data": [1, 300]}]}).encode(), {}, "range"),
    (json.dumps({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}).encode(), {}, "non-negative"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [' + b"0," * (5 << 20) + b"0]}]}", {}, "binary"),
]  # fmt: skip


def test_hostile_requests_are_answered_400_with_the_reason_and_the_server_keeps_serving(server, expected):
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 3, 6, 6], "datatype": "FP32", "parameters": {"binary_data_size": 432}}]}
    )
    truncated = (
        header.encode() + b"\0" * 100,
        {"Inference-Header-Content-Length": str(len(header))},
        "left in the body",
    )
    for body, headers, reason in [*HOSTILE, truncated]:
        status, answer = post(f"{server.url}/v2/models/cnn/infer", body, headers)
        assert status == 400 and reason in answer["error"], (reason, answer)
    assert post(f"{server.url}/v2/models/nobody/infer", infer_json(images(1)))[0] == 404
    status, answer = post(f"{server.url}/v2/models/broken/infer", infer_json(images(1)))
    assert status == 503 and "not ready" in answer["error"]
    x = images(2, seed=9)
    status, answer = post(f"{server.url}/v2/models/cnn/infer", infer_json(x))
    assert status == 200
    np.testing.assert_allclose(
        np.array(answer["outputs"][0]["data"], np.float32).reshape(2, 5), expected(x), rtol=1e-5, atol=1e-5
    )


def test_a_token_guards_everything_but_health(repo):
    repository = Repository(repo)
    repository.load("cnn")
    running = Running(repository, Settings(token="s3cret"))
    try:
        assert urllib.request.urlopen(f"{running.url}/v2/health/live", timeout=30).status == 200
        assert post(f"{running.url}/v2/models/cnn/infer", infer_json(images(1)))[0] == 401
        status, _ = post(
            f"{running.url}/v2/models/cnn/infer", infer_json(images(1)), {"Authorization": "Bearer s3cret"}
        )
        assert status == 200
    finally:
        running.stop()


def test_a_new_version_loads_beside_the_one_serving(repo, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(repo / "cnn", root / "cnn")
    repository = Repository(root)
    repository.load_all()
    running = Running(repository)
    try:
        (root / "cnn" / "2").mkdir()
        shutil.copy(root / "cnn" / "1" / "model.onnx", root / "cnn" / "2" / "model.onnx")
        assert post(f"{running.url}/v2/repository/models/cnn/load", b"")[0] == 200
        status, index = post(f"{running.url}/v2/repository/index", b"")
        assert {(row["version"], row["state"]) for row in index} == {("1", "UNAVAILABLE"), ("2", "READY")}
        status, answer = post(f"{running.url}/v2/models/cnn/versions/2/infer", infer_json(images(1)))
        assert status == 200 and answer["model_version"] == "2"
        assert post(f"{running.url}/v2/models/cnn/versions/1/infer", infer_json(images(1)))[0] == 404
    finally:
        running.stop()


def test_onnxruntime_behind_the_same_server_answers_the_same(repo, expected):
    pytest.importorskip("onnxruntime", reason="onnxruntime (the 'peers' extra) is the peer served")
    repository = Repository(repo, runtime="onnxruntime")
    repository.load("cnn")
    running = Running(repository)
    try:
        x = images(3, seed=4)
        status, answer = post(f"{running.url}/v2/models/cnn/infer", infer_json(x))
        assert status == 200
        np.testing.assert_allclose(
            np.array(answer["outputs"][0]["data"], np.float32).reshape(3, 5), expected(x), rtol=1e-5, atol=1e-5
        )
        bad = json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 6, 6], "datatype": "FP64", "data": [0.0] * 108},
                                     {"name": "scale", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode()  # fmt: skip
        status, answer = post(f"{running.url}/v2/models/cnn/infer", bad)
        assert status == 400 and "dtype" in answer["error"]  # checked by the signature, as kiln's requests are
    finally:
        running.stop()


def test_requests_of_different_lengths_are_joined_by_the_server(tmp_path):
    """`kiln serve --dim seq=1..32` on a token model: concurrent requests of lengths 2..31 (through
    tritonclient, binary tensors) are joined into batches whose samples each keep their own valid
    length; every answer is the request's own, nothing compiles while serving."""
    from tests.runtime.test_padded_lengths import attention_model, feeds, reference

    (tmp_path / "tokens" / "1").mkdir(parents=True)
    onnx.save(attention_model(), tmp_path / "tokens" / "1" / "model.onnx")
    repository = Repository(tmp_path, max_batch=8, dims={"seq": "1..32", "unused": "1..4"})
    repository.load_all()
    assert repository.loaded["tokens"].model.ranges == {"batch": (1, 8), "seq": (1, 32)}
    running = Running(repository, Settings(max_queue_delay_ms=50, max_batch=8))
    try:
        url = running.url[len("http://") :]

        def one(i: int) -> tuple[dict, np.ndarray]:
            request = feeds(1, 2 + (i * 7) % 30, seed=i)
            inputs = [
                httpclient.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
                for name, array in request.items()
            ]
            for put, array in zip(inputs, request.values()):
                put.set_data_from_numpy(array, binary_data=True)
            result = httpclient.InferenceServerClient(url).infer("tokens", inputs)
            return request, result.as_numpy("y")

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
        assert len({request["x"].shape[1] for request, _ in results}) == 8
        for request, y in results:
            np.testing.assert_allclose(y, reference(request["x"], request["mask"])[0], rtol=1e-4, atol=1e-4)
        metrics = urllib.request.urlopen(f"{running.url}/metrics", timeout=30).read().decode()
        executions = float(_metric(metrics, 'kiln_execution_count_total{model="tokens",version="1"}'))
        assert executions < 8  # different lengths joined
        assert float(_metric(metrics, "kiln_compiles_during_serving")) == 0
    finally:
        running.stop()
