"""Long-running service guarantees: many threads on one compiled model get correct, independent
results; RSS stays flat over 100k inferences and over 1k compiled-then-dropped models."""

import gc
import json
import subprocess
import sys
import threading
from concurrent.futures import wait
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

import kiln
from kiln.bench.metrics import growth_per_thousand, rss_bytes
from tests.helpers import make_model

RNG = np.random.default_rng(9)
WEIGHTS = {"w": RNG.standard_normal((16, 8)).astype(np.float32), "b": RNG.standard_normal(8).astype(np.float32)}


def small_model():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, [4, 16])], [("y", TensorProto.FLOAT, None)], WEIGHTS)


def expected(x):
    return np.maximum(x @ WEIGHTS["w"] + WEIGHTS["b"], 0)


def test_eight_threads_calling_run_and_submit_get_their_own_results():
    model = kiln.compile(small_model())
    inputs = [RNG.standard_normal((4, 16)).astype(np.float32) for _ in range(32)]
    wants = [expected(x) for x in inputs]
    errors: list[str] = []

    def worker(seed: int) -> None:
        for call in range(1000):
            index = (seed * 7 + call) % len(inputs)
            if call % 2:
                got = model.run({"x": inputs[index]})["y"]
            else:
                got = model.submit({"x": inputs[index]}).result()["y"]
            if not np.allclose(got, wants[index], rtol=1e-5, atol=1e-5):
                errors.append(f"thread {seed} call {call}")
                return

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:5]


def test_many_requests_in_flight_at_once():
    model = kiln.compile(small_model())
    inputs = [RNG.standard_normal((4, 16)).astype(np.float32) for _ in range(200)]
    futures = [model.submit({"x": x}) for x in inputs]
    wait(futures)
    for x, future in zip(inputs, futures):
        np.testing.assert_allclose(future.result()["y"], expected(x), rtol=1e-5, atol=1e-5)


def inference_growth() -> tuple[float, list]:
    """(MB of RSS per 1000 inferences, samples) over 100k runs of one model."""
    model = kiln.compile(small_model())
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    for _ in range(2000):  # warm: arenas, caches, allocator pools
        model.run({"x": x})
    samples = []
    for count in range(100_001):
        model.run({"x": x})
        if count % 5000 == 0:
            samples.append((count, rss_bytes()))
    return growth_per_thousand(samples), samples


def compile_growth() -> tuple[float, list]:
    """(MB of RSS per 1000 models, samples) over 1000 models compiled, run once and dropped."""
    proto = small_model()
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    samples = []
    for count in range(1001):
        model = kiln.compile(proto)
        model.run({"x": x})
        del model
        if count % 50 == 0:
            gc.collect()
            samples.append((count, rss_bytes()))
    return growth_per_thousand(samples[4:]), samples  # after the first models filled the caches


def in_a_fresh_process(measure: str) -> tuple[float, list]:
    """``measure()`` run in a new interpreter: a test worker's RSS carries every earlier test's
    memory and background threads (a 1.1 GB xdist worker once grew under these measurements)."""
    code = f"import json; from tests.runtime.test_stress import {measure}; print(json.dumps({measure}()))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    slope, samples = json.loads(result.stdout.strip().splitlines()[-1])
    return slope, samples


def test_rss_is_flat_over_100k_inferences():
    slope, samples = in_a_fresh_process("inference_growth")
    # a leak of even 100 bytes per call would be 0.1 MB per 1k
    assert slope < 0.02, (slope, samples)


def test_rss_is_flat_over_1k_compiled_and_dropped_models():
    slope, samples = in_a_fresh_process("compile_growth")
    assert slope < 5.0, (slope, samples)  # MB per 1000 models: a leaked plan would be far more
