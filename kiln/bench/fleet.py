"""kiln bench on a Ray cluster: the job matrix (model x backend x scenario) run once per hardware
class of the fleet's nodes, each timed job holding its node alone.

* **What a node has.** Each node is described where it runs (``node_fingerprint``: CPU model, ISA
  flags, cores, memory, GPUs by NVML, accelerator cards under /dev); what its operator advertises
  as Ray custom resources named ``kiln:<key>=<value>`` (``kiln fleet advertise`` prints them for
  ``ray start --resources``) overrides the detected value (how a test fakes a GPU node). Nodes
  with the same CPU, ISA, GPUs and cards form one hardware class; the report groups by class.
* **Selectors.** ``--on 'gpu=H100'`` (repeatable; all must hold): ``cpu``, ``gpu``, ``card``,
  ``node`` match a substring (case-insensitive), ``isa`` an ISA flag, ``cpus`` at least that many.
* **Exclusive nodes.** A job asks for every CPU of its node (Ray's resource accounting then runs
  nothing else there) and is pinned to it; the nodes of a class share its jobs.
* **Streaming.** Each record is stored in the local SQLite store the moment it arrives, with the
  node's fingerprint in ``record["node"]``.
* **Lost nodes.** A job whose node dies is run again on another live node of its class; with none
  left it is reported ``failed`` with the reason, and the run (and its report) carries on.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench.machine import fingerprint
from kiln.bench.runner import BenchConfig, plan
from kiln.errors import KilnError

RESOURCE_PREFIX = "kiln:"
SELECTOR_KEYS = ("cpu", "gpu", "card", "isa", "node", "cpus")
MAX_ATTEMPTS = 3  # a job whose node (or Ray worker) dies runs again at most this often in all
Progress = Callable[[str, dict[str, Any] | None], None]


class FleetError(KilnError):
    """The fleet cannot run the job matrix (no cluster, no node matching the selectors)."""


def unavailable() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError as err:
        return f"Ray is not installed ({err}); pip install -e .[fleet] (make setup installs it)"
    return None


# -- what a node has -------------------------------------------------------------------------------------


def detected_hardware() -> dict[str, Any]:
    """This machine: CPU and ISA (kiln bench's fingerprint), GPUs by NVML, accelerator cards."""
    machine = fingerprint()
    gpus: list[str] = []
    try:
        import pynvml

        pynvml.nvmlInit()
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            gpus.append(name.decode() if isinstance(name, bytes) else str(name))
    except Exception:
        gpus = []
    cards = sorted(
        name
        for name in (os.listdir("/dev") if os.path.isdir("/dev") else [])
        if name.startswith(("xclmgmt", "xocl", "fpga", "aclpci"))  # Xilinx / Intel FPGA cards
    )
    return {
        "hostname": socket.gethostname(),
        "cpu": machine["cpu"],
        "flags": machine["flags"],
        "cpus": machine["usable_cpus"],
        "memory_gb": machine["memory_gb"],
        "gpu": _count(gpus),
        "card": _count(cards),
    }


def _count(names: list[str]) -> str:
    if not names:
        return ""
    kinds = sorted(set(names))
    return ", ".join(f"{kind} x{names.count(kind)}" for kind in kinds)


def advertised(resources: dict[str, float]) -> dict[str, str]:
    """``kiln:gpu=H100`` style custom resources as {"gpu": "H100"}."""
    found = {}
    for name in resources:
        if name.startswith(RESOURCE_PREFIX) and "=" in name:
            key, value = name[len(RESOURCE_PREFIX) :].split("=", 1)
            # (resource names carry no spaces: a name's "_" stands for one; ISA flags keep theirs)
            found[key] = value if key == "isa" else value.replace("_", " ")
    return found


def advertise_flags() -> str:
    """The ``ray start`` resources that describe this machine to kiln's fleet."""
    import json

    hardware = detected_hardware()
    resources = {}
    for key in ("cpu", "gpu", "card"):
        if hardware[key]:
            resources[f"{RESOURCE_PREFIX}{key}={hardware[key]}".replace(" ", "_")] = 1
    resources[f"{RESOURCE_PREFIX}isa={'+'.join(hardware['flags'])}"] = 1
    return f"--resources='{json.dumps(resources)}'"


def describe(hardware: dict[str, Any], resources: dict[str, float], node_id: str) -> dict[str, Any]:
    """A node's fingerprint: detected hardware, advertised values over it, its class and label."""
    node = {**hardware, **advertised(resources)}
    if "isa" in node:  # advertised as flags joined by "+" (Ray's resource names take no commas)
        node["flags"] = sorted(f for f in str(node.pop("isa")).replace(",", "+").split("+") if f)
    node["cpus"] = int(resources.get("CPU", node.get("cpus") or 1))
    key = f"{node['cpu']}|{','.join(node['flags'])}|{node.get('gpu', '')}|{node.get('card', '')}"
    node["fingerprint"] = hashlib.sha256(key.encode()).hexdigest()[:12]
    best = next((f for f in ("amx_tile", "avx512f", "avx2", "sve", "asimd") if f in node["flags"]), "generic")
    node["label"] = " · ".join(
        p for p in (_short_cpu(node["cpu"]), best, node.get("gpu") or "", node.get("card") or "") if p
    )
    node["node_id"] = node_id
    return node


def _short_cpu(name: str) -> str:
    for noise in ("(R)", "(TM)", "CPU", "Processor", "  "):
        name = name.replace(noise, " ")
    return " ".join(name.split())[:40]


def matches(node: dict[str, Any], selectors: Iterable[str]) -> bool:
    for selector in selectors:
        key, _, value = selector.partition("=")
        key, value = key.strip().lower(), value.strip()
        if key not in SELECTOR_KEYS or not value:
            raise FleetError(f"bad selector {selector!r}: use KEY=VALUE with KEY one of {', '.join(SELECTOR_KEYS)}")
        if key == "isa":
            if value.lower() not in node["flags"]:
                return False
        elif key == "cpus":
            if int(node.get("cpus") or 0) < int(value):
                return False
        elif key == "node":
            if value.lower() not in f"{node.get('hostname', '')} {node['node_id']}".lower():
                return False
        elif value.lower() not in str(node.get(key) or "").lower():
            return False
    return True


# -- running the matrix ----------------------------------------------------------------------------------


def _remote_fingerprint() -> dict[str, Any]:
    return detected_hardware()


def _remote_job(
    model: dict[str, Any], backend: str, scenario: str, config: dict[str, Any], reference: dict[str, np.ndarray] | None
) -> dict[str, Any]:
    """One job on its node: the model prepared there, the reference outputs written there, the
    worker process run as on one machine."""
    import importlib
    import tempfile

    from kiln.bench.models import BenchModel
    from kiln.bench.runner import run_one

    for plugin in config.get("plugins", []):  # backends a plugin registers, in this process too
        importlib.import_module(plugin)
    bench_model = BenchModel(**model)
    settings = BenchConfig(**config)
    with tempfile.TemporaryDirectory(prefix="kiln-fleet-") as scratch:
        workdir = Path(scratch)
        bench_model.prepare()
        path = None
        if reference is not None:
            path = str(workdir / "reference.npz")
            np.savez(path, **reference)
        return run_one(bench_model, backend, scenario, settings, path, workdir, lambda message, record: None)


def connect(address: str) -> Any:
    import ray

    if not ray.is_initialized():
        settings: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
        host = address.rsplit(":", 1)[0] if ":" in address else address
        if address == "local" or host in ("127.0.0.1", "localhost", "::1", "[::1]"):
            # a cluster on this machine only: this process's node is the loopback address too (Ray would
            # otherwise announce, and a local cluster listen on, the machine's outside address)
            settings["_node_ip_address"] = "127.0.0.1"
        if address == "local":
            settings["include_dashboard"] = False  # no HTTP port opened for a run that needs none
        has_token = address != "local" and _use_token_if_given()
        try:
            ray.init(address=address, **settings)
        except Exception as err:
            text = " ".join(str(err).split())
            if "uthentication token" in text or ("token" in text.lower() and "auth" in text.lower()) or not has_token:
                hint = (
                    "the token this process gave was refused"
                    if has_token
                    else "if it uses Ray's token authentication (`ray start` with RAY_AUTH_MODE=token), this "
                    "process had no token"
                )
                raise FleetError(
                    f"cannot join the Ray cluster at {address} ({type(err).__name__}: {text[:300]}): {hint}; give "
                    "this process the cluster's token as Ray reads it: RAY_AUTH_TOKEN=<token>, or the token's "
                    "file in RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (where `ray get-auth-token --generate` "
                    "writes it)"
                ) from None
            raise FleetError(f"cannot join the Ray cluster at {address}: {type(err).__name__}: {text}") from None
    return ray


def _use_token_if_given() -> bool:
    """Whether this process joins with a Ray authentication token. Ray only sends one when
    RAY_AUTH_MODE=token, and a cluster made by `ray start` with tokens on refuses a process without
    it (with a bare "Failed to connect"): a token the user has (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH,
    ~/.ray/auth_token) turns the mode on unless RAY_AUTH_MODE says otherwise."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    files = [Path(named)] if named else [Path.home() / ".ray" / "auth_token"]
    if not (os.environ.get("RAY_AUTH_TOKEN") or any(f.is_file() for f in files)):
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # Ray caches its settings once imported: read again with token mode on
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):
        pass
    return True


def nodes(address: str, selectors: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The live nodes of the cluster described (each in its own small task), those matching."""
    ray = connect(address)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_remote_fingerprint)
    alive = [n for n in ray.nodes() if n.get("Alive")]
    pending = {
        n["NodeID"]: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in alive
    }
    described = []
    for node in alive:
        try:
            hardware = ray.get(pending[node["NodeID"]], timeout=120)
        except Exception:
            continue
        described.append(describe(hardware, node.get("Resources", {}), node["NodeID"]))
    chosen = [n for n in described if matches(n, selectors)]
    return sorted(chosen, key=lambda n: (n["label"], n["node_id"]))


