"""Imports point one way. The import graph of ``kiln/`` (lazy imports inside functions included:
they hide a cycle from readers, they do not remove it) has no cycle, and no module imports a layer
above its own (LAYERS). Private names (``_foo``) are not imported across modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "kiln"

# The layers, lowest first, one per top-level module or package of ``kiln/`` (README "Layering"):
# a module imports its own layer and the layers below, never above. There is no catch-all: a new
# top-level module gets its place here, or the test says it has none.
LAYERS: tuple[str, ...] = (
    "kiln.errors", "kiln.version", "kiln.source_text", "kiln.output_files", "kiln.integrity", "kiln.memory", "kiln.arrays",  # the base
    "kiln.ir",
    "kiln.ops",  # op definitions, categories, type inference and the reference interpreter
    "kiln.frontend",
    "kiln.passes",
    "kiln.lower",  # target-neutral lowering to the kernel IR
    "kiln.backends",  # the target registry and each target's renderer, toolchain, loader
    "kiln.runtime",  # load and run plans only
    "kiln.driver",  # the pipeline, compiling, variants, caches, artifacts, quantization
    "kiln",  # the public API: compile, load, targets
    "kiln.diff", "kiln.conformance", "kiln.zoo", "kiln.torch_backend",  # tools on the API
    "kiln.serve",  # the Open Inference Protocol server (kiln serve)
    "kiln.bench",
    "kiln.tune",
    "kiln.cli_support", "kiln.cli_check_ranges", "kiln.cli_check", "kiln.cli_sizes", "kiln.cli_inspect", "kiln.cli_bench", "kiln.cli_study", "kiln.cli_compile", "kiln.cli_serve", "kiln.cli_generate", "kiln.cli",
    "kiln.__main__",
)  # fmt: skip


def top_level(module: str) -> str:
    """The top-level module or package ``module`` belongs to (``kiln`` for the package itself)."""
    return ".".join(module.split(".")[:2])


def layer(module: str) -> int:
    """The layer of ``module``: that of its top-level module or package."""
    top = top_level(module)
    assert top in LAYERS, f"{module} is in no layer: give {top} its place in LAYERS"
    return LAYERS.index(top)


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


def test_kiln_has_no_import_cycle():
    cycles = on_cycles(graph())
    assert not cycles, f"modules on an import cycle: {sorted(cycles)} (make imports point one way)"


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in sorted(graph().items())
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert upward == []


def test_the_layer_check_would_catch_an_upward_import():
    assert layer("kiln.lower.lowering") < layer("kiln.driver.pipeline") < layer("kiln.cli")
    assert layer("kiln.backends.cpu.c") == layer("kiln.backends")
    assert layer("kiln.runtime.executable") < layer("kiln.driver.variants")  # the runtime never reaches up


def test_every_top_level_module_has_a_layer_of_its_own():
    tops = {top_level(name) for name in modules()}
    assert tops == set(LAYERS), f"no layer: {sorted(tops - set(LAYERS))}; no module: {sorted(set(LAYERS) - tops)}"
    assert len(LAYERS) == len(set(LAYERS))
    try:
        layer("kiln.newtool")
    except AssertionError as err:
        assert "give kiln.newtool its place" in str(err)
    else:
        raise AssertionError("a module outside LAYERS was given a layer")


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


def private_members(tree: ast.AST) -> set[str]:
    """The private attributes and methods (``_name``) the classes of a module define."""
    names = set()
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node in cls.body:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(sources: dict[str, str]) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` is a private member of a
    class of another module only (a module may read its own classes' privates on other objects)."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    members = {name: private_members(tree) for name, tree in trees.items()}
    known = set().union(*members.values())
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in known or node.attr in members[name]:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{name}:{node.lineno}: {ast.unparse(node.value)}.{node.attr}")
    return found


def test_no_private_attribute_is_used_across_modules():
    assert private_uses({name: path.read_text() for name, path in modules().items()}) == []


def test_the_private_attribute_check_would_catch_one():
    owner = "class Model:\n    def __init__(self):\n        self._variants = {}\n"
    reader = "def save(model):\n    return model._variants\n"
    assert private_uses({"a": owner, "b": reader}) == ["b:2: model._variants"]
    assert private_uses({"a": owner + "\ndef same(model):\n    return model._variants\n"}) == []


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
GENERATED = frozenset()  # generated tables a size limit does not apply to (none today)


def oversized(sources: dict[str, str]) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions (methods, nested ones) over
    MAX_FUNCTION_LINES, decorators excluded, docstrings included."""
    found = []
    for name, text in sources.items():
        if name in GENERATED:
            continue
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}.{node.name}: {length} lines")
    return found


def test_no_module_and_no_function_is_too_long_to_read():
    assert oversized({name: path.read_text() for name, path in modules().items()}) == []


def test_the_size_check_would_catch_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert oversized({"m": f"def f():\n{body}\n"}) == ["m.f: 81 lines"]
