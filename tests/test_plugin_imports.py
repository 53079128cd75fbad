"""The plugin machinery sits below what it registers.

`kvtiers.plugins` loads the core's built-ins (`kvtiers.default_plugins`) by module
name, and records name code lazily, so (1) loading the registry imports no command,
bench, manager, tier class or torch, and (2) in the static import graph of the core
no cycle passes through a `kvtiers.plugins` module. The graph counts every import
statement, also those inside functions (a lazy import still closes a cycle when it
runs), but not those under `if TYPE_CHECKING:`; importing `a.b.c` also imports the
packages `a.b` and `a` (except the importer's own ancestors, which are always
being imported already).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "kvtiers-core" / "src"
HEAVY = ("kvtiers.cli", "kvtiers.bench", "kvtiers.manager", "kvtiers.tiers.memory",
         "kvtiers.tiers.faulty", "kvtiers.policies", "kvtiers.swap", "torch", "numpy")  # fmt: skip


def test_loading_the_registry_imports_nothing_it_registers() -> None:
    code = (
        "import sys\n"
        "from kvtiers.plugins.registry import load_registry\n"
        "reg = load_registry(entry_points=[], environ={})\n"
        "assert {'memory', 'faulty'} <= set(reg.tiers) and 'lru' in reg.policies\n"
        "assert {'plugins', 'validate', 'bench'} <= set(reg.commands)\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"loading the registry imported {done.stdout.strip()}"


def test_a_command_record_resolves_only_when_used() -> None:
    code = (
        "import sys\n"
        "from kvtiers.plugins.registry import load_registry\n"
        "rec = load_registry(entry_points=[], environ={}).commands['validate'].record\n"
        "assert 'kvtiers.cli.validate_cmd' not in sys.modules\n"
        "run = rec.load_run()\n"
        "print(run.__module__, 'kvtiers.cli.bench_cmd' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["kvtiers.cli.validate_cmd", "False"]


# ------------------------------------------------------------------ the static graph


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every module an import statement of `tree` names (TYPE_CHECKING blocks aside)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (m for n in node.orelse for m in _imports(n, module, is_package))
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            yield base
            # `from a import b` imports module a.b when b is one.
            yield from (f"{base}.{a.name}" for a in node.names)
        yield from _imports(node, module, is_package)


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.joinpath("kvtiers").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        edges: set[str] = set()
        for target in _imports(ast.parse(path.read_text(), str(path)), module, is_package):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                if name in files and name not in ancestors:
                    edges.add(name)
        graph[module] = edges
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative: the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_the_graph_sees_real_edges() -> None:
    graph = import_graph()
    assert "kvtiers.plugins.registry" in graph["kvtiers.manager.build"]
    assert "kvtiers.plugins.records" in graph["kvtiers.default_plugins.commands"]
    # A lazy import inside a function counts; one for type checking only does not.
    assert "kvtiers.plugins.registry" in graph["kvtiers.tier"]
    assert "kvtiers.config.model" in graph["kvtiers.tiers._factory"]
    registry = graph["kvtiers.plugins.registry"]
    assert not any(m.startswith("kvtiers.default_plugins") for m in registry)


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [{"a", "b", "c"}]


def test_no_import_cycle_passes_through_the_plugin_machinery() -> None:
    cycles = [c for c in strongly_connected(import_graph()) if any(
        m == "kvtiers.plugins" or m.startswith("kvtiers.plugins.") for m in c)]  # fmt: skip
    assert not cycles, f"import cycles through kvtiers.plugins: {[sorted(c) for c in cycles]}"


def test_the_cli_imports_only_the_command_it_runs() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from kvtiers.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    helped = sorted(m for m in sys.modules if m.startswith('kvtiers.cli.'))\n"
        "    rc = main(['plugins', '--json'])\n"
        f"heavy = {HEAVY!r}\n"
        "listed = sorted(m for m in sys.modules if m.startswith(heavy))\n"
        "print(rc, helped, listed)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0 [] ['kvtiers.cli', 'kvtiers.cli.plugins_cmd']"
