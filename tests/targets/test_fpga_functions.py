"""The fpga target's functions in fixed point: interpolated ROMs, constant powers, and the -inf of
a mask (no infinity in fixed point: a stand-in far below), each bit for bit the reference and
within the output format's tolerance of fp32."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.backends.fpga import ap_types
from kiln.backends.fpga.fixed import Format, Interval
from kiln.backends.fpga.tables import Table, build
from kiln.driver.fixed_point import output_tolerance, reference_run
from tests.helpers import make_model

pytestmark = pytest.mark.skipif(
    not ap_types() or shutil.which("g++") is None,
    reason="the fpga target's C simulation needs g++ and the ap_types headers (pip install hls4ml)",
)
FLOAT = TensorProto.FLOAT


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def own_cache(module_cache, monkeypatch):
    """The module's own cache: a design built once is reused by the tests that build the same
    source (a C simulation is seconds of g++); plans are not cached, so each test renders its own."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(module_cache))
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")


def check(model, feeds_list):  # type: ignore[no-untyped-def]
    compiled = kiln.compile(model, target="fpga:vitis", calibration=feeds_list)
    expected = kiln.compile(model, target="reference")
    atol = output_tolerance(compiled)
    for feeds in feeds_list[:2]:
        got, want, fp32 = compiled.run(feeds), reference_run(compiled, feeds), expected.run(feeds)
        for key in fp32:
            np.testing.assert_array_equal(got[key], want[key])  # the C simulation is the reference
            np.testing.assert_allclose(got[key], fp32[key], rtol=1e-3, atol=atol)
    return compiled


def test_interpolated_tables_follow_steep_functions():
    """log near its small inputs: between two edges the ROM interpolates (its error the curvature
    times a bin squared, not the slope times a bin)."""
    source = Format(16, 6, True)
    table = build("log", source, Interval(0.05, 8.0))
    worst = 0.0
    for m in range(table.start + 1, table.start + (table.size << table.shift), max(1, table.shift)):
        x = m * source.step
        if 0.05 <= x <= 8.0:
            worst = max(worst, abs(table.lookup(m) * table.out.step - np.log(x)))
    assert isinstance(table, Table) and len(table.values) == table.size + 1
    assert worst < 5e-3  # a bin centre's sample alone: ~8e-2 at x = 0.05 (the slope, 20, times half a bin)


def test_constant_powers_run_in_fixed_point():
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Pow", ["x", "three"], ["cube"]),
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Pow", ["a", "half"], ["root"]),
        helper.make_node("Pow", ["a", "odd"], ["odd_power"]),
        helper.make_node("Add", ["cube", "root"], ["s"]),
        helper.make_node("Add", ["s", "odd_power"], ["y"]),
    ]
    constants = {
        "three": np.array(3.0, np.float32),
        "half": np.array(0.5, np.float32),
        "odd": np.array(1.7, np.float32),
    }
    model = make_model(nodes, [("x", FLOAT, [2, 16])], [("y", FLOAT, [2, 16])], constants)
    feeds = [{"x": rng.uniform(-1.5, 1.5, (2, 16)).astype(np.float32)} for _ in range(4)]
    check(model, feeds)


def test_a_causal_mask_of_minus_infinity_gives_zero_weight():
    rng = np.random.default_rng(1)
    mask = np.triu(np.full((6, 6), -np.inf, np.float32), 1)
    nodes = [
        helper.make_node("Add", ["scores", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["y"], axis=-1),
    ]
    model = make_model(nodes, [("scores", FLOAT, [6, 6])], [("y", FLOAT, [6, 6])], {"mask": mask})
    feeds = [{"scores": rng.standard_normal((6, 6)).astype(np.float32)} for _ in range(4)]
    compiled = check(model, feeds)
    got = compiled.run(feeds[0])["y"]
    assert np.all(got[np.triu_indices(6, 1)] == 0.0)  # the masked weights are exactly 0
    _ = numpy_helper