def run_fleet(
    config: BenchConfig,
    address: str,
    selectors: list[str],
    db: Path | None = None,
    progress: Progress | None = None,
    references: Callable[[Any], dict[str, np.ndarray] | None] | None = None,
) -> dict[str, Any]:
    """Run the matrix once per hardware class; records stream into ``db`` as they arrive."""
    from kiln.bench import store

    config.validate()
    say = progress or (lambda message, record: None)
    ray = connect(address)
    fleet = nodes(address, selectors)
    if not fleet:
        raise FleetError(f"no live node of the cluster at {address} matches {' and '.join(selectors) or 'anything'}")
    classes: dict[str, list[dict[str, Any]]] = {}
    for node in fleet:
        classes.setdefault(node["fingerprint"], []).append(node)
    run: dict[str, Any] = {
        "run_id": datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**fingerprint(), "fleet": address, "nodes": fleet},
        "config": {**asdict(config), "cluster": address, "on": selectors},
        "records": [],
        "interrupted": False,
        "streamed": db is not None,
    }
    if db is not None:
        store.start_run(db, run)
    say(f"{len(fleet)} node(s) in {len(classes)} hardware class(es): " + "; ".join(n["label"] for n in fleet), None)
    jobs = plan(config)
    for model in {(m.label, m.batch): m for m, _, _ in jobs}.values():
        model.prepare(progress=lambda message: say(message, None))
    reference_of: dict[tuple[str, int], dict[str, np.ndarray] | None] = {}
    if config.agreement and references is not None:
        for model in {(m.label, m.batch): m for m, _, _ in jobs}.values():
            reference_of[(model.label, model.batch)] = references(model)
    dispatch = _Dispatch(ray, config, classes, jobs, reference_of, run, db, say)
    try:
        dispatch.submit()
        while dispatch.running:
            done, _ = ray.wait(list(dispatch.running), num_returns=1, timeout=5.0)
            if not done:
                _notice_lost(ray, fleet, dispatch.lost)
                continue
            task = done[0]
            node, job = dispatch.running.pop(task)
            dispatch.busy.discard(node["node_id"])
            try:
                dispatch.finish(ray.get(task), node, job[3])
            except Exception as err:
                _notice_lost(ray, fleet, dispatch.lost)  # (a live node whose Ray worker died stays in use)
                dispatch.lost_job(node, job, err)
            dispatch.submit()
    except KeyboardInterrupt:
        run["interrupted"] = True
        for task in dispatch.running:
            ray.cancel(task, force=True)
    return run


