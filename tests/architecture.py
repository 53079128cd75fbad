"""The repository's import structure, read with `ast` (nothing is imported).

Two checks build on it (tests/test_architecture.py):

- `import_graph` + `cycles`: the module graph of every distribution, example, test
  and bench module. Every import statement counts - at module level, inside
  functions (a lazy import still closes a cycle when it runs) and under
  `if TYPE_CHECKING:` (a cycle there is a cycle in the design). Importing `a.b.c`
  also imports the packages `a.b` and `a`, so it is an edge to each of them (except
  the importer's own ancestors, which are always being imported already), and
  `from a import b` is an edge to the module `a.b` when there is one.
- `surface_violations`: which `kvtiers.*` names a distribution or example imports,
  held against the faces it may use (`Rules`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"__pycache__", "build", "dist", ".venv", "venv", ".eggs", ".git", "node_modules"}


# ------------------------------------------------------------------ modules and edges


def python_files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*.py")
        if not SKIP_DIRS & set(p.relative_to(root).parts)
        and not any(part.endswith(".egg-info") for part in p.parts)
    )  # fmt: skip


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_roots(repo: Path = REPO) -> list[tuple[Path, Path]]:
    """(import root, directory to walk) for every place modules live: each
    distribution's and example's `src`, and the repository's `tests` and `bench`
    (walked from the repository root, so they are `tests.*` and `bench.*`)."""
    roots = [(p, p) for p in sorted(repo.glob("kvtiers-*/src")) if p.is_dir()]
    roots += [(p, p) for p in sorted(repo.glob("examples/*/src")) if p.is_dir()]
    roots += [(repo, repo / name) for name in ("tests", "bench") if (repo / name).is_dir()]
    return roots


def modules(repo: Path = REPO) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root, walk in source_roots(repo):
        for path in python_files(walk):
            found.setdefault(module_name(path, root), path)
    return found


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, dotted module) for every module an import statement of `tree` names,
    wherever it stands (functions, `TYPE_CHECKING` blocks); relative imports made
    absolute; `from a import b` yields both `a` and `a.b`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def import_graph(found: Mapping[str, Path] | None = None) -> dict[str, set[str]]:
    """module -> the modules of `found` it imports (see the module docstring)."""
    found = modules() if found is None else found
    graph: dict[str, set[str]] = {}
    for module, path in found.items():
        is_package = path.name == "__init__.py"
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for _, target in imported_names(tree, module, is_package):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                if name in found and name not in ancestors:
                    edges.add(name)
        graph[module] = edges
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
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
                if child not in graph:
                    continue
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def describe_cycle(component: Sequence[str], graph: Mapping[str, set[str]]) -> str:
    members = set(component)
    arrows = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"{len(component)} modules: " + "; ".join(arrows)


# ------------------------------------------------------------------ faces

#: what a tier's code may import of the core
TIER_FACES = frozenset({"kvtiers.sdk", "kvtiers.plugins", "kvtiers.errors"})
#: ... and its tests
TEST_FACES = TIER_FACES | {"kvtiers.testing"}
#: ... and an application shipped inside a distribution (a serving node, an
#: engine adapter): the engine face and the named packages
APP_FACES = TEST_FACES | {
    "kvtiers", "kvtiers.config", "kvtiers.manager", "kvtiers.pool", "kvtiers.metrics",
    "kvtiers.ops",
}  # fmt: skip
#: the core's private names are never reached from outside (`x._y`, not dunders)
_PRIVATE = re.compile(r"(^|\.)_(?!_)")


@dataclass(frozen=True)
class Rules:
    """Which faces the code under each path may import. `apps` are paths (files or
    directories, relative to the repository) of applications; a file under a `tests`
    or `bench` directory may add `kvtiers.testing`; everything else is tier code."""

    apps: frozenset[str]

    def faces_for(self, rel: str) -> frozenset[str]:
        if any(rel == app or rel.startswith(app.rstrip("/") + "/") for app in self.apps):
            return APP_FACES
        if {"tests", "bench"} & set(rel.split("/")[:-1]):
            return TEST_FACES
        return TIER_FACES


def outside_trees(repo: Path = REPO) -> list[Path]:
    """Every distribution and example directory except the core."""
    found = [p for p in repo.glob("kvtiers-*") if p.is_dir() and p.name != "kvtiers-core"]
    examples = repo / "examples"
    if examples.is_dir():
        found += [p for p in examples.iterdir() if p.is_dir()]
    return sorted(found)


def core_imports(source: str, filename: str = "<string>") -> Iterator[tuple[int, str, str]]:
    """(line, module, name) for each `kvtiers` import of `source`; name is "" for
    `import module`."""
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "kvtiers" or alias.name.startswith("kvtiers."):
                    yield node.lineno, alias.name, ""
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and (node.module == "kvtiers" or node.module.startswith("kvtiers."))):
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def private_attributes(source: str, filename: str = "<string>") -> Iterator[tuple[int, str]]:
    """(line, `name._attr`) where `source` reaches a private attribute (`_x`, not a
    dunder) of a name it imported from the core."""
    tree = ast.parse(source, filename)
    bound = {alias.asname or alias.name.split(".")[0]
             for _, module, name in core_imports(source, filename)
             for alias in [ast.alias(name or module)]}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _PRIVATE.match(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in bound):
            yield node.lineno, f"{node.value.id}.{node.attr}"


def surface_violations(source: str, faces: frozenset[str], exports: Mapping[str, set[str]],
                       filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, message) for each import of `source` outside `faces`, and each private
    attribute reached on a core name; the message names the face that offers the
    name (`exports`: face -> the names it exports)."""
    out: list[tuple[int, str]] = [
        (line, f"`{what}`: a private name of the core")
        for line, what in private_attributes(source, filename)]
    for line, module, name in core_imports(source, filename):
        shown = f"from {module} import {name}" if name else f"import {module}"
        if _PRIVATE.search(module) or _PRIVATE.match(name):
            out.append((line, f"`{shown}`: a private name of the core"))
        elif module not in faces:
            offering = sorted(f for f in faces if name and name in exports.get(f, ()))
            hint = (f"use `from {offering[0]} import {name}`" if offering
                    else f"allowed here: {', '.join(sorted(faces))}")
            out.append((line, f"`{shown}`: {hint}"))
        elif name and exports.get(module) is not None and name not in exports[module] \
                and f"{module}.{name}" not in exports:
            out.append((line, f"`{shown}`: {module} does not export {name}"))
    return out
