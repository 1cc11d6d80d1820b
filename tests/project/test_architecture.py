"""The floor plan, checked on the source: which package may import which.

Imports are read from the AST of every module (imports under ``TYPE_CHECKING`` and
inside functions included), so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = "snakemake_executor_context"
#: The layers, bottom up, and the command line on top (a module, but a layer of its
#: own). The rest is "core", shared by every process: the root's modules and the
#: packages of :data:`SHARED`.
PACKAGES = (
    "fleet", "catalog", "dispatch", "server", "pilots", "cluster", "executor", "report",
    "simulate", "cli",
)  # fmt: skip
#: Packages of the core: the settings (and the batch systems' facts they check against,
#: a part of the pilots), stray processes, the model cache, gangs, paths.
SHARED = ("settings", "pilots.batch", "strays", "modelcache", "gang", "paths")


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(base: Path, top: str) -> dict[str, Path]:
    return {_module_name(p, base): p for p in sorted((base / top).rglob("*.py"))}


SOURCES = _modules(REPO, ROOT)
MONITOR = _modules(REPO / "monitor", "snakemake_context_monitor")


def imports_of(name: str, path: Path) -> set[str]:
    """The project modules one module imports (anywhere in it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from package import module` imports the module; the package's own
            # __init__ only when a name is not a module of it.
            submodules = {f"{target}.{alias.name}" for alias in node.names}
            found.update(submodules)
            if not submodules <= SOURCES.keys():
                found.add(target)
    return {m for m in found if m in SOURCES}


GRAPH = {name: imports_of(name, path) for name, path in {**SOURCES, **MONITOR}.items()}


def closure(start: Iterable[str]) -> set[str]:
    """Every project module reachable from ``start``."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        for target in GRAPH.get(name, ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def under(package: str) -> set[str]:
    prefix = f"{ROOT}.{package}"
    return {name for name in SOURCES if name == prefix or name.startswith(prefix + ".")}


def package_of(module: str) -> str:
    """The layer a module is in: the longest package of :data:`PACKAGES` holding it."""
    name = module.removeprefix(f"{ROOT}.")
    held = [p for p in (*PACKAGES, *SHARED) if name == p or name.startswith(p + ".")]
    layer = max(held, key=len, default="core")
    return "core" if layer in SHARED else layer


def test_the_graph_is_read():
    """The checks below would pass on an empty graph: make sure it is not one."""
    assert f"{ROOT}.fleet.state" in GRAPH[f"{ROOT}.fleet.placement"]
    assert f"{ROOT}.catalog.store" in GRAPH[f"{ROOT}.catalog.writing.writer"]
    assert f"{ROOT}.fleet.events" in closure([f"{ROOT}.catalog.writing.record"])
    assert f"{ROOT}.dispatch.machine" in GRAPH[f"{ROOT}.executor.loop"]
    assert f"{ROOT}.dispatch.machine" in closure([f"{ROOT}.executor.adapter"])


def test_the_fleet_imports_nothing_above_it():
    outside = closure(under("fleet")) - under("fleet")
    assert not outside, f"the fleet package reaches {sorted(outside)}"


@pytest.mark.parametrize("module", ["fleet.placement", "fleet.state"])
def test_placement_and_the_fleet_state_import_no_catalog(module):
    reached = closure([f"{ROOT}.{module}"])
    for package in ("dispatch", "catalog", "server", "cluster", "executor"):
        assert not reached & under(package), f"{module} reaches {package}"


def test_the_catalog_imports_the_fleets_vocabulary_and_never_the_reverse():
    reached = closure(under("catalog"))
    for package in ("dispatch", "executor", "server", "cluster"):
        assert not reached & under(package), f"the catalog reaches {package}"
    assert f"{ROOT}.fleet.events" in reached


@pytest.mark.parametrize("package", ["settings", "pilots.batch", "strays"])
def test_the_settings_batch_systems_and_strays_sit_on_the_core_alone(package):
    """Every process reads the settings and sweeps its strays: they reach the core and
    the fleet's vocabulary, no layer above."""
    reached = closure(under(package))
    above = sorted(m for m in reached if package_of(m) not in ("core", "fleet"))
    assert not above, f"{package} reaches {above}"
    assert not reached & under("pilots") - under("pilots.batch")


def test_the_catalogs_readers_never_import_its_write_side():
    reached = closure(under("catalog.reading"))
    assert not reached & under("catalog.writing"), sorted(reached & under("catalog.writing"))
    assert f"{ROOT}.catalog.models" in reached


def test_the_dispatch_machine_imports_neither_dask_nor_snakemake():
    for module in under("dispatch"):
        tree = ast.parse(SOURCES[module].read_text())
        names = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {n.split(".")[0] for n in names} & {"distributed", "dask", "snakemake"}
    reached = closure(under("dispatch"))
    # errors escapes its messages' control characters through terminal.
    allowed = under("fleet") | under("dispatch") | {f"{ROOT}.errors", f"{ROOT}.terminal"}
    assert reached <= allowed, sorted(reached)


def test_nothing_below_the_command_line_imports_the_simulator():
    """The simulator sits on top of the executor: it drives the dispatch machine and
    the fleet's policy, and only the command line imports it."""
    for name in SOURCES:
        if name in under("simulate") or name == f"{ROOT}.cli":
            continue
        reached = closure([name]) & under("simulate")
        assert not reached, f"{name} reaches {sorted(reached)}"
    assert f"{ROOT}.dispatch.machine" in closure(under("simulate"))


def test_the_monitor_imports_only_the_catalog_errors_and_terminal_text():
    shared = {f"{ROOT}.errors", f"{ROOT}.terminal"}  # terminal: values shown escaped
    for name, path in MONITOR.items():
        for target in imports_of(name, path):
            assert target.startswith(f"{ROOT}.catalog") or target in shared, (
                f"{name} imports {target}"
            )


def test_no_package_cycle():
    edges = {
        (package_of(a), package_of(b))
        for a, targets in GRAPH.items()
        if a in SOURCES
        for b in targets
        if package_of(a) != package_of(b)
    }
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(p for p in graph if reaches(p, p, {p}))
    assert not cycles, f"packages in a cycle: {cycles} (edges {sorted(edges)})"


def test_the_snakemake_adapter_is_thin():
    """The RemoteExecutor subclass (no base class of this project) stays an adapter."""
    path = SOURCES[f"{ROOT}.executor.adapter"]
    tree = ast.parse(path.read_text())
    (executor,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Executor"]
    assert [ast.unparse(base) for base in executor.bases] == ["RemoteExecutor"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_cycle():
    """No file-level import cycle, counting type-only and function-level imports:
    moving an import into a function hides a cycle from Python, not from here."""
    graph = {name: targets for name, targets in GRAPH.items() if name in SOURCES}
    cycles = _cycles(graph)
    assert not cycles, "modules in an import cycle: " + "; ".join(
        " <-> ".join(m.removeprefix(f"{ROOT}.") for m in cycle) for cycle in cycles
    )


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_adapter_receives_the_adapter_object():
    """Topic modules get what they need as arguments, never the whole executor."""
    adapter = ast.parse(SOURCES[f"{ROOT}.executor.adapter"].read_text())
    passes_self = [
        ast.unparse(node)
        for node in ast.walk(adapter)
        if isinstance(node, ast.Call)
        and any(
            isinstance(a, ast.Name) and a.id == "self"
            for a in [*node.args, *(k.value for k in node.keywords)]
        )
        and not (isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) == "self")
    ]
    assert not passes_self, passes_self
    for name, path in SOURCES.items():
        if name == f"{ROOT}.executor.adapter":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
                taken = params & {"executor", "adapter"}
                assert not taken, f"{name}.{node.name} takes the executor as {taken}"


@pytest.mark.parametrize(
    "package",
    sorted(
        {p.parent for p in (REPO / ROOT).rglob("*.py")}
        | {p.parent for p in (REPO / "monitor" / "snakemake_context_monitor").rglob("*.py")}
    ),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_each_package_docstring_names_its_modules(package: Path):
    """A package's docstring is its map: it names every module in it."""
    init = package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
    assert doc, f"{package.relative_to(REPO)} has no package docstring"
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    modules += sorted(p.name for p in package.iterdir() if (p / "__init__.py").exists())
    missing = [m for m in modules if not re.search(rf"(?<![\w]){re.escape(m)}(?![\w])", doc)]
    assert not missing, f"{package.relative_to(REPO)}'s docstring does not name {missing}"
