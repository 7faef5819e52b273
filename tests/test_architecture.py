"""Imports point one way. The import graph of ``kiln/`` (lazy imports inside functions included:
they hide a cycle from readers, they do not remove it) must have no cycle beyond the debt listed
here, which only shrinks: a new module on a cycle fails, and so does a listed module that left its
cycle (remove it from the list). Private names (``_foo``) are not imported across modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "kiln"

# Modules on an import cycle today (issue 13 removes them): the lowering modules that register
# themselves with lowering.py, the op families with the reference interpreter, the compile driver
# with the runtime and caches, graph.py with its printer.
CYCLE_DEBT = {
    "kiln",
    "kiln.codegen.c",
    "kiln.compiler",
    "kiln.ir.graph",
    "kiln.ir.printer",
    "kiln.lower.attention_lowering",
    "kiln.lower.fused_lowering",
    "kiln.lower.gemm_lowering",
    "kiln.lower.index_lowering",
    "kiln.lower.lowering",
    "kiln.lower.movement_lowering",
    "kiln.lower.nn_lowering",
    "kiln.lower.window_lowering",
    "kiln.lower.winograd",
    "kiln.ops",
    "kiln.ops.control",
    "kiln.ops.elementwise",
    "kiln.ops.kiln_ops",
    "kiln.ops.misc",
    "kiln.ops.nn",
    "kiln.ops.onnx_bridge",
    "kiln.ops.registry",
    "kiln.ops.shape",
    "kiln.repro",
    "kiln.runtime.artifact",
    "kiln.runtime.interpreter",
    "kiln.runtime.model",
    "kiln.runtime.native",
    "kiln.runtime.plan_cache",
    "kiln.tune",
    "kiln.tune.db",
    "kiln.tune.worker",
}


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(module imported, name imported from it or None) for every import in the file."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.append((full, None) if full in known else (module, alias.name))
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for module, _ in imports(name, path, known):
            while module and module not in known:
                module = module.rpartition(".")[0]
            if module and module != name:
                targets.add(module)
        edges[name] = targets
    return edges


def on_cycles(edges: dict[str, set[str]]) -> set[str]:
    """Modules that can reach themselves (Tarjan's strongly connected components of size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: set[str] = set()
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.update(component)
    return result


def test_no_module_joins_an_import_cycle_and_the_debt_only_shrinks():
    cycles = on_cycles(graph())
    joined = sorted(cycles - CYCLE_DEBT)
    left = sorted(CYCLE_DEBT - cycles)
    assert not joined, f"modules now on an import cycle: {joined} (make imports point one way)"
    assert not left, f"no longer on a cycle, remove from CYCLE_DEBT: {left}"


def test_the_cycle_finder_finds_a_cycle():
    assert on_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {"a", "b", "c"}


def test_no_private_name_is_imported_across_modules():
    known = modules()
    offenders = [
        f"{name} imports {imported} from {module}"
        for name, path in known.items()
        for module, imported in imports(name, path, known)
        if imported and imported.startswith("_") and not imported.startswith("__") and module.startswith("kiln")
    ]
    assert offenders == []
