"""User-supplied weights for zoo models (``--weights MODEL=FILE``): exported in place of the
random ones, read without running code, and a mismatch is a named error."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

import kiln
from kiln import zoo
from kiln.zoo.weights import PUBLISHED_TOP1, WeightsError, load_into, parse_weights


def test_an_export_with_given_weights_computes_with_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(7)
    trained = zoo.get("jet-mlp").build(zoo.options_for("jet-mlp", seed=7)).eval()
    path = tmp_path / "jet.pth"
    torch.save({"state_dict": trained.state_dict()}, path)  # a checkpoint holding one
    default, given = zoo.onnx_path("jet-mlp"), zoo.onnx_path("jet-mlp", weights=str(path))
    assert default != given  # the weights' digest keys the export cache
    x = zoo.example_inputs("jet-mlp", batch=3)
    with torch.no_grad():
        want = trained(*(torch.from_numpy(v) for v in x.values())).numpy()
    got = next(iter(kiln.compile(str(given), target="reference").run(x).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    other = next(iter(kiln.compile(str(default), target="reference").run(x).values()))
    assert not np.allclose(other, want)  # the random weights would not have given it


def test_a_file_that_would_run_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps(Payload()))
    module = zoo.get("jet-mlp").build(zoo.options_for("jet-mlp"))
    with pytest.raises(WeightsError, match="not a state_dict PyTorch loads safely"):
        load_into(module, path)
    assert not marker.exists()


def test_mistakes_are_named(tmp_path):
    module = zoo.get("jet-mlp").build(zoo.options_for("jet-mlp"))
    with pytest.raises(WeightsError, match="not a regular file"):
        load_into(module, tmp_path)
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "other.pth")
    with pytest.raises(WeightsError, match=r"does not fit the model: \d+ missing .* 1 unexpected \(fc.weight\)"):
        load_into(module, tmp_path / "other.pth")
    wrong = {k: torch.zeros(*v.shape[:-1], v.shape[-1] + 1) for k, v in module.state_dict().items()}
    torch.save(wrong, tmp_path / "shapes.pth")
    with pytest.raises(WeightsError, match="of another shape"):
        load_into(module, tmp_path / "shapes.pth")
    with pytest.raises(WeightsError, match="give MODEL=FILE"):
        parse_weights(["jet.pth"], zoo.MODELS)
    with pytest.raises(WeightsError, match="'alexnet' is not a zoo model"):
        parse_weights([f"alexnet={tmp_path / 'other.pth'}"], zoo.MODELS)


def test_published_figures_are_for_zoo_models():
    assert set(PUBLISHED_TOP1) <= set(zoo.MODELS)
    assert PUBLISHED_TOP1["resnet50"]["IMAGENET1K_V1"] == pytest.approx(76.13)
