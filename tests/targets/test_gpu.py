"""The gpu target (Triton). No GPU is available to these machines: ``gpu:interpret`` runs the very
kernels ``gpu`` would launch in Triton's interpreter (through the same device arena and transfers,
the CPU standing in for the device), and every seed model's kernels are compiled ahead for sm_80
and sm_90 (PTX -> cubin with Triton's own ptxas) and read back for registers and spills. The shared
compiled-vs-reference cases run on gpu:interpret through the ``target`` fixture (conftest)."""

from __future__ import annotations

import re
import threading
import types

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.ir.types import DType
from kiln.lower.kir import Assign, Binary, Buffer, Const, For, Index, Kernel, Let, Load, Scalar, Store, i64
from tests.helpers import FLOAT, INT64, make_model

triton = pytest.importorskip("triton", reason="the gpu target needs Triton (kiln's gpu extra)")

from kiln.backends.gpu import transfer_times  # noqa: E402
from kiln.backends.gpu.lanes import lane_depth, vector_loop  # noqa: E402
from kiln.backends.gpu.module import render_module  # noqa: E402

F32 = DType.FLOAT32


def relative_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm((got - want).ravel()) / max(1e-30, np.linalg.norm(want.ravel())))


# -- which loops become lanes -------------------------------------------------------------------------------


def nest(store_index, load_index=None, extents=(4, 8)) -> For:
    """for i < 4: for j < 8: out[store_index] = x[load_index] (+ out[...] when loading out)."""
    i, j = Index("i"), Index("j")
    out, x = Buffer("out", F32, 64), Buffer("x", F32, 64)
    index = store_index(i, j)
    value = Load(x, (load_index or store_index)(i, j))
    return For(i, extents[0], [For(j, extents[1], [Store(out, index, value)])])


def flat(i, j):
    return Binary("+", Binary("*", i, i64(8)), j)


def test_independent_loops_become_lanes_and_carried_ones_do_not():
    assert lane_depth(nest(flat)) == 2  # out[8i + j]
    assert lane_depth(nest(lambda i, j: Binary("+", i, Binary("*", j, i64(4))))) == 2  # a transposed write
    assert lane_depth(nest(lambda i, j: j)) == 0  # every i writes the same 8 elements: no lane is safe
    assert lane_depth(nest(lambda i, j: Binary("+", Binary("*", i, i64(4)), j))) == 0  # rows overlap

    # a running sum: out[i] = out[i - 1] + x[i] carries a value from one iteration to the next
    i = Index("i")
    out, x = Buffer("out", F32, 16), Buffer("x", F32, 16)
    scan = For(i, 15, [Store(out, Binary("+", i, i64(1)), Binary("+", Load(out, i), Load(x, Binary("+", i, i64(1)))))])
    assert lane_depth(scan) == 0
    # a scatter: where it writes depends on data
    idx = Buffer("idx", DType.INT64, 16)
    assert lane_depth(For(i, 16, [Store(out, Load(idx, i), Load(x, i))])) == 0


def test_an_inner_loop_folding_into_a_scalar_is_a_tree_reduction_and_a_carried_one_is_not():
    k = Index("k")
    x = Buffer("x", F32, 64)
    total = Scalar("total", F32)
    summing = For(k, 64, [Assign(total, Binary("+", total, Load(x, k)))])
    assert vector_loop(summing, frozenset()) == {"total": "+"}
    from kiln.lower.pointwise import FLOAT_OPS

    largest = For(k, 64, [Assign(total, FLOAT_OPS["Max"]([total, Load(x, k)], {}, F32))])
    assert vector_loop(largest, frozenset()) == {"total": "max"}
    # total = total * 0.5 + x[k]: not associative in the order the loop writes it
    decaying = For(k, 64, [Assign(total, Binary("+", Binary("*", total, Const(0.5, F32)), Load(x, k)))])
    assert vector_loop(decaying, frozenset()) is None
    # a store each iteration reads back from the previous one
    out = Buffer("out", F32, 65)
    chained = For(k, 64, [Store(out, Binary("+", k, i64(1)), Load(out, k))])
    assert vector_loop(chained, frozenset()) is None


