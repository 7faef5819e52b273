"""The autotuner: candidates measured in an isolated worker, the default always kept, failures
skipped, results in SQLite so a second compile (and a second tuning run) does no tuning."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln import tune
from kiln.driver import tuning_db as db
from kiln.frontend.onnx import import_onnx
from kiln.passes import optimize
from kiln.tune.worker import Measurer
from tests.helpers import make_model

RNG = np.random.default_rng(5)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_TUNED", "1")
    monkeypatch.setattr(tune.db, "TUNED_HERE", set())
    return tmp_path


def model():
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y"]),
    ]
    weights = {
        "w": RNG.standard_normal((16, 8, 3, 3)).astype(np.float32),
        "m": RNG.standard_normal((16 * 12 * 12, 10)).astype(np.float32),
    }
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, 8, 12, 12])], [("y", TensorProto.FLOAT, None)], weights)


def test_search_space_keeps_the_default_first_and_offers_winograd_choices():
    conv = tune.candidates("Conv", {"pads": [1, 1, 1, 1]}, [(1, 8, 12, 12), (16, 8, 3, 3)])
    assert conv[0] == {} and {"algorithm": "winograd2"} in conv and {"algorithm": "im2col"} in conv
    strided = tune.candidates("Conv", {"strides": [2, 2]}, [(1, 8, 12, 12), (16, 8, 3, 3)])
    assert all("algorithm" not in c for c in strided)
    assert tune.candidates("MatMul", {}, [(4, 8), (8, 4)])[1:] == tune.BLOCKINGS


def test_tuning_records_every_kernel_and_a_second_run_measures_nothing(cache, monkeypatch):
    graph = optimize(import_onnx(model()))
    tasks = tune.tasks_for(graph)
    assert sorted(t.spec["op"] for t in tasks) == ["Conv", "MatMul"]
    calls = []
    outcomes = tune.tune(
        graph, budget_s=300, progress=lambda done, total, outcome, best: calls.append((done, total)), runs=3
    )
    assert [o.cached for o in outcomes] == [False, False]
    assert calls[-1] == (2, 2)
    for outcome in outcomes:
        assert outcome.measured == len(outcome.task.candidates) and not outcome.failures
        assert outcome.seconds <= outcome.default_seconds  # the default is a candidate
        assert db.best(outcome.task.key) == outcome.choice

    def no_measuring(*args, **kwargs):
        raise AssertionError("a second tuning run must come from the database")

    monkeypatch.setattr(Measurer, "measure", no_measuring)
    again = tune.tune(graph, budget_s=300)
    assert [o.cached for o in again] == [True, True]


def test_tuned_choices_are_applied_and_shown_when_compiling(cache):
    graph = optimize(import_onnx(model()))
    (conv_task,) = [t for t in tune.tasks_for(graph) if t.spec["op"] == "Conv"]
    db.record(conv_task.key, {"algorithm": "im2col", "kc": 128}, 1.0, 2.0, 6, 0, "test")
    proto = model()
    compiled = kiln.compile(proto)
    kernels = [k for step in compiled.plans[0].steps for k in step.kernels]
    conv = next(k for k in kernels if "conv" in k.kind)
    assert conv.kind == "conv+epilogue" and conv.tuning == "cached"  # im2col, not winograd
    assert "g.kc = 128;" in compiled.plans[0].source
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(compiled(x), kiln.compile(proto, target="reference")(x), rtol=1e-4, atol=1e-4)


def test_failing_and_hanging_candidates_are_skipped(cache, monkeypatch):
    graph = optimize(import_onnx(model()))
    (task,) = [t for t in tune.tasks_for(graph) if t.spec["op"] == "MatMul"]
    task.candidates = [{}, {"kc": 64}, {"boom": 1}, {"hang": 1}]
    real = Measurer.measure

    def measure(self, spec, candidate, runs):
        if "boom" in candidate:
            raise RuntimeError("the worker crashed")
        if "hang" in candidate:
            raise TimeoutError("no result within 1 s")
        return real(self, spec, candidate, runs)

    monkeypatch.setattr(Measurer, "measure", measure)
    with Measurer(120) as measurer:
        outcome = tune._search(task, measurer, runs=2, deadline=float("inf"))
    assert len(outcome.failures) == 2 and outcome.choice in ({}, {"kc": 64})


def test_the_worker_survives_a_real_timeout():
    spec = {"op": "MatMul", "attrs": {}, "shapes": [(512, 512), (512, 512)], "constant": [False, True]}
    with Measurer(timeout_s=0.01) as measurer:
        with pytest.raises(TimeoutError):
            measurer.measure(spec, {}, 1)
        measurer.timeout_s = 300
        seconds, output, noise = measurer.measure(
            {"op": "MatMul", "attrs": {}, "shapes": [(4, 8), (8, 4)], "constant": [False, True]}, {}, 1
        )
        assert seconds > 0 and output.shape == (4, 4) and noise >= 0


def test_a_corrupt_database_is_set_aside(cache):
    db.path().write_bytes(b"this is not sqlite" * 100)
    assert db.best("anything") is None
    assert (cache / "tune.corrupt").exists()


class ScriptedMeasurer:
    """Times as scripted per candidate (a list: one per measurement), the same output for all."""

    def __init__(self, times):
        self.times = {key: list(values) for key, values in times.items()}

    def measure(self, spec, candidate, runs):
        seconds, noise = self.times[tuple(sorted(candidate.items()))].pop(0)
        return seconds, np.ones(4, np.float32), noise


def scripted_search(times):
    task = tune.Task("k", "label", {}, [{}, {"kc": 64}, {"kc": 128}])
    return tune._search(task, ScriptedMeasurer(times), runs=3, deadline=float("inf"))


def test_contention_during_the_default_is_not_a_speed_up():
    # the default's first measurement ran while another process took the core (78x slower)
    outcome = scripted_search(
        {(): [(78e-3, 0.02), (1.0e-3, 0.02)], (("kc", 64),): [(0.99e-3, 0.02)], (("kc", 128),): [(1.01e-3, 0.02)]}
    )
    assert outcome.choice == {} and outcome.default_seconds == 1.0e-3 and outcome.speedup == 1.0


def test_an_alternative_within_the_noise_is_not_kept_but_a_real_gain_is():
    noisy = scripted_search(
        {(): [(1.0e-3, 0.05), (1.0e-3, 0.05)], (("kc", 64),): [(0.85e-3, 0.05)], (("kc", 128),): [(2e-3, 0.0)]}
    )
    assert noisy.choice == {}  # 15% faster, but the runs spread 5% each: 2 * (5% + 5%) = 20% needed
    clear = scripted_search(
        {(): [(1.0e-3, 0.01), (1.02e-3, 0.01)], (("kc", 64),): [(0.6e-3, 0.01)], (("kc", 128),): [(2e-3, 0.0)]}
    )
    assert clear.choice == {"kc": 64} and clear.speedup == pytest.approx(1.0 / 0.6)
