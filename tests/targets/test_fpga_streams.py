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


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


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
    # the second conv's input (the pool's output, C1 x 6 x 6) streams pixel by pixel; its window
    # holds the 3 input rows one output row needs, all channels: a line buffer
    assert second.buffer.size == C1 * half * half and not second.staged and second.order.radices
    assert second.window.size == 3 * half * C1 < second.buffer.size
    pool = next(c for c in channels if kinds[c.consumer] == "pool")
    assert pool.window.size == 2 * SIZE * C1  # 2 rows of the first conv's output for a 2x2 pool
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
