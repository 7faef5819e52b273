"""A model's ``threads`` is its own: two models whose plans share one library (the same code, one
loaded copy) each run their loops under the bound they were given, whatever the other asked for
(the bound travels with each run, through its C API context, not in the library)."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln


def wide_product() -> onnx.ModelProto:
    """A product wide enough that the engine splits it over the pool."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 512])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def last_bound(model) -> int:  # type: ignore[no-untyped-def]
    (executable,) = model.executables()
    library = ctypes.CDLL(str(executable.plan.library))  # (the loaded copy: dlopen returns it)
    library.kiln_pool_last_bound.restype = ctypes.c_int
    return int(library.kiln_pool_last_bound())


def test_two_models_on_one_library_keep_their_own_threads(monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")  # (a plan read from the plan cache brings its own copy)
    x = np.ones((64, 256), np.float32)
    one = kiln.compile(wide_product(), threads=1)
    three = kiln.compile(wide_product(), threads=3)
    (a,), (b,) = one.executables(), three.executables()
    assert a.plan.library == b.plan.library, "the same code: one library for both"
    one(x)
    assert last_bound(one) == 1
    three(x)
    assert last_bound(three) == 3
    one(x)  # (the library's own bound is the last model's; this run's is its own)
    assert last_bound(one) == 1
    np.testing.assert_allclose(one(x), three(x), rtol=1e-5)
