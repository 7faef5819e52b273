"""kiln's graph optimization pipeline, in order. Each stage is ``Graph -> Graph``; ``level`` is the
lowest -O level that runs it. The IR verifier runs after every stage (``verify=True``), so a pass
that breaks an invariant is named at once.

    -O0  nothing but dead-code elimination
    -O1  constant folding (with type refinement), algebraic simplification, CSE
    -O2  + Gemm canonicalization, BatchNorm folding, transpose sinking (the default)
    -O2  + layout assignment (channels-last regions where the target's kernels pay for the
         conversions; kiln.passes.layout), then fuses elementwise chains and conv/matmul
         epilogues into single kernels
    -O3  as -O2
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kiln.errors import KilnError
from kiln.ir.graph import Graph
from kiln.ops.verify import verify
from kiln.passes.cse import cse
from kiln.passes.dce import dce
from kiln.passes.fold_batchnorm import fold_batchnorm
from kiln.passes.fold_constants import fold_constants
from kiln.passes.fuse import fuse
from kiln.passes.gemm import canonicalize_gemm
from kiln.passes.grouped_heads import group_heads
from kiln.passes.layout import Narrow, assign_layouts
from kiln.passes.simplify import simplify
from kiln.passes.transpose import sink_transposes


@dataclass(frozen=True)
class Stage:
    name: str
    level: int
    run: Callable[..., Graph]
    per_target: bool = False  # run(graph, target, narrow): the target's kernels and the precision decide


def folded(graph: Graph) -> Graph:
    """fold_constants inside the pipeline: every node's types were inferred when the graph was
    built (import, ``specialize``) or by the pass that wrote it, and ``optimize`` verifies after
    each pass, so static nodes are not inferred again."""
    return fold_constants(graph, verified=True)


PIPELINE: tuple[Stage, ...] = (
    Stage("fold_constants", 1, folded),
    Stage("simplify", 1, simplify),
    Stage("canonicalize_gemm", 2, canonicalize_gemm),
    Stage("fold_batchnorm", 2, fold_batchnorm),
    Stage("assign_layouts", 2, assign_layouts, per_target=True),
    Stage("sink_transposes", 2, sink_transposes),
    Stage("fold_constants", 1, folded),
    Stage("simplify", 1, simplify),
    Stage("group_heads", 2, group_heads),  # grouped-query attention's K/V heads read in place, not repeated
    Stage("cse", 1, cse),
    Stage("dce", 0, dce),  # dead readers (rewritten-away reshapes) must not block fusion
    Stage("fuse", 2, fuse),
    Stage("dce", 0, dce),
)
PASS_NAMES = tuple(dict.fromkeys(stage.name for stage in PIPELINE))


def optimize(
    graph: Graph,
    level: int = 2,
    disable: Iterable[str] = (),
    after: Callable[[str, Graph], None] | None = None,
    verify_each: bool = True,
    target: Any = None,
    narrow: Narrow | None = None,
) -> Graph:
    """Run the pipeline at -O ``level`` without the ``disable``d passes; ``after(name, graph)`` is
    called after each stage (``kiln explain --print-after``). ``target`` (None: no target) and
    ``narrow`` (an int8 or bf16 compile's products) are for the stages whose choices they decide."""
    disabled = set(disable)
    unknown = disabled - set(PASS_NAMES)
    if unknown:
        raise KilnError(f"unknown pass(es) {sorted(unknown)}; passes: {', '.join(PASS_NAMES)}")
    if not 0 <= level <= 3:
        raise KilnError(f"optimization level must be 0..3, got {level}")
    for stage in PIPELINE:
        if stage.level > level or stage.name in disabled:
            continue
        graph = stage.run(graph, target, narrow) if stage.per_target else stage.run(graph)
        if verify_each:
            try:
                verify(graph)
            except KilnError as err:
                raise KilnError(f"kiln bug: the IR is invalid after pass {stage.name!r}:\n{err}") from err
        if after:
            after(stage.name, graph)
    return graph
