"""Op categories live on the registry: what passes and lowering ask of an op."""

from kiln.ops.registry import has_trait, ops_with


def test_categories_are_registry_traits():
    assert has_trait("Relu", "", "layout_free") and not has_trait("Add", "", "layout_free")
    assert has_trait("Add", "", "elementwise") and not has_trait("MatMul", "", "elementwise")
    assert has_trait("ReduceSum", "", "accumulating") and has_trait("Softmax", "", "axis")
    assert has_trait("Fused", "kiln", "contracting") and has_trait("Einsum", "", "contracting")
    assert ops_with("nondeterministic") >= {"RandomNormal", "RandomUniformLike", "Bernoulli"}
    assert has_trait("Conv", "", "anchor") and has_trait("MatMul", "", "anchor")
