"""``kiln serve --ray``: the same protocol served by replicas of a Ray Serve deployment on a local
Ray cluster bound to loopback."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest

import kiln
from kiln.serve.app import Settings
from tests.runtime.test_sizes import small_cnn
from tests.serve.test_serve import SCALE, images, infer_json, post

pytest.importorskip("ray.serve", reason="ray[serve] (the 'fleet' extra) runs the deployment")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_replicas_serve_the_protocol(tmp_path):
    import ray
    from ray import serve

    from kiln.serve import ray_serve

    (tmp_path / "cnn" / "1").mkdir(parents=True)
    onnx.save(small_cnn(), tmp_path / "cnn" / "1" / "model.onnx")
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        app = ray_serve.deployment(str(tmp_path), {"max_batch": 8}, Settings(), replicas=2, max_replicas=None)
        ray_serve.run(app, "127.0.0.1", port, None)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                metadata = json.loads(urllib.request.urlopen(f"{url}/v2/models/cnn", timeout=30).read())
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert metadata["inputs"][0]["shape"] == [-1, 3, 6, 6]
        reference = kiln.compile(small_cnn(), target="reference")
        for seed in range(6):
            x = images(1 + seed % 3, seed)
            status, answer = post(f"{url}/v2/models/cnn/infer", infer_json(x))
            assert status == 200, answer
            got = np.array(answer["outputs"][0]["data"], np.float32).reshape(x.shape[0], 5)
            np.testing.assert_allclose(got, reference.run({"x": x, "scale": SCALE})["y"], rtol=1e-5, atol=1e-5)
        assert post(f"{url}/v2/models/cnn/infer", b"{bad")[0] == 400
        assert serve.status().applications[ray_serve.APP].deployments["kiln"].replica_states == {"RUNNING": 2}
    finally:
        serve.shutdown()
        ray.shutdown()
