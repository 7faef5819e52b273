import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch", reason="torch (the 'zoo' extra) is needed for the PyTorch frontend")


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return torch.softmax(self.fc(x.mean(dim=(2, 3))), dim=-1)


def test_torch_module_compiles_and_matches_torch():
    torch.manual_seed(0)
    net = TinyNet().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(net, example_inputs=(x,))
    got = compiled(x.numpy())
    np.testing.assert_allclose(got, net(x).detach().numpy(), rtol=1e-4, atol=1e-6)


def test_torch_module_needs_example_inputs():
    with pytest.raises(kiln.KilnError, match="example_inputs"):
        kiln.compile(TinyNet())


def test_torch_module_goes_through_torch_export_and_a_dynamic_batch_stays_symbolic():
    torch.manual_seed(0)
    net = TinyNet().eval()
    x = torch.randn(2, 3, 16, 16)
    batch = torch.export.Dim("batch", min=1, max=64)
    compiled = kiln.compile(net, example_inputs={"image": x}, dynamic_shapes=({0: batch},))
    (value,) = compiled.graph.inputs
    assert value.name == "image" and isinstance(value.type.shape[0], str)  # symbolic, not 2
    assert not any(n.op == "Constant" for n in compiled.graph.nodes)
    for size in (1, 5):
        y = torch.randn(size, 3, 16, 16)
        np.testing.assert_allclose(compiled(y.numpy()), net(y).detach().numpy(), rtol=1e-4, atol=1e-6)


def test_export_dim_bounds_become_the_models_declared_range():
    """torch.export's Dim("batch", min=1, max=16): kiln's dim is named batch, its range is 1..16
    (checked every run), and a sample-parallel batch runs every size in it from its two size classes."""
    from torch.export import Dim

    from kiln.errors import InputError

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)
    ).eval()
    compiled = kiln.compile(
        module, example_inputs=(torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: Dim("batch", min=1, max=16)},)
    )
    assert compiled.ranges == {"batch": (1, 16)}
    assert str(compiled.signature.inputs[0].type) == "f32[batch,3,8,8]"
    for batch in (1, 5, 16):
        x = torch.randn(batch, 3, 8, 8)
        with torch.no_grad():
            expected = module(x).numpy()
        np.testing.assert_allclose(compiled(x.numpy()), expected, rtol=1e-4, atol=1e-5)
    assert sorted(dict(key)["batch"] for key, _ in compiled.variants.items()) == [1, 8]  # no size compiled
    with pytest.raises(InputError, match="batch=17 is outside"):
        compiled(np.zeros((17, 3, 8, 8), np.float32))