def test_the_rendered_module_keeps_one_function_per_distinct_kernel():
    def kernel(name: str, source: Buffer, dest: Buffer) -> Kernel:
        i = Index(f"i_{name}")
        body = [For(i, 100, [Let(Scalar(f"t_{name}", F32), Load(source, i)), Store(dest, i, Load(source, i))])]
        return Kernel(name, "pointwise", body, [source], [dest], [name])

    a, b, c = (Buffer(n, F32, 100) for n in "abc")
    table = {Buffer("status", DType.INT32, 1): 0, a: 1, b: 2, c: 3}
    source = render_module([[kernel("k1", a, b), kernel("k2", b, c)]], table)
    namespace: dict = {}
    exec(source.split("\n\nLAUNCHES = ", 1)[1].join(["LAUNCHES = ", ""]), namespace)
    launches = namespace["LAUNCHES"][0]
    assert [launch[0] for launch in launches] == ["k1_0", "k1_0"]  # k2 is k1 on other buffers
    assert [launch[3] for launch in launches] == [(1, 2), (2, 3)]
    assert source.count("@triton.jit\ndef k") == 1


# -- models on gpu:interpret ---------------------------------------------------------------------------------


def f(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def check(model, feeds, tolerance=1e-5):
    compiled = kiln.compile(model, target="gpu:interpret")
    assert compiled.is_native, [(x.node.label, x.reason) for p in compiled.plans for x in p.fallbacks]
    expected = kiln.compile(model, target="reference").run(feeds)
    got = compiled.run(feeds)
    for key, value in expected.items():
        assert relative_l2(np.asarray(got[key], np.float64), np.asarray(value, np.float64)) < tolerance, key
    return compiled


@pytest.mark.parametrize(
    "attrs",
    [
        {"pads": [1, 1, 1, 1]},
        {"pads": [0, 1, 2, 1], "strides": [2, 2]},
        {"pads": [2, 2, 2, 2], "dilations": [2, 2]},
    ],
    ids=["padded", "strided", "dilated"],
)
def test_a_convolution_is_an_implicit_gemm_with_its_epilogue(attrs):
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])],
        [("x", FLOAT, [2, 5, 11, 9])],
        [("y", FLOAT, None)],
        {"w": f(7, 5, 3, 3), "b": f(7)},
    )
    compiled = check(model, {"x": f(2, 5, 11, 9, seed=1)})
    assert "tl.dot" in compiled.plans[0].source and "inside = " in compiled.plans[0].source


def test_attention_runs_as_one_flash_kernel_and_a_fully_masked_row_gives_the_references_answer():
    # scores masked to -inf on a whole row: the reference's softmax gives NaN there, and so must kiln
    q, k, v = f(1, 2, 24, 16, seed=1), f(1, 2, 40, 16, seed=2), f(1, 2, 40, 16, seed=3)
    mask = np.zeros((24, 40), np.float32)
    mask[5, :] = -np.inf
    mask[:, 33:] = -np.inf
    model = make_model(
        [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["s"]),
            helper.make_node("Mul", ["s", "scale"], ["ss"]),
            helper.make_node("Add", ["ss", "mask"], ["sm"]),
            helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["y"]),
        ],
        [("q", FLOAT, [1, 2, 24, 16]), ("k", FLOAT, [1, 2, 40, 16]), ("v", FLOAT, [1, 2, 40, 16])],
        [("y", FLOAT, None)],
        {"scale": np.array(0.25, np.float32), "mask": mask},
    )
    feeds = {"q": q, "k": k, "v": v}
    compiled = kiln.compile(model, target="gpu:interpret")
    source = compiled.plans[0].source
    assert "tl.dot(p, vb" in source and source.count("@triton.jit\ndef k") == 1  # one kernel, scores in registers
    got = compiled.run(feeds)["y"]
    want = kiln.compile(model, target="reference").run(feeds)["y"]
    assert np.isnan(got[0, :, 5]).all() and np.isnan(want[0, :, 5]).all()
    keep = np.ones(24, bool)
    keep[5] = False
    np.testing.assert_allclose(got[0][:, keep], want[0][:, keep], rtol=1e-4, atol=1e-5)


def test_reductions_and_a_sequential_scan_match_the_reference():
    model = make_model(
        [
            helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
            helper.make_node("Softmax", ["n"], ["s"], axis=-1),
            helper.make_node("ReduceMax", ["s", "axes"], ["m"], keepdims=0),
            helper.make_node("CumSum", ["x", "axis"], ["c"]),
        ],
        [("x", FLOAT, [3, 7, 300])],
        [("m", FLOAT, None), ("c", FLOAT, None)],
        {"g": f(300), "b": f(300, seed=4), "axes": np.array([1], np.int64), "axis": np.array(2, np.int64)},
    )
    x = f(3, 7, 300, seed=5)
    x[1, 2, 7] = np.nan  # NaN wins a max on every target
    compiled = kiln.compile(model, target="gpu:interpret")
    got = compiled.run({"x": x})
    want = kiln.compile(model, target="reference").run({"x": x})
    np.testing.assert_allclose(got["m"], want["m"], rtol=1e-5, atol=1e-6)
    assert np.isnan(got["m"][1]).any()
    np.testing.assert_allclose(got["c"], want["c"], rtol=1e-4, atol=1e-4)


