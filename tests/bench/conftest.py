import numpy as np
import onnx
import pytest
from onnx import helper

from tests.helpers import FLOAT, make_model


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory):
    """A small MLP, [batch, 16] -> [batch, 10]."""
    rng = np.random.default_rng(0)
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        [("x", FLOAT, ["batch", 16])],
        [("y", FLOAT, ["batch", 10])],
        {
            "w1": rng.standard_normal((16, 32)).astype(np.float32),
            "w2": rng.standard_normal((32, 10)).astype(np.float32),
        },
    )
    path = tmp_path_factory.mktemp("models") / "tiny.onnx"
    onnx.save(model, path)
    return str(path)
