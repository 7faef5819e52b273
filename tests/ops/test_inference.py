"""Type inference, written in the IR's text form: the parser builds the inputs, the registry infers."""

import numpy as np
import pytest

from kiln.errors import ShapeInferenceError
from kiln.ir.graph import Node, Value
from kiln.ir.types import DType, TensorType, parse_type
from kiln.ops import REGISTRY
from kiln.ops.inference import infer_node

SEED_OPS = (
    "Add And AveragePool Cast Concat Constant ConstantOfShape Conv Div Equal Erf Expand Flatten Gather "
    "GatherElements GatherND Gemm GlobalAveragePool GreaterOrEqual Identity IsNaN LayerNormalization "
    "LessOrEqual MatMul MaxPool Mul Pow ReduceMean Relu Reshape Shape Softmax Split Tanh Transpose Where"
).split()


def infer(op, input_types, attrs=None, values=None, outputs=1):
    inputs = [None if t is None else Value(f"in{i}", parse_type(t)) for i, t in enumerate(input_types)]
    placeholders = [Value(f"out{i}", TensorType(DType.FLOAT32, None)) for i in range(outputs)]
    node = Node(op, inputs, placeholders, attrs or {})
    known = [None if values is None else values.get(i) for i in range(len(inputs))]
    types, symbolic = infer_node(node, [None if v is None else v.type for v in inputs], known, [None] * len(inputs))
    return [str(t) for t in types], symbolic


def test_every_seed_model_op_is_registered():
    missing = [op for op in SEED_OPS if ("", op) not in REGISTRY]
    assert not missing


def test_registry_is_large_and_every_op_infers():
    assert len(REGISTRY) >= 190
    assert all(callable(d.infer) for d in REGISTRY.values())


@pytest.mark.parametrize(
    ("op", "types", "attrs", "expected"),
    [
        ("Add", ["f32[batch,768]", "f32[768]"], {}, "f32[batch,768]"),
        ("Add", ["f32[batch,1,4]", "f32[1,seq,4]"], {}, "f32[batch,seq,4]"),
        ("Equal", ["i64[batch,3]", "i64[]"], {}, "bool[batch,3]"),
        ("MatMul", ["f32[batch,seq,768]", "f32[768,3072]"], {}, "f32[batch,seq,3072]"),
        ("MatMul", ["f32[768]", "f32[768,10]"], {}, "f32[10]"),
        ("MatMul", ["f32[2,1,5,6]", "f32[3,6,7]"], {}, "f32[2,3,5,7]"),
        ("Gemm", ["f32[batch,2048]", "f32[1000,2048]", "f32[1000]"], {"transB": 1}, "f32[batch,1000]"),
        (
            "Conv",
            ["f32[batch,3,224,224]", "f32[64,3,7,7]"],
            {"strides": (2, 2), "pads": (3, 3, 3, 3)},
            "f32[batch,64,112,112]",
        ),
        ("Conv", ["f32[1,8,10,10]", "f32[8,2,3,3]"], {"group": 4, "auto_pad": "SAME_UPPER"}, "f32[1,8,10,10]"),
        ("Conv", ["f32[1,3,10,10]", "f32[4,3,3,3]"], {"dilations": (2, 2)}, "f32[1,4,6,6]"),
        (
            "MaxPool",
            ["f32[1,64,112,112]"],
            {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)},
            "f32[1,64,56,56]",
        ),
        ("AveragePool", ["f32[1,1,5,5]"], {"kernel_shape": (2, 2), "strides": (2, 2), "ceil_mode": 1}, "f32[1,1,3,3]"),
        ("GlobalAveragePool", ["f32[batch,2048,7,7]"], {}, "f32[batch,2048,1,1]"),
        ("ConvTranspose", ["f32[1,4,5,5]", "f32[4,2,3,3]"], {"strides": (2, 2)}, "f32[1,2,11,11]"),
        ("Flatten", ["f32[batch,2048,1,1]"], {"axis": 1}, "f32[batch,2048]"),
        ("Transpose", ["f32[batch,seq,12,64]"], {"perm": (0, 2, 1, 3)}, "f32[batch,12,seq,64]"),
        ("Concat", ["f32[batch,3]", "f32[batch,5]"], {"axis": 1}, "f32[batch,8]"),
        ("Gather", ["f32[30522,768]", "i64[batch,seq]"], {"axis": 0}, "f32[batch,seq,768]"),
        ("Softmax", ["f32[batch,12,seq,seq]"], {"axis": -1}, "f32[batch,12,seq,seq]"),
        ("Cast", ["i64[batch,seq]"], {"to": 1}, "f32[batch,seq]"),
        ("Einsum", ["f32[b,i,k]", "f32[b,k,j]"], {"equation": "bik,bkj->bij"}, "f32[b,i,j]"),
        ("Einsum", ["f32[3,4]"], {"equation": "ij"}, "f32[3,4]"),
        ("Einsum", ["f32[2,3,4]"], {"equation": "...ij->...ji"}, "f32[2,4,3]"),
        ("Where", ["bool[batch,1,1,seq]", "f32[]", "f32[batch,12,seq,seq]"], {}, "f32[batch,12,seq,seq]"),
        ("IsNaN", ["f16[4]"], {}, "bool[4]"),
    ],
)
def test_infer(op, types, attrs, expected):
    assert infer(op, types, attrs)[0] == [expected]


