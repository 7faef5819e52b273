"""kiln.passes.batching: which symbolic dims are sample-parallel (each output sample computed from
its own input sample alone), and the node that refuses the others."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.driver.sizes import Chunking
from kiln.ir.parser import parse_graph
from kiln.passes.batching import Parallel, Refused, sample_parallel

RNG = np.random.default_rng(0)
WEIGHTS = {
    "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
    "fc": RNG.standard_normal((4, 5)).astype(np.float32),
}


def analysed(body: str, inputs: str = "%x: f32[batch,3,6,6]", outputs: str = "%y") -> Parallel | Refused:
    graph = parse_graph(
        f"""
graph g({inputs}) -> ({outputs}) {{
  const %w: f32[4,3,3,3]
  const %fc: f32[4,5]
{body}
}}""",
        WEIGHTS,
    )
    return sample_parallel(graph)["batch"]


def test_a_small_cnn_is_sample_parallel_with_its_shape_arithmetic():
    """Conv -> Relu -> global pool -> a Reshape to [Shape(x)[0], -1] (the count of samples as a
    target shape, as exporters write flatten) -> MatMul: the samples' dim is axis 0 in and out."""
    found = analysed(
        """
  const %zero: i64[] = [0]
  const %axes: i64[1] = [0]
  const %rest: i64[1] = [-1]
  %c: f32[batch,4,4,4] = Conv(%x, %w)
  %r: f32[batch,4,4,4] = Relu(%c)
  %p: f32[batch,4,1,1] = GlobalAveragePool(%r)
  %s: i64[4] = Shape(%x)
  %d0: i64[] = Gather(%s, %zero) {axis=0}
  %d: i64[1] = Unsqueeze(%d0, %axes)
  %target: i64[2] = Concat(%d, %rest) {axis=0}
  %f: f32[batch,4] = Reshape(%p, %target)
  %y: f32[batch,5] = MatMul(%f, %fc)"""
    )
    assert found == Parallel("batch", (0,), (0,))


def test_a_dim_merged_with_the_next_and_split_again_stays_sample_parallel():
    """[batch,4,3] -> [batch*4,3] (attention's heads folded into the batch) -> Softmax over the
    last dim -> [batch,12]: the merged dim holds 4 indices per sample."""
    found = analysed(
        """
  const %merge: i64[2] = [-1, 3]
  const %split: i64[2] = [-1, 12]
  %m: f32[n,3] = Reshape(%x, %merge)
  %s: f32[n,3] = Softmax(%m) {axis=-1}
  %y: f32[batch,12] = Reshape(%s, %split)""",
        inputs="%x: f32[batch,4,3]",
    )
    assert found == Parallel("batch", (0,), (0,))


MIXING = [
    ("a mean over the samples", "%y: f32[1,3,6,6] = ReduceMean(%x, %ax) {keepdims=1}", "along the samples"),
    ("a softmax over the samples", "%y: f32[batch,3,6,6] = Softmax(%x) {axis=0}", "along the samples"),
    ("samples concatenated along their own dim", "%y: f32[b2,3,6,6] = Concat(%x, %x) {axis=0}", "along the samples"),
    (
        "a product contracting the samples",
        "%t: f32[3,6,6,batch] = Transpose(%x) {perm=[1, 2, 3, 0]}\n  %y: f32[3,6,6,6] = MatMul(%t, %x6)",
        "contracts over",
    ),
    (
        "a reshape moving elements across the samples",
        "%y: f32[3,q] = Reshape(%x, %three)",
        "moves elements across",
    ),
    (
        "the count of samples used as a number",
        "%s: i64[4] = Shape(%x)\n  %n: i64[] = Gather(%s, %zero) {axis=0}\n  %f: f32[] = Cast(%n) {to=1}\n"
        "  %y: f32[batch,3,6,6] = Div(%x, %f)",
        "computed from their count",
    ),
    (
        "indices counted over the samples",
        "%s: i64[4] = Shape(%x)\n  %n: i64[] = Gather(%s, %zero) {axis=0}\n  %y: i64[k] = Range(%zero, %n, %one)",
        "computed from the count",
    ),
]


