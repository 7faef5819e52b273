"""Transformers exported with a symbolic sequence length run every length in a declared range
from one library whose kernels take the length at run time (kiln.passes.padding, kiln.driver.extents): GPT-2's causal mask built from flat indices
into the padding mask, its Conv1D rows merged with the batch, BERT's token types gathered from a
buffer; each against PyTorch, attention still one kernel per layer, nothing compiled at run time."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch (the 'zoo' extra) exports the models")
pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the models")

import torch

import kiln
from kiln.frontend.onnx import import_onnx
from kiln.passes.padding import Padding, paddable
from tests.zoo.test_dynamo_exports import tiny

AXES = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}


def export(kind: str, exporter: str, path: str) -> torch.nn.Module:
    module = tiny(kind)
    ids, mask = torch.randint(0, 97, (1, 16)), torch.ones((1, 16), dtype=torch.int64)
    names = ["input_ids", "attention_mask"]
    with torch.no_grad():
        if exporter == "dynamo":  # opset 18, the exporter's own mask lookups (GatherND by index tuples)
            pytest.importorskip("onnxscript", reason="onnxscript (the 'zoo' extra) is the dynamo exporter's backend")
            program = torch.onnx.export(
                module, (ids, mask), input_names=names, opset_version=18, dynamo=True, dynamic_axes=AXES
            )
            program.save(path, external_data=False)
        else:  # opset 17: flat indices into the flattened mask, Linear rows merged with the batch
            torch.onnx.export(
                module, (ids, mask), path, input_names=names, opset_version=17, dynamo=False, dynamic_axes=AXES
            )
    return module


@pytest.mark.parametrize(
    ("kind", "exporter"),
    # BERT's dynamo export reads its mask by the same (sample, position) tuples as GPT-2's
    [("gpt2", "torchscript"), ("gpt2", "dynamo"), ("bert", "torchscript")],
)
def test_an_export_runs_every_length_from_its_compiled_lengths(kind, exporter, tmp_path):
    module = export(kind, exporter, str(tmp_path / "m.onnx"))
    found = paddable(import_onnx(str(tmp_path / "m.onnx")), "seq")
    assert isinstance(found, Padding), found
    # per layer: the scores' keys to -inf before Softmax, V's padded rows to 0 (the probabilities
    # are exactly 0 there already: no mask on them, so attention stays one kernel)
    assert sorted((m.fill, m.index) for m in found.masks) == [(-np.inf, 0)] * 2 + [(0.0, 1)] * 2
    compiled = kiln.compile(str(tmp_path / "m.onnx"), dims={"seq": (1, 24), "batch": (1, 1)})
    # one library whose kernels take the length at run time (GPT-2's [seq, seq] causal mask is
    # computed by a kernel, kiln.driver.extents.computed_at_run_time: as a constant it would be
    # the capacity's)
    assert compiled.padder().classes == (24,) and compiled.padder().samples, compiled.run_time_refused
    before = len(compiled.executables())
    assert before == len(compiled.padder().classes)
    rng = np.random.default_rng(5)
    for length in (1, 2, 9, 16, 17, 24):
        ids = rng.integers(0, 97, (1, length))
        mask = np.ones((1, length), np.int64)
        mask[0, max(1, length - 3) :] = 0  # a tokenizer's padding of its own
        got = np.asarray(next(iter(compiled.run({"input_ids": ids, "attention_mask": mask}).values())))
        with torch.no_grad():
            want = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        assert got.shape == want.shape
        assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want), length
    assert len(compiled.executables()) == before  # nothing compiled at run time
    kernels = [k.kind for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
    assert kernels.count("attention") == 2 * before, kernels
    assert compiled.is_native


def test_torch_export_dim_bounds_a_sequence_that_pads():
    """torch.export's Dim("seq", min=2, max=24) on both inputs: kiln converts the arange over seq,
    the mask lookups by symbolic index tensors and the expands to seq, declares the range and
    runs every length from its compiled lengths, against PyTorch."""
    from torch.export import Dim

    module = tiny("gpt2")
    ids, mask = torch.randint(0, 97, (1, 16)), torch.ones((1, 16), dtype=torch.int64)
    seq = Dim("seq", min=2, max=24)
    compiled = kiln.compile(module, example_inputs=(ids, mask), dynamic_shapes=({1: seq}, {1: seq}))
    assert compiled.ranges["seq"] == (2, 24)
    assert compiled.padder() is not None and compiled.padder().classes == (24,), compiled.run_time_refused
    before = len(compiled.executables())
    for length in (2, 7, 16, 23):
        i, m = torch.randint(0, 97, (1, length)), torch.ones((1, length), dtype=torch.int64)
        m[0, -1] = 0
        got = np.asarray(next(iter(compiled.run(dict(zip(compiled.input_names, (i.numpy(), m.numpy())))).values())))
        with torch.no_grad():
            want = module(i, m).numpy()
        assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want), length
    assert len(compiled.executables()) == before
