"""A compiled plan: what the runtime executes. The steps run in order: native segments
(consecutive kernels built into one function by the target's backend) and host fallbacks (a node
run by its reference implementation, for ops with no native lowering yet; each with its reason)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.lower.kir import Buffer, Kernel
from kiln.lower.memory import MemoryPlan
from kiln.lower.target import Target


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
    products: tuple[Path, ...]  # what the target's build made of the source: zero, one or many files
    source: str
    kernel_labels: dict[int, str] = field(default_factory=dict)  # status code -> node label
    whole_graph_reason: str = ""  # set when the graph cannot be planned at all (dynamic shapes)
    target: Target | None = None  # what it was compiled for (its backend loads it)

    @property
    def library(self) -> Path | None:
        """The first build product (the cpu target's one shared library), None when there is none."""
        return self.products[0] if self.products else None

    @property
    def fallbacks(self) -> list[Fallback]:
        return [s for s in self.steps if isinstance(s, Fallback)]

    @property
    def is_native(self) -> bool:
        return not self.whole_graph_reason and not self.fallbacks