class _Dispatch:
    """Which job runs where: per hardware class the jobs still to run, per node the job running
    there; a job whose node was lost runs again on another node of its class (last on the node
    it failed on), or is recorded failed when none is left."""

    def __init__(self, ray, config, classes, jobs, reference_of, run, db, say) -> None:  # type: ignore[no-untyped-def]
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.affinity = NodeAffinitySchedulingStrategy
        self.config, self.classes, self.reference_of, self.run, self.db, self.say = (
            config, classes, reference_of, run, db, say,
        )  # fmt: skip
        self.queue: dict[str, list[tuple[Any, str, str, int]]] = {
            key: [(m, b, s, 1) for m, b, s in jobs] for key in classes
        }
        self.remote = ray.remote(max_retries=0)(_remote_job)
        self.running: dict[Any, tuple[dict[str, Any], tuple[Any, str, str, int]]] = {}
        self.busy: set[str] = set()
        self.lost: set[str] = set()
        self.failed_on: dict[tuple[str, str, str, int], set[str]] = {}

    def pick(self, key: str, node: dict[str, Any]) -> tuple[Any, str, str, int] | None:
        live = {n["node_id"] for n in self.classes[key] if n["node_id"] not in self.lost}
        for index, job in enumerate(self.queue[key]):
            avoid = self.failed_on.get(_job_key(job), set())
            if node["node_id"] not in avoid or live <= avoid:
                return self.queue[key].pop(index)
        return None

    def submit(self) -> None:
        for key, members in self.classes.items():
            for node in members:
                if node["node_id"] in self.busy or node["node_id"] in self.lost or not self.queue[key]:
                    continue
                job = self.pick(key, node)
                if job is None:
                    continue
                model, backend, scenario, _ = job
                task = self.remote.options(
                    num_cpus=node["cpus"], scheduling_strategy=self.affinity(node["node_id"], soft=False)
                ).remote(
                    asdict(model),
                    backend,
                    scenario,
                    asdict(self.config),
                    self.reference_of.get((model.label, model.batch)),
                )
                self.running[task] = (node, job)
                self.busy.add(node["node_id"])
                self.say(
                    f"running {backend} / {model.label} / {scenario} on {node['label']} ({node['hostname']})", None
                )

    def finish(self, record: dict[str, Any], node: dict[str, Any], attempt: int) -> None:
        from kiln.bench import store

        record["node"] = {k: v for k, v in node.items() if k != "node_id"} | {"node_id": node["node_id"]}
        record["attempts"] = attempt
        self.run["records"].append(record)
        if self.db is not None:
            store.add_records(self.db, self.run["run_id"], [record])
        self.say(
            f"{record['backend']} / {record['model']} / {record['scenario']} on {node['label']}: {record['status']}",
            record,
        )

    def lost_job(self, node: dict[str, Any], job: tuple[Any, str, str, int], err: BaseException) -> None:
        model, backend, scenario, attempt = job
        key = node["fingerprint"]
        others = [n for n in self.classes[key] if n["node_id"] not in self.lost]
        reason = f"node {node['hostname']} ({node['node_id'][:8]}) lost mid-job: {type(err).__name__}"
        if others and attempt < MAX_ATTEMPTS:
            self.say(f"{reason}; running the job again on another {node['label']} node", None)
            self.failed_on.setdefault(_job_key(job), set()).add(node["node_id"])
            self.queue[key].insert(0, (model, backend, scenario, attempt + 1))
            return
        base = {"backend": backend, "model": model.label, "batch": model.batch, "scenario": scenario}
        why = "no other node of its class" if not others else f"{attempt} attempts"
        failed = {**base, "threads": self.config.threads, "status": "failed", "error": f"{reason}; {why}"}
        self.finish(failed, node, attempt)
        if not others:
            self.queue[key] = _drop_class(self.queue[key], self.config, node, reason, self.finish)


