"""``torch.compile(model, backend="kiln")``: kiln as a TorchDynamo backend.

Dynamo hands over each captured FX graph (graph breaks give several); kiln traces it to core ATen
(``make_fx`` with torch's core decompositions), converts it to kiln's IR directly
(``kiln.frontend.fx``: no ONNX), compiles it for the chosen target and returns a callable on torch
tensors (CPU tensors cross as NumPy views, without copies). A graph kiln cannot convert runs
eagerly, with the op named in a warning (``options={"fallback": False}`` makes it an error).
Shapes: each distinct input signature compiles once (dims dynamo marks dynamic included), as kiln's
own variants do.

Registered as ``kiln`` through the ``torch_dynamo_backends`` entry point (no import needed) and on
``import kiln.torch_backend``. Inference only: weights are read when a graph compiles.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import KilnError

DEFAULTS = {"target": "cpu", "precision": "fp32", "opt_level": 2, "fallback": True, "threads": 0}


class KilnGraph:
    """One captured graph compiled by kiln, one kiln model per input signature."""

    def __init__(self, gm: Any, options: dict[str, Any], example_inputs: list[Any]) -> None:
        self.gm = gm
        self.options = options
        self.models: dict[tuple, Any] = {}
        self.lock = threading.Lock()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # dynamo passes a module's parameters and buffers as graph inputs: they are weights
        # (constants kiln folds and packs), read when the graph compiles
        self.weights = {
            i for i, (node, value) in enumerate(zip(placeholders, example_inputs)) if _is_weight(node.name, value)
        }
        self.user = [i for i in range(len(placeholders)) if i not in self.weights]
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self.single = not isinstance(output.args[0], (tuple, list))

    def signature(self, args: tuple) -> tuple:
        """What selects the compiled model: the shapes and types of the inputs that are not
        weights (dynamo passes every parameter on every call: reading them all costs more than
        a small model's run)."""
        return tuple(
            (tuple(args[i].shape), args[i].dtype) if hasattr(args[i], "shape") else ("value", args[i])
            for i in self.user
        )

    def compile(self, args: tuple) -> Any:
        import torch
        from torch._decomp import core_aten_decompositions
        from torch.func import functionalize
        from torch.fx.experimental.proxy_tensor import make_fx

        import kiln
        from kiln.frontend.fx import import_traced

        # traced on fake tensors (shapes only: the model is not run); in-place ops (relu_) and
        # views become their functional forms first
        with torch.no_grad(), torch._guards.tracing(None):  # its own fake mode, not dynamo's
            traced = make_fx(
                functionalize(self.gm, remove="mutations_and_views"),
                decomposition_table=core_aten_decompositions(),
                tracing_mode="fake",
            )(*args)
        graph = import_traced(traced, list(args), self.weights)
        model = kiln.compile(
            graph,
            target=self.options["target"],
            precision=self.options["precision"],
            opt_level=self.options["opt_level"],
            threads=self.options["threads"],
        )
        return model, [v.name for v in graph.inputs]

    def __call__(self, *args: Any) -> Any:
        import torch

        key = self.signature(args)
        found = self.models.get(key)
        if found is None:
            with self.lock:
                found = self.models.get(key)
                if found is None:
                    try:
                        found = self.compile(args)
                    except KilnError as err:  # this signature runs eagerly (or fails, if asked)
                        found = (_eager(self.gm, self.options, str(err)), None)
                    self.models[key] = found
        model, names = found
        if names is None:
            return model(*args)
        given = (args[i] for i in self.user if isinstance(args[i], torch.Tensor))
        feeds = dict(zip(names, (_numpy(a) for a in given)))
        outputs = [torch.from_numpy(np.asarray(o)) for o in model.run(feeds).values()]
        return outputs[0] if self.single else tuple(outputs)


def _concrete(value: Any) -> bool:
    """A real tensor or number (not one of dynamo's symbolic sizes or fake tensors)."""
    import torch

    if isinstance(value, torch.Tensor):
        return all(isinstance(d, int) for d in value.shape) and not type(value).__name__.startswith("Fake")
    return isinstance(value, (int, float, bool))


def _is_weight(name: str, value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Parameter) or "_parameters_" in name or "_buffers_" in name


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
    compiled = KilnGraph(gm, settings, example_inputs)
    if all(_concrete(a) for a in example_inputs):
        try:  # convert and compile now: an op kiln lacks falls back here, not mid-run
            compiled(*example_inputs)
        except KilnError as err:
            return _eager(gm, settings, str(err))
    return compiled  # dims dynamo made symbolic: each call's sizes compile on first use


def _eager(gm: Any, settings: dict[str, Any], reason: str) -> Callable[..., Any]:
    if not settings["fallback"]:
        raise KilnError(f"kiln cannot compile this graph: {reason}")
    warnings.warn(f"kiln: this graph runs eagerly: {reason}", RuntimeWarning, stacklevel=3)
    return gm.forward


def register() -> None:
    """Make ``backend="kiln"`` known to torch.compile in this process (the entry point does this
    without an import)."""
    from torch._dynamo import list_backends, register_backend

    if "kiln" not in list_backends(exclude_tags=()):
        register_backend(kiln_backend, name="kiln")


register()