def test_reshape_uses_constant_shape_and_keeps_symbols():
    shape = {1: np.array([0, 0, 12, 64], np.int64)}
    assert infer("Reshape", ["f32[batch,seq,768]", "i64[4]"], values=shape)[0] == ["f32[batch,seq,12,64]"]
    flat = {1: np.array([-1, 768], np.int64)}
    (result,), _ = infer("Reshape", ["f32[4,128,768]", "i64[2]"], values=flat)
    assert result == "f32[512,768]"
    (symbolic,), _ = infer("Reshape", ["f32[batch,768]", "i64[2]"], values={1: np.array([-1, 768])})
    assert symbolic == "f32[batch,768]"
    with pytest.raises(ShapeInferenceError, match="cannot reshape"):
        infer("Reshape", ["f32[4,6]", "i64[2]"], values={1: np.array([5, 5])})


def test_shape_op_exposes_symbolic_contents():
    (result,), symbolic = infer("Shape", ["f32[batch,seq,768]"])
    assert result == "i64[3]"
    assert symbolic[0] == ("batch", "seq", 768)


def test_split_reduce_topk_and_unknown_sizes():
    assert infer("Split", ["f32[batch,10]"], {"axis": 1}, outputs=2)[0] == ["f32[batch,5]", "f32[batch,5]"]
    assert infer("Split", ["f32[5]"], {"num_outputs": 4}, outputs=4)[0] == ["f32[2]", "f32[2]", "f32[1]", "f32[0]"]
    axes = {1: np.array([-1])}
    assert infer("ReduceMean", ["f32[batch,seq,768]", "i64[1]"], {"keepdims": 1}, values=axes)[0] == [
        "f32[batch,seq,1]"
    ]
    assert infer("ReduceSum", ["f32[2,3]", "i64[1]"], {"keepdims": 0}, values={1: np.array([0])})[0] == ["f32[3]"]
    k = {1: np.array([3])}
    assert infer("TopK", ["f32[batch,10]", "i64[1]"], values=k, outputs=2)[0] == ["f32[batch,3]", "i64[batch,3]"]
    (nonzero,), _ = infer("NonZero", ["f32[4,5]"])
    assert nonzero.startswith("i64[2,") and "out0_n" in nonzero  # data-dependent: a fresh symbol


