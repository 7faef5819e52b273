"""KILN_DEBUG=1: generated code range-checks every buffer index and is built with AddressSanitizer
and UBSan. The fuzz tests run once that way (in a subprocess that preloads the ASan runtime), and
an injected out-of-bounds read is caught with the buffer and line named."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sanitized_env(tmp_path):
    runtime = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not runtime or not os.path.isabs(runtime) or not os.path.exists(runtime):
        pytest.skip("gcc's AddressSanitizer runtime (libasan.so) is not installed")
    env = dict(os.environ)
    env.update(
        {
            "KILN_DEBUG": "1",
            "LD_PRELOAD": runtime,
            # Python itself is not built with ASan: its allocations are not leaks to report
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
            "KILN_CACHE_DIR": str(tmp_path / "cache"),
            "KILN_FUZZ_EXAMPLES": os.environ.get("KILN_SANITIZED_EXAMPLES", "8"),
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


def test_fuzz_cases_pass_under_asan_and_ubsan_with_bounds_checks(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "fuzz" / "test_fuzz.py"),
            str(ROOT / "tests" / "fuzz" / "test_fuzz_ops.py"),
        ],
        env=sanitized_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "passed" in result.stdout


def test_the_bf16_and_int8_products_pass_under_asan_and_ubsan_with_bounds_checks(tmp_path):
    """Every bf16 and int8 path this machine has (AMX tiles, AVX-512, AVX2, portable), their
    packers, edge blocks and direct convolutions (strided, channels last), with the engine's own
    span checks on (KILN_DEBUG) and the sanitizers."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "rounded or exact or channels_last",
         str(ROOT / "tests" / "codegen" / "test_bf16.py"), str(ROOT / "tests" / "codegen" / "test_int8.py")],
        env=sanitized_env(tmp_path), capture_output=True, text=True, timeout=1200, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout


def test_an_out_of_bounds_read_is_caught_and_named(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np
        from onnx import TensorProto, helper
        import kiln
        from kiln.lower import families, lowering
        from kiln.ir.types import DType
        from kiln.lower.kir import Cast, Load, Store, add, i64

        original = lowering.LOWERINGS["Neg"]

        def off_by_one(lw, node):  # a deliberately wrong lowering: reads x[i + int(x[0])], x[0] = 1
            # (an offset known only at run time: a constant one is caught before, by the kernel-IR verifier)
            src, dst = lw.buffer(node.inputs[0]), lw.buffer(node.outputs[0])
            offset = Cast(DType.INT64, Load(src, i64(0)))
            body, indices = lowering.nest(lw, (dst.size,), lambda i: [Store(dst, i[0], Load(src, add(i[0], offset)))])
            return [lw.kernel(node, "pointwise", body, [node.inputs[0]], [node.outputs[0]], lowering.Schedule())]

        families.lowerings()["Neg"] = off_by_one
        g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
        model(np.ones(8, np.float32))
        print("not caught")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=sanitized_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert result.returncode != 0 and "not caught" not in result.stdout
    assert "kiln debug: index 8 outside" in result.stderr, result.stderr[-2000:]


def test_an_engine_descriptor_out_of_range_is_caught_by_the_engine_checks(tmp_path):
    # A wrong matrix-multiply descriptor (one row more than the operands hold): the engine's own
    # KILN_DEBUG checks name the operand before any memory outside it is touched (before ASan would).
    script = textwrap.dedent(
        """
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper
        import kiln
        from kiln.lower import families
        from kiln.lower.kir import GemmSpec

        original = families.lowerings()["MatMul"]  # the engine's rule, then the loop nests'

        def one_row_too_many(lw, node, *args, **kwargs):
            kernels = original(lw, node, *args, **kwargs)
            for kernel in kernels:
                for stmt in kernel.body:
                    if isinstance(stmt, GemmSpec):
                        stmt.m += 1
            return kernels

        families.lowerings()["MatMul"] = one_row_too_many
        w = numpy_helper.from_array(np.ones((32, 48), np.float32), "w")
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
        model = kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
        model(np.ones((40, 32), np.float32))
        print("not caught")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=sanitized_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert result.returncode != 0 and "not caught" not in result.stdout, result.stdout + result.stderr[-2000:]
    # the row is outside both A (40 x 32) and C (40 x 48): whichever the engine checks first is named
    named = "outside A[0, 1280)" in result.stderr or "outside C[0, 1920)" in result.stderr
    assert "kiln debug: index" in result.stderr and named, result.stderr[-2000:]
