"""The fpga target's dataflow: kernels connected by hls::stream FIFOs, a convolution reading its
input through a line buffer (a window of the rows it needs, not the feature map), bit for bit the
fixed-point reference; and a CNN's project keeps the HLS rules."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import kiln
from kiln.backends.fpga import ap_types
from kiln.backends.fpga.hls_rules import check
from kiln.driver.fixed_point import design_of, reference_run

pytestmark = pytest.mark.skipif(
    not ap_types() or shutil.which("g++") is None,
    reason="the fpga target's C simulation needs g++ and the ap_types headers (pip install hls4ml)",
)
SIZE, C1, C2 = 12, 4, 6  # a 12x12 image: conv 3x3 (4) -> ReLU -> max-pool 2 -> conv 3x3 (6) -> ReLU


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def own_cache(module_cache, monkeypatch):
    """The module's own cache: a design built once is reused by the tests that build the same
    source (a C simulation is seconds of g++); plans are not cached, so each test renders its own."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(module_cache))
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")


def small_cnn(tmp_path, stride: int = 1):
    torch.manual_seed(1)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(2, C1, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(C1, C2, 3, padding=1, stride=stride),
        torch.nn.ReLU(),
    ).eval()
    path = tmp_path / "cnn.onnx"
    torch.onnx.export(
        net, (torch.randn(1, 2, SIZE, SIZE),), str(path), dynamo=False, opset_version=13, input_names=["x"]
    )
    rng = np.random.default_rng(0)
    return path, [{"x": rng.standard_normal((1, 2, SIZE, SIZE)).astype(np.float32)} for _ in range(6)]


@pytest.mark.parametrize("stride", [1, 2])
def test_a_cnn_streams_between_kernels_through_line_buffers_bit_for_bit(tmp_path, stride):
    path, samples = small_cnn(tmp_path, stride)
    compiled = kiln.compile(str(path), target="fpga:vitis", calibration=samples)
    ((plan, design, _),) = design_of(compiled)
    kinds = {kd.kernel.name: kd.kernel.kind for kd in design.kernels}
    channels = list(design.streams.values())
    assert len(channels) == len(design.kernels) - 1  # a chain: every tensor between kernels is a FIFO
    second = next(c for c in channels if kinds[c.consumer].startswith("conv"))
    half = SIZE // 2
    # the second conv's input (the pool's output, C1 x 6 x 6) streams pixel by pixel, a pixel's
    # channels a beat; its window holds the 3 input rows one output row needs and the rows (the
    # stride's) read ahead while it computes, all channels: a line buffer
    assert second.buffer.size == C1 * half * half and not second.staged and second.order.radices
    assert second.lanes == C1 and second.window.size == (3 + stride) * half * C1 < second.buffer.size
    if stride == 1:  # an input row per output row: the read-ahead keeps up, no fill between rows
        assert second.window.step == 0
    pool = next(c for c in channels if kinds[c.consumer] == "pool")
    assert pool.window.size == (2 + 2) * SIZE * C1  # a 2x2 pool's 2 rows, and the next 2 read ahead
    source = plan.source
    assert source.count("hls::stream<") >= 2 * len(channels) and "#pragma HLS STREAM variable=" in source
    assert check(source) == []
    for feeds in samples[:2]:
        got = compiled.run(feeds)
        want = reference_run(compiled, feeds)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_the_estimates_count_windows_not_feature_maps(tmp_path):
    from dataclasses import replace

    from kiln.backends.fpga.estimate import estimate

    path, samples = small_cnn(tmp_path)
    compiled = kiln.compile(str(path), target="fpga:vitis", calibration=samples)
    ((plan, design, facts),) = design_of(compiled)
    streamed = estimate(design, facts, plan.target)
    arrays = estimate(replace(design, streams={}), facts, plan.target)  # every tensor a whole array

    def memory(found):  # type: ignore[no-untyped-def]
        return found.total.ff + 18432 * found.total.bram_18k

    assert memory(streamed) < memory(arrays)


def test_m_axi_puts_weights_that_do_not_fit_in_ddr_and_its_project_passes(tmp_path):
    """interface=m_axi: tensors behind AXI masters with s_axilite control; weights=ddr reads the
    large weights through a port per kernel (bursts); the C simulation is still bit for bit, and
    the project's own testbench (g++, no kiln) passes."""
    import subprocess

    from kiln.driver.fixed_point import write_fpga_project

    torch.manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(net, (torch.randn(1, 64),), str(path), dynamo=False, opset_version=13, input_names=["x"])
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(6)]
    on_chip = kiln.compile(str(path), target="fpga:vitis,interface=m_axi", calibration=samples)
    assert "ddr_" not in on_chip.plans[0].source  # auto: they fit on the part, so ROMs
    compiled = kiln.compile(str(path), target="fpga:vitis,interface=m_axi,weights=ddr", calibration=samples)
    source = compiled.plans[0].source
    assert "#pragma HLS INTERFACE m_axi port=ddr_" in source and "#pragma HLS INTERFACE s_axilite port=return" in source
    assert "#pragma HLS INTERFACE axis" not in source and check(source) == []
    # the 64x32 weight (2,048 >= 1,024 elements) is read from DDR; the 32x4 one stays a ROM
    assert source.count("m_axi port=ddr_") == 1
    for feeds in samples[:2]:
        got, want = compiled.run(feeds), reference_run(compiled, feeds)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    folder = tmp_path / "prj"
    write_fpga_project(compiled, folder, samples[0])
    binary = tmp_path / "tb"
    build = [
        "g++", "-std=c++14", "-O1", "-w", f"-I{ap_types()}", "tb/kiln_tb.cpp", "firmware/kiln_model.cpp",
        "-o", str(binary),
    ]  # fmt: skip
    subprocess.run(build, cwd=folder, check=True, capture_output=True)
    result = subprocess.run([str(binary)], cwd=folder, capture_output=True, text=True)
    assert result.returncode == 0 and "PASSED" in result.stdout, result.stdout
