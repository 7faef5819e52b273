"""Small builders shared by tests: hand-made ONNX models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def linear_layer(rng: np.random.Generator, k: int, n: int, tail: str, rows: str = "rows") -> tuple:
    """x [rows, k] . w + b, then ``tail``: "relu" (the engine's finish, in registers) or "square"
    (Relu then x * x: a generated epilogue); w and b drawn from ``rng``. Returns (model, w,
    finish), ``finish(h)`` the layer's output from the product h = x . w."""
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"])]
    nodes.append(helper.make_node("Relu", ["a"], ["y" if tail == "relu" else "r"]))
    if tail == "square":
        nodes.append(helper.make_node("Mul", ["r", "r"], ["y"]))
    model = make_model(nodes, [("x", FLOAT, [rows, k])], [("y", FLOAT, [rows, n])], {"w": w, "b": b})

    def finish(h: np.ndarray) -> np.ndarray:
        y = np.maximum(h + b, 0)
        return y * y if tail == "square" else y

    return model, w, finish


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


def residual_chain(rng):
    """A ResNet-like chain on [2, 40, 12, 13] images (the layout pass runs it channels last in
    int8 and bf16 compiles): 3x3 with bias and Relu, 1x1, 3x3 of stride 2 with asymmetric pads,
    bias and Relu, 1x1 plus a residual Add, Relu; returns (model, input)."""
    weights = {
        "w1": rng.standard_normal((48, 40, 3, 3)).astype(np.float32) * 0.1,
        "b1": rng.standard_normal(48).astype(np.float32),
        "w2": rng.standard_normal((64, 48, 1, 1)).astype(np.float32) * 0.2,
        "w3": rng.standard_normal((32, 64, 3, 3)).astype(np.float32) * 0.1,
        "b3": rng.standard_normal(32).astype(np.float32),
        "w4": rng.standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.2,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a"]),
        helper.make_node("Conv", ["a", "w2"], ["b"]),
        helper.make_node("Conv", ["b", "w3", "b3"], ["c3"], pads=[1, 0, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c3"], ["c"]),
        helper.make_node("Conv", ["c", "w4"], ["c4"]),
        helper.make_node("Add", ["c4", "c"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, [2, 40, 12, 13])], [("y", FLOAT, None)], weights)
    x = rng.standard_normal((2, 40, 12, 13)).astype(np.float32)
    return model, x


def prompt_error_and_step_check(precision: str, plain: str, same_step: bool = True) -> Any:
    """The tiny Llama decode step (dynamo export) compiled at ``precision`` (a weight format with
    its own prompt rows) and at ``plain``: the relative L2 between their logits on a 33-token
    prompt; a one-token step after it must give the same logits bit for bit (asserted here), or
    with ``same_step`` False (a format whose token steps have int8 rows too) the pair (prompt's
    error, the step's)."""
    import kiln
    from kiln.driver.generation import roles
    from kiln.zoo import decoders

    path = str(decoders.export("llama", exporter="dynamo"))
    dims = {"past": "0..40", "new": "1..41", "total": "1..41", "batch": "1..1"}
    wide, narrow = (kiln.compile(path, dims=dims, precision=p) for p in (precision, plain))
    logits = roles(narrow).logits
    prompt = decoders.inputs("llama", past=0, new=33)
    got, want = wide.run(prompt)[logits], narrow.run(prompt)[logits]
    error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    step = decoders.inputs("llama", past=33, new=1)
    got_step, want_step = wide.run(step)[logits], narrow.run(step)[logits]
    if not same_step:
        return error, float(np.linalg.norm(got_step - want_step) / np.linalg.norm(want_step))
    np.testing.assert_array_equal(got_step, want_step)
    return error
