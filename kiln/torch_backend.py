"""``torch.compile(model, backend="kiln")``: kiln as a TorchDynamo backend.

Dynamo hands over each captured FX graph (graph breaks give several); kiln traces it to core ATen
(``make_fx`` with torch's core decompositions), converts it to kiln's IR directly
(``kiln.frontend.fx``: no ONNX), compiles it for the chosen target and returns a callable on torch
tensors (CPU tensors cross as NumPy views, without copies). A graph kiln cannot convert runs
eagerly, with the op named in a warning (``options={"fallback": False}`` makes it an error).
Shapes: dims dynamo marks dynamic (``dynamic=True``, ``mark_dynamic``, or its automatic dynamic
shapes after a size changed) are traced symbolically and become kiln's symbolic dims: one kiln model
whose variants (one per binding, weights packed once) cover every size dynamo's guards let through.
A graph whose sizes kiln cannot keep symbolic (a size computed from several dims) compiles once per
input signature instead.

Registered as ``kiln`` through the ``torch_dynamo_backends`` entry point (no import needed) and on
``import kiln.torch_backend``. Inference only: weights are read when a graph compiles.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from kiln.errors import KilnError
from kiln.frontend.dynamo_graph import (
    concrete,
    dynamic_dims,
    example,
    fixed_sizes,
    is_size,
    is_weight,
    linears_by_symbolic_sizes,
    scalars_folded,
    static_context,
    symbol_bounds,
    unified,
    writes_as_outputs,
)

log = logging.getLogger("kiln.torch_backend")

DEFAULT_HIGH = 64  # an unbounded dynamic dim serves up to max(2 x its first size, this) from one compile
DEFAULTS = {"target": "cpu", "precision": "fp32", "opt_level": 2, "fallback": True, "threads": 0}


class KilnGraph:
    """One captured graph compiled by kiln: one kiln model with symbolic dims (``general``), or
    one per input signature."""

    def __init__(self, gm: Any, options: dict[str, Any], example_inputs: list[Any]) -> None:
        self.options = options
        self.models: dict[tuple, Any] = {}
        self.lock = threading.Lock()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # dynamo passes a module's parameters, buffers and other attributes as graph inputs:
        # they are weights (constants kiln folds and packs), read when the graph compiles
        self.weights = {
            i for i, (node, value) in enumerate(zip(placeholders, example_inputs)) if is_weight(node, value)
        }
        # Python floats dynamo passes as 0-d tensors (``dynamic=True``; ``math.pi`` in a GELU) that
        # are not attributes: folded at their first values like the weights' numbers, and a call
        # with other values runs eagerly (their guard)
        self.floats = {
            i
            for i, node in enumerate(placeholders)
            if i not in self.weights and getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False)
        }
        self.float_values = tuple(_number(example_inputs[i]) for i in sorted(self.floats))
        self.eager = gm.forward
        self.gm = scalars_folded(gm, placeholders, example_inputs, self.weights | self.floats)
        # sizes dynamo passes beside the tensors that carry them (``s0`` of a dynamic batch)
        self.sizes = {i for i, value in enumerate(example_inputs) if is_size(value)}
        self.user = [i for i in range(len(placeholders)) if i not in self.weights and i not in self.sizes]
        # input position -> {dim: dynamo's symbol}; equal sizes at the same dim of two inputs one
        # symbol (a guard: a call where they differ compiles alone)
        traced = dynamic_dims(placeholders)
        self.dynamic = unified(traced, example_inputs)
        self.bounds = symbol_bounds(placeholders)  # dynamo's symbol -> (low, high or None: unbounded)
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self.single = not isinstance(output.args[0], (tuple, list))
        # each size argument's tensor and dim (where dynamo's symbol first appears)
        self.size_carriers: dict[int, tuple[int, int]] = {}
        for i in self.sizes:
            symbol = str(example(placeholders[i]))
            carrier = next(((j, d) for j, dims in traced.items() for d, s in dims.items() if s == symbol), None)
            if carrier is None:
                raise KilnError(f"dynamo passes the size {symbol}, which no input tensor carries")
            self.size_carriers[i] = carrier
        # the model compiled with symbolic dims, its dims, and the signature it serves
        self.general: tuple[Any, list[str]] | None = None
        self.general_dims: dict[int, dict[int, str]] = {}
        self.general_key: tuple = ()
        self.general_ranges: dict[tuple[int, int], tuple[int, int]] = {}  # (position, dim) -> declared range
        self.widened: dict[tuple[int, int], int] = {}  # (position, dim) -> the high a call asked for

    def signature(self, args: tuple, symbolic: dict[int, dict[int, str]] | None = None) -> tuple:
        """What selects the compiled model: the shapes and types of the inputs that are not
        weights (dynamo passes every parameter on every call: reading them all costs more than
        a small model's run); the dims in ``symbolic`` are any size."""
        symbolic = symbolic or {}
        return tuple(
            (
                tuple(None if d in symbolic.get(i, ()) else size for d, size in enumerate(args[i].shape)),
                args[i].dtype,
            )
            if hasattr(args[i], "shape")
            else ("value", args[i])
            for i in self.user
        )

    def compile_general(self, args: tuple) -> None:
        """A model with the dims dynamo made dynamic as kiln's symbolic dims: all of them, else
        each input's first (a batch; the others compiled static: the views of a flattened
        image are products of several symbols, which kiln's dims do not express)."""
        first = {i: dict([min(dims.items())]) for i, dims in self.dynamic.items()}
        attempts = [self.dynamic] + ([first] if first != self.dynamic else [])
        for symbolic in attempts:
            ranges: dict[tuple[int, int], tuple[int, int]] = {}
            try:
                self.general = self.compile(args, symbolic, ranges)
            except Exception as err:  # kiln (or torch's tracer) keeps no symbol here: the next attempt
                log.info("kiln cannot keep dims %s symbolic (%s: %s)", symbolic, type(err).__name__, err)
                continue
            # the dims the trace kept symbolic (torch may specialize some it was asked to keep)
            kept = self.kept(symbolic, args)
            self.general_dims, self.general_key = kept, self.signature(args, kept)
            self.general_ranges = ranges
            return

    def declared(self, args: tuple, symbolic: dict[int, dict[int, str]], graph: Any) -> dict[str, tuple[int, int]]:
        """The ranges kiln declares for the trace's symbols, each by the first input dim that has
        it: dynamo's bounds (``mark_dynamic(x, d, min=, max=)``); an unbounded dim serves up to
        ``max(2 x its size, DEFAULT_HIGH)`` (or what a larger call asked for), said in the log.
        One compile then serves every size in them (batch classes, padded lengths, run-time dims)."""
        found: dict[str, tuple[int, int]] = {}
        for position, d, size in self.symbolic_inputs(args, graph):
            if size in found or d not in symbolic.get(position, {}):
                continue
            low, high = self.bounds.get(symbolic[position][d], (1, None))
            if high is None:
                high = max(2 * int(args[position].shape[d]), DEFAULT_HIGH, self.widened.get((position, d), 0))
                log.info(
                    "kiln: dim %d of input %d has no upper bound; one library serves %d..%d, a larger "
                    "size one built for a wider range (torch._dynamo.mark_dynamic(x, %d, min=, max=) declares it)",
                    d,
                    position,
                    low,
                    high,
                    d,
                )
            found[size] = (low, high)
        return found

    def symbolic_inputs(self, args: tuple, graph: Any) -> list[tuple[int, int, str]]:
        """(input position, dim, the graph's symbol) of each symbolic dim of the graph's inputs."""
        import torch

        positions = [i for i in self.user if isinstance(args[i], torch.Tensor)]
        return [
            (position, d, size)
            for position, value in zip(positions, graph.inputs)
            for d, size in enumerate(value.type.shape)
            if isinstance(size, str)
        ]

    def in_range(self, args: tuple) -> bool:
        """Whether the general model's declared ranges hold ``args``' sizes; a size above an
        unbounded dim's range widens it (the next compile serves it), one below it compiles alone."""
        fits = True
        sizes: dict[str, int] = {}
        for position, dims in self.general_dims.items():
            for d, symbol in dims.items():
                if sizes.setdefault(symbol, int(args[position].shape[d])) != int(args[position].shape[d]):
                    return False  # dims the model holds equal differ in this call
        for (position, d), (low, high) in self.general_ranges.items():
            size = int(args[position].shape[d])
            if size > high:
                self.widened[(position, d)] = max(2 * size, 2 * high)
                fits = False
            elif size < low:
                fits = False
        return fits

    def kept(self, symbolic: dict[int, dict[int, str]], args: tuple) -> dict[int, dict[int, str]]:
        """Of ``symbolic``, the dims the general model's inputs still have as symbols."""
        import torch

        assert self.general is not None and self.general.names is not None
        shapes = {v.name: v.type.shape for v in self.general.model.signature.inputs}
        positions = [i for i in self.user if isinstance(args[i], torch.Tensor)]
        kept: dict[int, dict[int, str]] = {}
        for position, name in zip(positions, self.general.names):
            dims = {d: sym for d, sym in symbolic.get(position, {}).items() if isinstance(shapes[name][d], str)}
            if dims:
                kept[position] = dims
        return kept

    def compile(
        self,
        args: tuple,
        symbolic: dict[int, dict[int, str]] | None = None,
        ranges: dict[tuple[int, int], tuple[int, int]] | None = None,
    ) -> Any:
        """Trace (shapes only: fake tensors, the model is not run), convert and compile; the
        dims in ``symbolic`` (input position -> {dim: dynamo's symbol}) stay symbols, with
        declared ranges (``declared``; written to ``ranges`` by input position and dim)."""
        import torch
        from torch.func import functionalize
        from torch.fx.experimental.proxy_tensor import make_fx

        import kiln
        from kiln.frontend.fx import decompositions, import_traced

        fakes = self.fakes(args, symbolic or {})
        # in its own fake mode, not dynamo's; in-place ops (relu_) and views become their
        # functional forms first, and writes to the graph's inputs copy_ nodes at its end
        with torch.no_grad(), torch._guards.tracing(None):
            traced = make_fx(
                functionalize(
                    linears_by_symbolic_sizes(self.gm) if symbolic else self.gm, remove="mutations_and_views"
                ),
                decomposition_table=decompositions(),
                tracing_mode="symbolic" if symbolic else "fake",
            )(*fakes)
        writes = writes_as_outputs(traced)
        state = set(writes) & self.weights
        if state:  # a buffer the graph writes (a counter, BatchNorm's running statistics) is read every call
            self.weights -= state
            self.user = sorted({*self.user, *state})
        # placeholders typed by the fakes (symbolic dims), weights' values from the real tensors
        examples = [args[i] if i in self.weights else fake for i, fake in enumerate(fakes)]
        fixed = fixed_sizes(fakes)
        graph = import_traced(traced, examples, self.weights)
        late = fixed_sizes(fakes) - fixed  # sizes a converter read as its example's number
        if late:
            raise KilnError(f"converting the trace fixed the sizes {sorted(late)}")
        if symbolic and all(v.type.is_static for v in graph.inputs):  # type: ignore[union-attr]
            raise KilnError("the trace specialized every dynamic size")
        log.info(
            "kiln compiles a graph of %d nodes, inputs %s",
            len(graph.nodes),
            ", ".join(f"{v.name}{list(v.type.shape)}" for v in graph.inputs),  # type: ignore[union-attr]
        )
        model = kiln.compile(
            graph,
            target=self.options["target"],
            precision=self.options["precision"],
            opt_level=self.options["opt_level"],
            threads=self.options["threads"],
        )
        declared = self.declared(args, symbolic or {}, graph) if symbolic else {}
        if declared:  # built now: for the ranges, or (where kernels cannot take them) this call's sizes
            found = self.symbolic_inputs(args, graph)
            model.declare(declared, ahead={size: int(args[position].shape[d]) for position, d, size in found})
            padder = model.padder()
            for symbol in model.run_time_refused:  # compiled per size: no range to outgrow
                if padder is None or padder.symbol != symbol:
                    model.ranges.pop(symbol, None)
                    declared.pop(symbol, None)
            if ranges is not None:
                ranges.update({(position, d): declared[size] for position, d, size in found if size in declared})
        return Compiled(model, [v.name for v in graph.inputs], tuple(writes))

    def fakes(self, args: tuple, symbolic: dict[int, dict[int, str]]) -> list[Any]:
        """Fake tensors to trace with, in a fake mode of kiln's own: the dims in ``symbolic``
        symbols, the rest static; each size argument the size of the tensor that carries it."""
        import torch
        from torch._dynamo.source import ConstantSource
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

        env = ShapeEnv()
        mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=False)
        shared: dict[str, Any] = {}  # dynamo's symbol -> this trace's: dims dynamo found equal stay one
        fakes: list[Any] = []
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                fakes.append(arg)
                continue
            dynamic = symbolic.get(i, {})
            if not dynamic:
                fakes.append(mode.from_tensor(arg, symbolic_context=static_context(arg)))
                continue
            sizes = []
            for d, size in enumerate(arg.shape):
                if d not in dynamic:
                    sizes.append(int(size))
                    continue
                if dynamic[d] not in shared:
                    source = ConstantSource(f"kiln_{dynamic[d]}")
                    shared[dynamic[d]] = env.create_unspecified_symint_and_symbol(int(size), source, DimDynamic.DYNAMIC)
                sizes.append(shared[dynamic[d]])
            with mode:
                fakes.append(torch.empty(sizes, dtype=arg.dtype, device=arg.device))
        for i, (carrier, dim) in self.size_carriers.items():
            fakes[i] = fakes[carrier].shape[dim]  # a symbol, or the call's number
        return fakes

    def prepare(self, args: tuple) -> Compiled:
        """The compiled model for ``args``' signature, compiled now if it is new (nothing runs:
        a graph that writes its inputs must write them once per call, never at compile time).
        A graph kiln cannot compile gets the eager fallback (or KilnError if asked)."""
        key = self.signature(args)
        found = self.models.get(key)
        if found is None:
            with self.lock:
                found = self.models.get(key)
                if found is None:
                    try:
                        found = self.compile(args)
                    except NotCompiled:
                        raise
                    except KilnError as err:  # this signature runs eagerly (or fails, if asked)
                        found = Compiled(_eager(self.gm, self.options, str(err)), None, ())
                    except Exception as err:
                        reason = f"kiln bug converting this graph ({type(err).__name__}: {err})"
                        found = Compiled(_eager(self.gm, self.options, reason), None, ())
                    self.models[key] = found
                    self.models[self.signature(args)] = found  # the key, once written buffers are inputs
        return found

    def __call__(self, *args: Any) -> Any:
        if self.floats and tuple(_number(args[i]) for i in sorted(self.floats)) != self.float_values:
            return self.eager(*args)  # a float kiln folded has another value in this call
        if self.general is not None and self.signature(args, self.general_dims) == self.general_key:
            if self.in_range(args):
                return self.run(self.general, args)
            if self.widened and self.regrow(args):
                return self.run(self.general, args)
        found = self.prepare(args)
        if found.names is None:
            return found.model(*args)
        return self.run(found, args)

    def regrow(self, args: tuple) -> bool:
        """Compile the general model again with the ranges a call outgrew widened (once per
        doubling); False (the call compiles alone) if it still does not fit."""
        with self.lock:
            if not self.in_range(args):
                general, dims, key, ranges = self.general, self.general_dims, self.general_key, self.general_ranges
                self.compile_general(args)
                if self.general is None:  # the wider compile failed: keep the one that worked
                    self.general, self.general_dims, self.general_key, self.general_ranges = general, dims, key, ranges
        return self.in_range(args)

    def run(self, compiled: Compiled, args: tuple) -> Any:
        import torch

        given = (args[i] for i in self.user if isinstance(args[i], torch.Tensor))
        feeds = dict(zip(compiled.names, (_numpy(a) for a in given)))
        outputs = [torch.from_numpy(np.asarray(o)) for o in compiled.model.run(feeds).values()]
        if compiled.writes:  # the graph's writes to its inputs, applied once, after it read them
            written = outputs[len(outputs) - len(compiled.writes) :]
            outputs = outputs[: len(outputs) - len(compiled.writes)]
            with torch.no_grad():
                for position, value in zip(compiled.writes, written):
                    args[position].copy_(value)
        return outputs[0] if self.single else tuple(outputs)


