"""Fuzzing the classes the second hostile probe found (issue 26): integer ops on their edge values
(never a trap, always the reference's answer), artifacts with hostile fields (always an
ArtifactError, never another exception), and torch modules that mutate their inputs and buffers
(each write applied exactly once per call, as eager does).

CI runs a quick budget; ``KILN_FUZZ_EXAMPLES=2000 pytest tests/fuzz`` is the long local mode.
"""

from __future__ import annotations

import io
import json
import os
import warnings
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import kiln
from kiln.driver.artifact import ArtifactError
from tests.helpers import make_model, write_signed_artifact

EXAMPLES = int(os.environ.get("KILN_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# -- integer edge values --------------------------------------------------------------------------------

INTEGER_TYPES = {np.int8: TensorProto.INT8, np.int16: TensorProto.INT16, np.int32: TensorProto.INT32,
                 np.int64: TensorProto.INT64, np.uint8: TensorProto.UINT8, np.uint32: TensorProto.UINT32}  # fmt: skip


def edge_values(dtype):
    info = np.iinfo(dtype)
    edges = {info.min, info.max, 0, 1, info.max - 1}
    if info.min < 0:
        edges |= {-1, info.min + 1}
    return st.one_of(st.sampled_from(sorted(edges)), st.integers(int(info.min), int(info.max)))


@st.composite
def integer_cases(draw):
    dtype = draw(st.sampled_from(list(INTEGER_TYPES)))
    op = draw(st.sampled_from(["Mod0", "Mod1", "Add", "Sub", "Mul", "Max", "Min", "Abs", "Neg"]))
    size = draw(st.integers(1, 12))
    a = np.array([draw(edge_values(dtype)) for _ in range(size)], dtype)
    b = np.array([draw(edge_values(dtype)) for _ in range(size)], dtype)
    return dtype, op, a, b


@FUZZ
@given(integer_cases())
def test_integer_ops_on_edge_values_match_the_reference_and_never_trap(case):
    dtype, op, a, b = case
    code = INTEGER_TYPES[dtype]
    if op.startswith("Mod"):
        node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=int(op[-1]))
    elif op in ("Abs", "Neg"):
        if op == "Neg" and np.iinfo(dtype).min == 0:
            return  # Neg is for signed types
        node = helper.make_node(op, ["a"], ["y"])
    else:
        node = helper.make_node(op, ["a", "b"], ["y"])
    inputs = [("a", code, [len(a)])] + ([("b", code, [len(b)])] if len(node.input) == 2 else [])
    model = make_model([node], inputs, [("y", code, [len(a)])])
    feeds = {"a": a, "b": b} if len(node.input) == 2 else {"a": a}
    with np.errstate(all="ignore"):
        want = kiln.compile(model, target="reference").run(feeds)["y"]
    got = kiln.compile(model).run(feeds)["y"]  # a trap here kills the test process: the failure
    np.testing.assert_array_equal(got, want)


# -- artifacts with hostile fields ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifact_members(tmp_path_factory):
    w = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 100
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, ["batch", 64])],
        [("y", TensorProto.FLOAT, ["batch", 8])],
        {"w": w},
    )
    path = tmp_path_factory.mktemp("fuzz-artifact") / "m.kiln"
    kiln.compile(model, dims={"batch": 1}).save(path)
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist() if name != "manifest.json"}


HOSTILE_VALUES = st.one_of(
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-5, 5), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(-(2**40), 2**40), max_size=3),
)