@pytest.mark.parametrize(
    ("op", "types", "attrs", "message"),
    [
        ("Add", ["f32[3]", "f32[4]"], {}, "cannot broadcast dims \\[3, 4\\]"),
        ("MatMul", ["f32[2,3]", "f32[4,5]"], {}, "inner dims differ"),
        ("Conv", ["f32[1,3,8,8]", "f32[4,2,3,3]"], {}, "input has 3 channels but the weight expects 2 x group 1"),
        ("Transpose", ["f32[2,3]"], {"perm": (0, 0)}, "not a permutation"),
        ("Concat", ["f32[2,3]", "f32[2]"], {"axis": 0}, "different ranks"),
        ("Gemm", ["f32[2,3,4]", "f32[4,5]"], {}, "2-D inputs"),
    ],
)
def test_inference_errors(op, types, attrs, message):
    with pytest.raises(ShapeInferenceError, match=message):
        infer(op, types, attrs)


def test_a_slice_to_a_length_read_from_a_shape_keeps_its_other_dims_and_broadcasts_to_that_length():
    """position_ids[:, :seq] (ends from Shape: symbolic contents) of a [1,512] table is
    [1, min(seq,512)] (not two fresh symbols); added to [batch,seq,64] it is seq: equal to seq, or
    1 and then so is seq, in every run that broadcasts."""
    data = Value("positions", parse_type("f32[1,512,64]"))
    starts, ends, axes = (Value(n, parse_type("i64[1]")) for n in ("starts", "ends", "axes"))
    node = Node("Slice", [data, starts, ends, axes], [Value("out", TensorType(DType.FLOAT32, None))], {})
    known = [None, np.array([0]), None, np.array([1])]
    types, _ = infer_node(node, [v.type for v in node.inputs], known, [None, None, ("seq",), None])
    assert [str(t) for t in types] == ["f32[1,min(512,seq),64]"]
    assert infer("Add", ["f32[batch,seq,64]", "f32[1,min(seq,512),64]"])[0] == ["f32[batch,seq,64]"]
    assert infer("Add", ["f32[1,min(seq,512),64]", "f32[1,min(512,seq),64]"])[0] == ["f32[1,min(512,seq),64]"]
    # another length is not the clamped one: a fresh symbol, as before
    assert infer("Add", ["f32[batch,other,64]", "f32[1,min(seq,512),64]"])[0] != ["f32[batch,other,64]"]
    node = Node("Slice", [data, starts, ends, axes], [Value("out", TensorType(DType.FLOAT32, None))], {})
    types, _ = infer_node(node, [v.type for v in node.inputs], [None, np.array([0]), None, np.array([1])], [None] * 4)
    assert str(types[0]).startswith("f32[1,") and str(types[0]).endswith(",64]")  # unknown ends: that dim alone


def test_range_over_a_size_is_that_size_long_and_a_squeezed_size_keeps_its_contents():
    """arange(seq) as the dynamo exporter writes it: Squeeze(Shape(x)[1:2]) -> Range(0, n, 1)."""
    size = Value("size", parse_type("i64[1]"))
    node = Node("Squeeze", [size], [Value("n", TensorType(DType.INT64, None))], {})
    types, symbolic = infer_node(node, [size.type], [None], [("seq",)])
    assert [str(t) for t in types] == ["i64[]"] and symbolic == {0: ("seq",)}
    ends = [Value(n, parse_type("i64[]")) for n in ("start", "limit", "delta")]
    node = Node("Range", ends, [Value("r", TensorType(DType.INT64, None))], {})
    types, _ = infer_node(node, [v.type for v in ends], [np.array(0), None, np.array(1)], [None, ("seq",), None])
    assert [str(t) for t in types] == ["i64[seq]"]
    types, _ = infer_node(node, [v.type for v in ends], [np.array(1), None, np.array(1)], [None, ("seq",), None])
    assert [str(t) for t in types] != ["i64[seq]"]  # 1..seq-1 is not seq long


