"""The memory plan kiln prints at compile time is what a run actually takes: a model whose
intermediates dwarf its weights grows the process by the arena when it is compiled (the first
request's memory is made and touched then, not by the first inference), and its first inference
by at most the engine's packing scratch, both as printed."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import kiln
    from kiln.bench.metrics import rss_bytes

    rng = np.random.default_rng(0)
    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["c"]),
        helper.make_node("Conv", ["b", "w3"], ["d"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "d"], ["e"]),
        helper.make_node("GlobalAveragePool", ["e"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 192, 192])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight("w1", 48, 8, 3, 3), weight("w2", 48, 48, 1, 1), weight("w3", 48, 48, 3, 3)],
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    kiln.compile(onnx_model)  # (once: the libraries built, the imports made)
    x = rng.standard_normal((1, 8, 192, 192)).astype(np.float32)
    start = rss_bytes()
    model = kiln.compile(onnx_model)
    memory = model.plans[0].memory
    before = rss_bytes()
    model(x)
    after = rss_bytes()
    print(json.dumps({"arena": memory.arena_bytes, "scratch": memory.scratch_bytes(),
                      "described": memory.describe(), "compile": before - start, "growth": after - before}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="RSS is read from /proc (Linux only)")
def test_first_run_grows_the_process_by_the_printed_plan(tmp_path):
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    arena, scratch, growth = figures["arena"], figures["scratch"], figures["growth"]
    # intermediates of 48 x 192 x 192 floats (7 MB each), several alive at once
    assert arena >= 14e6, figures
    assert f"arena {arena / 1e6:.2f} MB" in figures["described"]
    # the arena is made and touched by the compile (its pages resident before the first run) ...
    assert figures["compile"] >= 0.9 * arena, figures
    # ... and the first run takes nothing beyond the engine's scratch (plus 4 MB for Python)
    assert growth <= scratch + 4e6, figures
