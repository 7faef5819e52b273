"""A fleet run on this one machine: a local Ray cluster of four nodes advertising fake hardware
(two "H100" GPU nodes, a "Xeon 8480" node, the head), ``kiln bench --cluster`` over it, and one
H100 node killed mid-run: its job moves to the other H100 node, and the report groups by node.

    python benchmarks/fleet_demo.py [--models mobilenet_v2] [--backends kiln,onnxruntime]
                                    [--kill-after 20] [--out reports/fleet]

What it shows is the fleet machinery (classes, selectors, exclusive jobs, a lost node, streaming,
the report), not four machines' speed: every node is this machine's CPUs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading


def _kill(cluster, node) -> None:  # type: ignore[no-untyped-def]
    print(f"--- killing an H100 node ({node.unique_id[:8]}) mid-job ---", flush=True)
    cluster.remove_node(node, allow_graceful=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mobilenet_v2")
    parser.add_argument("--backends", default="kiln,onnxruntime")
    parser.add_argument("--duration", default="2")
    parser.add_argument(
        "--kill-after", type=float, default=1.5, help="seconds after the H100 jobs start that one H100 node is killed"
    )
    parser.add_argument("--out", default="reports/fleet")
    options = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    # the node processes write their logs to a file, not over this script's output
    log = (
        open(os.path.join(os.path.abspath(options.out), "ray-nodes.log"), "w")
        if os.makedirs(options.out, exist_ok=True) is None
        else None
    )
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        h100 = {"kiln:gpu=H100": 1, "kiln:cpu=AMD_EPYC_9654": 1}
        victim = cluster.add_node(num_cpus=1, resources=h100)
        cluster.add_node(num_cpus=1, resources=h100)
        cluster.add_node(num_cpus=1, resources={"kiln:cpu=Intel_Xeon_8480": 1, "kiln:isa=avx2+avx512f+amx_tile": 1})
        cluster.wait_for_nodes()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    print(f"local Ray cluster at {cluster.address}: head + 2 'H100' nodes + 1 'Xeon 8480' node", flush=True)

    command = [
        sys.executable, "-m", "kiln", "bench", "--cluster", cluster.address, "-m", options.models,
        "-b", options.backends, "-d", options.duration, "--out", options.out,
    ]  # fmt: skip
    killed = False
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
            if not killed and "running" in line and "H100" in line:
                # both H100 nodes get a job at once: the victim is busy; kill it a little later
                threading.Timer(options.kill_after, _kill, (cluster, victim)).start()
                killed = True
        code = process.wait()
    finally:
        ray.shutdown()
        cluster.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    main()