def _job_key(job: tuple[Any, str, str, int]) -> tuple[str, str, str, int]:
    model, backend, scenario, _ = job
    return (model.label, backend, scenario, model.batch)


def _drop_class(
    pending: list[tuple[Any, str, str, int]], config: BenchConfig, node: dict[str, Any], reason: str, finish: Any
) -> list:
    """A class with no live node left: its remaining jobs are failed rows with the reason."""
    for model, backend, scenario, attempt in pending:
        record = {
            "backend": backend, "model": model.label, "batch": model.batch, "scenario": scenario,
            "threads": config.threads, "status": "failed", "error": f"{reason}; no other node of its class",
        }  # fmt: skip
        finish(record, node, attempt)
    return []


def _notice_lost(ray: Any, fleet: list[dict[str, Any]], lost: set[str]) -> None:
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    lost.update(node["node_id"] for node in fleet if node["node_id"] not in alive)


def wait_for_nodes(ray: Any, count: int, timeout: float = 60.0) -> None:
    """Until ``count`` nodes are alive (a cluster just started)."""
    deadline = time.monotonic() + timeout
    while sum(1 for n in ray.nodes() if n.get("Alive")) < count:
        if time.monotonic() > deadline:
            raise FleetError(f"fewer than {count} live nodes after {timeout:.0f} s")
        time.sleep(0.5)