def test_an_index_out_of_range_is_an_error_not_a_wild_read():
    model = make_model(
        [helper.make_node("Gather", ["w", "i"], ["y"], axis=0)],
        [("i", INT64, [5])],
        [("y", FLOAT, None)],
        {"w": f(10, 33)},
    )
    compiled = kiln.compile(model, target="gpu:interpret")
    np.testing.assert_array_equal(compiled.run({"i": np.array([0, 9, -1, 3, 3])})["y"], f(10, 33)[[0, 9, -1, 3, 3]])
    with pytest.raises(kiln.KilnError, match="out of range"):
        compiled.run({"i": np.array([0, 10, 3, 3, 3])})


def test_transfers_are_timed_apart_from_kernels_and_concurrent_runs_stay_correct():
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
        [("x", FLOAT, [8, 64])],
        [("y", FLOAT, None)],
        {"w": f(64, 32)},
    )
    compiled = kiln.compile(model, target="gpu:interpret")
    feeds = [{"x": f(8, 64, seed=s)} for s in range(6)]
    want = [np.tanh(x["x"] @ f(64, 32)) for x in feeds]
    results: dict[int, np.ndarray] = {}

    def run(n: int) -> None:
        results[n] = compiled.run(feeds[n])["y"]

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(6):
        np.testing.assert_allclose(results[n], want[n], rtol=1e-5, atol=1e-5)
    times = transfer_times([r for p in compiled.executables() for r in p.runners])
    assert times is not None and times["runs"] == 6
    assert times["upload_ms"] > 0 and times["compute_ms"] > 0 and times["download_ms"] > 0


class FakeGraph:
    """torch.cuda.CUDAGraph's part the runtime uses, on the CPU: what was launched while capturing
    is recorded (and not run), replay runs it again."""

    captures = 0

    def __init__(self) -> None:
        self.recorded: list = []

    def replay(self) -> None:
        for call in self.recorded:
            call()


def test_a_cuda_device_replays_the_launches_as_one_graph_captured_after_the_first_run(monkeypatch):
    """No GPU here: the runtime's side of CUDA graphs (when it captures, that replays replace the
    launches, that inputs of later runs reach the replayed kernels, that a failed capture keeps
    direct launches and says why) with a CPU stand-in for the graph; docs/gpu holds the device runs."""
    import contextlib

    import torch

    from kiln.backends.gpu.runtime import SegmentRunner

    capturing: list[FakeGraph] = []
    original = SegmentRunner.launch

    def launch(self):  # while capturing, launches are recorded into the graph, not run
        if capturing:
            capturing[-1].recorded.append(lambda: original(self))
        else:
            original(self)

    @contextlib.contextmanager
    def graph(fake):
        FakeGraph.captures += 1
        capturing.append(fake)
        try:
            yield
        finally:
            capturing.pop()

    monkeypatch.setattr(SegmentRunner, "launch", launch)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
        [("x", FLOAT, [8, 64])],
        [("y", FLOAT, None)],
        {"w": f(64, 32)},
    )
    compiled = kiln.compile(model, target="gpu:interpret")
    compiled.run({"x": f(8, 64)})  # compiled and run: the runners exist now
    runners = [r for p in compiled.executables() for r in p.runners]
    for runner in runners:  # a CUDA device, as far as the runner can tell
        runner.state.device = types.SimpleNamespace(type="cuda")
        runner.graph, runner.graph_note = None, ""
    calls = []
    monkeypatch.setattr(SegmentRunner, "launch", lambda self: (calls.append(self), launch(self))[1])
    FakeGraph.captures = 0
    for seed in range(4):
        x = f(8, 64, seed=seed + 10)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], np.tanh(x @ f(64, 32)), rtol=1e-5, atol=1e-5)
    assert FakeGraph.captures == len(runners) and all(r.graph is not None for r in runners)
    assert len(calls) == 2 * len(runners)  # the first run's launches and the capture's; then replays only
    assert transfer_times(runners)["cuda_graphs"] == "captured"

    def refuse(fake):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph", refuse)
    for runner in runners:
        runner.graph, runner.graph_note = None, ""
    for seed in range(2):
        x = f(8, 64, seed=seed + 20)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], np.tanh(x @ f(64, 32)), rtol=1e-5, atol=1e-5)
    assert all(r.graph is None for r in runners)
    assert "not captured: RuntimeError: operation not permitted" in transfer_times(runners)["cuda_graphs"]


