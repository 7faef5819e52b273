"""Accuracy on real data in CI: scikit-learn's 8x8 digits, the zoo's two models trained on them in
seconds, and every backend's top-1 on the 450 held-out images against bounds (torch's own top-1,
less what each precision may cost)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.bench.backends.base import module_exists

pytestmark = pytest.mark.skipif(
    not module_exists("sklearn") or not module_exists("torch"),
    reason="the digits models need scikit-learn and torch (the zoo extra)",
)
MODELS = ("digits-mlp", "digits-cnn")
FLOOR = {"digits-mlp": 0.95, "digits-cnn": 0.96}  # the trained models' own top-1 is above these
COST = {
    "fp32": 0.0045,
    "bf16": 0.01,
    "int8": 0.015,
    "fpga": 0.01,
}  # top-1 a precision may lose (450 images: 0.0045 is 2)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


def top1(run, name: str) -> float:  # type: ignore[no-untyped-def]
    from kiln.zoo import digits

    images, labels = digits.test_split(name)
    logits = np.asarray(run(images))
    return float((logits.argmax(axis=1) == labels).mean())


@pytest.fixture(scope="module")
def references():  # type: ignore[no-untyped-def]
    import torch

    from kiln.zoo import digits

    found = {}
    for name in MODELS:
        model = digits.trained(name)
        with torch.no_grad():
            found[name] = top1(lambda x: model(torch.from_numpy(x)).numpy(), name)
    return found


def test_the_models_train_deterministically_to_a_real_accuracy(references):
    from kiln.zoo import digits

    a, b = digits.trained("digits-mlp"), digits.trained("digits-mlp")
    assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    for name in MODELS:
        assert references[name] >= FLOOR[name], (name, references[name])


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("precision", ["fp32", "int8", "bf16"])
def test_kiln_on_real_digits(references, name, precision):
    import kiln
    from kiln import zoo
    from kiln.backends import registry

    target = registry.parse("cpu")
    reason = registry.backend("cpu").precisions(target).get(precision, "")
    if reason:
        pytest.skip(f"{precision} on this CPU: {reason}")
    calibration = [zoo.example_inputs(name, seed=s) for s in range(1, 11)] if precision == "int8" else None
    compiled = kiln.compile(str(zoo.onnx_path(name)), precision=precision, calibration=calibration)
    got = top1(lambda x: next(iter(compiled.run({"x": x}).values())), name)
    assert got >= references[name] - COST[precision], (name, precision, got, references[name])


@pytest.mark.skipif(not module_exists("onnxruntime"), reason="onnxruntime is not installed (the peers extra)")
@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_on_real_digits(references, name):
    import onnxruntime

    from kiln import zoo

    session = onnxruntime.InferenceSession(str(zoo.onnx_path(name)), providers=["CPUExecutionProvider"])
    got = top1(lambda x: session.run(None, {"x": x})[0], name)
    assert got >= references[name] - COST["fp32"]


def test_the_fpga_target_on_real_digits(references):
    from kiln.backends.fpga import ap_types

    if not ap_types():
        pytest.skip("the fpga target's C simulation needs the ap_types headers (pip install hls4ml)")
    import kiln
    from kiln import zoo

    name = "digits-mlp"
    calibration = [zoo.example_inputs(name, seed=s) for s in range(1, 21)]
    compiled = kiln.compile(str(zoo.onnx_path(name)), target="fpga:vitis", calibration=calibration)
    got = top1(lambda x: np.concatenate([next(iter(compiled.run({"x": r[None]}).values())) for r in x]), name)
    assert got >= references[name] - COST["fpga"]