@pytest.mark.parametrize(("why", "body", "reason"), MIXING, ids=[m[0] for m in MIXING])
def test_whatever_mixes_samples_is_refused_naming_its_node(why, body, reason):
    found = analysed(
        """
  const %ax: i64[1] = [0]
  const %zero: i64[] = [0]
  const %one: i64[] = [1]
  const %three: i64[2] = [3, -1]
  """
        + body,
        inputs="%x: f32[batch,3,6,6]" + (", %x6: f32[batch,6]" if "%x6" in body else ""),
    )
    assert isinstance(found, Refused), why
    assert found.__traceback__ is None  # (models keep refusals: their frames would hold the graph's weights)
    assert found.node in ("y", "<unnamed Range -> y>") or found.node.endswith("-> y>"), found  # where, and why
    assert reason in found.reason, found


def test_an_unknown_op_reading_samples_is_refused_not_guessed():
    graph = parse_graph(
        """
graph g(%x: f32[batch,3]) -> (%y) {
  %y: f32[batch,3] = Einsum(%x) {equation="bi->bi"}
}""",
        {},
    )
    found = sample_parallel(graph)["batch"]
    assert isinstance(found, Refused) and "cannot tell" in found.reason


def _onnx(nodes, inputs, outputs, constants):  # type: ignore[no-untyped-def]
    """An ONNX model imported by kiln's frontend: its types are kiln's inference, not declared."""
    from onnx import helper

    from kiln.frontend.onnx import import_onnx
    from tests.helpers import make_model

    model = make_model(
        [helper.make_node(*n[:3], **(n[3] if len(n) > 3 else {})) for n in nodes], inputs, outputs, constants
    )
    return import_onnx(model.SerializeToString())


# b1 = [[0], [1], ..., [count-1]]: each sample's number, from the mask's shape
SAMPLE_NUMBERS = [
    ("Shape", ["mask"], ["s"]),
    ("Gather", ["s", "zero"], ["n"], {"axis": 0}),
    ("Range", ["zero", "n", "one"], ["b"]),
    ("Unsqueeze", ["b", "axes"], ["b1"]),
]


def _mask_lookup(offsets: list[int]):  # type: ignore[no-untyped-def]
    """The exporters' per-sample mask lookup: flat_mask[b*4 + j] for j in ``offsets``, b in
    Range(0, count), gathered from the [batch, 4] mask flattened to [batch*4]."""
    from tests.helpers import INT64

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    return _onnx(
        [
            *SAMPLE_NUMBERS,
            ("Mul", ["b1", "four"], ["start"]),
            ("Add", ["start", "offsets"], ["index"]),
            ("Reshape", ["mask", "flat"], ["m"]),
            ("Gather", ["m", "index"], ["y"], {"axis": 0}),
        ],
        [("mask", INT64, ["batch", 4])],
        [("y", INT64, None)],
        {
            "zero": np.array(0, np.int64),
            "one": np.array(1, np.int64),
            "four": np.array(4, np.int64),
            "axes": i64(1),
            "offsets": np.array([offsets], np.int64),
            "flat": i64(-1),
        },
    )


def test_per_sample_indices_into_each_samples_own_block_are_sample_parallel():
    found = sample_parallel(_mask_lookup([3, 2, 1, 0]))["batch"]
    assert found == Parallel("batch", (0,), (0,))


def test_indices_reaching_into_the_next_samples_block_are_refused():
    found = sample_parallel(_mask_lookup([1, 2, 3, 4]))["batch"]  # 4: the next sample's first
    assert isinstance(found, Refused) and "per-sample indices" in found.reason


def test_equal_and_where_on_shape_vectors_keep_the_symbol_in_expands_type():
    """Where(shape == -1, 1, shape) before an Expand (the exporters' spelling of expand_as): a
    size is never -1, so the Expand's inferred type keeps batch, and the analysis follows it."""
    from tests.helpers import FLOAT

    graph = _onnx(
        [
            ("Shape", ["x"], ["s"]),
            ("Gather", ["s", "zero"], ["n"], {"axis": 0}),
            ("Unsqueeze", ["n", "axes"], ["n1"]),
            ("Concat", ["n1", "three"], ["target"], {"axis": 0}),
            ("Reshape", ["target", "flat"], ["target2"]),
            ("Equal", ["target2", "minus"], ["is"]),
            ("Where", ["is", "ones", "target2"], ["shape"]),
            ("Expand", ["w", "shape"], ["e"]),
            ("Add", ["x", "e"], ["y"]),
        ],
        [("x", FLOAT, ["batch", 3])],
        [("y", FLOAT, None)],
        {
            "zero": np.array(0, np.int64),
            "axes": np.array([0], np.int64),
            "three": np.array([3], np.int64),
            "flat": np.array([-1], np.int64),
            "minus": np.array([-1, -1], np.int64),
            "ones": np.array([1, 1], np.int64),
            "w": np.array([[1, 2, 3]], np.float32),
        },
    )
    expand = next(n for n in graph.nodes if n.op == "Expand")
    assert expand.outputs[0].type.shape == ("batch", 3)
    assert sample_parallel(graph)["batch"] == Parallel("batch", (0,), (0,))


