"""The server under pressure and at its end: a full queue, a slow request, SIGTERM with requests in
flight, and a thousand mangled requests between valid ones."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest

import kiln
from kiln.serve.app import Settings
from kiln.serve.repository import Repository
from kiln.serve.server import Running
from tests.runtime.test_sizes import small_cnn
from tests.serve.test_serve import SCALE, images, infer_json, post

pytest.importorskip("uvicorn", reason="uvicorn (the 'serve' extra) runs the server")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("one") / "cnn.onnx"
    onnx.save(small_cnn(), path)
    return path


def started(model_file, settings: Settings) -> Running:
    repository = Repository(model_file)
    repository.load_all()
    return Running(repository, settings)


def test_a_full_queue_is_503_with_retry_after(model_file):
    running = started(model_file, Settings(max_queue=1, max_queue_delay_ms=400))
    try:

        def one(_: int) -> tuple[int, str | None]:
            request = urllib.request.Request(
                f"{running.url}/v2/models/cnn/infer", data=infer_json(images(1)), method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    return answer.status, None
            except urllib.error.HTTPError as err:
                return err.code, err.headers.get("retry-after")

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(one, range(4)))
        assert (200, None) in answers and (503, "1") in answers
    finally:
        running.stop()


def test_a_request_past_the_timeout_is_504_and_the_next_one_is_served(model_file):
    running = started(model_file, Settings(timeout_s=0.05, max_queue_delay_ms=500))
    try:
        status, answer = post(f"{running.url}/v2/models/cnn/infer", infer_json(images(1)))
        assert status == 504 and "timeout" in answer["error"]
    finally:
        running.stop()


def test_sigterm_answers_the_requests_in_flight_then_exits(model_file):
    server = subprocess.Popen(
        [sys.executable, "-m", "kiln", "serve", str(model_file), "--port", "0", "--max-queue-delay-ms", "1500"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        url, before = None, []
        for line in server.stderr:  # type: ignore[union-attr]
            if line.startswith("serving on "):
                url = line.split()[2]
                break
            before.append(line)
        assert url is not None, "the server did not say where it listens"
        # it says so once its startup is done (the batch sizes measured): a client that starts on
        # the line does not wait behind that work
        assert any("compute per batch size" in line for line in before), before
        answers: list[tuple[int, dict]] = []
        caller = threading.Thread(
            target=lambda: answers.append(post(f"{url}/v2/models/cnn/infer", infer_json(images(2))))
        )
        caller.start()
        threading.Event().wait(0.5)  # the request waits in its batch's delay now
        server.send_signal(signal.SIGTERM)
        caller.join(30)
        assert answers and answers[0][0] == 200 and len(answers[0][1]["outputs"][0]["data"]) == 10
        assert server.wait(30) in (0, -signal.SIGTERM)  # (uvicorn ends by the signal it drained for)
    finally:
        server.kill()
        server.wait()


def mangled(rng: np.random.Generator, valid: bytes) -> tuple[bytes, dict]:
    """One hostile request: the valid JSON with bytes flipped, cut, or a field replaced by junk, or
    binary framing that lies."""
    kind = rng.integers(6)
    body, headers = bytearray(valid), {}
    if kind == 0:
        for at in rng.integers(0, len(body), size=rng.integers(1, 8)):
            body[at] = int(rng.integers(0, 256))
    elif kind == 1:
        body = body[: rng.integers(0, len(body))]
    elif kind == 2:
        document = json.loads(valid)
        entry = document["inputs"][int(rng.integers(2))]
        junk = [None, -1, 1e300, "x", [], {}, [[[]]], True, 2**70, [-5, 3], ["a"]]
        entry[str(rng.choice(["name", "shape", "datatype", "data", "parameters"]))] = junk[int(rng.integers(len(junk)))]
        body = bytearray(json.dumps(document).encode())
    elif kind == 3:
        headers["Inference-Header-Content-Length"] = str(int(rng.integers(-5, len(body) + 50)))
    elif kind == 4:
        document = json.loads(valid)
        document["inputs"][0] = {"name": "x", "shape": [int(rng.integers(0, 4)), 3, 6, 6], "datatype": "FP32",
                                 "parameters": {"binary_data_size": int(rng.integers(0, 2000))}}  # fmt: skip
        head = json.dumps(document).encode()
        body = bytearray(head + bytes(int(rng.integers(0, 2000))))
        headers["Inference-Header-Content-Length"] = str(len(head))
    else:
        body = bytearray(
            json.dumps(
                {"inputs": [{"name": "x", "shape": [1] * int(rng.integers(0, 40)), "datatype": "FP32", "data": [0.0]}]}
            ).encode()
        )
    return bytes(body), headers


def test_a_thousand_mangled_requests_get_answers_and_valid_ones_between_stay_right(model_file):
    reference = kiln.compile(small_cnn(), target="reference")
    running = started(model_file, Settings(max_queue_delay_ms=0))
    rng = np.random.default_rng(49)
    try:
        valid = infer_json(images(1))
        statuses: dict[int, int] = {}
        for number in range(1000):
            body, headers = mangled(rng, valid)
            status, answer = post(f"{running.url}/v2/models/cnn/infer", body, headers)
            statuses[status] = statuses.get(status, 0) + 1
            assert status in (200, 400), (status, answer, body[:200])
            if number % 100 == 0:
                x = images(2, seed=number)
                status, answer = post(f"{running.url}/v2/models/cnn/infer", infer_json(x))
                want = reference.run({"x": x, "scale": SCALE})["y"]
                np.testing.assert_allclose(
                    np.array(answer["outputs"][0]["data"], np.float32).reshape(2, 5), want, rtol=1e-5, atol=1e-5
                )
        assert statuses.get(400, 0) > 500  # most were refused, each with its reason
    finally:
        running.stop()
