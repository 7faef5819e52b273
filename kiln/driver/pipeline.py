"""The compile pipeline: a table of stages (``PIPELINE``) that ``kiln.compile``, ``kiln explain``,
``kiln diff``, ``--profile`` and the tuner all run (``run_stages`` iterates it), so what explain
shows is what a compile does:

    [import: the frontend] -> specialize -> fold -> decompose[target] -> passes -> lower[target]
           -> plan-memory -> render[target] -> build[target] -> load[target: the runtime]

Each ``Stage`` is a named function of the compile's state (``Compile``) returning what it
produced; stages marked [target] ask the target's backend (``kiln.backends``). ``observe(stage,
result)`` is called after each stage with that result (a Graph, the kernels, the memory plan, the
source, the build products, the loaded runners): ``kiln explain --print-after STAGE`` prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from kiln.backends import Backend, Threading, parse
from kiln.backends import backend as backend_of
from kiln.backends.registry import Placement, PlanFacts
from kiln.driver.artifact import source_key
from kiln.driver.options import CompileOptions, Quantization
from kiln.errors import KilnError
from kiln.ir.graph import Graph, Node, Value, free_values
from kiln.ir.types import DType, TensorType
from kiln.lower.families import lowerings
from kiln.lower.kir import Buffer, Kernel, buffers_in
from kiln.lower.kir_verify import verify_kernel
from kiln.lower.lowering import CannotLower, Lowerer
from kiln.lower.memory import MemoryPlan, plan_memory
from kiln.lower.quantized_only import store_quantized_only
from kiln.lower.target import Target
from kiln.memory import BIG, aligned_if_big, one_copy, return_freed
from kiln.passes import PASS_NAMES, cache_in_place, optimize, specialize
from kiln.passes.decompose import decompose
from kiln.passes.fold_constants import fold_constants
from kiln.passes.fuse import unfuse
from kiln.passes.layout import Narrow
from kiln.passes.quantized import quantized_model
from kiln.passes.widen_half import widen_half
from kiln.runtime.executable import Executable
from kiln.runtime.plan import Fallback, Plan, Segment

Observer = Callable[[str, Any], None]


@dataclass
class Compile:
    """One compile's state as the stages fill it in."""

    graph: Graph
    target: Target
    options: CompileOptions
    dims: dict[str, int] = field(default_factory=dict)  # the binding ``specialize`` applies
    prebuilt: dict[str, tuple[Path, ...]] = field(default_factory=dict)  # source key -> what an artifact brought
    choices: dict | None = None  # tuning key -> schedule (the tuner's candidates)
    build_library: bool = True  # False: nothing rendered or built (``kiln check``)
    expose: Callable[[Graph], Graph] | None = None  # rewrites the graph after the passes (``kiln diff``)
    # lowered only to read its kernels' sizes (a run-time length's samples, ``kiln.driver.extents``):
    # the graph is not re-verified after each pass, packed weights are views, never aligned copies
    sizes_only: bool = False
    folded: bool = False  # the graph is constant-folded as it stands (``specialize`` folds)
    observe: Observer | None = None  # told of each stage's result, and of each graph pass
    unplannable: str = ""  # why the graph cannot be planned statically ('' if it can): the stages stop
    lowerer: Lowerer | None = None
    steps: list[Segment | Fallback] = field(default_factory=list)
    access: list[tuple[list[Buffer], list[Buffer]]] = field(default_factory=list)  # each step's reads, writes
    roots: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)
    released: set = field(default_factory=set)  # constants let go while lowering (their packed copies serve)
    aligned: dict = field(default_factory=dict)  # id of a weight the plan reads as it is -> its aligned copy
    memory: MemoryPlan | None = None
    table: dict[Buffer, int] = field(default_factory=dict)
    source: str = ""
    products: tuple[Path, ...] = ()  # the build's files

    @property
    def backend(self) -> Backend:
        return backend_of(self.target.backend)

    @property
    def segments(self) -> list[list[Kernel]]:
        return [s.kernels for s in self.steps if isinstance(s, Segment)]

    def plan(self) -> Plan:
        """The finished plan (after build; after the graph stages when the graph is unplannable)."""
        if self.unplannable:
            empty = MemoryPlan({}, {}, 0, 0)
            return Plan(self.graph, [], {}, {}, [], [], {}, empty, (), "", whole_graph_reason=self.unplannable)
        assert self.lowerer is not None and self.memory is not None
        # how a run-time error names a kernel's node: op, opset and the types it was compiled for
        described = {n.label: describe_node(n, self.graph) for n in self.graph.nodes}
        labels = {
            int(k.name[1:]): described.get(k.sources[0], k.sources[0]) for kernels in self.segments for k in kernels
        }
        inputs = [self.roots[v] for v in self.graph.inputs]
        outputs = [self.roots[v] for v in self.graph.outputs]
        # the optimized graph keeps only the weights the plan reads as they are: one only its packed
        # copies serve is not held twice (a model's weights stayed resident beside their packed form)
        kept = {id(a) for a in self.constants.values()}
        constants = {v: self.aligned.get(id(a), a) for v, a in self.graph.constants.items()}
        graph = self.graph.with_(constants={v: a for v, a in constants.items() if id(a) in kept})
        return Plan(
            graph,
            self.steps,
            self.table,
            self.roots,
            inputs,
            outputs,
            self.constants,
            self.memory,
            self.products,
            self.source,
            labels,
            target=self.target,
        )


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    run: Callable[[Compile], Any]  # does the stage's work on the state; returns what it produced
    per_target: bool = False  # the target's backend decides how (or whether) it runs
    graph: bool = False  # a graph stage (before lowering: ``kiln explain --no-kernels`` stops after them)


