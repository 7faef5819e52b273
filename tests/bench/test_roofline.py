"""The roofline's nominal work: counted from the ONNX file alone, shapes bound by the inputs."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from kiln.bench.roofline import Peaks, Work, bound_ms, model_work

F = TensorProto.FLOAT


def test_nominal_flops_count_every_product_with_the_batch_the_inputs_bind():
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.standard_normal((8, 2, 3, 3)).astype(np.float32),  # groups=2: each output sums 2*3*3
        "fc": rng.standard_normal((8 * 6 * 6, 10)).astype(np.float32),
        "g": rng.standard_normal((5, 10)).astype(np.float32),  # Gemm with transB
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], group=2),  # x: (n, 4, 8, 8) -> (n, 8, 6, 6)
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["m"]),
        helper.make_node("Gemm", ["m", "g"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "work",
        [helper.make_tensor_value_info("x", F, ["n", 4, 8, 8])],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = np.zeros((3, 4, 8, 8), np.float32)
    work = model_work(model, {"x": x})
    conv = 2 * (3 * 8 * 6 * 6) * (2 * 3 * 3)
    matmul = 2 * (3 * 10) * (8 * 6 * 6)
    gemm = 2 * (3 * 5) * 10
    assert work.flops == conv + matmul + gemm
    assert work.unknown == 0
    weights = sum(a.nbytes for a in inits.values())
    assert work.traffic_bytes == weights + x.nbytes + 3 * 5 * 4
    # the model itself is left as it was (its batch still symbolic)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "n"


def test_the_bound_is_the_slower_of_compute_and_traffic():
    peaks = Peaks(gflops=100.0, gbps=10.0, how="given")
    assert bound_ms(Work(flops=10**9, traffic_bytes=10**6, unknown=0), peaks) == 10.0  # compute: 1 GFLOP at 100/s
    assert bound_ms(Work(flops=10**6, traffic_bytes=10**9, unknown=0), peaks) == 100.0  # traffic: 1 GB at 10 GB/s