def test_a_size_divided_by_a_number_is_one_name_wherever_it_is_computed():
    """``h // 4`` is ``h//4`` (Swin's window count: computed once for the partition and again for
    its reverse, so the two views agree), bound by specialize to the floor division; the names
    older kiln wrote (``h.d4``, ``h.x2``) read as the same expressions."""
    from kiln.ops.symbolic_dims import bound, floored

    size, four = Value("size", parse_type("i64[1]")), Value("four", parse_type("i64[1]"))
    node = Node("Div", [size, four], [Value("q", TensorType(DType.INT64, None))], {})
    _, symbolic = infer_node(node, [size.type, four.type], [None, np.array([4])], [("h",), None])
    assert symbolic == {0: ("h//4",)} and floored("h", 4) == "h//4" and floored("h", 1) == "h"
    assert floored("4*h", 4) == "h" and floored("h//2", 2) == "h//4"
    assert bound("h//4", {"h": 10}) == 2 and bound("h.x2.d4", {"h": 10}) == 5 and bound("h.d4", {}) == "h//4"


def test_a_piece_of_a_target_inference_cannot_name_leaves_the_others_their_names():
    """Concat(count, unknown, [16]): the count and 16 are kept, the unknown piece a fresh symbol
    (before: the whole target had no contents, so a view by it lost the count's name)."""
    count, unknown, width = (Value(n, parse_type("i64[1]")) for n in ("count", "rows", "width"))
    node = Node("Concat", [count, unknown, width], [Value("target", TensorType(DType.INT64, None))], {"axis": 0})
    _, symbolic = infer_node(
        node, [v.type for v in node.inputs], [None, None, np.array([16])], [("batch",), None, None]
    )
    first, middle, last = symbolic[0]
    assert (first, last) == ("batch", 16) and isinstance(middle, str) and middle not in ("batch", "rows")


def test_a_pad_by_amounts_computed_from_sizes_keeps_the_dims_it_does_not_pad():
    """Pad amounts [0, 0, 0, 0, 0, p, q, 0] with p, q known only at run time: the batch and the
    channels stay themselves, the padded dims are new (before: every dim a fresh symbol)."""
    data, pads = Value("x", parse_type("f32[batch,h,w,16]")), Value("pads", parse_type("i64[8]"))
    node = Node("Pad", [data, pads], [Value("padded", TensorType(DType.FLOAT32, None))], {})
    types, _ = infer_node(node, [data.type, pads.type], [None, None], [None, (0, 0, 0, 0, 0, "p", "q", 0)])
    dims = types[0].shape
    assert dims[0] == "batch" and dims[3] == 16 and dims[1] not in ("h", "p") and dims[2] not in ("w", "q")


def test_a_large_constant_sliced_or_transposed_is_not_read_as_shape_arithmetic(monkeypatch):
    """Shape inference keeps the contents of small integer tensors (shape vectors) through a Slice
    or Transpose; a large table (GPT-Neo's 2048x2048 causal mask, sliced in every layer and every
    lowering) is never turned into Python numbers for that (it cost 25 s of a 26 s compile)."""
    from kiln.ir.graph import Node, Value
    from kiln.ir.types import DType, TensorType
    from kiln.ops import registry
    from kiln.ops.inference import infer_node

    read = []
    original = registry.InferContext.integers_value

    def counting(self, index):  # type: ignore[no-untyped-def]
        found = original(self, index)
        read.append(0 if found is None else len(found))
        return found

    monkeypatch.setattr(registry.InferContext, "integers_value", counting)
    table = np.zeros((512, 512), np.int64)
    for op, extra, attrs in (
        ("Slice", [np.array([0]), np.array([7]), np.array([0])], {}),
        ("Transpose", [], {"perm": [1, 0]}),
    ):
        values = [Value("table", TensorType(DType.INT64, (512, 512)))]
        values += [Value(f"i{k}", TensorType(DType.INT64, (1,))) for k in range(len(extra))]
        node = Node(op, tuple(values), (Value("out", None),), attrs)
        (typed,), _ = infer_node(node, [v.type for v in values], [table, *extra], [None] * len(values))
        assert typed.shape == ((7, 512) if op == "Slice" else (512, 512))
    assert max(read, default=0) < 512 * 512