def _tuple_lookup(clamp: int | None):  # type: ignore[no-untyped-def]
    """The dynamo exports' mask[b, j] lookup: (Range(0, count), j) tuples for GatherND; with
    ``clamp``, the sample numbers go through Max(b, clamp) first."""
    from tests.helpers import INT64

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        ("Shape", ["mask"], ["s"]),
        ("Gather", ["s", "zero"], ["n"], {"axis": 0}),
        ("Range", ["zero", "n", "one"], ["b"]),
        ("Unsqueeze", ["b", "axes1"], ["b1"]),
        ("Unsqueeze", ["n", "axes0"], ["n1"]),
        ("Concat", ["n1", "four"], ["target"], {"axis": 0}),
    ]
    if clamp is not None:
        nodes.append(("Max", ["b1", "clamp"], ["b1c"]))
    source = "b1c" if clamp is not None else "b1"
    nodes += [
        ("Expand", [source, "target"], ["bb"]),
        ("Expand", ["j", "target"], ["jj"]),
        ("Unsqueeze", ["bb", "last"], ["bb1"]),
        ("Unsqueeze", ["jj", "last"], ["jj1"]),
        ("Concat", ["bb1", "jj1"], ["index"], {"axis": -1}),
        ("GatherND", ["mask", "index"], ["y"]),
    ]
    return _onnx(
        nodes,
        [("mask", INT64, ["batch", 4])],
        [("y", INT64, None)],
        {
            "zero": np.array(0, np.int64),
            "one": np.array(1, np.int64),
            "axes0": i64(0),
            "axes1": i64(1),
            "last": i64(-1),
            "four": i64(4),
            "j": np.array([[3, 2, 1, 0]], np.int64),
            "clamp": np.array(clamp or 0, np.int64),
        },
    )


def test_index_tuples_led_by_the_sample_number_are_sample_parallel():
    assert sample_parallel(_tuple_lookup(None))["batch"] == Parallel("batch", (0,), (0,))
    assert sample_parallel(_tuple_lookup(0))["batch"] == Parallel("batch", (0,), (0,))  # Max(b, 0): b


def test_sample_numbers_a_max_changes_are_refused():
    """Max(b, 2) is b for samples 2.. of the whole batch but 2 for a chunk's first two samples."""
    found = sample_parallel(_tuple_lookup(2))["batch"]
    assert isinstance(found, Refused) and "depend on the chunk" in found.reason


def test_heads_folded_into_the_batch_with_a_symbolic_length_and_a_clamped_position_slice_are_sample_parallel():
    """The exporters' attention layout with a symbolic sequence length: positions sliced to the
    length ([0:seq] of 512, whose dim is min(seq, 512)) added to the tokens, [batch,seq,64] ->
    [batch,seq,4,16] -> [batch,4,seq,16] -> [batch*4,seq,16] -> back: each sample is 4 indices of
    the merged dim, seen by cancelling seq on both sides of the reshape."""
    graph = parse_graph(
        """
graph g(%x: f32[batch,seq,64]) -> (%y) {
  const %pos: f32[1,512,64]
  const %zero: i64[1] = [0]
  const %one: i64[1] = [1]
  const %rest: i64[1] = [-1]
  const %four: i64[1] = [4]
  const %sixteen: i64[1] = [16]
  %n: i64[1] = Shape(%x) {start=1, end=2}
  %b: i64[1] = Shape(%x) {start=0, end=1}
  %p: f32[1,min(seq,512),64] = Slice(%pos, %zero, %n, %one, %one)
  %h: f32[batch,seq,64] = Add(%x, %p)
  %t1: i64[4] = Concat(%b, %n, %rest, %sixteen) {axis=0}
  %v: f32[batch,seq,4,16] = Reshape(%h, %t1)
  %tr: f32[batch,4,seq,16] = Transpose(%v) {perm=[0, 2, 1, 3]}
  %t2: i64[3] = Concat(%rest, %n, %sixteen) {axis=0}
  %m: f32[heads,seq,16] = Reshape(%tr, %t2)
  %r: f32[heads,seq,16] = Relu(%m)
  %t3: i64[4] = Concat(%b, %four, %n, %sixteen) {axis=0}
  %u: f32[batch,4,seq,16] = Reshape(%r, %t3)
  %y: f32[batch,seq,4,16] = Transpose(%u) {perm=[0, 2, 1, 3]}
}""",
        {"pos": RNG.standard_normal((1, 512, 64)).astype(np.float32)},
    )
    assert sample_parallel(graph)["batch"] == Parallel("batch", (0,), (0,))


