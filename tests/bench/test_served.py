"""The kiln-served row: kiln behind ``kiln serve``, measured by the harness over the protocol
(LoadGen's scenarios included), and ``kiln bench --server URL`` against a server already running."""

from __future__ import annotations

import importlib.util
import shutil
import urllib.request

import pytest
from click.testing import CliRunner

from kiln.bench.runner import BenchConfig, run_bench
from kiln.cli import main

pytest.importorskip("uvicorn", reason="the 'serve' extra runs kiln serve")


def served_tiny(tiny_onnx, tmp_path):  # type: ignore[no-untyped-def]
    """A server on a free loopback port with the tiny model as REPO/tiny/1/model.onnx."""
    from kiln.serve.repository import Repository
    from kiln.serve.server import Running

    (tmp_path / "repo" / "tiny" / "1").mkdir(parents=True)
    shutil.copy(tiny_onnx, tmp_path / "repo" / "tiny" / "1" / "model.onnx")
    repository = Repository(tmp_path / "repo")
    repository.load_all()
    return Running(repository)


def test_a_served_row_beside_the_in_process_one(tiny_onnx, tmp_path):
    config = BenchConfig(models=[tiny_onnx], backends=["kiln", "kiln-served", "onnxruntime-served"], scenarios=["single-stream", "offline"],
                         duration=1.0, min_iterations=50, warmup=1, timeout=300)  # fmt: skip
    run = run_bench(config, tmp_path / "work")
    rows = {(r["backend"], r["scenario"]): r for r in run["records"]}
    for scenario in ("single-stream", "offline"):
        served, local = rows[("kiln-served", scenario)], rows[("kiln", scenario)]
        assert served["status"] == "ok", served.get("error")
        assert served["agreement"]["rel_l2"] < 1e-6  # the same answers over the wire
        assert served["latency_ms"]["p50"] > 0 and local["status"] == "ok"
    assert "kiln serve" in rows[("kiln-served", "single-stream")]["config"]["server"]
    peer = rows[("onnxruntime-served", "single-stream")]  # the peer behind the same server code
    if importlib.util.find_spec("onnxruntime") is None:  # (the 'peers' extra): its row says why not
        assert peer["status"] == "unavailable" and "onnxruntime" in peer["error"]
    else:
        assert peer["status"] == "ok" and peer["agreement"]["rel_l2"] < 1e-5


def test_kiln_bench_server_measures_a_running_server(tiny_onnx, tmp_path, monkeypatch):
    from kiln.bench.backends.served_backend import SERVER_ENV

    monkeypatch.delenv(SERVER_ENV, raising=False)  # (kiln bench --server sets it: gone after this test)

    running = served_tiny(tiny_onnx, tmp_path)
    try:
        result = CliRunner().invoke(
            main, ["bench", "-m", tiny_onnx, "-b", "kiln", "--server", running.url, "--duration", "1", "--out", str(tmp_path / "out")]
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        metrics = urllib.request.urlopen(f"{running.url}/metrics", timeout=30).read().decode()
        line = next(
            x for x in metrics.splitlines() if x.startswith('kiln_execution_count_total{model="tiny",version="1"}')
        )
        assert float(line.split()[-1]) > 10  # the bench's requests reached the running server
        assert "kiln-served" in result.output
    finally:
        running.stop()


def test_a_kept_connection_the_server_closed_is_opened_again(tiny_onnx, tmp_path):
    """A keep-alive connection closed while idle (the server's keep-alive timeout, at a low request
    rate) is not a failed request: the client opens it again and sends once more; a connection that
    fails when it is new is still an error."""
    import socket

    import numpy as np

    from kiln.bench.backends.served_backend import ServedSession

    running = served_tiny(tiny_onnx, tmp_path)
    try:
        session = ServedSession(running.url, "tiny")
        x = np.ones((2, 16), np.float32)
        first = session.run({"x": x})
        old = session.local.connection
        old.sock.shutdown(socket.SHUT_RDWR)  # what the peer closing an idle connection leaves
        again = session.run({"x": x})
        assert session.local.connection is not old
        np.testing.assert_array_equal(first[0], again[0])
        gone = ServedSession(running.url.rsplit(":", 1)[0] + ":1", "tiny")  # nothing listens on port 1
        with pytest.raises(ConnectionRefusedError):
            gone.run({"x": x})
    finally:
        running.stop()