def describe_node(node: Node, graph: Graph) -> str:
    """How errors after import name a node: label, opset and the types it was compiled for (a
    fused group's opset is that of the ONNX ops it was made from)."""
    domain = "" if node.domain == "kiln" else node.domain
    types = ", ".join(f"%{v.name}: {v.type}" for v in node.inputs if v is not None)
    return f"{node.label} (opset {graph.opsets.get(domain, '?')}) with inputs {types}"


def unplannable(graph: Graph) -> str:
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


def resolve_target(target: Target | str | None) -> Target:
    if target is None:
        return parse("cpu")
    return parse(target) if isinstance(target, str) else target


def chooser(choices: dict | None, target: Target, options: CompileOptions) -> Callable[[str], tuple[dict, str]]:
    """Schedules for tunable kernels: what this compile was given (the tuner's candidates), else
    the tuning database's best (unless ``options.tuned`` is off), else the default."""
    from kiln.driver import tuning_db

    given = choices or {}

    def choose(key: str) -> tuple[dict, str]:
        if key in given:
            return dict(given[key]), "tuned" if given[key] else "default"
        if options.tuned:
            stored = tuning_db.best(key, repr(target))
            if stored:
                return stored, "tuned" if key in tuning_db.TUNED_HERE else "cached"
        return {}, "default"

    return choose


def resolve_precision(precision: str, target: Target) -> str:
    """The precision a compile for ``target`` runs at: ``auto`` becomes the best the target
    computes natively here (bf16, else fp32); one it cannot compute is a KilnError saying why."""
    offered = backend_of(target.backend).precisions(target)
    if precision == "auto":
        return "bf16" if offered.get("bf16") == "" else "fp32"
    reason = offered.get(precision, f"unknown precision {precision!r}")
    if reason:
        raise KilnError(f"precision {precision} is not available for target {target.name}: {reason}")
    return precision


def _specialize(state: Compile) -> Graph:
    state.graph = specialize(state.graph, state.dims)
    state.folded = bool(state.dims)  # specialize folds what the binding made constant
    return state.graph


def _fold(state: Compile) -> Graph:
    graph = quantized_model(state.graph)  # QOperator ops as QDQ; QDQ products marked for the int8 path
    if graph is not state.graph or not state.folded:
        graph = fold_constants(graph)  # what folds away needs no decomposition
    state.graph = graph
    return state.graph


def _decompose(state: Compile) -> Graph:
    state.graph = decompose(state.graph, keep=state.backend.keeps)
    if state.backend.widens_half:
        state.graph = widen_half(state.graph)
    return state.graph


