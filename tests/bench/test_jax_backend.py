"""The XLA row's converter: every JAX function checked on the ONNX conformance cases of its op
(against their expected outputs, as kiln's own targets are), an op it lacks named as the row's
reason, and a zoo model run end to end through jax.jit."""

from __future__ import annotations

import collections

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax row is an optional extra (pip install -e .[xla]; make setup)")

from kiln.bench.backends import Unavailable  # noqa: E402
from kiln.bench.backends.jax_backend import JAX_OPS, _ensure_table, missing_ops, to_jax  # noqa: E402
from kiln.conformance.runner import _to_numpy, compare_outputs, load_cases  # noqa: E402
from kiln.errors import KilnError  # noqa: E402

jax.config.update("jax_enable_x64", True)  # int64 and float64 cases keep their types, as ONNX's


def _cases() -> dict[str, list]:
    _ensure_table()
    by_op = collections.defaultdict(list)
    for case in load_cases(("node",)):
        if len(case.ops) == 1 and case.ops[0] in JAX_OPS:
            by_op[case.ops[0]].append(case)
    return by_op


CASES = _cases()


def _run(case) -> str:  # type: ignore[no-untyped-def]
    """'pass', or 'unavailable: why' (an input or attribute the converter refuses by name)."""
    import onnx

    from kiln.frontend.onnx import import_onnx
    from kiln.passes.specialize import input_dims, specialize

    model = onnx.load_from_string(case.model)
    for inputs, outputs in case.data_sets:
        arrays = [_to_numpy(x) for x in inputs]
        try:
            graph = import_onnx(model)
        except KilnError as err:
            return f"unavailable: kiln cannot import it ({err})"
        names = [v.name for v in graph.inputs]
        graph = specialize(graph, input_dims(graph, dict(zip(names, arrays))))
        graph, arrays = _static_arguments(graph, arrays)
        try:
            function = jax.jit(to_jax(graph))
            got = [np.asarray(o) for o in function(*arrays)]
        except Unavailable as err:
            return f"unavailable: {err}"
        compare_outputs([_to_numpy(x) for x in outputs], got, case.rtol, max(case.atol, 1e-6))
    return "pass"


def _static_arguments(graph, arrays):  # type: ignore[no-untyped-def]
    """The cases pass shapes, axes and indices as inputs; in a model they are constants (XLA needs
    them static): integer inputs read at a position other than the data's become constants."""
    from kiln.ir.graph import Graph

    readers = {id(v): [] for v in graph.inputs}
    for node in graph.nodes:
        for position, value in enumerate(node.inputs):
            if value is not None and id(value) in readers:
                readers[id(value)].append(position)
    keep, constants = [], dict(graph.constants)
    kept_arrays = []
    for value, array in zip(graph.inputs, arrays):
        if np.issubdtype(np.asarray(array).dtype, np.integer) and readers[id(value)] and 0 not in readers[id(value)]:
            constants[value] = np.asarray(array)
        else:
            keep.append(value)
            kept_arrays.append(array)
    baked = Graph(tuple(keep), graph.outputs, graph.nodes, constants, opsets=graph.opsets)
    return baked, kept_arrays


@pytest.mark.parametrize("op", sorted(CASES))
def test_the_ops_jax_function_matches_its_conformance_cases(op):
    results = {case.name: _run(case) for case in CASES[op]}
    passed = [name for name, status in results.items() if status == "pass"]
    assert passed, f"{op}: no conformance case passes: {results}"
    # every other case was refused with a reason (never a wrong answer: compare_outputs raises)
    assert all(status == "pass" or status.startswith("unavailable: ") for status in results.values())


def test_every_jax_function_has_conformance_cases():
    uncovered = sorted(set(JAX_OPS) - set(CASES))
    assert not uncovered, f"JAX functions no conformance case exercises: {uncovered}"


def test_a_missing_op_is_the_rows_reason():
    from onnx import TensorProto, helper

    from kiln.frontend.onnx import import_onnx

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Hardmax", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    kiln_graph = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert missing_ops(kiln_graph) == ["Hardmax"]
    with pytest.raises(Unavailable, match="no JAX conversion for op Hardmax"):
        to_jax(kiln_graph)


@pytest.mark.slow
def test_a_zoo_model_runs_through_jax_jit(tmp_path):
    """mobilenet_v2 (convolutions, depthwise, clip, pooling, gemm) compiled by XLA agrees with kiln."""
    import kiln
    from kiln import zoo
    from kiln.bench.backends.jax_backend import JaxBackend
    from kiln.bench.models import resolve_model

    model = resolve_model("mobilenet_v2", 1, None)
    feeds = model.inputs(seed=0)
    backend = JaxBackend(2)
    assert backend.availability() is None
    backend.compile(model, feeds)
    got = backend.load().run(feeds)
    want = list(kiln.compile(str(zoo.onnx_path("mobilenet_v2"))).run(feeds).values())
    error = np.linalg.norm(got[0] - want[0]) / np.linalg.norm(want[0])
    assert error < 1e-4, error
