"""Small builders shared by tests: hand-made ONNX models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list | None]],
    outputs: list[tuple[str, int, list | None]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    """A model with IR version 10 (so onnxruntime 1.31 accepts it too)."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64


def write_signed_artifact(members: dict[str, bytes], path) -> None:
    """A .kiln artifact of ``members`` with its manifest signed again, as an attacker who knows
    the format would write one (the manifest detects damage, not malice)."""
    import hashlib
    import json
    import zipfile

    manifest = {"sha256": {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("manifest.json", json.dumps(manifest), compress_type=zipfile.ZIP_DEFLATED)
        for name, data in members.items():
            kind = zipfile.ZIP_DEFLATED if name.endswith((".json", ".txt")) else zipfile.ZIP_STORED
            archive.writestr(name, data, compress_type=kind)


def run_without_a_compiler(script: str, tmp_path: Path) -> str:
    """Run ``script`` in a fresh Python with no compiler on its PATH (and CC pointing nowhere) and an
    empty kiln cache; asserts it succeeds and returns its standard output."""
    env = {**os.environ, "PATH": "", "KILN_CACHE_DIR": str(tmp_path / "cache"), "CC": "/nonexistent/cc"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_fpga_testbench(project: Path, binary: Path) -> subprocess.CompletedProcess:
    """An fpga project's own C simulation, built without kiln (g++ with the ap_types headers) and
    run in the project's folder."""
    from kiln.backends.fpga import ap_types

    build = ["g++", "-std=c++14", "-O1", "-w", f"-I{ap_types()}", "tb/kiln_tb.cpp", "firmware/kiln_model.cpp"]
    subprocess.run([*build, "-o", str(binary)], cwd=project, check=True, capture_output=True)
    return subprocess.run([str(binary)], cwd=project, capture_output=True, text=True)
