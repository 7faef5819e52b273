"""interpret(G) == interpret(pass(G)) on the zoo models, for each pass alone and the whole pipeline."""

import numpy as np
import pytest

from kiln import zoo
from kiln.frontend.onnx import import_onnx
from kiln.ops.interpreter import Interpreter
from kiln.ops.verify import verify
from kiln.passes import PIPELINE, optimize, specialize

pytest.importorskip("torch", reason="torch (the 'zoo' extra) builds the zoo models")

STAGES = {stage.name: stage.run for stage in PIPELINE}
# Passes that rewrite float arithmetic (folded weights are rounded to float32 once, instead of
# scaling at run time) meet the fp32 model standard; the others must be exact to rounding noise.
TOLERANCE = {"fold_batchnorm": 1e-4, "pipeline": 1e-4}


def relative_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


# the seed models at reduced sizes (the interpreter runs each graph a dozen times): the same
# operators and patterns as at full size, two of the transformers' twelve layers (VGG-19 stays at
# 224: its exported adaptive pooling needs a 7x7 last plane)
REDUCED = {
    "resnet50": {"image_size": 32},
    "bert-base": {"seq": 16, "layers": 2},
    "gpt2": {"seq": 16, "layers": 2},
}


@pytest.fixture(scope="module", params=zoo.DEFAULT_MODELS)
def zoo_case(request):
    name = request.param
    sizes = REDUCED.get(name, {})
    graph = specialize(import_onnx(zoo.onnx_path(name, **sizes)), {"batch": 1})
    feeds = zoo.example_inputs(name, **sizes)
    inputs = [feeds[v.name] for v in graph.inputs]
    return name, graph, inputs, Interpreter(graph).run(inputs)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [*STAGES, "pipeline"])
def test_pass_preserves_zoo_outputs(zoo_case, stage):
    name, graph, inputs, expected = zoo_case
    transformed = optimize(graph, level=3) if stage == "pipeline" else STAGES[stage](graph)
    verify(transformed)
    got = Interpreter(transformed).run(inputs)
    for g, e in zip(got, expected):
        assert relative_l2(g, e) <= TOLERANCE.get(stage, 1e-5), f"{stage} changed {name}'s output"


@pytest.mark.slow
def test_pipeline_leaves_static_graphs_without_shape_arithmetic(zoo_case):
    name, graph, _, _ = zoo_case
    optimized = optimize(graph, level=2)
    ops = {n.op for n in optimized.nodes}
    assert not ops & {"Shape", "Identity", "ConstantOfShape", "Gemm", "Dropout"}, (name, sorted(ops))
    assert all(v.type.is_static for n in optimized.nodes for v in n.outputs), name
