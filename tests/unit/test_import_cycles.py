"""The package's import graph: no cycles, and a pure core that needs neither Docker nor git.

Every ``import`` and ``from ... import`` in every module counts, wherever it stands: at the
top, under ``if TYPE_CHECKING:``, or inside a function. A lazy import hides a cycle from the
interpreter, not from the design.

How an import becomes an edge:

- ``import a.b.c`` is an edge to the module ``a.b.c`` only, not to ``a`` or ``a.b``. Python
  runs the parents' ``__init__`` too, but counting that would make every package that
  re-exports its submodules (``orchestrator.sandbox`` and ``orchestrator.sandbox.files``)
  a trivial cycle.
- ``from a.b import x`` is an edge to ``a.b.x`` if that is a module, else to ``a.b``.
- Relative imports are resolved against the importing module's package.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import orchestrator

PACKAGE_DIR = Path(orchestrator.__file__).parent
ROOT = PACKAGE_DIR.parent

#: The pure core: declarations in, a plan out. None of it may reach Docker or git, directly
#: or through another module of the package.
PURE_CORE = (
    "orchestrator.config",
    "orchestrator.policy",
    "orchestrator.plan",
    "orchestrator.prepare",
)
FORBIDDEN_FOR_CORE = (
    "docker",
    "git",
    "orchestrator.docker",
    "orchestrator.clearance",
    "orchestrator.cli",
)


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name; a package is named by its ``__init__``."""
    modules: dict[str, Path] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """What ``name`` imports, anywhere in the file: the edges to the package's modules, and
    every imported module name (the package's or not), for the rules on outside libraries."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    edges: set[str] = set()
    sources: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                sources.add(alias.name)
                if alias.name in modules:
                    edges.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                assert node.module is not None
                source = node.module
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    edges.add(submodule)
                    sources.add(submodule)
                else:
                    sources.add(source)
                    if source in modules:
                        edges.add(source)
    edges.discard(name)
    return edges, sources


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The edges between the package's modules, and every imported module name per module."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    imported: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name], imported[name] = imports_of(name, path, set(modules))
    return graph, imported


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; the components of more than one module, or a module
    that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            if successors:
                successor = successors.pop(0)
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, sorted(graph[successor])))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    lines = [" <-> ".join(component)]
    for module in component:
        for target in sorted(graph[module] & members):
            lines.append(f"    {module} -> {target}")
    return "\n".join(lines)


def reachable(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_graph_sees_the_package() -> None:
    graph, _ = import_graph()
    assert "orchestrator.plan" in graph
    assert "orchestrator.config.models" in graph["orchestrator.config.loader"]
    # A package that re-exports its submodules is no cycle with them.
    assert "orchestrator.sandbox" not in graph["orchestrator.sandbox.files"]


def test_the_vocabulary_modules_are_leaves() -> None:
    graph, _ = import_graph()
    assert not graph["orchestrator.exits"]
    assert not graph["orchestrator.vocabulary"]


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    graph, _ = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles in the package:\n" + "\n".join(
        describe(component, graph) for component in cycles
    )


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def test_pure_core_needs_neither_docker_nor_git() -> None:
    graph, imported = import_graph()
    core = sorted(name for name in graph if _within(name, PURE_CORE))
    assert {"orchestrator.plan", "orchestrator.prepare"} <= set(core)
    problems = {
        f"{module} reaches {reached}, which imports {name}"
        for module in core
        for reached in reachable(module, graph)
        for name in imported[reached]
        if _within(name, FORBIDDEN_FOR_CORE)
    }
    assert not problems, "\n".join(sorted(problems))


def test_pure_core_loads_neither_docker_nor_git() -> None:
    """What the interpreter really loads, package ``__init__`` files included."""
    code = (
        "import sys\n"
        "import orchestrator.config, orchestrator.policy, orchestrator.plan, orchestrator.prepare\n"
        f"print(sorted(m for m in sys.modules if m.startswith({FORBIDDEN_FOR_CORE!r})))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


#: Modules on the run's side of the backend seam: they reach a backend only through
#: ``runtime.backend`` (Backend, Launch, Capabilities), never a concrete one.
ABOVE_THE_SEAM = (
    "orchestrator.runtime.run",
    "orchestrator.runtime.session",
    "orchestrator.runtime.pool",
    "orchestrator.runtime.broker",
)
CONCRETE_BACKENDS = ("orchestrator.runtime.container", "orchestrator.docker")
#: What a concrete backend is made of (``runtime.engine`` also holds shared data types,
#: such as ``Stream``, which are fine).
ENGINE_NAMES = {"Engine", "Containers", "Networks", "CredentialProxies", "Inventory"}


def test_the_run_side_of_the_seam_imports_no_concrete_backend() -> None:
    graph, _ = import_graph()
    problems = {
        f"{module} imports {target}"
        for module in ABOVE_THE_SEAM
        for target in graph[module]
        if _within(target, CONCRETE_BACKENDS)
    }
    for module in ABOVE_THE_SEAM:
        tree = ast.parse(module_files()[module].read_text())
        problems |= {
            f"{module} imports {alias.name} from {node.module}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.runtime.engine"
            for alias in node.names
            if alias.name in ENGINE_NAMES
        }
    assert not problems, "\n".join(sorted(problems))


def test_harness_adapters_use_only_the_public_api() -> None:
    """Harness adapters drive Orchestrator, sessions and pools; never a run, a backend
    or an engine underneath them."""
    graph, _ = import_graph()
    under = (
        "orchestrator.runtime.run",
        "orchestrator.runtime.backend",
        "orchestrator.runtime.container",
        "orchestrator.runtime.engine",
        "orchestrator.docker",
    )
    adapters = sorted(name for name in graph if _within(name, ("orchestrator.integrations",)))
    assert "orchestrator.integrations.inspect.sandboxes" in adapters
    problems = {
        f"{module} imports {target}"
        for module in adapters
        for target in graph[module]
        if _within(target, under)
    }
    assert not problems, "\n".join(sorted(problems))