def _taken(state: Compile) -> Graph:
    """The state's graph, no longer held by it: a compile that consumed its source then frees the
    weights each pass rewrote (BN-folded, transposed) when that pass returns, instead of holding
    every original beside its copy through all the passes (ResNet-50's load into an empty cache:
    -100 MB)."""
    graph, state.graph = state.graph, None  # type: ignore[assignment]
    return graph


def narrow_of(options: CompileOptions) -> Narrow | None:
    """What an int8 or bf16 compile tells the layout pass: int8 runs the products whose
    activations were calibrated (``kiln_range_of`` or their own name) and not kept in fp32."""
    if options.precision == "bf16":
        return Narrow("bf16")
    if options.precision != "int8":
        return None
    quantization = options.quantization
    return Narrow("int8", frozenset(name for name, _, _ in quantization.ranges), frozenset(quantization.keep))


def _passes(state: Compile) -> Graph:
    options, target = state.options, state.target
    graph = optimize(
        _taken(state),  # not held here: each pass's input goes when the pass returns
        level=options.level,
        disable=options.passes_disabled,
        after=state.observe,
        target=target,
        verify_each=not state.sizes_only,
        narrow=narrow_of(options),
    )
    # fusion is target-neutral; a group the target has no engine for is split back into its ops
    # (lowered one by one) rather than run on the host
    graph = unfuse(graph, lambda node: node.attrs.get("kind") != "attention" or "attention" in target.engines)
    if options.cache_layouts and "cache-in-place" not in options.disabled:
        graph = cache_in_place.in_place(graph, dict(options.cache_layouts))
    if state.expose is not None:
        graph = state.expose(graph)
    state.graph = graph
    state.unplannable = unplannable(graph)
    return graph


def _lower(state: Compile) -> list[Segment | Fallback]:
    # the graph lowered holds its weights in a dict of its own: a weight only its packed copy serves
    # is let go as soon as its last reader is lowered (the passes' graph may share its dict with
    # the source graph, which must keep every weight)
    graph = state.graph = state.graph.with_()
    weights = dict(graph.constants)  # (the graph is this stage's own: no one else sees its dict change)
    object.__setattr__(graph, "constants", MappingProxyType(weights))
    options = state.options
    lowerer = state.lowerer = Lowerer(
        graph,
        state.target,
        lowerings(),
        chooser(state.choices, state.target, options),
        options.algorithms_disabled,
        options.precision,
        options.quantization,
        copy_packed=not state.sizes_only,
    )
    current: list[Kernel] = []
    release = _Release(graph, weights, lowerer) if not state.sizes_only else None
    for number, node in enumerate(graph.nodes):
        try:
            kernels = lowerer.lower(node)
        except KilnError:
            raise
        except CannotLower as err:
            if current:
                state.steps.append(Segment(len(state.segments), current))
                current = []
            state.steps.append(Fallback(node, str(err)))
            reads = [lowerer.buffer(v) for v in node.inputs if v is not None]
            state.access.append((reads, [lowerer.buffer(v) for v in node.outputs]))
            if release is not None:
                release.after(number, [(reads, [])])
            continue
        except Exception as err:  # a kiln bug: name the node it happened on
            err.add_note(f"kiln node: {describe_node(node, graph)}")
            raise
        current.extend(kernels)
        access = [(k.reads, [*k.writes, *buffers_in(k.body)]) for k in kernels]
        state.access.extend((k.reads, k.writes) for k in kernels)
        if release is not None:
            release.after(number, access)
    state.released = release.released if release is not None else set()
    if current:
        state.steps.append(Segment(len(state.segments), current))
    if "quantized-only" not in options.algorithms_disabled:
        kernels = [k for step in state.steps if isinstance(step, Segment) for k in step.kernels]
        other = {lowerer.buffer(v) for v in graph.outputs} | {
            lowerer.buffer(v) for step in state.steps if isinstance(step, Fallback) for v in step.node.inputs if v is not None
        }  # fmt: skip
        store_quantized_only(kernels, other)
    return state.steps