def test_save_and_load_rebuild_the_kernels_from_the_ir(tmp_path):
    model = make_model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
        [("x", FLOAT, [4, 16])],
        [("y", FLOAT, None)],
        {"w": f(8, 16), "b": f(8)},
    )
    compiled = kiln.compile(model, target="gpu:interpret")
    path = compiled.save(tmp_path / "m.kiln")
    loaded = kiln.load(path)
    x = f(4, 16, seed=9)
    assert loaded.target == "gpu:interpret"
    np.testing.assert_allclose(loaded.run({"x": x})["y"], compiled.run({"x": x})["y"], rtol=0, atol=0)


def test_the_gpu_target_without_a_cuda_device_says_so_and_names_the_interpreter():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: target 'gpu' runs")
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)])
    with pytest.raises(kiln.KilnError, match="no CUDA device.*gpu:interpret"):
        kiln.compile(model, target="gpu")


def test_autotuning_the_gpu_target_is_refused_with_the_reason():
    from kiln import tune

    with pytest.raises(kiln.KilnError, match="CUDA device"):
        tune.tune(None, 1.0, target="gpu:interpret")  # type: ignore[arg-type]


# -- memory ordering inside one program ---------------------------------------------------------------------


def unordered_rereads(source: str) -> list[str]:
    """Loads of a buffer that an earlier statement of the same Triton function stored with no
    ``tl.debug_barrier()`` between them, in program text order. On a GPU such a load may run in
    another thread than the store (each tensor has its own layout over the program's threads) and
    read stale memory; Triton's interpreter runs whole tensors in order and never shows it."""
    found = []
    written: set[str] = set()
    function = ""
    for line in source.splitlines():
        if line.startswith("def "):
            function, written = line, set()
        if "tl.debug_barrier()" in line:
            written.clear()
        loads = set(re.findall(r"tl\.load\((p\d+)\b", line))
        if loads & written:
            found.append(f"{function.split('(')[0]}: {line.strip()[:120]}")
        written |= set(re.findall(r"tl\.store\((p\d+)\b", line))
    return found


POOLS = [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 1, 0, 1]}),
]


@pytest.mark.parametrize(("op", "attrs"), POOLS)
def test_a_program_rereading_what_it_stored_waits_for_a_barrier_first(op, attrs):
    """ResNet-50's max pool (3x3, stride 2, pads 1) gave wrong answers on an H100 (rel L2 4.8e-2;
    docs/gpu/2026-11-27-h100-run2.md) and right ones in the interpreter: its kernel stores -inf,
    then folds each tap into the output in loops whose vectors start one element later (the
    padded column), so another thread read the element before the -inf or the last tap's value
    reached memory."""
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, ["r"], ["y"], **attrs)],
        [("x", FLOAT, [1, 8, 30, 30])],
        [("y", FLOAT, None)],
        {},
    )
    x = f(1, 8, 30, 30, seed=3)
    compiled = kiln.compile(model, target="gpu:interpret")
    got = compiled.run({"x": x})["y"]
    source = "\n".join(e.plan.source for e in compiled.executables())
    assert "tl.store" in source and "tl.load" in source
    assert unordered_rereads(source) == []
    want = kiln.compile(model, target="reference").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_reread_check_finds_a_store_then_load_with_no_barrier():
    racy = "def k(p0, p1):\n    tl.store(p0 + i, 0.0)\n    tl.store(p0 + i, tl.load(p0 + i) + tl.load(p1 + i))\n"
    assert unordered_rereads(racy) == ["def k: tl.store(p0 + i, tl.load(p0 + i) + tl.load(p1 + i))"]
    ordered = racy.replace("    tl.store(p0 + i, tl.load", "    tl.debug_barrier()\n    tl.store(p0 + i, tl.load")
    assert unordered_rereads(ordered) == []


def residual_product():
    """y = x @ w + x2 (the add fused into the product's epilogue) then Relu: a tiled launch."""
    return make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "r"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        [("x", FLOAT, [64, 48]), ("r", FLOAT, [64, 80])],
        [("y", FLOAT, None)],
        {"w": f(48, 80)},
    )


def tuning_reports(compiled):
    return transfer_times([r for p in compiled.executables() for r in p.runners])["tuning"]


