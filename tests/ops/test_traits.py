"""Op traits live on the op's definition; passes and lowerings ask for them instead of keeping
lists of names. A fusable op needs exactly one line of scalar semantics (kiln.lower.pointwise)."""

import pytest

from kiln.lower.pointwise import FLOAT_OPS
from kiln.ops.registry import declare_trait, has_trait, ops_with


def test_every_fusable_op_has_one_line_of_scalar_semantics():
    # (Clip reads its optional bounds from inputs: scalarize_for builds it from Max and Min)
    missing = sorted(op for op in ops_with("fusable") if op not in FLOAT_OPS and op != "Clip")
    assert missing == []
    assert {"Add", "Relu", "Gelu", "Clip"} <= ops_with("fusable")


def test_traits_describe_what_passes_and_lowerings_rely_on():
    assert ops_with("anchor") == {"Conv", "MatMul"} == ops_with("tunable")
    assert ops_with("reshape") == {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
    assert ops_with("alias") == ops_with("reshape") | {"Identity", "Dropout"}
    assert has_trait("Relu", "", "fusable") and not has_trait("Relu", "com.example", "fusable")
    assert not has_trait("Softmax", "", "fusable")


def test_an_unknown_trait_or_op_is_refused():
    with pytest.raises(ValueError, match="unknown op trait"):
        declare_trait("fast", ["Relu"])
    with pytest.raises(KeyError):
        declare_trait("fusable", ["NoSuchOp"])