class _Release:
    """Lets go of the weights that only their packed copies serve, while lowering: a constant
    whose last reader has been lowered, that no kernel so far reads as it is and on whose buffer
    nothing else lives (a reshape's view), is replaced in the lowered graph's dict by a
    placeholder of its type that holds no memory. (The compile's peak was the source weights, their
    folded copies and the packed forms at once.) ``_plan_memory`` checks that no step reads one."""

    def __init__(self, graph: Graph, weights: dict[Value, np.ndarray], lowerer: Lowerer) -> None:
        self.weights, self.lowerer = weights, lowerer
        self.last: dict[int, list[Value]] = {}  # node number -> the constants it reads last
        last: dict[Value, int] = {}
        for number, node in enumerate(graph.nodes):
            for value in node.inputs:
                if value is not None and value in graph.constants:
                    last[value] = number
            for sub in node.subgraphs():
                for value in free_values(sub):
                    if value in graph.constants:
                        last[value] = number
        for value, number in last.items():
            if value not in lowerer.outputs:
                self.last.setdefault(number, []).append(value)
        self.read: set[Buffer] = set()
        self.released: set[Value] = set()
        self.unreturned = 0  # bytes let go since the freed heap was last handed back

    def after(self, number: int, access: list[tuple[list[Buffer], list[Buffer]]]) -> None:
        for reads, others in access:
            self.read.update(reads, others)
        lowerer, constants = self.lowerer, self.weights
        for value in self.last.get(number, ()):
            if lowerer.root(value) is not value or lowerer.shared(value):
                continue
            if value in lowerer.buffers and lowerer.buffers[value] in self.read:
                continue
            array = constants[value]
            if array.nbytes < 4096:  # small: not worth a placeholder
                continue
            constants[value] = np.broadcast_to(np.zeros((), array.dtype), array.shape)
            self.released.add(value)
            self.unreturned += array.nbytes
            del array  # (this reference too)
        if self.unreturned >= BIG:  # freed blocks smaller than the packed ones would stay in the RSS
            return_freed()
            self.unreturned = 0


def _verify(state: Compile) -> list[str]:
    """With ``debug`` (KILN_DEBUG): the kernel IR's invariants, static bounds included, before any source."""
    if not state.options.debug:
        return []
    problems = [p for kernels in state.segments for k in kernels for p in verify_kernel(k)]
    if problems:
        raise AssertionError("the kernel IR breaks its invariants:\n" + "\n".join(problems[:20]))
    return problems


def _aligned(state: Compile, array: np.ndarray) -> np.ndarray:
    """A weight the plan reads as it is (an embedding table), contiguous and, where big, 64-byte
    aligned now (``aligned_if_big``), the plan (and its graph) holding only that copy: the runtime
    had copied an unaligned one while the plan kept the original (a 1B decoder's 1 GB table held
    twice); one copy however many size classes compile it (``one_copy``). The ONNX import aligns
    a file's."""
    contiguous = np.ascontiguousarray(array)
    found = contiguous if state.sizes_only else aligned_if_big(contiguous)
    if found is not contiguous:  # (moved: keyed by the graph's array)
        state.aligned[id(array)] = found = one_copy(found)
    return found


def _plan_memory(state: Compile) -> MemoryPlan:
    graph, lowerer = state.graph, state.lowerer
    assert lowerer is not None
    roots = state.roots = {v: lowerer.buffer(v) for v in graph.values()}
    inputs = [roots[v] for v in graph.inputs]
    outputs = [roots[v] for v in graph.outputs]
    # constants no step reads (weights only their packed copies serve) stay out of the plan
    used = {b for reads, writes in state.access for b in (*reads, *writes)} | set(outputs)
    used.update(b for kernels in state.segments for k in kernels for b in buffers_in(k.body))
    state.constants = {
        roots[v]: _aligned(state, a) for v, a in graph.constants.items() if lowerer.root(v) is v and roots[v] in used
    }
    misread = [v.name for v in state.released if roots[v] in used]
    if misread:
        raise AssertionError(f"weights let go while lowering are read by a step: {misread[:5]}")
    state.constants.update(lowerer.packed)
    fixed = set(inputs) | set(outputs) | set(roots[v] for v in graph.constants) | set(lowerer.packed)
    temps = {b for b in roots.values() if b not in fixed} | set(lowerer.scratch)
    memory = state.memory = plan_memory(state.access, temps)
    kernels = [k for segment in state.segments for k in segment]
    memory.scratch_shared, memory.scratch_per_thread = state.backend.scratch(kernels, state.target)
    state.table = {lowerer.status: 0}
    for buffer in [*dict.fromkeys(roots.values()), *lowerer.packed, *lowerer.scratch]:
        state.table.setdefault(buffer, len(state.table))
    return memory


