"""ONNX backend conformance: runs the test cases the installed ``onnx`` package provides.

Each case runs in a worker process with a timeout; a crash or hang of one case is recorded as that
case's result and the worker is replaced, so the run always finishes. Outputs are compared the way
ONNX's own backend runner does (shape, dtype, then allclose with the case's rtol/atol).
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.connection
import os
import re
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

SUITES = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")
DEFAULT_TIMEOUT = 60.0


@dataclass
class Case:
    name: str
    suite: str
    model: bytes
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float
    atol: float
    ops: list[str]


@dataclass
class CaseResult:
    name: str
    suite: str
    status: str  # pass | fail | error | crash | timeout
    ops: list[str]
    seconds: float
    message: str = ""
    native: bool | None = None  # for compiled targets: ran with no host fallback


@dataclass
class Report:
    target: str
    results: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.status == "pass" for r in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def native(self) -> int | None:
        """Cases that passed running compiled code only (no host fallback); None for the reference."""
        if all(r.native is None for r in self.results):
            return None
        return sum(r.status == "pass" and bool(r.native) for r in self.results)

    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(r.status for r in self.results))

    def per_op(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for result in self.results:
            for op in result.ops:
                row = table.setdefault(op, {"cases": 0, "passed": 0})
                row["cases"] += 1
                row["passed"] += result.status == "pass"
        return dict(sorted(table.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "summary": {
                "total": self.total,
                "passed": self.passed,
                "rate": self.rate,
                "native": self.native,
                **self.counts(),
            },
            "per_op": self.per_op(),
            "cases": [asdict(r) for r in self.results],
        }


# -- loading cases ---------------------------------------------------------------------------------


def load_cases(suites: Iterable[str] = ("node",), name_filter: str | None = None) -> list[Case]:
    """The installed onnx package's backend test cases for ``suites``, filtered by a regex."""
    import onnx
    from onnx.backend.test.loader import load_model_tests

    pattern = re.compile(name_filter) if name_filter else None
    cases: list[Case] = []
    for suite in suites:
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tests = load_model_tests(kind=suite)
        for test in tests:
            if pattern and not pattern.search(test.name):
                continue
            model = test.model if test.model is not None else _model_from_dir(test.model_dir)
            if model is None:
                continue  # 'real' models are downloaded on demand; none are on disk here
            data_sets = test.data_sets if test.data_sets is not None else _data_from_dir(test.model_dir, model)
            ops = sorted({n.op_type for n in model.graph.node})
            cases.append(Case(test.name, suite, model.SerializeToString(), data_sets, test.rtol, test.atol, ops))
    _ = onnx
    return cases


def _model_from_dir(model_dir: str | None) -> Any:
    import onnx

    if not model_dir:
        return None
    path = os.path.join(model_dir, "model.onnx")
    return onnx.load(path) if os.path.exists(path) else None


def _data_from_dir(model_dir: str, model: Any) -> list[tuple[list[Any], list[Any]]]:
    import glob

    import onnx
    from onnx import numpy_helper

    data_sets = []
    for folder in sorted(glob.glob(os.path.join(model_dir, "test_data_set*"))):
        inputs, outputs = [], []
        for prefix, target in (("input", inputs), ("output", outputs)):
            for path in sorted(glob.glob(os.path.join(folder, f"{prefix}_*.pb")), key=_index):
                tensor = onnx.TensorProto()
                with open(path, "rb") as handle:
                    tensor.ParseFromString(handle.read())
                target.append(numpy_helper.to_array(tensor))
        data_sets.append((inputs, outputs))
    return data_sets


def _index(path: str) -> int:
    match = re.search(r"_(\d+)\.pb$", path)
    return int(match.group(1)) if match else 0


# -- running one case ------------------------------------------------------------------------------


def _to_numpy(value: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, onnx.SequenceProto):
        return [_to_numpy(v) for v in numpy_helper.to_list(value)]
    if isinstance(value, onnx.OptionalProto):
        return _to_numpy(numpy_helper.to_optional(value))
    if isinstance(value, list):
        return [_to_numpy(v) for v in value]
    return value


def compare_outputs(expected: list[Any], got: list[Any], rtol: float, atol: float) -> None:
    """Raise AssertionError unless ``got`` matches ``expected`` as ONNX's backend runner requires."""
    if len(expected) != len(got):
        raise AssertionError(f"expected {len(expected)} outputs, got {len(got)}")
    for index, (ref, out) in enumerate(zip(expected, got)):
        if ref is None or out is None:
            if ref is not out:
                raise AssertionError(f"output {index}: expected {ref!r}, got {type(out).__name__}")
            continue
        if isinstance(ref, (list, tuple)):
            if not isinstance(out, (list, tuple)):
                raise AssertionError(f"output {index}: expected a sequence, got {type(out).__name__}")
            compare_outputs(list(ref), list(out), rtol, atol)
            continue
        ref, out = np.asarray(ref), np.asarray(out)
        if ref.shape != out.shape:
            raise AssertionError(f"output {index}: shape {list(out.shape)}, expected {list(ref.shape)}")
        if ref.dtype == object:
            np.testing.assert_array_equal(out, ref)
            continue
        if ref.dtype != out.dtype:
            raise AssertionError(f"output {index}: dtype {out.dtype}, expected {ref.dtype}")
        output_rtol = rtol
        if ref.dtype.name == "bfloat16":
            output_rtol = max(rtol, 2**-6)  # two bfloat16 ULPs, as ONNX's runner allows
        if ref.dtype.kind not in "biufc":  # ml_dtypes (bfloat16, float8, int4...) compare as float32
            ref, out = ref.astype(np.float32), out.astype(np.float32)
        np.testing.assert_allclose(out, ref, rtol=output_rtol, atol=atol, err_msg=f"output {index}")


