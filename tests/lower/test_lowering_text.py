"""Before/Expected tests of lowering: a graph in the IR's text form, lowered by the very pipeline a
compile runs, for the test-only ``kir`` target (16-byte vectors, an 8x8 engine tile: the printed
kernels do not depend on the machine running the tests), printed with the kernel-IR printer and
compared as text; then the kernels run on the kernel-IR interpreter against the reference
interpreter. No C compiler is involved."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.driver.options import CompileOptions
from kiln.driver.pipeline import compile_plan
from kiln.ir.parser import parse_graph
from kiln.lower.kir_printer import print_kernel
from kiln.ops.interpreter import Interpreter
from kiln.runtime.executable import Executable
from kiln.runtime.plan import Segment

OPTIONS = CompileOptions(level=2, plan_cache=False, tuned=False)

CASES = {
    "a fused elementwise chain is one loop nest": (
        """
graph g(%x: f32[2,3]) -> (%y) {
  %e: f32[2,3] = Exp(%x)
  %y: f32[2,3] = Relu(%e)
}""",
        """
kernel k1 (pointwise) reads b1: f32[6] writes b0: f32[6]
  for i_1 in 0..2:
    for i_2 in 0..3:
      %t0 = exp(b1[((i_1 * 3) + i_2)])
      b0[((i_1 * 3) + i_2)] = select((%t0 < 0.0), 0.0, %t0)""",
    ),
    "a product with constant weights is one engine call with its bias and activation as epilogue": (
        """
graph g(%x: f32[3,4]) -> (%y) {
  const %w: f32[4,2] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  const %b: f32[2] = [0.5, -0.5]
  %m: f32[3,2] = MatMul(%x, %w)
  %a: f32[3,2] = Add(%m, %b)
  %y: f32[3,2] = Relu(%a)
}""",
        """
kernel k1 (matmul+epilogue) reads b1: f32[12], w0: f32[32], b3: f32[2] writes b0: f32[6]
  gemm(batch=1, m=3, n=2, k=4, a=view(b1, 0, 4, 1), b=packed(w0, 0, 8, f32), out=b0, out_batch_stride=6, ldc=2, blocking=(0, 0, 0), precision=fp32, quant=none, finish=finish(none, b3, True, -inf, inf), requant=none, given=none, scales=none, offsets=none, group=0, prompt=) epilogue kiln_k1_epilogue
helper kiln_k1_epilogue(bt, i0, i1, j0, j1) schedule vectorize=c simd=j
  if (((i1 - i0) == 8) && ((j1 - j0) == 8)):
    for r in 0..8:
      for c in 0..8:
        %t0 = (j0 + c)
        %t1 = (b0[(((bt * 6) + ((i0 + r) * 2)) + %t0)] + b3[%t0])
        b0[(((bt * 6) + ((i0 + r) * 2)) + (j0 + c))] = select((%t1 < 0.0), 0.0, %t1)
  if !(((i1 - i0) == 8) && ((j1 - j0) == 8)):
    for i in i0..i1:
      for j in j0..j1:
        %t2 = (b0[(((bt * 6) + (i * 2)) + j)] + b3[j])
        b0[(((bt * 6) + (i * 2)) + j)] = select((%t2 < 0.0), 0.0, %t2)""",
    ),
    "softmax is a max, an exp-and-sum in double, and a scale per row": (
        """
graph g(%x: f32[2,5]) -> (%y) {
  %y: f32[2,5] = Softmax(%x) {axis=-1}
}""",
        """
kernel k1 (normalize) reads b0: f32[10] writes b1: f32[10]
  for i_1 in 0..2:
    let m_3: f32 = -inf
    for k_2 in 0..5:
      m_3 = max(m_3, b0[((i_1 * 5) + (k_2 * 1))])
    let sum_4: f64 = 0.0
    for k_2 in 0..5:
      let e_6: f32 = exp((b0[((i_1 * 5) + (k_2 * 1))] - m_3))
      b1[((i_1 * 5) + (k_2 * 1))] = e_6
      sum_4 = (sum_4 + f64(e_6))
    let inv_5: f32 = f32((1.0 / sum_4))
    for k_2 in 0..5:
      b1[((i_1 * 5) + (k_2 * 1))] = (b1[((i_1 * 5) + (k_2 * 1))] * inv_5)""",
    ),
}


def lowered(text: str):  # type: ignore[no-untyped-def]
    return compile_plan(parse_graph(text), "kir", OPTIONS)


@pytest.mark.parametrize("name", list(CASES))
def test_lowering_prints_as_expected(name):
    before, expected = CASES[name]
    plan = lowered(before)
    got = "\n".join(print_kernel(k) for s in plan.steps if isinstance(s, Segment) for k in s.kernels)
    assert got == expected.strip("\n"), f"got:\n{got}"


@pytest.mark.parametrize("name", list(CASES))
def test_the_lowered_kernels_compute_what_the_reference_does(name):
    before, _ = CASES[name]
    graph = parse_graph(before)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal([int(d) for d in v.type.shape]).astype(np.float32) for v in graph.inputs]
    expected = Interpreter(graph).run(inputs)
    got = Executable(lowered(before)).run(inputs)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_scalar_constants_of_a_fused_chain_are_immediates_and_division_by_one_is_a_product():
    graph = parse_graph(
        """
graph g(%x: f32[2,3]) -> (%y) {
  const %c: f32[] = [1.4142135381698608]
  const %lo: f32[] = [0.0]
  %d: f32[2,3] = Div(%x, %c)
  %e: f32[2,3] = Erf(%d)
  %y: f32[2,3] = Max(%e, %lo)
}"""
    )
    plan = compile_plan(graph, "kir", OPTIONS)
    (kernel,) = [k for s in plan.steps if isinstance(s, Segment) for k in s.kernels]
    text = print_kernel(kernel)
    assert "* 0.70710676" in text and " / " not in text, text  # x / sqrt(2) as x * (1 / sqrt(2))
    body = text.split("\n", 1)[1]
    loaded = {b.name for b in kernel.reads if f"{b.name}[" in body}
    assert len(loaded) == 1, text  # only x is loaded: the two scalars are immediates
    x = np.array([[-2.0, -0.5, 0.0], [0.3, 1.0, 40.0]], np.float32)
    want = Interpreter(graph).run([x])[0]
    np.testing.assert_allclose(kiln.compile(graph, target="kir").run({"x": x})["y"], want, rtol=1e-6, atol=1e-7)
