import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.errors import InvalidModelError, KilnError, ModelLoadError, UnsupportedModelError
from kiln.frontend.onnx import import_onnx, load_model
from tests.helpers import FLOAT, INT64, make_model


def small_model(opset=17):
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="act")],
        [("x", FLOAT, ["batch", 4])],
        [("y", FLOAT, None)],
        {"w": weight},
        opset=opset,
    )


def test_load_from_path_bytes_and_proto_agree(tmp_path):
    model = small_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graphs = [import_onnx(model), import_onnx(model.SerializeToString()), import_onnx(str(path)), import_onnx(path)]
    assert all(g == graphs[0] for g in graphs)
    assert str(graphs[0].inputs[0].type) == "f32[batch,4]"
    assert str(graphs[0].outputs[0].type) == "f32[batch,3]"


def test_external_data_files_are_loaded(tmp_path):
    model = small_model()
    path = tmp_path / "external.onnx"
    onnx.save(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0
    )
    assert (tmp_path / "weights.bin").exists()
    compiled = kiln.compile(str(path))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(compiled(x), np.maximum(x @ np.arange(12, dtype=np.float32).reshape(4, 3), 0))


def test_external_data_is_read_tensor_by_tensor_and_never_relative_to_the_working_directory(tmp_path, monkeypatch):
    """A file's external tensors are read from its folder as the import converts them (the model's
    message never holds them); a model given as bytes or a message whose tensors name an external
    file is refused with a named error (its data is not read from wherever the process runs)."""
    model = small_model()
    path = tmp_path / "external.onnx"
    onnx.save(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    loaded, _ = load_model(path)
    assert all(not init.raw_data for init in loaded.graph.initializer)  # (left in the file)
    assert import_onnx(path) == import_onnx(small_model())  # (onnx.save moved the first one's data out)
    pointing = onnx.load(str(path), load_external_data=False)
    monkeypatch.chdir(tmp_path)  # (weights.bin is right here: still not read)
    for source in (pointing, pointing.SerializeToString()):
        with pytest.raises(KilnError, match="external file: compile the model from its .onnx file's path"):
            import_onnx(source)


def test_truncated_and_non_onnx_files_name_the_file(tmp_path):
    data = small_model().SerializeToString()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated.onnx: not a valid ONNX model"):
        import_onnx(truncated)
    text = tmp_path / "notes.txt"
    text.write_text("this is not a model")
    with pytest.raises(ModelLoadError, match="notes.txt"):
        import_onnx(text)
    with pytest.raises(ModelLoadError, match="no such file"):
        import_onnx(tmp_path / "missing.onnx")
    with pytest.raises(ModelLoadError, match="is a directory"):
        import_onnx(tmp_path)
    with pytest.raises(ModelLoadError, match="<bytes>"):
        import_onnx(b"\x00\x01garbage")


def test_all_unsupported_constructs_are_reported_at_once():
    nodes = [
        helper.make_node("FancyOp", ["x"], ["a"], name="first_unknown"),
        helper.make_node("Relu", ["a"], ["b"], name="downstream"),
        helper.make_node("OtherOp", ["x"], ["c"], name="second_unknown"),
        helper.make_node("Relu", ["x"], ["d"], name="bad_attr", alpha=1.0),
        helper.make_node("Add", ["b", "c"], ["y"], name="join"),
    ]
    model = make_model(nodes, [("x", FLOAT, [2])], [("y", FLOAT, None), ("d", FLOAT, None)])
    with pytest.raises(UnsupportedModelError) as info:
        import_onnx(model)
    problems = info.value.problems
    assert len(problems) == 3, problems
    assert "node 'first_unknown' (op FancyOp, opset 17) with inputs x: f32[2]: unknown op" in problems[0]
    assert "node 'second_unknown' (op OtherOp, opset 17) with inputs x: f32[2]: unknown op" in problems[1]
    assert "node 'bad_attr' (op Relu, opset 17) with inputs x: f32[2]: attribute(s) alpha not supported" in problems[2]


def test_undefined_value_and_cycle_are_invalid():
    undefined = make_model(
        [helper.make_node("Relu", ["ghost"], ["y"], name="r")], [("x", FLOAT, [2])], [("y", FLOAT, None)]
    )
    with pytest.raises(InvalidModelError, match="node 'r' .*\\['ghost'\\] are not defined before use"):
        import_onnx(undefined)
    cyclic = make_model(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="first"),
            helper.make_node("Relu", ["a"], ["b"], name="second"),
        ],
        [("x", FLOAT, [2])],
        [("b", FLOAT, None)],
    )
    with pytest.raises(InvalidModelError, match="node 'first' .*\\['b'\\] are not defined before use .*a cycle"):
        import_onnx(cyclic)


