"""The fpga target (``fpga:vitis``): HLS C++ in calibrated fixed point, run as a C simulation
(g++ against hls4ml's ap_types headers).

- the shared compiled-vs-reference cases pass within a tolerance derived from the output's
  format (256 steps of its last bit: 8 of 16 bits for the error budget);
- on every kernel kind (pointwise, matrix product, convolution, pooling, normalization, gather,
  reduction) the C simulation equals kiln's Python-integer fixed-point reference bit for bit;
- the MLP's project passes the static HLS-rule check, and its own testbench (g++, no kiln) passes;
- a model that does not fit its part is an error naming the layer and the resource.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import kiln
from kiln.backends.fpga import ap_types
from kiln.backends.fpga.hls_rules import check
from kiln.driver.fixed_point import design_of, output_tolerance, reference_run, write_fpga_project
from kiln.lower.target import TargetError
from tests.helpers import make_model, run_fpga_testbench
from tests.targets.test_targets import CASES

pytestmark = pytest.mark.skipif(
    not ap_types() or shutil.which("g++") is None,
    reason="the fpga target's C simulation needs g++ and the ap_types headers (pip install hls4ml)",
)
FLOAT = TensorProto.FLOAT
# kernel kinds, on cases small enough for the Python-integer reference
EXACT_CASES = ["depthwise conv", "pooling", "layernorm", "gather + reduce"]


def tolerance(model) -> float:
    """256 steps of the output's last bit (the worst output of the plan)."""
    return output_tolerance(model)


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def own_cache(module_cache, monkeypatch):
    """The module's own cache: a design built once is reused by the tests that build the same
    source (a C simulation is seconds of g++); plans are not cached, so each test renders its own."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(module_cache))
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")


@pytest.mark.parametrize("name,model,feeds", CASES, ids=[c[0] for c in CASES])
def test_the_shared_cases_run_on_the_fpga_target(name, model, feeds):
    compiled = kiln.compile(model, target="fpga:vitis", calibration=[feeds])
    assert compiled.is_native and compiled.target == "fpga:vitis"
    expected = kiln.compile(model, target="reference").run(feeds)
    got = compiled.run(feeds)
    atol = tolerance(compiled)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=atol, err_msg=f"{name} on fpga")


def mlp(tmp_path, softmax: bool = True):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU()]
    layers += [torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)]
    net = torch.nn.Sequential(*layers, *([torch.nn.Softmax(-1)] if softmax else [])).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(net, (torch.randn(1, 16),), str(path), dynamo=False, opset_version=13, input_names=["x"])
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(10)]
    return path, net, samples


@pytest.mark.parametrize("name", EXACT_CASES)
def test_the_c_simulation_equals_the_fixed_point_reference_bit_for_bit(name):
    _, model, feeds = next(c for c in CASES if c[0] == name)
    compiled = kiln.compile(model, target="fpga:vitis", calibration=[feeds])
    got = compiled.run(feeds)
    want = reference_run(compiled, feeds)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=name)


def test_an_mlp_with_softmax_is_bit_exact_and_close_to_fp32(tmp_path):
    path, net, samples = mlp(tmp_path)
    compiled = kiln.compile(str(path), target="fpga:vitis", calibration=samples)
    kinds = {kd.kernel.kind for _, d, _ in design_of(compiled) for kd in d.kernels}
    assert {"normalize"} <= kinds and any("matmul" in k for k in kinds)
    for feeds in samples[:3]:
        got = compiled.run(feeds)
        (key,) = got
        np.testing.assert_array_equal(got[key], reference_run(compiled, feeds)[key])
        fp32 = net(torch.from_numpy(feeds["x"])).detach().numpy()
        np.testing.assert_allclose(got[key], fp32, atol=0.01)
    assert compiled.accuracy is not None and compiled.accuracy.rel_l2 < 0.02


def test_the_mlp_project_keeps_the_hls_rules_and_its_testbench_passes(tmp_path):
    path, _, samples = mlp(tmp_path)
    compiled = kiln.compile(str(path), target="fpga:vitis", calibration=samples)
    folder = tmp_path / "prj"
    written = write_fpga_project(compiled, folder, samples[0])
    names = {p.relative_to(folder).as_posix() for p in written}
    assert {"firmware/kiln_model.cpp", "tb/kiln_tb.cpp", "build_prj.tcl", "estimates.json"} <= names
    source = (folder / "firmware/kiln_model.cpp").read_text()
    assert check(source) == []
    assert "#pragma HLS DATAFLOW" in source and "#pragma HLS PIPELINE II=1" in source
    assert "#pragma HLS INTERFACE axis" in source
    # the rules check catches what it is for
    assert check(source + "\nvoid bad(int n) { int *p = new int[n]; for (int i = 0; i < n; ++i) p[i] = 0; bad(n); }\n")
    tcl = (folder / "build_prj.tcl").read_text()
    assert "set_part {xcu250-figd2104-2L-e}" in tcl and "csynth_design" in tcl
    # the testbench is the project's own C simulation: built without kiln, bit for bit
    result = run_fpga_testbench(folder, tmp_path / "tb")
    assert result.returncode == 0 and "PASSED" in result.stdout, result.stdout


def test_a_design_that_does_not_fit_names_the_layer_and_the_resource(tmp_path):
    path, _, samples = mlp(tmp_path, softmax=False)
    with pytest.raises(kiln.KilnError, match=r"needs [\d,]+ DSP of 220 \(estimate\).*largest user is .*Gemm") as err:
        kiln.compile(str(path), target="fpga:vitis,part=xc7z020", calibration=samples[:2])
    # what it would need of every resource, so a user can pick the part or the reuse factor
    assert all(f"{r} " in str(err.value) for r in ("DSP", "BRAM_18K", "LUT", "FF")) and "would need" in str(err.value)
    # a larger reuse factor shares the multipliers: it fits
    compiled = kiln.compile(str(path), target="fpga:vitis,part=xc7z020,reuse=64", calibration=samples[:2])
    assert compiled.is_native


def test_the_reuse_factor_trades_multipliers_for_cycles_as_hls4ml_counts_them(tmp_path):
    from kiln.backends.fpga.estimate import estimate

    path, _, samples = mlp(tmp_path, softmax=False)
    found = {}
    for reuse in (1, 16):
        compiled = kiln.compile(str(path), target=f"fpga:vitis,reuse={reuse}", calibration=samples[:2])
        ((plan, design, facts),) = design_of(compiled)
        found[reuse] = estimate(design, facts, plan.target)
    first = found[1].kernels[0][1]  # the 16 x 64 dense layer: hls4ml's DSPs are n_in * n_out / reuse
    assert first.dsp == 16 * 64
    assert found[16].kernels[0][1].dsp <= 2 * 16 * 64 // 16 and found[16].latency > found[1].latency


def test_bad_fpga_targets_are_clear_errors():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)])
    for spec, message in [
        ("fpga:quartus", "tools: vitis"),
        ("fpga:vitis,part=xc9999", "unknown FPGA part"),
        ("fpga:vitis,bits=99", "bits 4..32"),
        ("fpga:vitis,speed=2", "key=value"),
    ]:
        with pytest.raises(TargetError, match=message):
            kiln.compile(model, target=spec)


def test_missing_ap_types_headers_are_named(monkeypatch, tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)])
    monkeypatch.setenv("KILN_AP_TYPES", str(tmp_path / "nowhere"))
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    ap_types.cache_clear()
    try:
        with pytest.raises(kiln.KilnError, match="ap_types headers are missing"):
            kiln.compile(model, target="fpga:vitis", calibration=[{"x": np.ones(4, np.float32)}])
    finally:
        monkeypatch.delenv("KILN_AP_TYPES")
        ap_types.cache_clear()


def test_max_accuracy_drop_finds_a_per_layer_bit_budget(tmp_path, monkeypatch):
    """With max_accuracy_drop the widths grow until the drop fits, then each layer's output is
    narrowed 2 bits at a time while it still fits: a per-layer budget, measured, never above it."""
    from kiln.driver import fixed_point

    monkeypatch.setattr(fixed_point, "MAX_TRIALS", 4)  # the search's compiles, kept few here
    path, _, samples = mlp(tmp_path, softmax=False)
    budget = 0.05
    compiled = kiln.compile(str(path), target="fpga:vitis", calibration=samples, max_accuracy_drop=budget)
    widths = dict(compiled.plans[0].target.widths)
    assert widths and all(w < 16 for w in widths.values())  # some layer narrower than the model's 16 bits
    assert "narrower" in compiled.accuracy.precision and compiled.accuracy.drop() <= budget
    ((_, design, facts),) = design_of(compiled)
    narrowed = {facts.names.get(b, b.name): f.width for b, f in design.formats.items()}
    assert all(narrowed[name] == w for name, w in widths.items())
