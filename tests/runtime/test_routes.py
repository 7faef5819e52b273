"""One route chooser serves every run (``kiln.driver.routes``): the route a binding took, what it
did, whether it compiled, and why the routes before it refused the binding."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.driver.routes import ROUTES, dim_routes
from kiln.driver.variants import plans_compiled
from kiln.errors import ExecutionError, KilnError
from tests.helpers import FLOAT, INT64, make_model
from tests.passes.test_size_expressions import folded_rows_model
from tests.runtime.test_padded_lengths import attention_model
from tests.runtime.test_padded_lengths import feeds as token_feeds
from tests.runtime.test_run_time_dims import image, strided_cnn
from tests.runtime.test_sizes import feeds, small_cnn

RNG = np.random.default_rng(11)


def refusals(model) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dict(model.route.refused)


def test_a_size_class_runs_its_variant_and_another_size_runs_as_its_chunks():
    model = kiln.compile(small_cnn(), dims={"batch": (1, 64)})
    model.run(feeds(8))
    assert (model.route.name, model.route.detail, model.route.compiled) == (
        "compiled",
        "a variant compiled before",
        False,
    )
    assert set(refusals(model)) == {"run-time sizes", "padded"}
    model.run(feeds(37))
    assert model.route.name == "size classes" and not model.route.compiled
    assert model.route.detail == "batch 37 as chunks 8+8+8+8+1+1+1+1+1"
    assert model.routes_taken == {"compiled": 1, "size classes": 1}


def count_scaled() -> onnx.ModelProto:
    """x times the number of samples: no sample's result is its own (no chunks), and no padding
    keeps the count (no padded length)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["count"], axis=0),
        helper.make_node("Cast", ["count"], ["n"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "n"], ["y"]),
    ]
    return make_model(
        nodes, [("x", FLOAT, ["batch", 4])], [("y", FLOAT, ["batch", 4])], {"zero": np.array(0, np.int64)}
    )


def test_a_dim_that_is_not_sample_parallel_compiles_its_size_and_says_why():
    ranged = kiln.compile(count_scaled(), dims={"batch": (1, 16)})  # with a range: one compile serves it
    ranged.run({"x": RNG.standard_normal((5, 4)).astype(np.float32)})
    assert (ranged.route.name, ranged.route.compiled) == ("run-time sizes", False)
    model = kiln.compile(count_scaled())  # no range: each size compiles
    model.run({"x": RNG.standard_normal((5, 4)).astype(np.float32)})
    assert (model.route.name, model.route.detail, model.route.compiled) == (
        "compiled",
        "compiled for this size now",
        True,
    )
    assert refusals(model)["size classes"].startswith("batch: ")  # the batching analysis's reason
    assert refusals(model)["padded"] == "no ranged dim pads"
    model.run({"x": RNG.standard_normal((5, 4)).astype(np.float32)})
    assert (model.route.detail, model.route.compiled) == ("a variant compiled before", False)


def test_a_guard_that_does_not_hold_refuses_the_chunks_with_the_guard():
    """(h*w) % 16 == 0 is what makes each chunk's rows whole: at 3x3 planes a batch of 16 is valid
    as a whole but its chunks of 8 are not, so it compiles for its size, and says which guard."""
    model = kiln.compile(folded_rows_model(), dims={"batch": "1..16", "h": 4, "w": 8})
    x = RNG.standard_normal((5, 16, 4, 8)).astype(np.float32)
    model.run({"x": x})
    assert model.route.name == "size classes"
    model.run({"x": RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)})
    assert model.route.name == "compiled" and model.route.compiled
    assert refusals(model)["size classes"] == "batch is sample-parallel only where (h*w)%16 == 0"


def test_a_padded_length_and_sizes_taken_at_run_time_are_routes_of_their_own():
    tokens = kiln.compile(attention_model(), dims={"seq": (1, 40), "batch": (1, 9)})
    before = plans_compiled()
    tokens.run(token_feeds(2, 13))
    assert tokens.route.name == "padded" and tokens.route.detail.startswith("seq 13 ")
    assert plans_compiled() == before and not tokens.route.compiled
    assert "run-time sizes" in refusals(tokens)
    images = kiln.compile(strided_cnn(), dims={"batch": 1, "h": (6, 40), "w": (6, 40)})
    images.run(image(1, 17, 29))
    assert images.route.name == "run-time sizes" and images.route.detail == "h, w taken by the kernels at run time"
    assert images.route.refused == () and not images.route.compiled


def test_each_ranged_dim_says_its_route_before_any_run():
    """``dim_routes`` (what ``kiln compile`` prints, what benchmarks record): chunked batch, a
    length padded or taken at run time, image sizes in the dims vector, and a per-size compile
    where no range is declared and the batch is not sample-parallel."""
    tokens = kiln.compile(attention_model(), dims={"seq": (1, 40), "batch": (1, 9)})
    found = dim_routes(tokens)
    assert found["batch"][0] == "chunked" and found["seq"][0] in ("padded", "run-time length")
    assert found["seq"][1].startswith("(1..40): ")
    images = kiln.compile(strided_cnn(), dims={"batch": 1, "h": (6, 40), "w": (6, 40)})
    assert {k: v[0] for k, v in dim_routes(images).items() if k in ("h", "w")} == {
        "h": "run-time dims",
        "w": "run-time dims",
    }
    scaled = dim_routes(kiln.compile(count_scaled()))
    assert scaled["batch"][0] == "per-size compile" and "no range declared" in scaled["batch"][1]


def test_a_static_model_has_one_route():
    model = kiln.compile(
        make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2, 3])], [("y", FLOAT, [2, 3])])
    )
    model.run({"x": np.ones((2, 3), np.float32)})
    assert (model.route.name, model.route.detail) == ("compiled", "the one variant")
    assert model.route.name in ROUTES


def test_kiln_check_prints_the_route_of_each_binding(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), path)
    done = subprocess.run(
        [sys.executable, "-m", "kiln", "check", str(path), "--dim", "batch=1..20", "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["ranges"]["bindings"]
    routes = {row["dims"]["batch"]: row["route"]["route"] for row in rows}
    assert routes[1] == "compiled" and routes[20] == "size classes"
    assert all(row["route"]["compiled"] is False for row in rows)


def test_a_failure_at_one_binding_names_the_binding():
    """An index out of range in the third sample: the run went as chunks of the batch-1 class, so
    the node's message shows the chunk's shapes; the error also names the run's binding."""
    nodes = [helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)]
    source = make_model(
        nodes, [("idx", INT64, ["batch"])], [("y", FLOAT, None)], {"table": np.ones((4, 3), np.float32)}
    )
    model = kiln.compile(source)
    assert model.run({"idx": np.array([0, 3, 1], np.int64)})["y"].shape == (3, 3)
    with pytest.raises(ExecutionError, match="^at batch=3: node .*out of range"):
        model.run({"idx": np.array([0, 1, 9], np.int64)})
    reshape = [helper.make_node("Reshape", ["x", "pairs"], ["y"])]  # a compile's failure names it its own way
    pairs = {"pairs": np.array([2, -1], np.int64)}
    odd = kiln.compile(make_model(reshape, [("x", FLOAT, ["batch", 3])], [("y", FLOAT, None)], pairs))
    with pytest.raises(KilnError, match=r"cannot reshape.*\(compiling for batch=3\)$"):
        odd.run({"x": np.ones((3, 3), np.float32)})