def test_block_sizes_are_measured_after_the_first_run_remembered_and_the_first_answer_is_right(monkeypatch, tmp_path):
    """KILN_GPU_TUNE=force tunes in the interpreter too (its times mean nothing: the bookkeeping,
    the buffers put back after every try and the cache are what is checked; docs/gpu has the GPU's)."""
    from kiln.backends.gpu import tuning

    monkeypatch.setenv("KILN_GPU_TUNE", "force")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    model = residual_product()
    feeds = {"x": f(64, 48, seed=1), "r": f(64, 80, seed=2)}
    want = np.maximum(feeds["x"] @ f(48, 80) + feeds["r"], 0)
    tried = []
    original = tuning.choose

    def choose(entry, configs, *rest):
        tried.append([c.label() for c in configs])
        return configs[-1], {c.label(): 1.0 for c in configs}  # the last candidate "wins": it must then run

    monkeypatch.setattr(tuning, "choose", choose)
    compiled = kiln.compile(model, target="gpu:interpret")
    np.testing.assert_allclose(compiled.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)
    report = tuning_reports(compiled)
    assert report["tuned"] == len(tried) >= 1 and report["changed"] == report["tuned"] and report["cached"] == 0
    assert all(labels[0] == "64x64 w4 s3" and "32x32 w2 s4" in labels for labels in tried), tried
    assert not any(label.startswith("128x") for labels in tried for label in labels)  # m = 64: no 128-row tile
    assert any(label.startswith("64x128") for labels in tried for label in labels)  # n = 80: 128 columns fit
    again = {"x": f(64, 48, seed=3), "r": f(64, 80, seed=4)}
    np.testing.assert_allclose(
        compiled.run(again)["y"], np.maximum(again["x"] @ f(48, 80) + again["r"], 0), rtol=1e-5, atol=1e-5
    )
    files = list((tmp_path / "cache" / "gpu").glob("tuned-*.json"))
    assert len(files) == 1 and "32" in files[0].read_text()

    monkeypatch.setattr(tuning, "choose", original)
    fresh = kiln.compile(model, target="gpu:interpret")  # a second load: the choice comes from the file
    np.testing.assert_allclose(fresh.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)
    report = tuning_reports(fresh)
    assert report["tuned"] == 0 and report["cached"] == len(tried) and report["changed"] == len(tried)


def test_a_candidate_that_disagrees_or_fails_is_skipped_and_the_buffers_are_put_back(monkeypatch, tmp_path):
    from kiln.backends.gpu import tuning

    monkeypatch.setenv("KILN_GPU_TUNE", "force")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "gpu").mkdir(parents=True)
    garbage = tmp_path / "cache" / "gpu" / "tuned-interpret.json"
    garbage.write_text('{"k": [1, 2], "x": {"constants": "no"}')  # not JSON: ignored, then rewritten
    calls = {"n": 0}
    original_agree = tuning.agree

    def agree(got, want):  # every other candidate "disagrees"
        calls["n"] += 1
        return original_agree(got, want) and calls["n"] % 2 == 1

    monkeypatch.setattr(tuning, "agree", agree)
    monkeypatch.setitem(tuning.FAMILIES, "gemm", [({"BM": 32, "BN": 32}, 2, 4), ({"BM": 64, "BN": 64}, 4, 1000)])
    feeds = {"x": f(64, 48, seed=1), "r": f(64, 80, seed=2)}
    compiled = kiln.compile(residual_product(), target="gpu:interpret")
    got = compiled.run(feeds)["y"]
    np.testing.assert_allclose(got, np.maximum(feeds["x"] @ f(48, 80) + feeds["r"], 0), rtol=1e-5, atol=1e-5)
    report = tuning_reports(compiled)
    assert report["tuned"] >= 1 and report["failed"] >= report["tuned"]
    import json

    assert json.loads(garbage.read_text())  # rewritten as JSON


def test_tuning_is_off_in_the_interpreter_unless_forced_and_off_when_asked(monkeypatch):
    from kiln.backends.gpu import tuning

    monkeypatch.delenv("KILN_GPU_TUNE", raising=False)
    assert tuning.mode() == "on"
    compiled = kiln.compile(residual_product(), target="gpu:interpret")
    compiled.run({"x": f(64, 48), "r": f(64, 80)})
    assert tuning_reports(compiled) == "off"  # gpu:interpret: times from the interpreter mean nothing
    monkeypatch.setenv("KILN_GPU_TUNE", "0")
    assert tuning.mode() == "off"