def test_shape_errors_name_the_node():
    model = make_model(
        [helper.make_node("Add", ["x", "z"], ["y"], name="bad_add")],
        [("x", FLOAT, [3]), ("z", FLOAT, [4])],
        [("y", FLOAT, None)],
    )
    with pytest.raises(
        InvalidModelError,
        match="node 'bad_add' \\(op Add, opset 17\\) with inputs x: f32\\[3\\], z: f32\\[4\\]: cannot broadcast",
    ):
        import_onnx(model)


def test_missing_domain_is_unsupported():
    model = make_model(
        [helper.make_node("Foo", ["x"], ["y"], domain="com.example")], [("x", FLOAT, [2])], [("y", FLOAT, None)]
    )
    with pytest.raises(UnsupportedModelError, match="domain 'com.example' is not imported"):
        import_onnx(model)


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the 'peers' extra) is needed for this comparison")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_reduce_sum_and_mean_forms_across_opsets(opset):
    # ReduceSum took axes as an attribute before opset 13, ReduceMean before 18.
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    nodes, inits = [], {}
    if opset < 13:
        nodes.append(helper.make_node("ReduceSum", ["x"], ["s"], axes=[1], keepdims=0))
    else:
        inits["axes"] = np.array([1], np.int64)
        nodes.append(helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0))
    if opset < 18:
        nodes.append(helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]))
    else:
        inits["last"] = np.array([-1], np.int64)
        nodes.append(helper.make_node("ReduceMean", ["x", "last"], ["m"]))
    model = make_model(nodes, [("x", FLOAT, [2, 3, 4])], [("s", FLOAT, None), ("m", FLOAT, None)], inits, opset=opset)
    out = kiln.compile(model).run({"x": x})
    np.testing.assert_allclose(out["s"], x.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(out["m"], x.mean(axis=-1, keepdims=True), rtol=1e-6)
    for got, expected in zip(out.values(), _ort(model, {"x": x})):
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_softmax_before_opset_13_flattens_at_axis():
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    model = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", FLOAT, [2, 3, 4])], [("y", FLOAT, None)], opset=11
    )
    got = kiln.compile(model)(x)
    flat = x.reshape(2, 12)
    expected = (np.exp(flat) / np.exp(flat).sum(axis=1, keepdims=True)).reshape(2, 3, 4)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(got, _ort(model, {"x": x})[0], rtol=1e-5)


def test_split_and_squeeze_attribute_forms():
    x = np.arange(12, dtype=np.float32).reshape(1, 12)
    model = make_model(
        [
            helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[4, 8]),
            helper.make_node("Squeeze", ["a"], ["s"], axes=[0]),
        ],
        [("x", FLOAT, [1, 12])],
        [("s", FLOAT, None), ("b", FLOAT, None)],
        opset=11,
    )
    compiled = kiln.compile(model)
    assert [str(v.type) for v in compiled.graph.outputs] == ["f32[4]", "f32[1,8]"]
    s, b = compiled(x)
    np.testing.assert_array_equal(s, x[0, :4])
    np.testing.assert_array_equal(b, x[:, 4:])


def test_shape_subgraph_keeps_symbolic_batch():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write it.
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "zero_axes"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "zero_axes": np.array([0], np.int64), "rest": np.array([12, 64], np.int64)}
    model = make_model(nodes, [("x", FLOAT, ["batch", "seq", 768])], [("y", FLOAT, None)], inits)
    compiled = kiln.compile(model)
    assert str(compiled.graph.outputs[0].type) == "f32[batch,12,64]"
    x = np.ones((2, 1, 768), np.float32)
    assert compiled(x).shape == (2, 12, 64)