def test_tokens_flattened_to_rows_with_a_symbolic_length_are_sample_parallel():
    """GPT-2's Conv1D: [batch,seq,64] -> [-1,64] (seq rows per sample, seq symbolic) -> MatMul ->
    back to [batch,seq,8]; a reshape that would put another symbol's elements in a sample's block
    is refused."""
    body = """
graph g(%x: f32[batch,seq,64]) -> (%y) {{
  const %w: f32[64,8]
  const %rows: i64[2] = [-1, 64]
  const %rest: i64[2] = [-1, 8]
  %b: i64[1] = Shape(%x) {{start=0, end=1}}
  %n: i64[1] = Shape(%x) {{start=1, end=2}}
  %r: f32[{rows},64] = Reshape(%x, %rows)
  %m: f32[{rows},8] = MatMul(%r, %w)
  %t: i64[3] = Concat(%b, %n, %rest) {{axis=0}}
  %y: f32[{out}] = Reshape(%m, %t)
}}"""
    weights = {"w": RNG.standard_normal((64, 8)).astype(np.float32)}
    graph = parse_graph(body.format(rows="flat", out="batch,seq,8"), weights)
    assert sample_parallel(graph)["batch"] == Parallel("batch", (0,), (0,))
    graph = parse_graph(body.format(rows="flat", out="seq,batch,8"), weights)  # samples moved: refused
    assert isinstance(sample_parallel(graph)["batch"], Refused)


def test_monomials_multiply_and_divide_with_symbols():
    from kiln.ops.symbolic_dims import ONE, Monomial

    block = Monomial.of(["seq", 4, 16])
    assert block == Monomial(64, ("seq",)) and block * Monomial.of(["heads"]) == Monomial(64, ("heads", "seq"))
    assert block.divided(Monomial.of(["seq", 16])) == Monomial(4)
    assert block.divided(Monomial.of([16])) == Monomial(4, ("seq",))
    assert block.divided(Monomial.of(["other"])) is None and block.divided(Monomial.of([3])) is None
    assert Monomial.of([]) == ONE and str(Monomial(4, ("seq",))) == "4*seq"


def _symbolic_mask_lookup(scale_from: str = "mask", offset: int = 0, offsets_from: str = "mask"):  # type: ignore[no-untyped-def]
    """The TorchScript exports' lookup with a symbolic length: flat_mask[b*seq + j + offset] for
    j in Range(0, seq), the scale and the range's end read from shapes (``scale_from`` and
    ``offsets_from`` name the tensors whose dim 1 they read: ``other`` has another length)."""
    from tests.helpers import INT64

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    return _onnx(
        [
            *SAMPLE_NUMBERS,
            ("Shape", [scale_from], ["s2"]),
            ("Gather", ["s2", "one"], ["seq"], {"axis": 0}),
            ("Cast", ["seq"], ["seq64"], {"to": 7}),
            ("Mul", ["b1", "seq64"], ["start"]),
            ("Shape", [offsets_from], ["s3"]),
            ("Gather", ["s3", "one"], ["len"], {"axis": 0}),
            ("Range", ["zero", "len", "one"], ["j"]),
            ("Add", ["j", "shift"], ["js"]),
            ("Unsqueeze", ["js" if offset else "j", "zero_axis"], ["j1"]),
            ("Add", ["start", "j1"], ["index"]),
            ("Reshape", ["mask", "flat"], ["m"]),
            ("Gather", ["m", "index"], ["y"], {"axis": 0}),
        ],
        [("mask", INT64, ["batch", "seq"]), ("other", INT64, ["batch", "keys"])],
        [("y", INT64, None)],
        {
            "zero": np.array(0, np.int64),
            "one": np.array(1, np.int64),
            "axes": i64(1),
            "zero_axis": i64(0),
            "shift": np.array(offset, np.int64),
            "flat": i64(-1),
        },
    )


