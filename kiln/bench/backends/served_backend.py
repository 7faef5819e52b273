"""kiln behind its own server (``kiln serve``), measured over the network: the ``kiln-served`` row.

Compile starts ``kiln serve MODEL.onnx`` in a process of its own on a free loopback port (the
server compiles the model as it loads: that is the timed compile) and waits until the model is
ready; each run is one Open Inference Protocol request with binary tensors over a keep-alive
connection (one per calling thread), so every scenario the harness drives (LoadGen's Server and
Offline included) measures served kiln: the protocol, the server's dynamic batching and the model.

With ``kiln bench --server URL`` (the environment variable ``KILN_BENCH_SERVER``), the row is a
server already running there instead, its model named as the bench model (``REPO/resnet50/1/...``
for ``-m resnet50``): nothing is started or stopped. ``KILN_SERVED_ARGS`` passes more arguments to
the server a row starts (``--max-batch 1``: the same server without dynamic batching).
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session, Unavailable

SERVER_ENV = "KILN_BENCH_SERVER"
ARGS_ENV = "KILN_SERVED_ARGS"  # more arguments for the kiln serve a row starts ("--max-batch 1": no batching)
KINDS = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64", "int32": "INT32", "int8": "INT8",
         "uint8": "UINT8", "bool": "BOOL"}  # fmt: skip
DTYPES = {v: k for k, v in KINDS.items()}
START_S = 900  # the server compiles the model before it listens


class ServedSession(Session):
    """Runs as protocol requests; thread-safe (a connection per calling thread)."""

    def __init__(self, url: str, name: str, on_close: Any = None) -> None:
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        self.host, self.port, self.path = host, int(port), f"/v2/models/{name}/infer"
        self.local = threading.local()
        self.on_close = on_close  # (the server this session's backend started: stopped with it)

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=600)
            connection.connect()
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
            self.local.connection = connection
        return connection

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        inputs, blobs = [], []
        for name, array in feeds.items():
            array = np.ascontiguousarray(array)
            if array.dtype.name not in KINDS:
                raise ValueError(f"input {name!r}: no protocol datatype for {array.dtype}")
            inputs.append({"name": name, "shape": list(array.shape), "datatype": KINDS[array.dtype.name],
                           "parameters": {"binary_data_size": array.nbytes}})  # fmt: skip
            blobs.append(array.tobytes())
        head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
        body, answer = self._post(head + b"".join(blobs), headers)
        if answer.status != 200:
            raise RuntimeError(f"the server answered HTTP {answer.status}: {body[:300]!r}")
        split = int(answer.getheader("Inference-Header-Content-Length") or len(body))
        document, offset, outputs = json.loads(body[:split]), split, []
        for entry in document["outputs"]:
            size = entry["parameters"]["binary_data_size"]
            raw = np.frombuffer(
                body,
                dtype=DTYPES[entry["datatype"]],
                count=size // np.dtype(DTYPES[entry["datatype"]]).itemsize,
                offset=offset,
            )
            outputs.append(raw.reshape(entry["shape"]))
            offset += size
        return outputs

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[bytes, http.client.HTTPResponse]:
        """The request on this thread's keep-alive connection; one the server closed while it was
        idle (its keep-alive timeout) is opened again and the request sent once more (inference
        is stateless: a request that never reached the server is safe to repeat)."""
        reused = getattr(self.local, "connection", None) is not None
        try:
            return self._exchange(body, headers)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            if not reused:
                raise
        return self._exchange(body, headers)  # (on a new connection: a failure now is the answer)

    def _exchange(self, body: bytes, headers: dict[str, str]) -> tuple[bytes, http.client.HTTPResponse]:
        connection = self._connection()
        try:
            connection.request("POST", self.path, body, headers)
            answer = connection.getresponse()
            return answer.read(), answer
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            connection.close()  # (dropped: the next request opens another)
            self.local.connection = None
            raise

    def close(self) -> None:
        connection = getattr(self.local, "connection", None)
        if connection is not None:
            connection.close()
        if self.on_close is not None:
            self.on_close()


class KilnServedBackend(Backend):
    name = "kiln-served"
    requires = ("uvicorn", "starlette", "prometheus_client")
    runtime_args: tuple[str, ...] = ()  # kiln serve --runtime ... (kiln by default)

    def __init__(self, threads: int) -> None:
        super().__init__(threads)
        self.server: subprocess.Popen | None = None
        self.url: str | None = os.environ.get(SERVER_ENV)
        self.model_name = ""

    def version(self) -> str:
        from kiln.version import __version__

        return __version__

    def config(self) -> dict[str, Any]:
        where = self.url if os.environ.get(SERVER_ENV) else "kiln serve started per model on loopback"
        return {"threads": self.threads, "server": where, "protocol": "Open Inference Protocol, HTTP, binary tensors",
                "memory": "the client's process (the server's is its own)"}  # fmt: skip

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        if os.environ.get(SERVER_ENV):
            self.model_name = model.name
            self._wait_ready(time.monotonic() + 60)
            return
        path = str(model.onnx_path)
        self.model_name = os.path.splitext(os.path.basename(path))[0]
        command = [sys.executable, "-m", "kiln", "serve", path, "--port", "0", "--threads", str(self.threads),
                   "--max-batch", str(max(8, model.batch)), "--log-level", "warning",
                   *self.runtime_args, *os.environ.get(ARGS_ENV, "").split()]  # fmt: skip
        self.server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
        atexit.register(self.close)  # (a job that fails before its session closes leaves no server behind)
        deadline = time.monotonic() + START_S
        for line in self.server.stderr:  # type: ignore[union-attr]
            if line.startswith("serving on "):
                self.url = line.split()[2]
                threading.Thread(target=self.server.stderr.read, daemon=True).start()  # type: ignore[union-attr]
                break
            if time.monotonic() > deadline:
                break
        if self.url is None:
            self.close()
            raise Unavailable("kiln serve did not start")
        self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> None:
        url = f"{self.url}/v2/models/{self.model_name}/ready"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=30) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                reason = str(err)
            if time.monotonic() > deadline:
                raise Unavailable(f"model {self.model_name!r} is not ready at {self.url}: {reason}")
            time.sleep(0.2)

    def load(self) -> Session:
        assert self.url is not None
        return ServedSession(self.url, self.model_name, self.close)

    def close(self) -> None:
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(60)
            except subprocess.TimeoutExpired:
                self.server.kill()
            self.server = None


class OnnxRuntimeServedBackend(KilnServedBackend):
    """onnxruntime behind the same server (``kiln serve --runtime onnxruntime``): the peer served
    the same way, so the protocol's cost is the same on both rows."""

    name = "onnxruntime-served"
    requires = ("uvicorn", "starlette", "prometheus_client", "onnxruntime")
    runtime_args = ("--runtime", "onnxruntime")

    def version(self) -> str:
        import onnxruntime

        return onnxruntime.__version__