def _render(state: Compile) -> str:
    if state.segments and state.build_library:
        if state.backend.reads_plan:
            facts = plan_facts(state)
            state.source = state.backend.render(
                state.segments, state.table, state.options.build, state.target, facts=facts
            )
        elif state.backend.reads_placement:
            assert state.memory is not None and state.roots is not None
            placement = Placement(
                state.memory,
                [state.roots[v] for v in state.graph.inputs],
                [state.roots[v] for v in state.graph.outputs],
                list(state.constants),
            )
            state.source = state.backend.render(
                state.segments, state.table, state.options.build, state.target, placement=placement
            )
        else:
            state.source = state.backend.render(state.segments, state.table, state.options.build, state.target)
    return state.source


def plan_facts(state: Compile | Plan, quantization: Quantization | None = None) -> PlanFacts:
    """What a backend that reads the plan gets with ``render`` (``Backend.reads_plan``), from a
    compile's state or a finished plan (then ``quantization`` gives the ranges)."""
    graph, steps, roots = state.graph, state.steps, state.roots
    quantization = quantization if quantization is not None else state.options.quantization  # type: ignore[union-attr]
    names = {buffer: value.name for value, buffer in roots.items()}
    outputs = [roots[v] for v in graph.outputs if v in roots]  # (one a host step computes has none)
    by_name = {value.name: buffer for value, buffer in roots.items()}
    ranges: dict[Buffer, tuple[float, float]] = {}
    for name, lo, hi in quantization.ranges:  # values sharing a buffer (in place): every one's range
        if name in by_name:
            old = ranges.get(by_name[name], (lo, hi))
            ranges[by_name[name]] = (min(old[0], lo), max(old[1], hi))
    reads = [
        {b for k in step.kernels for b in k.reads}
        if isinstance(step, Segment)
        else {roots[v] for v in step.node.inputs if v is not None and v in roots}
        for step in steps
    ]
    live = [set(outputs).union(*reads[i + 1 :]) for i, step in enumerate(steps) if isinstance(step, Segment)]
    inputs = [roots[v] for v in graph.inputs if v in roots]
    return PlanFacts(dict(state.constants), inputs, outputs, names, live, ranges)


def _build(state: Compile) -> tuple[Path, ...]:
    if state.source:  # a loaded artifact brings its build products: no compiler needed
        prebuilt = state.prebuilt.get(source_key(state.source))
        state.products = prebuilt or products(state.backend.build(state.source, state.target, state.options.build))
    return state.products


def products(built: Path | tuple[Path, ...] | list[Path] | None) -> tuple[Path, ...]:
    """A backend's build result as a tuple of files (a backend may return one path or None)."""
    if built is None:
        return ()
    return (Path(built),) if isinstance(built, (str, Path)) else tuple(Path(p) for p in built)


def load(plan: Plan, parallelism: Threading | None = None, **kwargs: Any) -> Executable:
    """The pipeline's last stage, the runtime's: the plan's build products opened, one runner per
    native segment (``kiln.runtime.executable``)."""
    return Executable(plan, parallelism=parallelism, **kwargs)


PIPELINE: tuple[Stage, ...] = (
    Stage("specialize", "bind symbolic dims to this request's sizes; shapes become static", _specialize, graph=True),
    Stage("fold", "evaluate what depends only on constants (so it needs no decomposition)", _fold, graph=True),
    Stage("decompose", "inline ONNX functions of ops the target cannot lower whole", _decompose, True, True),
    Stage("passes", "graph passes: " + ", ".join(PASS_NAMES), _passes, graph=True),
    Stage("lower", "nodes -> kernels of the kernel IR (or host fallbacks, with reasons)", _lower, True),
    Stage("verify", "with KILN_DEBUG: the kernel IR's invariants and static bounds checked", _verify),
    Stage("plan-memory", "one arena: intermediates placed by lifetime, engine scratch sized", _plan_memory),
    Stage("render", "kernels -> the target's source (C for cpu, Triton for gpu)", _render, True),
    Stage("build", "source -> the target's build products (content-addressed cache)", _build, True),
    Stage("load", "open the build products: one runner per native segment", lambda state: load(state.plan()), True),
)
STAGES = tuple(s.name for s in PIPELINE)
# what --print-after accepts: every stage, and every graph pass by name
PRINTABLE = ("import", *STAGES, *PASS_NAMES)


