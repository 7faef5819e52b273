"""From a static graph to a runnable plan: optimize, lower, plan memory, generate C, build.

The plan is a list of steps in execution order: native segments (consecutive kernels compiled
into one C function) and host fallbacks (a node run by its reference implementation, for ops
with no native lowering yet). Every fallback is recorded with its reason.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.codegen.c import emit_c
from kiln.codegen.target import Target
from kiln.codegen.toolchain import build, debug
from kiln.errors import KilnError
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType, TensorType
from kiln.lower.kir import Buffer, Kernel, buffers_in
from kiln.lower.kir_verify import verify_kernel
from kiln.lower.lowering import CannotLower, Lowerer
from kiln.lower.memory import MemoryPlan, engine_scratch, plan_memory
from kiln.passes import optimize


@dataclass
class Segment:
    number: int
    kernels: list[Kernel]


@dataclass
class Fallback:
    node: Node
    reason: str


@dataclass
class Plan:
    graph: Graph
    steps: list[Segment | Fallback]
    table: dict[Buffer, int]  # buffer -> slot in the pointer table (slot 0: status)
    roots: dict[Value, Buffer]  # every value -> the buffer holding it
    inputs: list[Buffer]
    outputs: list[Buffer]
    constants: dict[Buffer, np.ndarray]
    memory: MemoryPlan
    library: Path | None
    source: str
    kernel_labels: dict[int, str] = field(default_factory=dict)  # status code -> node label
    whole_graph_reason: str = ""  # set when the graph cannot be planned at all (dynamic shapes)

    @property
    def fallbacks(self) -> list[Fallback]:
        return [s for s in self.steps if isinstance(s, Fallback)]

    @property
    def is_native(self) -> bool:
        return not self.whole_graph_reason and not self.fallbacks


def describe_node(node: Node, graph: Graph) -> str:
    """How errors after import name a node: label, opset and the types it was compiled for (a
    fused group's opset is that of the ONNX ops it was made from)."""
    domain = "" if node.domain == "kiln" else node.domain
    types = ", ".join(f"%{v.name}: {v.type}" for v in node.inputs if v is not None)
    return f"{node.label} (opset {graph.opsets.get(domain, '?')}) with inputs {types}"


def _static(graph: Graph) -> str:
    """Why the graph cannot be planned statically ('' if it can)."""
    for value in graph.values():
        if not isinstance(value.type, TensorType) or not value.type.is_static:
            return f"%{value.name} has type {value.type} (dynamic shapes and sequences run on the reference)"
        if value.type.dtype is DType.STRING:
            return f"%{value.name} holds strings (they run on the reference)"
    for node in graph.nodes:
        if node.domain != "kiln" and any(True for _ in node.subgraphs()):
            return f"node {node.label} has subgraphs (control flow runs on the reference)"
    return ""


def compile_plan(
    graph: Graph,
    level: int = 2,
    prebuilt: dict[str, Path] | None = None,
    profile: bool = False,
    choices: dict | None = None,
    build_library: bool = True,
    target: Target | None = None,
) -> Plan:
    """Optimize and lower a graph whose symbolic dims are already bound (see ``specialize``) for
    ``target`` (default: this machine's cpu target).
    ``profile`` builds the library with per-kernel timers (see ``kiln.runtime.profile``);
    ``choices`` maps tuning keys to schedules to apply (otherwise the tuning database is read);
    without ``build_library`` no C is generated (``kiln check`` only wants the plan's steps)."""
    stages = ["passes"]
    try:
        return _compile_plan(graph, level, prebuilt, profile, choices, build_library, stages, target or Target.host())
    except KilnError:
        raise
    except Exception as err:  # an invariant broke: say where
        err.add_note(f"kiln stage: {stages[-1]}")
        raise


def _compile_plan(graph, level, prebuilt, profile, choices, build_library, stages, target):  # type: ignore[no-untyped-def]
    """compile_plan's body; appends each stage's name to ``stages`` as it starts."""
    from kiln.lower.lowering import ALIASES, lowerings
    from kiln.passes.decompose import decompose
    from kiln.passes.fold_constants import fold_constants
    from kiln.passes.widen_half import widen_half

    graph = fold_constants(graph)  # what folds away needs no decomposition
    native = lowerings()
    graph = decompose(graph, keep=lambda node: bool(node.domain) or node.op in native or node.op in ALIASES)
    graph = optimize(widen_half(graph), level=level)
    reason = _static(graph)
    if reason:
        return Plan(graph, [], {}, {}, [], [], {}, MemoryPlan({}, {}, 0, 0), None, "", whole_graph_reason=reason)
    stages.append("lowering")
    lowerer = Lowerer(graph, choices, target)
    steps: list[Segment | Fallback] = []
    current: list[Kernel] = []
    access: list[tuple[list[Buffer], list[Buffer]]] = []
    for node in graph.nodes:
        try:
            kernels = lowerer.lower(node)
        except KilnError:
            raise
        except CannotLower as err:
            if current:
                steps.append(Segment(len([s for s in steps if isinstance(s, Segment)]), current))
                current = []
            steps.append(Fallback(node, str(err)))
            access.append(
                ([lowerer.buffer(v) for v in node.inputs if v is not None], [lowerer.buffer(v) for v in node.outputs])
            )
            continue
        except Exception as err:  # a kiln bug: name the node it happened on
            err.add_note(f"kiln node: {describe_node(node, graph)}")
            raise
        current.extend(kernels)
        access.extend((k.reads, k.writes) for k in kernels)
    if current:
        steps.append(Segment(len([s for s in steps if isinstance(s, Segment)]), current))
    if debug():  # KILN_DEBUG: the kernel IR's invariants, static bounds included, before any C
        stages.append("kernel verification")
        problems = [p for s in steps if isinstance(s, Segment) for k in s.kernels for p in verify_kernel(k)]
        if problems:
            raise AssertionError("the kernel IR breaks its invariants:\n" + "\n".join(problems[:20]))
    roots = {v: lowerer.buffer(v) for v in graph.values()}
    inputs = [roots[v] for v in graph.inputs]
    outputs = [roots[v] for v in graph.outputs]
    # constants no step reads (weights only their packed copies serve) stay out of the plan
    used = {b for reads, writes in access for b in (*reads, *writes)} | set(outputs)
    used.update(b for step in steps if isinstance(step, Segment) for k in step.kernels for b in buffers_in(k.body))
    constants = {
        roots[v]: np.ascontiguousarray(a)
        for v, a in graph.constants.items()
        if lowerer.root(v) is v and roots[v] in used
    }
    constants.update(lowerer.packed)
    fixed = set(inputs) | set(outputs) | set(roots[v] for v in graph.constants) | set(lowerer.packed)
    temps = {b for b in roots.values() if b not in fixed} | set(lowerer.scratch)
    stages.append("memory planning")
    memory = plan_memory(access, temps)
    memory.scratch_shared, memory.scratch_per_thread = engine_scratch(
        [k for s in steps if isinstance(s, Segment) for k in s.kernels], target.gemm_rows, target.gemm_cols
    )
    table = {lowerer.status: 0}
    for buffer in [*dict.fromkeys(roots.values()), *lowerer.packed, *lowerer.scratch]:
        table.setdefault(buffer, len(table))
    segments = [s.kernels for s in steps if isinstance(s, Segment)]
    stages.append("code generation")
    build_library = build_library and not target.interpreted  # the kernel-IR interpreter needs no C
    source = emit_c(segments, table, profile, target) if segments and build_library else ""
    library = None
    if segments and build_library:
        from kiln.runtime.artifact import source_key

        # a loaded artifact brings its libraries: no C compiler needed
        library = (prebuilt or {}).get(source_key(source)) or build(source, target)
    # how a run-time error names a kernel's node: op, opset and the types it was compiled for
    described = {n.label: describe_node(n, graph) for n in graph.nodes}
    labels = {int(k.name[1:]): described.get(k.sources[0], k.sources[0]) for kernels in segments for k in kernels}
    return Plan(graph, steps, table, roots, inputs, outputs, constants, memory, library, source, labels)


def load_functions(plan: Plan) -> list[ctypes._CFuncPtr]:  # type: ignore[name-defined]
    if plan.library is None:
        return []
    try:
        library = ctypes.CDLL(str(plan.library))
    except OSError as err:
        raise KilnError(f"cannot load the native library {plan.library}: {err}") from None
    functions = []
    for step in plan.steps:
        if isinstance(step, Segment):
            try:
                function = getattr(library, f"kiln_segment_{step.number}")
            except AttributeError:
                raise KilnError(f"the native library {plan.library} lacks segment {step.number}") from None
            function.argtypes = [ctypes.c_void_p]
            function.restype = ctypes.c_int
            functions.append(function)
    return functions
