"""Inputs as the ecosystem holds them (NumPy, torch tensors, DLPack and array-interface objects),
preallocated outputs, and the model's input/output metadata."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.errors import InputError
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(2)


@pytest.fixture(scope="module")
def model():
    proto = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceSum", ["r", "axes"], ["s"], keepdims=0)],
        [("x", FLOAT, ["batch", 3])],
        [("r", FLOAT, None), ("s", FLOAT, None)],
        {"axes": np.array([1], np.int64)},
    )
    return kiln.compile(proto)


def test_metadata_names_dtypes_and_symbolic_shapes(model):
    (x,) = model.inputs
    assert (x.name, x.dtype, x.shape, x.type) == ("x", np.dtype("float32"), ("batch", 3), "f32[batch,3]")
    assert [o.name for o in model.outputs] == ["r", "s"] and model.outputs[0].dtype == np.float32


def test_torch_tensors_are_read_in_place():
    torch = pytest.importorskip("torch", reason="torch (the 'zoo' extra) provides the tensors")
    x = torch.randn(4, 3)
    proto = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, ["batch", 3])], [("y", FLOAT, None)])
    compiled = kiln.compile(proto)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(x.numpy(), 0))
    grad = torch.randn(2, 3, requires_grad=True)  # detached, not refused
    np.testing.assert_array_equal(compiled(grad), np.maximum(grad.detach().numpy(), 0))
    from kiln.runtime.inputs import foreign_array  # the conversion itself: no copy

    assert np.shares_memory(foreign_array("x", x), x.numpy())


def test_dlpack_and_array_interface_objects(model):
    class Interface:
        def __init__(self, array):
            self.array = array

        def __array__(self, dtype=None, copy=None):
            return self.array

    x = RNG.standard_normal((2, 3)).astype(np.float32)
    assert np.array_equal(model.run({"x": Interface(x)})["r"], np.maximum(x, 0))

    class DLPackOnly:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    assert np.array_equal(model.run({"x": DLPackOnly(x)})["r"], np.maximum(x, 0))
    with pytest.raises(InputError, match="input 'x': expected an array"):
        model.run({"x": object()})


def test_results_go_into_preallocated_arrays(model):
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    r, s = np.empty((5, 3), np.float32), np.empty((5,), np.float32)
    results = model.run({"x": x}, outputs={"r": r, "s": s})
    assert results["r"] is r and results["s"] is s
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    np.testing.assert_allclose(s, np.maximum(x, 0).sum(axis=1), rtol=1e-6)
    with pytest.raises(InputError, match="has shape \\[4\\], the result \\[5\\]"):
        model.run({"x": x}, outputs={"s": np.empty((4,), np.float32)})
    with pytest.raises(InputError, match="expected dtype f32"):
        model.run({"x": x}, outputs={"s": np.empty((5,), np.float64)})
    with pytest.raises(InputError, match="unknown output 'z'"):
        model.run({"x": x}, outputs={"z": r})
