"""The seed models on the gpu target without a GPU: every kernel compiles ahead for sm_80 and sm_90
(registers read back from the cubins: no spills in the product, convolution and attention kernels),
fusion is at least as deep as on the cpu target, and the models at reduced sizes match the reference
in Triton's interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import zoo

pytest.importorskip("triton", reason="the gpu target needs Triton (kiln's gpu extra)")
pytest.importorskip("torch", reason="torch (the 'zoo' extra) builds the zoo models")

from kiln.backends.gpu.ahead import compile_ahead
from tests.targets.test_gpu import unordered_rereads

HEAVY = ("matmul", "conv", "attention")


def gpu_plan(name: str):  # type: ignore[no-untyped-def]
    from kiln.driver.pipeline import compile_plan
    from kiln.frontend.onnx import import_onnx
    from kiln.passes import specialize

    graph = import_onnx(str(zoo.onnx_path(name)))
    dims = {d: 1 if d == "batch" else 128 for v in graph.inputs for d in v.type.shape if isinstance(d, str)}
    # the cpu plan only counts its kernels: nothing rendered or built
    return compile_plan(specialize(graph, dims), "gpu"), compile_plan(
        specialize(graph, dims), "cpu", build_library=False
    )


# each arch for every kernel kind: the two CNNs have the same kinds (convolutions, pooling,
# epilogues), and so have the two transformers (products, attention, normalizations), so each model
# compiles for one arch and each pair covers both (resnet50's 100+ distinct kernels for two archs
# were 130 s of a fresh machine's 20-minute test budget, the transformers' second arch ~40 s)
ARCHES = {"resnet50": ("sm_90",), "vgg19": ("sm_80",), "bert-base": ("sm_80",), "gpt2": ("sm_90",)}


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.DEFAULT_MODELS)
def test_every_kernel_of_a_seed_model_compiles_for_sm80_and_sm90_without_spills(name):
    gpu, cpu = gpu_plan(name)
    assert gpu.is_native, [(f.node.label, f.reason) for f in gpu.fallbacks]
    kernels = [k for s in gpu.steps for k in getattr(s, "kernels", [])]
    # fusion at least as deep as on the cpu target (which runs Winograd's three kernels per layer)
    assert len(kernels) <= sum(len(getattr(s, "kernels", [])) for s in cpu.steps)
    # no program reads memory it stored without a barrier between (a race on a GPU; test_gpu.py)
    assert unordered_rereads(gpu.source) == []
    for arch in ARCHES[name]:
        reports = compile_ahead(gpu.source, arch)
        failed = [(r.function, r.error) for r in reports if r.error]
        assert not failed, f"{name} on {arch}: {failed}"
        assert all(r.registers > 0 and r.spill_bytes >= 0 for r in reports)
        spilled = [(r.function, r.kind, r.spill_bytes) for r in reports if r.kind in HEAVY and r.spill_bytes]
        assert not spilled, f"{name} on {arch}: {spilled}"
        assert sum(r.launches for r in reports) >= len(kernels)  # every kernel launched
        assert {r.kind for r in reports} & set(HEAVY)


# reduced: smaller inputs, and two of the transformers' twelve layers (the same kernels as all twelve)
REDUCED = [
    ("resnet50", {"image_size": 32}),  # every kernel kind at a 1x1 last plane: the interpreter runs per element
    ("bert-base", {"seq": 16, "layers": 2}),
    ("gpt2", {"seq": 16, "layers": 2}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "sizes"), REDUCED, ids=[n for n, _ in REDUCED])
def test_a_seed_model_at_reduced_size_matches_the_reference_in_the_interpreter(name, sizes):
    from kiln.zoo.check import relative_l2

    path = str(zoo.onnx_path(name, **sizes))
    feeds = zoo.example_inputs(name, **sizes)
    compiled = kiln.compile(path, target="gpu:interpret", dims={"batch": 1})
    assert compiled.is_native
    expected = kiln.compile(path, target="reference").run(feeds)
    got = compiled.run(feeds)
    for key in expected:
        assert relative_l2(np.asarray(got[key]), np.asarray(expected[key])) <= 1e-4, key
