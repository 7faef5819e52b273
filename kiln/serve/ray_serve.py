"""``kiln serve --ray``: the same server as replicas of a Ray Serve deployment.

Each replica loads the repository itself (its own models, batchers and metrics: the same
Starlette application ``kiln serve`` runs, built in the replica by ``__serve_build_asgi_app__``) and
Ray Serve's proxy spreads requests over the replicas, with its autoscaling when a range of replicas
is given: a user who outgrows one machine adds Ray nodes, not code. ``/metrics`` is then the
answering replica's.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import asdict
from typing import Any

from kiln.errors import ArgumentError
from kiln.serve.app import Settings, build_app
from kiln.serve.protocol import Limits
from kiln.serve.repository import Repository

log = logging.getLogger("kiln.serve")
APP = "kiln"


class KilnReplica:
    """One replica: the repository loaded, the protocol's application built on it."""

    def __init__(self, root: str, options: dict[str, Any], settings: dict[str, Any]) -> None:
        self.repository = Repository(root, **options)
        self.repository.load_all()
        limits = settings.pop("limits", None)
        self.settings = Settings(**settings, limits=Limits(**limits) if limits else None)

    def __serve_build_asgi_app__(self) -> Any:  # (the name Ray Serve calls)
        return build_app(self.repository, self.settings)


def deployment(root: str, options: dict[str, Any], settings: Settings, replicas: int, max_replicas: int | None) -> Any:
    """The Ray Serve application: ``replicas`` replicas, or autoscaling between ``replicas`` and
    ``max_replicas``."""
    from ray import serve

    if replicas < 1 or (max_replicas is not None and max_replicas < replicas):
        raise ArgumentError(
            f"replicas: at least 1, and --max-replicas at least --replicas (got {replicas}, {max_replicas})"
        )
    scaling: dict[str, Any] = {"num_replicas": replicas}
    if max_replicas is not None and max_replicas > replicas:
        scaling = {"autoscaling_config": {"min_replicas": replicas, "max_replicas": max_replicas}}
    ingress = serve.ingress()(KilnReplica)
    served = serve.deployment(name="kiln", **scaling)(ingress)
    return served.bind(root, options, asdict(settings))


def run(app: Any, host: str, port: int, address: str | None) -> None:
    """Start Ray (or join the cluster at ``address``) and Ray Serve's proxy on ``host``:``port``,
    then deploy ``app`` at ``/``."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=APP, route_prefix="/")


def wait_then_stop() -> None:
    """Wait for SIGTERM or Ctrl-C, then take the deployment and Ray Serve down."""
    from ray import serve

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.delete(APP)
    serve.shutdown()