@st.composite
def hostile_meta(draw, members):
    meta = json.loads(members["meta.json"])
    kind = draw(st.sampled_from(["field", "variant", "nesting", "tensor", "drop"]))
    if kind == "field":
        meta[draw(st.sampled_from(sorted(meta)))] = draw(HOSTILE_VALUES)
    elif kind == "variant":
        meta["variants"] = draw(
            st.lists(st.dictionaries(st.sampled_from(["batch", "seq", ""]), HOSTILE_VALUES), max_size=3)
        )
    elif kind == "nesting":
        meta["variants"] = "NESTED"  # spliced in as text below (json itself cannot build it)
    elif kind == "drop":
        meta.pop(draw(st.sampled_from(sorted(meta))))
    changed = dict(members)
    text = json.dumps(meta)
    if kind == "nesting":
        depth = draw(st.integers(60, 200_000))
        text = text.replace('"NESTED"', "[" * depth + "]" * depth)
    changed["meta.json"] = text.encode()
    if kind == "tensor":
        shape = draw(st.lists(st.integers(0, 70), min_size=0, max_size=3))
        dtype = draw(st.sampled_from([np.float32, np.float16, np.int32, np.float64, np.uint8]))
        buffer = io.BytesIO()
        np.savez(buffer, t0=np.zeros(shape, dtype))
        changed["tensors.npz"] = buffer.getvalue()
    return changed


@FUZZ
@given(st.data())
def test_artifacts_with_hostile_fields_load_right_or_give_an_artifact_error(artifact_members, tmp_path, data):
    members = data.draw(hostile_meta(artifact_members))
    path = tmp_path / "hostile.kiln"
    write_signed_artifact(members, path)
    try:
        model = kiln.load(path)
    except ArtifactError:
        return
    # what loads must be the model: same answers as the unmodified artifact's source
    x = np.ones((1, 64), np.float32)
    want = np.ones((1, 64), np.float32) @ (np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 100)
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5)


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400"])
@pytest.mark.parametrize("field", ["opt_level", "version", "variants"])
def test_a_non_finite_number_in_an_artifacts_json_is_an_artifact_error(artifact_members, tmp_path, field, number):
    """JSON as Python reads it takes Infinity, NaN and 1e400 (an infinite float): int() of one was
    an OverflowError escaping the loader (found by the fuzzer above); kiln never writes one."""
    text = artifact_members["meta.json"].decode()
    meta = json.loads(text)
    meta[field] = "PLACEHOLDER" if field != "variants" else [{"batch": "PLACEHOLDER"}]
    path = tmp_path / "hostile.kiln"
    write_signed_artifact(
        {**artifact_members, "meta.json": json.dumps(meta).replace('"PLACEHOLDER"', number).encode()}, path
    )
    with pytest.raises(ArtifactError, match="damaged artifact|not a kiln artifact|newer|older"):
        kiln.load(path)


# -- torch modules that write their inputs and buffers -------------------------------------------------


@st.composite
def mutating_programs(draw):
    """A list of in-place steps over (x, buffer): what each step writes and with what."""
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["x", "buffer", "x[:, :1]", "buffer[1:]"]),  # what is written
                st.sampled_from(["add_", "mul_", "clamp_"]),
                st.floats(-2, 2, allow_nan=False, width=32),
            ),
            min_size=1,
            max_size=4,
        )
    )
    return steps, draw(st.integers(1, 3))


@FUZZ
@given(mutating_programs())
def test_torch_modules_writing_inputs_and_buffers_write_once_per_call(program):
    torch = pytest.importorskip("torch", reason="the torch.compile cases need torch (the zoo extra)")
    import kiln.torch_backend  # noqa: F401  (backend="kiln")

    steps, calls = program

    class Mutating(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", torch.arange(3, dtype=torch.float32))

        def forward(self, x):
            for where, method, value in steps:
                target = {"x": x, "buffer": self.state, "x[:, :1]": x[:, :1], "buffer[1:]": self.state[1:]}[where]
                if method == "clamp_":
                    target.clamp_(min=-abs(value) - 1, max=abs(value) + 1)
                else:
                    getattr(target, method)(value)
            return x.sum(dim=1) + self.state.sum()

    module, twin = Mutating(), Mutating()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kiln")
    for call in range(calls):
        x = torch.linspace(-1, 1, 6).reshape(2, 3) + call
        x_twin = x.clone()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a graph kiln cannot convert falls back, named: fine here
            got = compiled(x)
        want = twin(x_twin)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x, x_twin, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(module.state, twin.state, rtol=1e-5, atol=1e-5)
