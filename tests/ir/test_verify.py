import numpy as np
import pytest

from kiln.errors import VerificationError
from kiln.ir.graph import Graph, Node, Value, topological_order
from kiln.ir.parser import parse_graph
from kiln.ir.types import DType, tensor
from kiln.ops.verify import verify

F = DType.FLOAT32


def test_valid_graph_passes():
    graph = parse_graph("""
graph g(%x: f32[batch,3]) -> (%y) {
  %a: f32[batch,3] = Relu(%x)
  %y: f32[batch,3] = Add(%a, %x)
}""")
    assert verify(graph) is graph


def test_cycle_is_reported():
    x = Value("x", tensor(F, 2))
    a = Value("a", tensor(F, 2))
    b = Value("b", tensor(F, 2))
    first = Node("Add", [x, b], [a], name="first")
    second = Node("Relu", [a], [b], name="second")
    graph = Graph([x], [b], [first, second])
    with pytest.raises(VerificationError, match="'first' .*%b is produced later by 'second'"):
        verify(graph)
    with pytest.raises(ValueError, match="cycle"):
        topological_order([first, second])


def test_undefined_value_and_double_definition_are_all_reported():
    x = Value("x", tensor(F, 2))
    ghost = Value("ghost", tensor(F, 2))
    y = Value("y", tensor(F, 2))
    graph = Graph([x], [y], [Node("Add", [x, ghost], [y], name="uses_ghost"), Node("Relu", [x], [y], name="again")])
    with pytest.raises(VerificationError) as info:
        verify(graph)
    problems = info.value.problems
    assert any("%ghost is never defined" in p for p in problems)
    assert any("%y is defined more than once" in p for p in problems)


def test_types_inconsistent_with_inference_are_reported():
    graph = parse_graph("""
graph g(%x: f32[2,3], %w: f32[3,5]) -> (%y) {
  %y: f32[2,4] = MatMul(%x, %w) name="mm"
}""")
    with pytest.raises(VerificationError, match="'mm' .*f32\\[2,4\\] but inference gives f32\\[2,5\\]"):
        verify(graph)
    wrong_dtype = parse_graph("""
graph g(%x: f32[2]) -> (%y) {
  %y: i64[2] = Relu(%x)
}""")
    with pytest.raises(VerificationError, match="dtype differs"):
        verify(wrong_dtype)


def test_unknown_op_arity_and_attribute_are_reported():
    graph = parse_graph("""
graph g(%x: f32[2]) -> (%y) {
  %a: f32[2] = NoSuchOp(%x)
  %b: f32[2] = Relu(%x, %x)
  %y: f32[2] = Relu(%x) {alpha=1.0}
}""")
    with pytest.raises(VerificationError) as info:
        verify(graph)
    text = str(info.value)
    assert "NoSuchOp" in text and "unknown op" in text
    assert "2 inputs, expected 1..1" in text
    assert "unknown attribute(s) ['alpha']" in text


def test_undefined_output_and_constant_mismatch():
    x = Value("x", tensor(F, 2))
    c = Value("c", tensor(F, 3))
    out = Value("out", tensor(F, 2))
    graph = Graph([x], [out], [], {c: np.zeros(2, np.float32)})
    with pytest.raises(VerificationError) as info:
        verify(graph)
    assert "output %out is never defined" in str(info.value)
    assert "constant %c" in str(info.value)