def test_a_per_sample_lookup_scaled_by_a_symbolic_length_is_sample_parallel_and_runs_at_every_batch():
    import kiln

    graph = _symbolic_mask_lookup()
    assert sample_parallel(graph)["batch"] == Parallel("batch", (0, 0), (0,))
    model = kiln.compile(graph, dims={"batch": "1..8", "seq": "1..16"})
    for batch, seq in ((1, 5), (3, 7), (8, 16), (6, 1)):
        mask = RNG.integers(0, 2, (batch, seq)).astype(np.int64)
        other = np.zeros((batch, 3), np.int64)
        np.testing.assert_array_equal(model.run({"mask": mask, "other": other})["y"], mask)


@pytest.mark.parametrize("kind", ["scale from another length", "offsets shifted into the next sample"])
def test_a_symbolic_lookup_that_may_read_another_samples_block_is_refused(kind):
    graph = {
        "scale from another length": lambda: _symbolic_mask_lookup(scale_from="other"),
        "offsets shifted into the next sample": lambda: _symbolic_mask_lookup(offset=1),
    }[kind]()
    found = sample_parallel(graph)["batch"]
    assert isinstance(found, Refused) and "per-sample indices" in found.reason, found


def test_offsets_counted_by_another_length_hold_under_a_guard():
    """b*seq + j for j < keys reads only sample b's block where keys <= seq (a decode step's mask
    [batch, total] read at its past+1 positions): sample-parallel under the guard
    max(0, keys - seq) == 0, checked per run (chunks only where it is 0)."""
    found = sample_parallel(_symbolic_mask_lookup(offsets_from="other"))["batch"]
    assert isinstance(found, Parallel), found
    check = Chunking(found, (1,))
    assert len(found.guards) == 1, found
    assert check.holds({"batch": 2, "seq": 9, "keys": 9}) and check.holds({"batch": 2, "seq": 9, "keys": 3})
    assert not check.holds({"batch": 2, "seq": 9, "keys": 10})


def test_a_per_sample_gather_elements_from_a_buffer_expanded_over_the_batch_is_sample_parallel():
    """RoBERTa's token types: a [1, 8] buffer expanded to [batch, 8], gathered along dim 1 at
    per-sample positions; an index gathered along the samples' dim is refused."""
    from tests.helpers import INT64

    def gathered(axis: int):  # type: ignore[no-untyped-def]
        return _onnx(
            [
                ("Shape", ["ids"], ["s"]),
                ("Expand", ["buffer", "s"], ["wide"]),
                ("GatherElements", ["wide", "ids"], ["y"], {"axis": axis}),
            ],
            [("ids", INT64, ["batch", 8])],
            [("y", INT64, None)],
            {"buffer": np.arange(8, dtype=np.int64).reshape(1, 8) * 10},
        )

    along, across = gathered(1), gathered(0)
    assert sample_parallel(along)["batch"] == Parallel("batch", (0,), (0,))
    found = sample_parallel(across)["batch"]
    assert isinstance(found, Refused) and "samples' dim" in found.reason, found
    import kiln

    model = kiln.compile(along, dims={"batch": "1..8"})
    for batch in (1, 3, 8):
        ids = RNG.integers(0, 8, (batch, 8)).astype(np.int64)
        np.testing.assert_array_equal(model.run({"ids": ids})["y"], ids * 10)


