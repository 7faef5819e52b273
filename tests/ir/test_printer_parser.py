import numpy as np
import pytest

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.parser import ParseError, parse_graph
from kiln.ir.printer import print_graph, tensor_data
from kiln.ir.types import DType, OptionalType, SequenceType, TensorType, parse_type, tensor

TEXT = """
graph main(%x: f32[batch,4], %ids: i64[batch]) -> (%y, %s) opsets {"": 17} {
  const %w: f32[4,4] = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
  const %shape: i64[2] = [-1, 4]
  %h: f32[batch,4] = MatMul(%x, %w) name="mm/0"
  %r: f32[batch,4] = Reshape(%h, %shape) {allowzero=0}
  %y: f32[batch,4] = Relu(%r)
  %s: f32[batch,2], %t: f32[batch,2] = Split(%y, _) {axis=1, num_outputs=2}
}
"""


def test_parse_print_round_trip_is_exact():
    graph = parse_graph(TEXT)
    text = print_graph(graph)
    again = parse_graph(text, tensor_data(graph))
    assert print_graph(again) == text
    assert again == graph
    assert again.digest == graph.digest


def test_parsed_graph_structure():
    graph = parse_graph(TEXT)
    assert [v.name for v in graph.inputs] == ["x", "ids"]
    assert graph.inputs[0].type == tensor(DType.FLOAT32, "batch", 4)
    assert [n.op for n in graph.nodes] == ["MatMul", "Reshape", "Relu", "Split"]
    assert graph.nodes[0].name == "mm/0"
    assert graph.nodes[3].inputs[1] is None
    assert graph.nodes[3].attrs == {"axis": 1, "num_outputs": 2}
    np.testing.assert_array_equal(graph.constants[graph.find_value("shape")], [-1, 4])


def test_large_constants_print_by_reference():
    weights = np.arange(100, dtype=np.float32).reshape(10, 10)
    x = Value("x", tensor(DType.FLOAT32, 2, 10))
    w = Value("w", tensor(DType.FLOAT32, 10, 10))
    y = Value("y", tensor(DType.FLOAT32, 2, 10))
    graph = Graph([x], [y], [Node("MatMul", [x, w], [y])], {w: weights})
    text = print_graph(graph)
    assert "const %w: f32[10,10]\n" in text  # no data in the text
    with pytest.raises(ParseError, match="no data for constant %w"):
        parse_graph(text)
    assert parse_graph(text, tensor_data(graph)) == graph


def test_structural_equality_ignores_names_but_not_structure():
    renamed = TEXT.replace("%h", "%hidden").replace('name="mm/0"', 'name="other"')
    assert parse_graph(renamed) == parse_graph(TEXT)
    changed = TEXT.replace("Relu(%r)", "Sigmoid(%r)")
    assert parse_graph(changed) != parse_graph(TEXT)
    other_weight = TEXT.replace("[1.0, 0.0, 0.0, 0.0, 0.0, 1.0", "[2.0, 0.0, 0.0, 0.0, 0.0, 1.0")
    assert parse_graph(other_weight) != parse_graph(TEXT)
    other_attr = TEXT.replace("{axis=1, num_outputs=2}", "{axis=0, num_outputs=2}")
    assert parse_graph(other_attr) != parse_graph(TEXT)
    assert len({parse_graph(TEXT), parse_graph(renamed)}) == 1


def test_subgraphs_and_attribute_kinds_round_trip():
    text = """
graph g(%c: bool[], %x: f32[3]) -> (%out) opsets {"": 17} {
  %out: f32[3] = If(%c) {else_branch=graph e() -> (%n) opsets {"": 17} {
    %n: f32[3] = Neg(%x)
  }, then_branch=graph t() -> (%p) opsets {"": 17} {
    %p: f32[3] = Abs(%x)
  }}
  %z: f32[2] = ConstantOfShape(%x) {value=tensor<f32[1]>[0.5], ratios=[0.5, 1.5], mode="reflect", big=1e+20, neg=-inf, s=["a", "b"]}
}
"""
    graph = parse_graph(text)
    assert parse_graph(print_graph(graph)) == graph
    node = graph.nodes[1]
    assert node.attrs["ratios"] == (0.5, 1.5)
    assert node.attrs["s"] == ("a", "b")
    assert node.attrs["neg"] == float("-inf")
    np.testing.assert_array_equal(node.attrs["value"], np.array([0.5], np.float32))
    assert graph.nodes[0].attrs["then_branch"].nodes[0].inputs[0] is graph.inputs[1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("graph g(%x: f32[2]) -> (%y) {\n  %y: f32[2] = Relu(%q)\n}", "line 2.*%q is used before it is defined"),
        ("graph g(%x: f32[2]) -> (%y) {\n}", "output %y is never defined"),
        ("graph g(%x: f99[2]) -> (%x) {}", "unknown dtype 'f99'"),
        ("graph g(%x: f32[2]) -> (%x) {\n  %x: f32[2] = Relu(%x)\n}", "%x is defined twice"),
        ("graph g(%x: f32[2]) -> (%x) { $ }", "unexpected character"),
        ("graph g(%x: f32[2]) -> (%x) {\n  const %c: f32[2] = [1.0]\n}", "1 values for type f32\\[2\\]"),
    ],
)
def test_parse_errors_say_where(text, message):
    with pytest.raises(ParseError, match=message):
        parse_graph(text)


def test_types_parse_and_print():
    for text in ["f32[batch,768]", "i64[]", "f32[...]", "seq<f32[3]>", "opt<seq<i64[n]>>", "bf16[2,2]"]:
        assert str(parse_type(text)) == text
    assert parse_type("seq<f32[3]>") == SequenceType(tensor(DType.FLOAT32, 3))
    assert parse_type("opt<f32[...]>") == OptionalType(TensorType(DType.FLOAT32, None))
    with pytest.raises(ValueError, match="negative dim"):
        tensor(DType.FLOAT32, -1)
    with pytest.raises(ValueError, match="invalid dim"):
        tensor(DType.FLOAT32, "not a symbol")