def run_stages(state: Compile, first: str = "specialize", last: str = "build") -> Compile:
    """Run ``PIPELINE`` from ``first`` through ``last`` on ``state`` (stopping after the graph
    stages when the graph cannot be planned statically), telling ``state.observe`` of each. An
    error that is not a KilnError gets a note naming the stage it broke in."""
    names = STAGES[STAGES.index(first) : STAGES.index(last) + 1]
    result = None
    for stage in PIPELINE:
        if stage.name not in names or (state.unplannable and not stage.graph):
            continue
        result = None  # the last stage's result (a graph and its weights) is not held through this one
        try:
            result = stage.run(state)
        except KilnError:
            raise
        except Exception as err:  # an invariant broke: say where
            err.add_note(f"kiln stage: {stage.name}")
            raise
        if state.observe is not None:
            state.observe(stage.name, result)
        if stage.name in ("passes", "lower") and state.graph.constant_bytes() >= BIG:
            return_freed()  # the copies of the weights this stage freed leave the RSS before the next
    return state


def compile_variant(
    graph: Graph,
    dims: dict[str, int],
    target: Target | str | None = None,
    options: CompileOptions | None = None,
    observe: Observer | None = None,
    **kwargs: Any,
) -> Plan:
    """specialize, then ``compile_plan``."""
    return compile_plan(graph, target, options, observe=observe, dims=dims, first="specialize", **kwargs)


def compile_plan(
    graph: Graph,
    target: Target | str | None = None,
    options: CompileOptions | None = None,
    *,
    prebuilt: dict[str, tuple[Path, ...]] | None = None,
    choices: dict | None = None,
    build_library: bool = True,
    observe: Observer | None = None,
    expose: Callable[[Graph], Graph] | None = None,
    dims: dict[str, int] | None = None,
    first: str = "fold",
) -> Plan:
    """Compile a graph whose symbolic dims are bound (``specialize``) for ``target`` (default:
    this machine's cpu): the pipeline from fold through build. ``choices`` maps tuning keys to
    schedules (the tuner's candidates); without ``build_library`` nothing is rendered or built
    (``kiln check`` wants the steps only); ``prebuilt`` maps source keys to libraries a loaded
    artifact brought (no compiler needed); ``expose`` rewrites the graph after the passes, before
    lowering (``kiln diff`` makes every surviving tensor an output)."""
    state = start(
        graph, target, options, observe,
        dims=dims or {}, prebuilt=prebuilt or {}, choices=choices, build_library=build_library, expose=expose,
    )  # fmt: skip
    del graph  # the state holds it (a graph handed over is freed as the stages replace it)
    return run_stages(state, first).plan()


def start(
    graph: Graph,
    target: Target | str | None,
    options: CompileOptions | None,
    observe: Observer | None = None,
    **fields: Any,
) -> Compile:
    """A compile's initial state: the target resolved (default: this machine's cpu), the options
    (default: the KILN_* overrides) at the precision the target computes."""
    target = resolve_target(target)
    options = options or CompileOptions.from_env()
    options = options.with_(precision=resolve_precision(options.precision, target))
    return Compile(graph, target, options, observe=observe, **fields)


def optimized(
    graph: Graph,
    target: Target,
    options: CompileOptions,
    observe: Observer | None = None,
    expose: Callable[[Graph], Graph] | None = None,
) -> Graph:
    """The graph stages on a bound graph: fold -> decompose[target] -> passes (-> ``expose``)."""
    state = Compile(graph, target, options, observe=observe, expose=expose)
    return run_stages(state, "fold", "passes").graph


def graph_stages(
    graph: Graph, dims: dict[str, int], target: Target, options: CompileOptions, observe: Observer | None = None
) -> Graph:
    """specialize, then the graph stages (what ``kiln explain --no-kernels`` shows)."""
    state = Compile(graph, target, options, dims=dims, observe=observe)
    return run_stages(state, "specialize", "passes").graph
