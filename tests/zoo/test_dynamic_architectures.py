"""Architectures exported with symbolic batch and sequence length, compiled once with declared
ranges and run at the ranges' ends, primes and sizes inside (padding masks that differ per
sample) against onnxruntime on the same file: every size matches, and batch is proven
sample-parallel, so no size compiles after ``kiln.compile`` returned (issue 49; the whole table
is ``benchmarks/dynamic_architectures.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.backends import parse
from kiln.driver.variants import plans_compiled
from kiln.passes.batching import Parallel, sample_parallel
from kiln.zoo import architectures

pytest.importorskip("torch", reason="torch (the 'zoo' extra) exports the models")
pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the architectures")
pytest.importorskip("onnxscript", reason="onnxscript (the 'zoo' extra) is the dynamo exporter's backend")
onnxruntime = pytest.importorskip("onnxruntime", reason="the sizes are checked against onnxruntime")

SIZES = [(1, 16), (1, 1), (8, 64), (3, 7), (5, 13), (8, 1)]


# 16 architectures kiln's zoo does not have (and GPT-2, which it has, from the dynamo exporter),
# each from one exporter so both are covered; benchmarks/dynamic_architectures.py runs both of each
CASES = [
    ("gpt2", "dynamo"),  # tokens flattened to rows
    ("albert", "torchscript"),  # heads folded into the batch; the mask flattened, read at b*seq + j
    ("roberta", "dynamo"),  # position ids: a per-sample GatherElements from a buffer expanded over the batch
    ("bloom", "torchscript"),  # ALiBi: [batch*heads, 1, seq] reshaped by a target computed from the count
    ("gpt-neo", "dynamo"),  # a causal window cut from a table, its end min(seq, 2048): the length pads
    ("llama", "torchscript"),  # rotate_half's end x.shape[-1] // 2 read with the batch unbound: pads
    ("electra", "dynamo"),  # embeddings projected to a narrower hidden size
    ("xlm-roberta", "torchscript"),  # position ids from a CumSum of the padding mask
    ("roformer", "dynamo"),  # rotary positions from a sinusoidal table sliced to the length
    ("ernie", "torchscript"),  # task-type embeddings beside the token types
    ("mpnet", "dynamo"),  # relative-position buckets (a log of position differences)
    ("clip-text", "torchscript"),  # a causal mask beside the padding mask, the last token's features
    ("t5-encoder", "dynamo"),  # relative-position buckets: host-computed, the length in padded classes
    ("deberta-v2", "torchscript"),  # disentangled attention: a table tiled once per sample, gathered by distance
    ("opt", "dynamo"),  # learned positions offset by 2, from a CumSum of the mask
    ("qwen2", "torchscript"),  # grouped-query attention, RMSNorm, rotary positions
    ("bart", "torchscript"),  # encoder-decoder: decoder ids shifted right by ScatterNDs of index tuples
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_an_export_with_symbolic_sizes_runs_every_size_without_compiling_again(name, exporter, monkeypatch):
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")  # every plan is compiled, none read back
    path = str(architectures.export(name, exporter=exporter, dynamic=True))
    from kiln.frontend.onnx import import_onnx

    assert isinstance(sample_parallel(import_onnx(path))["batch"], Parallel)
    model = kiln.compile(path, dims={"batch": "1..8", "seq": "1..64"})
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    compiled = plans_compiled()
    for batch, seq in SIZES:
        matches(model, session, architectures.inputs(name, batch=batch, seq=seq), f"{name} at batch {batch}, seq {seq}")
    assert plans_compiled() == compiled, "a size compiled after kiln.compile returned"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["roberta", "albert", "mpnet"])
def test_torchscript_flat_index_offsets_take_the_length_at_run_time(name, monkeypatch):
    """TorchScript exports of BERT-family encoders fold arange(batch) * seq (flat-index offsets): a
    constant of one size whose values follow the length. Written by the runtime at the length it
    runs at, the length stays a run-time extent (one plan, not padded classes), every size right.
    MPNet's relative-position buckets cast log(0) = -inf to an integer: native on x86, no host
    fallback that would refuse the run-time length."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    path = str(architectures.export(name, exporter="torchscript", dynamic=True))
    model = kiln.compile(path, dims={"batch": "1..8", "seq": "1..64"})
    if name != "mpnet" or parse("cpu").float_to_int == "x86":
        assert not model.run_time_refused, model.run_time_refused
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    compiled = plans_compiled()
    for batch, seq in SIZES:
        matches(model, session, architectures.inputs(name, batch=batch, seq=seq), f"{name} at batch {batch}, seq {seq}")
    assert plans_compiled() == compiled, "a size compiled after kiln.compile returned"


def matches(model, session, feeds: dict, where: str) -> None:  # type: ignore[no-untyped-def]
    """The model's first output at ``feeds`` is onnxruntime's within relative L2 1e-5."""
    want = session.run(None, feeds)[0]
    got = next(iter(model.run(feeds).values()))
    assert got.shape == want.shape, where
    error = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert error <= 1e-5, f"{where}: relative L2 {error:.2e}"


IMAGE_SIZES = [(1, 32, 32), (4, 64, 64), (3, 37, 37), (2, 48, 63), (1, 61, 53)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["convnextv2", "segformer"])
def test_an_image_export_runs_every_image_size_without_compiling_again(name, monkeypatch):
    """ConvNeXtV2 (a 4x4 patchify, 7x7 depthwise windows channels last, GRN; before: a compile per
    image size, 'the lowering's structure differs with the length') and SegFormer (views whose
    targets mix the count with sizes computed by floor divisions; before: the batch refused),
    exported by the dynamo exporter with symbolic batch, height and width: every size matches
    onnxruntime on one compile."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    path = str(architectures.export(name, exporter="dynamo", dynamic=True))
    model = kiln.compile(path, dims={"batch": "1..4", "height": "32..64", "width": "32..64"})
    assert not model.run_time_refused, model.run_time_refused
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    compiled = plans_compiled()
    rng = np.random.default_rng(0)
    for batch, height, width in IMAGE_SIZES:
        feeds = {"pixel_values": rng.standard_normal((batch, 3, height, width)).astype(np.float32)}
        matches(model, session, feeds, f"{name} at {batch}x{height}x{width}")
    assert plans_compiled() == compiled, "an image size compiled after kiln.compile returned"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "exporter"), [("swin", "dynamo"), ("swin", "torchscript"), ("mobilevit", "torchscript")]
)
def test_window_and_patch_views_are_sample_parallel_at_every_batch(name, exporter, monkeypatch):
    """Swin's window partition and reverse (sizes padded to the window and computed again where
    each view needs them) and MobileViT's patch folding (its grid computed through floats:
    ceil(h / 2.0) * 2.0): the sizes are expressions, so the batch is proven sample-parallel and
    every batch runs on one compile (before: refused at their views, a compile per batch)."""
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    path = str(architectures.export(name, exporter=exporter, dynamic=True))
    from kiln.frontend.onnx import import_onnx

    assert isinstance(sample_parallel(import_onnx(path))["batch"], Parallel)
    model = kiln.compile(path, dims={"batch": "1..4", "height": 32, "width": 32})
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    compiled = plans_compiled()
    rng = np.random.default_rng(1)
    for batch in (1, 3, 4, 2):
        feeds = {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
        matches(model, session, feeds, f"{name} ({exporter}) at batch {batch}")
    assert plans_compiled() == compiled, "a batch size compiled after kiln.compile returned"