def _shift_right(exporter: str):  # type: ignore[no-untyped-def]
    """BART's shift-tokens-right, y[:, 1:] = x[:, :-1], as each exporter writes it: TorchScript as
    index tuples (Range(0, count) reshaped to [batch, 1], the columns broadcast to it by an Add
    whose shape alone is used, expanded, stacked); dynamo as rows of the transposed [5, batch]."""
    from tests.helpers import INT64

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    constants = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "five": np.array(5, np.int64)}
    constants.update({"col_axis": i64(1), "start": i64(0), "end": i64(4), "flat": i64(-1, 1), "last": i64(-1)})
    updates = [("Slice", ["x", "start", "end", "col_axis"], ["u"])]
    if exporter == "dynamo":
        constants["rows"] = np.array([[1], [2], [3], [4]], np.int64)
        nodes = [
            *updates,
            ("Transpose", ["x"], ["xt"], {"perm": [1, 0]}),
            ("Transpose", ["u"], ["ut"], {"perm": [1, 0]}),
            ("ScatterND", ["xt", "rows", "ut"], ["yt"]),
            ("Transpose", ["yt"], ["y"], {"perm": [1, 0]}),
        ]
    else:
        constants.update({"from1": i64(1), "to5": i64(5), "axis0": i64(0)})
        nodes = [
            *updates,
            ("Shape", ["x"], ["s"]),
            ("Gather", ["s", "zero"], ["n"], {"axis": 0}),
            ("Range", ["zero", "n", "one"], ["b"]),
            ("Reshape", ["b", "flat"], ["b2"]),
            ("Range", ["zero", "five", "one"], ["cols"]),
            ("Slice", ["cols", "from1", "to5", "axis0"], ["c"]),
            ("Add", ["b2", "c"], ["broadcast"]),
            ("Shape", ["broadcast"], ["bs"]),
            ("Expand", ["b2", "bs"], ["be"]),
            ("Expand", ["c", "bs"], ["ce"]),
            ("Unsqueeze", ["be", "last"], ["b3"]),
            ("Unsqueeze", ["ce", "last"], ["c3"]),
            ("Concat", ["b3", "c3"], ["tuples"], {"axis": -1}),
            ("ScatterND", ["x", "tuples", "u"], ["y"]),
        ]
    return _onnx(nodes, [("x", INT64, ["batch", 5])], [("y", INT64, None)], constants)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_tokens_shifted_right_by_scatter_nd_are_sample_parallel_and_run_at_every_batch(exporter):
    import kiln

    graph = _shift_right(exporter)
    assert sample_parallel(graph)["batch"] == Parallel("batch", (0,), (0,))
    model = kiln.compile(graph, dims={"batch": "1..8"})
    assert model.is_native
    for batch in (1, 3, 8, 5):
        x = RNG.integers(0, 100, (batch, 5)).astype(np.int64)
        want = x.copy()
        want[:, 1:] = x[:, :-1]
        np.testing.assert_array_equal(model.run({"x": x})["y"], want)


def test_a_scatter_nd_writing_across_samples_is_refused():
    """Index tuples that name rows of the samples' dim itself (a constant [[0]] into [batch, 5])."""
    from tests.helpers import INT64

    graph = _onnx(
        [("Slice", ["x", "start", "end", "axis0"], ["u"]), ("ScatterND", ["x", "first", "u"], ["y"])],
        [("x", INT64, ["batch", 5])],
        [("y", INT64, None)],
        {
            "first": np.array([[0]], np.int64),
            "start": np.array([1], np.int64),
            "end": np.array([2], np.int64),
            "axis0": np.array([0], np.int64),
        },
    )
    found = sample_parallel(graph)["batch"]
    assert isinstance(found, Refused), found


def _heads_folded_by_a_computed_count(tile: bool = False):  # type: ignore[no-untyped-def]
    """BLOOM's ALiBi and GPT-Neo's heads: [batch, seq, 64] -> [batch, 4, seq, 16] -> a Reshape to
    [Shape(x)[0] * 4, -1, 16] (the target computed from the count), Softmax, back to [batch, seq, 64].
    With ``tile``, DeBERTa's relative positions too: a [4, 16, 16] table tiled [Shape(x)[0], 1, 1]
    (once per sample) and multiplied in."""
    from tests.helpers import FLOAT

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        ("Reshape", ["x", "split"], ["h"]),
        ("Transpose", ["h"], ["t"], {"perm": [0, 2, 1, 3]}),
        ("Shape", ["x"], ["s"]),
        ("Gather", ["s", "zero"], ["n"], {"axis": 0}),
        ("Mul", ["n", "heads"], ["nh"]),
        ("Unsqueeze", ["nh", "axes"], ["nh1"]),
        ("Concat", ["nh1", "minus_one", "sixteen"], ["target"], {"axis": 0}),
        ("Reshape", ["t", "target"], ["folded"]),
        ("Softmax", ["folded"], ["p"], {"axis": -1}),
        ("Unsqueeze", ["n", "axes"], ["count"]),
    ]
    constants = {
        "split": i64(0, -1, 4, 16),
        "zero": np.array(0, np.int64),
        "heads": np.array(4, np.int64),
        "axes": i64(0),
        "minus_one": i64(-1),
        "sixteen": i64(16),
        "four": i64(4),
        "merge": i64(0, 0, 64),
    }
    last = "p"
    if tile:
        nodes += [
            ("Concat", ["count", "one", "one"], ["repeats"], {"axis": 0}),
            ("Tile", ["table", "repeats"], ["tiled"]),
            ("MatMul", ["p", "tiled"], ["q"]),
        ]
        constants.update(one=i64(1), table=RNG.standard_normal((4, 16, 16)).astype(np.float32))
        last = "q"
    nodes += [
        ("Concat", ["count", "four", "minus_one", "sixteen"], ["back"], {"axis": 0}),
        ("Reshape", [last, "back"], ["u"]),
        ("Transpose", ["u"], ["v"], {"perm": [0, 2, 1, 3]}),
        ("Reshape", ["v", "merge"], ["y"]),
    ]
    from onnx import helper

    from tests.helpers import make_model

    made = [helper.make_node(*n[:3], **(n[3] if len(n) > 3 else {})) for n in nodes]
    return make_model(made, [("x", FLOAT, ["batch", "seq", 64])], [("y", FLOAT, None)], constants).SerializeToString()


