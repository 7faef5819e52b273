import json
from pathlib import Path

import numpy as np
import pytest

from kiln.conformance.runner import compare_outputs, load_cases, run_conformance

BASELINE = json.loads((Path(__file__).parent / "baseline.json").read_text())


def sampled(cases: list) -> list:
    """Every third case plus the first of each operator set the sample would miss (every operator
    the suite has, at least once): the Triton interpreter runs a case in ~0.2 s, the whole suite
    would be a sixth of the test run, and the gpu target shares its lowering with the cpu target,
    which runs every case."""
    first: dict[tuple[str, ...], int] = {}
    for number, case in enumerate(cases):
        first.setdefault(tuple(case.ops), number)
    keep = set(range(0, len(cases), 3)) | set(first.values())
    return [case for number, case in enumerate(cases) if number in keep]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "suites", "sample"),
    [
        ("reference", ["node"], False),
        ("reference", ["simple", "pytorch-converted", "pytorch-operator"], False),
        ("cpu", ["node"], False),
        ("gpu:interpret", ["node"], True),  # the gpu target's Triton kernels in Triton's interpreter
    ],
    ids=["reference-node", "reference-other", "cpu-node", "gpu-interpret-node"],
)
def test_suite_pass_count_holds_the_baseline(target, suites, sample):
    if target.startswith("gpu"):
        pytest.importorskip("triton", reason="the gpu target needs Triton (kiln's gpu extra)")
    cases = load_cases(suites)
    expected = BASELINE[target]["+".join(suites)]
    assert len(cases) == expected["total"], "the installed onnx package has a different test suite"
    if sample:
        cases = sampled(cases)
        expected = expected["sampled"]
        assert len(cases) == expected["total"]
    report = run_conformance(cases, target=target, timeout=300)
    assert report.total == len(cases)
    failures = [f"{r.name}: {r.status}: {r.message[:200]}" for r in report.results if r.status != "pass"]
    assert report.passed >= expected["passed"], "\n".join(failures)
    if "native" in expected:
        # compiled with no host fallback: the floor is 70% of the node cases
        assert report.native >= expected["native"] >= 0.70 * report.total


def test_the_sample_covers_every_operator_set_of_the_suite():
    cases = load_cases(["node"])
    kept = sampled(cases)
    assert {tuple(c.ops) for c in kept} == {tuple(c.ops) for c in cases}
    assert len(cases) / 3 <= len(kept) < len(cases) / 2


def test_a_crashing_and_a_hanging_case_do_not_end_the_run():
    cases = load_cases(["node"], name_filter="^test_(abs|acos|add|relu)$")
    assert [c.name for c in cases] == ["test_abs", "test_acos", "test_add", "test_relu"]
    seen = []
    report = run_conformance(
        cases, jobs=2, timeout=5, progress=seen.append, case_runner="tests.conformance.misbehaving:run_case"
    )
    status = {r.name: r.status for r in report.results}
    assert status == {"test_abs": "crash", "test_acos": "timeout", "test_add": "pass", "test_relu": "pass"}
    assert "exit code 3" in next(r.message for r in report.results if r.name == "test_abs")
    assert len(seen) == 4
    assert report.per_op()["Add"] == {"cases": 1, "passed": 1}


def test_compare_outputs_follows_onnx_runner_rules():
    compare_outputs([np.array([1.0, 2.0], np.float32)], [np.array([1.0, 2.0005], np.float32)], rtol=1e-3, atol=1e-7)
    with pytest.raises(AssertionError, match="dtype"):
        compare_outputs([np.array([1.0], np.float32)], [np.array([1.0], np.float64)], 1e-3, 1e-7)
    with pytest.raises(AssertionError, match="shape"):
        compare_outputs([np.zeros((2, 1), np.float32)], [np.zeros(2, np.float32)], 1e-3, 1e-7)
    with pytest.raises(AssertionError):
        compare_outputs([np.array([1.0], np.float32)], [np.array([1.1], np.float32)], 1e-3, 1e-7)
    compare_outputs([[np.ones(2)], None], [[np.ones(2)], None], 1e-3, 1e-7)
    with pytest.raises(AssertionError, match="expected a sequence"):
        compare_outputs([[np.ones(2)]], [np.ones(2)], 1e-3, 1e-7)
