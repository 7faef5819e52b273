"""Grouped-query attention's repeated K/V heads (``kiln.passes.grouped_heads``): the exporters'
``Reshape(Expand(Unsqueeze(K, 2)))`` copies are gone from the compiled attention, which reads each
K/V head in place for its group of query heads, with the same results as the repeated form (NumPy
reference), at a decode step's few query rows (the attention driver's direct loops) and a
prompt's many (its engine products); a mask that varies per query head is left repeated."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from tests.conftest import runnable
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(11)
HEADS, KV_HEADS, DEPTH = 8, 2, 16


def gqa_model(mask_heads: int, depth: int = DEPTH) -> tuple:
    """q [b, 8, s, 16], k and v [b, 2, t, 16], mask [b, mask_heads, s, t] -> [b, s, 8, 16], K and V
    repeated to 8 heads as torch.onnx writes repeat_kv, then scale, mask, Softmax, . V, Transpose."""
    group = HEADS // KV_HEADS
    nodes = []
    for name in ("k", "v"):
        nodes += [
            helper.make_node("Unsqueeze", [name, "axis2"], [f"{name}5"]),
            helper.make_node("Expand", [f"{name}5", f"{name}_wide"], [f"{name}_many"]),
            helper.make_node("Reshape", [f"{name}_many", f"{name}_heads"], [f"{name}_rep"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["k_rep"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v_rep"], ["o"]),
        helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3]),
    ]
    # the shapes the repeat needs, computed from K's own shape as the exporters compute them
    for name in ("k", "v"):
        nodes += [
            helper.make_node("Shape", [name], [f"{name}_shape"]),
            helper.make_node("Gather", [f"{name}_shape", "first2"], [f"{name}_bh"], axis=0),
            helper.make_node("Gather", [f"{name}_shape", "last2"], [f"{name}_td"], axis=0),
            helper.make_node("Concat", [f"{name}_bh", "group", f"{name}_td"], [f"{name}_wide"], axis=0),
            helper.make_node("Gather", [f"{name}_shape", "zero"], [f"{name}_b"], axis=0),
            helper.make_node("Concat", [f"{name}_b", "heads", f"{name}_td"], [f"{name}_heads"], axis=0),
        ]
    nodes = nodes[-12:] + nodes[:-12]
    constants = {
        "axis2": np.array([2], np.int64), "first2": np.array([0, 1], np.int64), "last2": np.array([2, 3], np.int64),
        "zero": np.array([0], np.int64), "group": np.array([group], np.int64), "heads": np.array([HEADS], np.int64),
        "scale": np.array(depth**-0.5, np.float32),
    }  # fmt: skip
    inputs = [
        ("q", FLOAT, ["b", HEADS, "s", depth]),
        ("k", FLOAT, ["b", KV_HEADS, "t", depth]),
        ("v", FLOAT, ["b", KV_HEADS, "t", depth]),
        ("mask", FLOAT, ["b", mask_heads, "s", "t"]),
    ]
    return make_model(nodes, inputs, [("y", FLOAT, ["b", "s", HEADS, depth])], constants)


def reference(q, k, v, mask) -> np.ndarray:
    group, depth = HEADS // KV_HEADS, q.shape[-1]
    k, v = np.repeat(k, group, axis=1).astype(np.float64), np.repeat(v, group, axis=1).astype(np.float64)
    scores = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) * depth**-0.5 + mask
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("queries", [1, 3, 9])  # a decode step's rows (direct loops); a prompt's (products)
@pytest.mark.parametrize("mask_heads", [1, HEADS])
@pytest.mark.parametrize("target", ["cpu", "cpu:avx2"])  # (the direct loops' lane sums per vector width)
@pytest.mark.parametrize("depth", [DEPTH, 64])  # 64: the direct loops' blocks of keys and of V's columns
def test_grouped_heads_are_read_in_place_with_the_same_results(queries, mask_heads, target, depth):
    if target != "cpu" and queries != 1:
        pytest.skip("a prompt's rows run the same engine products on every path")
    if depth != DEPTH and queries == 9:
        pytest.skip("a prompt's rows run the engine products at any depth")
    runnable(target)
    keys, batch = 37, 2  # (37: blocks of keys and the keys after the last block)
    compiled = kiln.compile(
        gqa_model(mask_heads, depth),
        target=target,
        dims={"b": (batch, batch), "s": (queries, queries), "t": (keys, keys)},
    )
    q = RNG.standard_normal((batch, HEADS, queries, depth)).astype(np.float32)
    k, v = (RNG.standard_normal((batch, KV_HEADS, keys, depth)).astype(np.float32) for _ in range(2))
    mask = np.where(RNG.random((batch, mask_heads, queries, keys)) < 0.2, -1e4, 0).astype(np.float32)
    y = compiled.run({"q": q, "k": k, "v": v, "mask": mask})["y"]
    want = reference(q, k, v, mask)
    assert np.abs(y - want).max() <= 2e-5 * np.abs(want).max()
    for plan in compiled.plans:  # (the exact sizes' plan and a padded length's)
        sources = [s for st in plan.steps for k in getattr(st, "kernels", []) for s in k.sources]
        repeated = sum("Expand" in s for s in sources)
        if mask_heads == 1:  # K and V read in place: no Expand kernel copies them
            assert repeated == 0 and any("grouped_scores" in s for s in sources), sources
        else:  # a per-head mask does not lift to the grouped form: the repeats stay (and stay right)
            assert repeated == 2 and not any("grouped_scores" in s for s in sources), sources