@pytest.mark.parametrize("tile", [False, True], ids=["alibi-heads", "tiled-relative-table"])
def test_a_reshape_or_tile_by_the_count_times_a_number_is_sample_parallel_and_runs_at_every_batch(tile):
    """The count times 4 is the dim ``4*batch`` (not a fresh symbol): the Reshape's -1 is ``seq``
    and each sample spans 4 indices of the folded dim; a table tiled once per sample is the same."""
    import onnxruntime

    import kiln
    from kiln.driver.variants import plans_compiled
    from kiln.frontend.onnx import import_onnx

    model_bytes = _heads_folded_by_a_computed_count(tile)
    graph = import_onnx(model_bytes)
    folded = next(n for n in graph.nodes if n.outputs[0].name == "folded")
    assert folded.outputs[0].type.shape == ("4*batch", "seq", 16)
    if tile:
        tiled = next(n for n in graph.nodes if n.op == "Tile")
        assert tiled.outputs[0].type.shape == ("4*batch", 16, 16)
    assert sample_parallel(graph)["batch"] == Parallel("batch", (0,), (0,))
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    model = kiln.compile(model_bytes, dims={"batch": "1..8", "seq": 16})
    compiled = plans_compiled()
    for batch in (1, 3, 8, 5):
        x = RNG.standard_normal((batch, 16, 64)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert plans_compiled() == compiled


def test_sizes_scaled_clamped_and_divided_keep_their_names():
    from kiln.ops.symbolic_dims import Monomial, bound, scaled

    assert scaled("batch", 4) == "4*batch" and scaled("4*batch", 3) == "12*batch" and scaled("batch", 1) == "batch"
    assert scaled("batch", 0) == 0 and scaled("batch*seq", 2) == "2*batch*seq"
    assert Monomial.of(["4*batch", "seq", 16]) == Monomial(64, ("batch", "seq"))
    assert Monomial.of(["batch.x4"]) == Monomial(4, ("batch",))  # (the name older kiln wrote)
    assert bound("4*batch", {"batch": 3}) == 12 and bound("2*seq", {"batch": 3}) == "2*seq"
    assert bound("batch*seq", {"batch": 3}) == "3*seq" and bound("batch*seq", {"batch": 3, "seq": 5}) == 15
    from tests.helpers import FLOAT

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    graph = _onnx(
        [
            ("Shape", ["x"], ["s"]),
            ("Gather", ["s", "one"], ["len"], {"axis": 0}),
            ("Min", ["len", "cap"], ["capped"]),
            ("Mul", ["len", "three"], ["tripled"]),
            ("Div", ["tripled", "three"], ["again"]),
            ("Unsqueeze", ["capped", "axes"], ["c1"]),
            ("Unsqueeze", ["again", "axes"], ["a1"]),
            ("Concat", ["c1", "a1"], ["target"], {"axis": 0}),
            ("ConstantOfShape", ["target"], ["y"]),
        ],
        [("x", FLOAT, ["batch", "seq"])],
        [("y", FLOAT, None)],
        {"one": np.array(1, np.int64), "cap": np.array(512, np.int64), "three": np.array(3, np.int64), "axes": i64(0)},
    )
    assert graph.outputs[0].type.shape == ("min(512,seq)", "seq")