def test_constant_nodes_become_constants_and_int64_inputs_work():
    value = numpy_helper.from_array(np.array([1, 2, 3], np.int64))
    model = make_model(
        [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])],
        [("x", INT64, [3])],
        [("y", INT64, None)],
    )
    compiled = kiln.compile(model)
    assert not compiled.graph.nodes[0].op == "Constant"
    np.testing.assert_array_equal(compiled(np.array([1, 1, 1])), [2, 3, 4])


def test_legacy_broadcast_before_opset_7_aligns_at_axis():
    # Add-6 with broadcast=1, axis=1: B [3,4] lines up with A's dims 1 and 2.
    a = np.random.default_rng(2).standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    model = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)],
        [("a", FLOAT, [2, 3, 4, 5]), ("b", FLOAT, [3, 4])],
        [("y", FLOAT, None)],
        opset=6,
    )
    np.testing.assert_allclose(kiln.compile(model)(a, b), a + b.reshape(1, 3, 4, 1), rtol=1e-6)


def test_unknown_element_types_are_reported_not_raised():
    # found by the fuzzer: a flipped byte turned an input's element type into code 27
    from onnx import TensorProto, helper

    from kiln.errors import UnsupportedModelError
    from kiln.frontend.onnx import import_onnx

    info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    info.type.tensor_type.elem_type = 27
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [info],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedModelError, match="graph input 'x'.*element type code 27"):
        import_onnx(model.SerializeToString())


def test_non_utf8_names_in_a_damaged_model_are_not_a_crash():
    # found by the fuzzer: a flipped byte made the graph's name invalid UTF-8
    from onnx import TensorProto, helper

    import kiln
    from kiln.errors import KilnError

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "QQQQ",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    raw = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    damaged = raw.replace(b"QQQQ", b"\xff\xfe\xfd\xfc")
    try:
        model = kiln.compile(damaged)
    except KilnError:
        return
    assert model(np.array([-1.0, 2.0], np.float32)).tolist() == [0.0, 2.0]


@pytest.mark.parametrize(
    "nodes,inits,input_shape,message",
    [
        (
            [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")],
            {},
            [2],
            r"node 'b' .*output\(s\) \['y'\] are already defined",
        ),
        (
            [helper.make_node("Softmax", ["x"], ["y"], name="s", axis="q")],
            {},
            [2],
            "attribute 'axis' must be int, got string",
        ),
        (
            [helper.make_node("Softmax", ["x"], ["y"], name="s", axis=3)],
            {},
            [2],
            "axis 3 is out of range for input %x of rank 1",
        ),
        (
            [helper.make_node("Conv", ["x", "w"], ["y"], name="c", strides=[0, 1])],
            {"w": np.ones((1, 1, 2, 2), np.float32)},
            [1, 1, 4, 4],
            r"node 'c' \(op Conv, opset 17\) with inputs x: f32\[1,1,4,4\], w: f32\[1,1,2,2\]: strides \[0, 1\] must be integers >= 1",
        ),
        (
            [helper.make_node("Conv", ["x", "w"], ["y"], name="c", group=2)],
            {"w": np.ones((3, 1, 2, 2), np.float32)},
            [1, 2, 4, 4],
            "3 output channels, not a multiple of group 2",
        ),
        ([helper.make_node("Relu", ["x"], ["y"], name="r")], {}, [2**30, 2**30], "over kiln's limit"),
        (
            [helper.make_node("Expand", ["x", "s"], ["y"], name="e")],
            {"s": np.array([2**40, 2**30], np.int64)},
            [1],
            r"node 'e' .*output 0 would be f32\[1099511627776,1073741824\]",
        ),
        (
            [helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
            {"s": np.array([2.0], np.float64)},
            [2],
            r"input %s is f64, which the Reshape schema does not allow there \(int64\)",
        ),
    ],
    ids=[
        "second-producer",
        "attribute-kind",
        "axis",
        "zero-stride",
        "group",
        "huge-input",
        "huge-output",
        "schema-dtype",
    ],
)
def test_malformed_graphs_are_invalid_with_the_node_and_types_named(nodes, inits, input_shape, message):
    model = make_model(nodes, [("x", FLOAT, input_shape)], [("y", FLOAT, None)], inits)
    with pytest.raises(InvalidModelError, match=message):
        import_onnx(model)