class Compiled(NamedTuple):
    """One compiled signature: the kiln model (or the eager fallback, ``names`` None), its input
    names, and the graph inputs (positions) its extra last outputs are written back to."""

    model: Any
    names: list[str] | None
    writes: tuple[int, ...]


def _number(value: Any) -> float | None:
    """A float dynamo passed (a 0-d tensor, or the number itself) as a number; None if it is not one."""
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _numpy(tensor: Any) -> np.ndarray:
    """A CPU tensor's memory as an array (no copy); anything else copied to the CPU first."""
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    return data.numpy() if data.is_contiguous() else data.contiguous().numpy()


def kiln_backend(gm: Any, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The dynamo backend: ``gm`` compiled by kiln, or ``gm`` itself (eager) when kiln cannot."""
    import torch

    settings = {**DEFAULTS, **(options or {})}
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise KilnError(f"unknown kiln backend option(s) {sorted(unknown)}; options: {', '.join(DEFAULTS)}")
    if torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in [*example_inputs, *gm.parameters()]):
        return _eager(gm, settings, "kiln compiles inference graphs: gradients are required here (use torch.no_grad)")
    try:
        compiled = KilnGraph(gm, settings, example_inputs)
    except NotCompiled:  # refused already (fallback=False), with its reason: not wrapped twice
        raise
    except KilnError as err:
        return _eager(gm, settings, str(err))
    except Exception as err:
        return _eager(gm, settings, f"kiln bug reading this graph ({type(err).__name__}: {err})")
    if compiled.dynamic and all(concrete(a) or is_size(a) for a in example_inputs):
        compiled.compile_general(tuple(example_inputs))  # dims dynamo made dynamic: symbolic
        if compiled.general is not None:
            return compiled
    if all(concrete(a) for a in example_inputs):
        # convert and compile now, without running (dynamo calls what is returned: running here
        # too would apply a graph's writes to its inputs twice): an op kiln lacks falls back here
        found = compiled.prepare(tuple(example_inputs))
        if found.names is None:
            return found.model
    return compiled  # dims dynamo made symbolic: each call's sizes compile on first use


class NotCompiled(KilnError):
    """With ``fallback=False``: a graph kiln cannot compile, and why."""


def _eager(gm: Any, settings: dict[str, Any], reason: str) -> Callable[..., Any]:
    if not settings["fallback"]:
        raise NotCompiled(f"kiln cannot compile this graph: {reason}")
    warnings.warn(f"kiln: this graph runs eagerly: {reason}", RuntimeWarning, stacklevel=3)
    return gm.forward


def register() -> None:
    """Make ``backend="kiln"`` known to torch.compile in this process (the entry point does this
    without an import)."""
    from torch._dynamo import list_backends, register_backend

    if "kiln" not in list_backends(exclude_tags=()):
        register_backend(kiln_backend, name="kiln")


register()
