import numpy as np
import pytest

import kiln
from kiln import zoo

torch = pytest.importorskip("torch", reason="torch (the 'zoo' extra) builds the zoo models")


@pytest.mark.parametrize(("name", "parameters"), [("resnet50", 25_557_032), ("vgg19", 143_667_240)])
def test_cnn_architecture_matches_torchvision(name, parameters):
    # torchvision's published parameter counts, plus its module naming scheme.
    module = zoo.get(name).build(zoo.options_for(name))
    assert sum(p.numel() for p in module.parameters()) == parameters
    keys = set(module.state_dict())
    expected = (
        {"conv1.weight", "layer4.2.bn3.running_var", "fc.bias"}
        if name == "resnet50"
        else {"features.34.weight", "classifier.6.bias"}
    )
    assert expected <= keys


def test_state_dict_loads_strictly(tmp_path):
    torch.manual_seed(1)
    source = zoo.get("resnet50").build(zoo.options_for("resnet50", seed=1))
    path = tmp_path / "resnet50.pth"
    torch.save(source.state_dict(), path)
    loaded = zoo.load_state_dict("resnet50", path)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(x).numpy(), source(x).numpy())
    torch.save({"wrong.weight": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(kiln.KilnError, match=r"does not fit the model: \d+ missing \(.*1 unexpected \(wrong.weight\)"):
        zoo.load_state_dict("resnet50", tmp_path / "bad.pth")


def test_unknown_zoo_model_lists_the_known_ones():
    with pytest.raises(
        kiln.KilnError, match="unknown zoo model 'resnet9000'; available: resnet50, vgg19, bert-base, gpt2"
    ):
        zoo.get("resnet9000")


def test_example_inputs_are_deterministic():
    first, second = zoo.example_inputs("bert-base"), zoo.example_inputs("bert-base")
    assert list(first) == ["input_ids", "attention_mask"]
    assert first["input_ids"].shape == (1, 128)
    np.testing.assert_array_equal(first["input_ids"], second["input_ids"])


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.DEFAULT_MODELS)
def test_zoo_model_on_reference_matches_onnxruntime(name):
    pytest.importorskip("onnxruntime", reason="onnxruntime (the 'peers' extra) is the comparison point")
    from kiln.zoo.check import check_model

    result = check_model(name, target="reference")
    assert result.relative_l2 is not None and result.relative_l2 <= 1e-4, result


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.DEFAULT_MODELS)
def test_zoo_model_compiles_natively_and_matches_reference(name):
    from kiln.zoo.check import relative_l2

    path = str(zoo.onnx_path(name))
    feeds = zoo.example_inputs(name)
    compiled = kiln.compile(path, target="cpu", dims={"batch": 1})
    plan = compiled.plans[0]
    assert compiled.is_native, [(f.node.label, f.reason) for f in plan.fallbacks] or plan.whole_graph_reason
    assert any("epilogue" in k.kind for step in plan.steps for k in getattr(step, "kernels", [])) or name in (
        "bert-base",
    )
    expected = kiln.compile(path, target="reference").run(feeds)
    got = compiled.run(feeds)
    for key in expected:
        assert relative_l2(got[key], expected[key]) <= 1e-4