def fixed_point_target(target: str) -> bool:
    """Whether ``target`` computes in fixed point (the fpga target: calibrated from each case's
    inputs, compared within its output format's steps)."""
    return target.split(":")[0] == "fpga"


def makes_sense_in_fixed_point(case: Case) -> bool:
    """A case whose every input and output is a finite float32 tensor (fixed point has no NaN,
    infinity or integer/string tensors to compute)."""
    for inputs, outputs in case.data_sets:
        for value in [*inputs, *outputs]:
            array = _to_numpy(value)
            if not isinstance(array, np.ndarray) or array.dtype != np.float32 or not np.all(np.isfinite(array)):
                return False
    return bool(case.data_sets)


def run_case(case: Case, target: str) -> CaseResult:
    """Run one case in this process (the worker calls this); never raises."""
    import onnx

    import kiln
    from kiln.errors import KilnError

    start = time.perf_counter()
    native: bool | None = None
    try:
        model = onnx.load_from_string(case.model)
        atol = case.atol
        if fixed_point_target(target):
            from kiln.driver.fixed_point import output_tolerance

            initializers = {i.name for i in model.graph.initializer}
            names = [i.name for i in model.graph.input if i.name not in initializers]
            samples = [dict(zip(names, (_to_numpy(x) for x in inputs))) for inputs, _ in case.data_sets]
            compiled = kiln.compile(model, target=target, calibration=samples)
            atol = max(atol, output_tolerance(compiled))
        else:
            compiled = kiln.compile(model, target=target)
        input_names = compiled.input_names
        for inputs, outputs in case.data_sets:
            feeds = dict(zip(input_names, (_to_numpy(x) for x in inputs)))
            got = list(compiled.run(feeds).values())
            compare_outputs([_to_numpy(x) for x in outputs], got, case.rtol, atol)
        native = getattr(compiled, "is_native", None)  # known once every variant has compiled
        status, message = "pass", ""
    except AssertionError as err:
        status, message = "fail", str(err).strip()[:2000]
    except KilnError as err:
        status, message = "error", f"{type(err).__name__}: {err}"[:2000]
    except Exception as err:
        status = "error"
        message = f"internal error {type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}"[:4000]
    return CaseResult(case.name, case.suite, status, case.ops, time.perf_counter() - start, message, native)


# -- isolation: worker processes ---------------------------------------------------------------------


def _worker_main(connection: multiprocessing.connection.Connection, target: str, case_runner: str) -> None:
    import importlib

    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    module_name, _, function_name = case_runner.partition(":")
    runner = getattr(importlib.import_module(module_name), function_name)
    while True:
        try:
            case = connection.recv()
        except EOFError:
            return
        if case is None:
            return
        connection.send(runner(case, target))


class _Worker:
    def __init__(self, context: Any, target: str, case_runner: str) -> None:
        self.parent, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, target, case_runner), daemon=True)
        self.process.start()
        child.close()
        self.case: Case | None = None
        self.started = 0.0

    def send(self, case: Case) -> None:
        self.case = case
        self.started = time.monotonic()
        self.parent.send(case)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.parent.close()


def run_conformance(
    cases: list[Case],
    target: str = "reference",
    jobs: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[CaseResult], None] | None = None,
    case_runner: str = "kiln.conformance.runner:run_case",
) -> Report:
    """Run every case isolated in ``jobs`` worker processes; returns the report (case order kept).

    ``case_runner`` ("module:function") is what a worker calls per case; tests swap it to make
    workers crash or hang on purpose.
    """
    context = multiprocessing.get_context("spawn")
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(cases) or 1))
    pending = collections.deque(cases)
    results: dict[str, CaseResult] = {}
    workers = [_Worker(context, target, case_runner) for _ in range(jobs)]

    def record(result: CaseResult) -> None:
        results[f"{result.suite}/{result.name}"] = result
        if progress:
            progress(result)

    try:
        while pending or any(w.case for w in workers):
            for worker in workers:
                if worker.case is None and pending:
                    worker.send(pending.popleft())
            busy = {w.parent: w for w in workers if w.case is not None}
            ready = multiprocessing.connection.wait(list(busy), timeout=0.5)
            for connection in ready:
                worker = busy[connection]  # type: ignore[index]
                try:
                    result = connection.recv()  # type: ignore[union-attr]
                    worker.case = None
                    record(result)
                except (EOFError, OSError):
                    case = worker.case
                    assert case is not None
                    worker.process.join(timeout=5)
                    message = f"worker process died (exit code {worker.process.exitcode})"
                    workers[workers.index(worker)] = _replace(worker, context, target, case_runner)
                    record(
                        CaseResult(case.name, case.suite, "crash", case.ops, time.monotonic() - worker.started, message)
                    )
            now = time.monotonic()
            for position, worker in enumerate(workers):
                if worker.case is not None and now - worker.started > timeout:
                    case = worker.case
                    hung = CaseResult(
                        case.name,
                        case.suite,
                        "timeout",
                        case.ops,
                        now - worker.started,
                        f"no result after {timeout:.0f} s",
                    )
                    workers[position] = _replace(worker, context, target, case_runner)
                    record(hung)
    finally:
        for worker in workers:
            try:
                worker.parent.send(None)
            except (OSError, BrokenPipeError):
                pass
            worker.stop()
    report = Report(target)
    report.results = [results[f"{c.suite}/{c.name}"] for c in cases if f"{c.suite}/{c.name}" in results]
    return report


def _replace(worker: _Worker, context: Any, target: str, case_runner: str) -> _Worker:
    worker.stop()
    return _Worker(context, target, case_runner)
