"""Architectures users bring, as current PyTorch exports them (tiny random-weight transformers
models, dynamo exporter, opset 18): each compiles with no host fallback (``kiln check --strict``
exits 0) and matches eager PyTorch. The exports are cached in the zoo cache (first run: seconds
per model)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch (the 'zoo' extra) exports the models")
pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the architectures")
pytest.importorskip("onnxscript", reason="onnxscript (the 'zoo' extra) is the dynamo exporter's backend")

from click.testing import CliRunner

import kiln
from kiln.cli import main
from kiln.zoo import architectures

ATTENTION_LAYERS = {  # architectures whose every layer's attention must be one kernel
    "bert": 2, "roberta": 2, "distilbert": 2, "gpt2": 2, "llama": 2, "mistral": 2, "qwen2": 2, "gemma": 2,
    "phi": 2, "opt": 2, "falcon": 2, "vit": 2, "deit": 2, "gpt-neo": 2, "gptj": 2, "beit": 2, "swin": 2,
    "wav2vec2": 2,
}  # fmt: skip


@pytest.mark.parametrize("name", [n for n in architectures.ARCHITECTURES if n not in architectures.SIZES_SUITE])
def test_architecture_compiles_natively_and_matches_pytorch(name):
    path = architectures.export(name)
    result = CliRunner().invoke(main, ["check", str(path), "--strict", "--json"])
    found = json.loads(result.output)
    assert result.exit_code == 0, (found.get("fallbacks"), found.get("whole_graph_reason"), found.get("unsupported"))
    feeds = architectures.inputs(name)
    compiled = kiln.compile(str(path))
    assert compiled.is_native, [(f.node.label, f.reason) for p in compiled.plans for f in p.fallbacks]
    got = np.asarray(next(iter(compiled.run(feeds).values())), np.float64)
    want = architectures.eager(name, feeds).astype(np.float64)
    assert got.shape == want.shape
    error = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert error <= 1e-4, f"{name}: relative L2 {error:.2e} vs eager PyTorch"
    if name in ATTENTION_LAYERS:
        kinds = [k.kind for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
        assert kinds.count("attention") == ATTENTION_LAYERS[name], kinds


def test_zoo_arch_command_reports_each_architecture_and_refuses_unknown_names():
    result = CliRunner().invoke(main, ["zoo", "arch", "llama", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["name"] == "llama" and row["ok"] and row["fallbacks"] == [] and row["attention_kernels"] == 2
    assert row["relative_l2"] <= 1e-4
    result = CliRunner().invoke(main, ["zoo", "arch", "no-such-model"])
    assert result.exit_code != 0 and "unknown architecture" in result.output
