"""Tuning candidates measured on a Ray cluster's nodes of the target's hardware class, as TVM's RPC
tracker hands measurements to boards of the device being tuned for.

``kiln compile MODEL --tune 5m --cluster ADDRESS [--on KEY=VALUE]``: the nodes whose ISA the
target needs (``cpu:avx512`` -> avx512f, ``cpu:avx2`` -> avx2; ``cpu``, this machine's best ISA,
-> the same) and that match the selectors form the hardware class (the largest, if several); each
measurement runs there as a task holding its node alone (all its CPUs), every candidate of one
kernel on the same node so they compare on one machine. A node lost mid-measurement: the
measurement moves to another node of the class, or fails like a crashed candidate (skipped).
The choices are recorded in the local tuning database for the target, as local tuning's are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from kiln.backends import parse
from kiln.bench import fleet

ISA_FLAG = {"avx512": "avx512f", "avx2": "avx2", "neon": "asimd", "sve": "sve"}


def selectors_for(target: str, selectors: Iterable[str] = ()) -> list[str]:
    """The node selectors of a target's hardware class: its ISA, and the user's."""
    isa = getattr(parse(target), "isa", "")  # a cpu target's; others select by the user's selectors
    found = list(selectors)
    if isa in ISA_FLAG:
        found.append(f"isa={ISA_FLAG[isa]}")
    return found


class ClusterMeasurer:
    """The ``Measurer`` interface (``measure(spec, candidate, runs)``) served by cluster nodes."""

    def __init__(self, address: str, target: str, selectors: Iterable[str] = (), timeout_s: float = 120.0) -> None:
        self.ray = fleet.connect(address)
        wanted = selectors_for(target, selectors)
        found = fleet.nodes(address, wanted)
        if not found:
            raise fleet.FleetError(
                f"no live node of the cluster at {address} matches {' and '.join(wanted)} (the target {target!r})"
            )
        classes: dict[str, list[dict[str, Any]]] = {}
        for node in found:
            classes.setdefault(node["fingerprint"], []).append(node)
        self.nodes = max(classes.values(), key=len)  # the largest class (name one with --on)
        self.label = self.nodes[0]["label"]
        self.timeout_s = timeout_s
        from kiln.tune.worker import measure_here

        self.remote = self.ray.remote(max_retries=0)(measure_here)
        self.measured_on: dict[str, int] = {}  # node id -> measurements (for the report)

    def __enter__(self) -> ClusterMeasurer:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _node_for(self, spec: dict[str, Any]) -> dict[str, Any]:
        kernel = json.dumps({k: spec[k] for k in ("op", "attrs", "shapes")}, sort_keys=True, default=str)
        index = int(hashlib.sha256(kernel.encode()).hexdigest(), 16) % len(self.nodes)
        return self.nodes[index]

    def measure(self, spec: dict[str, Any], candidate: dict[str, Any], runs: int) -> tuple[float, np.ndarray, float]:
        from ray.exceptions import GetTimeoutError, RayTaskError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        while self.nodes:
            node = self._node_for(spec)
            task = self.remote.options(
                num_cpus=node["cpus"], scheduling_strategy=NodeAffinitySchedulingStrategy(node["node_id"], soft=False)
            ).remote(spec, candidate, runs)
            try:
                result = self.ray.get(task, timeout=self.timeout_s)
            except GetTimeoutError:
                self.ray.cancel(task, force=True)
                raise TimeoutError(f"no result from {node['hostname']} within {self.timeout_s:.0f} s") from None
            except RayTaskError as err:  # the candidate failed there (a build error...): its reason
                raise RuntimeError(str(err.cause) if err.cause is not None else str(err)) from None
            except Exception:  # the node died: measure on another of the class
                alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
                if node["node_id"] in alive:
                    raise
                self.nodes = [n for n in self.nodes if n["node_id"] != node["node_id"]]
                continue
            self.measured_on[node["node_id"]] = self.measured_on.get(node["node_id"], 0) + 1
            return result
        raise RuntimeError(f"every node of the class {self.label} was lost")
