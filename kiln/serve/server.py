"""Running the server: in the foreground (``kiln serve``), or on a thread (tests, embedding).

uvicorn runs the application: on SIGTERM or Ctrl-C it stops taking connections, answers the
requests in flight (up to ``GRACE_S``), then the batchers close.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from kiln.errors import ArgumentError
from kiln.serve.app import Settings, build_app
from kiln.serve.repository import Repository

GRACE_S = 30  # seconds SIGTERM waits for the requests in flight
MAX_CONNECTIONS = 1024  # connections and requests at once; past it uvicorn answers 503 (slow clients hold no more)
KEEP_ALIVE_S = 60  # an idle keep-alive connection is closed after this (uvicorn's default, 5 s, drops
# the connections of clients that send a request every few seconds: a client pool at a low rate)


def _config(app: Any, host: str, port: int, log_level: str) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=GRACE_S,
        lifespan="on",
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port); a named error when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # no Nagle delay: a response's headers and body leave as separate writes, and a client's
    # delayed ACK would hold the second for 40 ms (Linux: accepted connections inherit it)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ArgumentError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.listen(2048)
    return sock


def serve_forever(
    repository: Repository,
    settings: Settings,
    host: str,
    port: int,
    log_level: str = "info",
    announce: Any = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``repository`` on ``host``:``port`` (0: a free port; or on ``sock``, bound already)
    until SIGTERM or Ctrl-C; ``announce(url)`` is called once it listens and its startup is done (each
    model's compute per batch size measured: a request sent before waits for that)."""
    import uvicorn

    sock = sock or bind(host, port)
    port = sock.getsockname()[1]
    ready = None if announce is None else (lambda: announce(f"http://{host}:{port}"))
    app = build_app(repository, settings, host, on_ready=ready)  # (announced once the models are measured)
    uvicorn.Server(_config(app, host, port, log_level)).run(sockets=[sock])


class Running:
    """A server on a thread of this process (``url``; ``stop()`` drains it like SIGTERM)."""

    def __init__(
        self, repository: Repository, settings: Settings | None = None, host: str = "127.0.0.1", port: int = 0
    ):
        import uvicorn

        self.sock = bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.app = build_app(repository, settings or Settings(), host)
        self.server = uvicorn.Server(_config(self.app, host, self.port, "warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.grpc_port: int | None = self.app.state.service.grpc_port  # (bound in the startup, before started)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(GRACE_S + 5)
        self.sock.close()
