"""No code outside kvtiers-core uses a private name of the core.

Every distribution (`kvtiers-*/`) and every example (`examples/*/`) of the
repository, present and future, is parsed with `ast`; a use of a `kvtiers.*._*`
name (a module or attribute whose name starts with one underscore) is reported as
file:line. Uses are: imports (`import kvtiers.tiers._factory`,
`from kvtiers.tiers import _options`, `from kvtiers.x import _helper`), attributes
reached from an imported core name (`kvtiers.tiers._factory`, `TierContext._x`) and
lazy "module:attr" strings such as records name code with
(`"kvtiers.tiers._factory:create_tier"`). Plugins import public core names only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = "kvtiers-core"
SKIP_DIRS = {"__pycache__", "build", "dist", ".venv", "venv", ".eggs", "node_modules", ".git"}
# "kvtiers.a.b" or "kvtiers.a.b:attr.x", as records and importlib name code.
LAZY_PATH = re.compile(r"^kvtiers(\.\w+)+(:[\w.]+)?$|^kvtiers:[\w.]+$")


def _private(dotted: str) -> bool:
    """True when a component after the top-level `kvtiers` is private (`_x`, not a
    dunder such as `__version__`)."""
    parts = re.split(r"[.:]", dotted)
    return parts[0] == "kvtiers" and any(
        p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:]
    )


def _trees() -> list[Path]:
    """Every distribution and example directory except the core."""
    found = [p for p in REPO.glob("kvtiers-*") if p.is_dir() and p.name != CORE]
    examples = REPO / "examples"
    if examples.is_dir():
        found += [p for p in examples.iterdir() if p.is_dir()]
    return sorted(found)


def _python_files(tree: Path) -> list[Path]:
    return sorted(
        p for p in tree.rglob("*.py")
        if not SKIP_DIRS & set(p.relative_to(tree).parts) and not any(
            part.endswith(".egg-info") for part in p.parts)
    )  # fmt: skip


def _dotted(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def private_uses(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, what) for each use of a private core name in `source`."""
    tree = ast.parse(source, filename)
    bound: dict[str, str] = {}  # local name -> the core name it stands for
    found: list[tuple[int, str]] = []

    def report(line: int, what: str) -> None:
        if _private(what):
            found.append((line, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                report(node.lineno, alias.name)
                if alias.name.split(".")[0] == "kvtiers":
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else "kvtiers"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "kvtiers":
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                report(node.lineno, full)
                bound[alias.asname or alias.name] = full
    # Only the outermost attribute of a chain (`a.b.c`, not also `a.b`).
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts = _dotted(node)
            if parts and parts[0] in bound:
                report(node.lineno, ".".join([bound[parts[0]], *parts[1:]]))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and LAZY_PATH.match(node.value)
        ):
            report(node.lineno, node.value)
    return sorted(set(found))


def test_the_walk_finds_the_distributions_and_examples() -> None:
    names = {p.name for p in _trees()}
    assert {"kvtiers-fs", "kvtiers-sqlite"} <= names
    assert all(_python_files(p) for p in _trees() if p.name in {"kvtiers-fs", "kvtiers-sqlite"})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import kvtiers.tiers._factory\n", ["kvtiers.tiers._factory"]),
        ("from kvtiers.tiers import _options\n", ["kvtiers.tiers._options"]),
        ("from kvtiers.tiers._factory import current_registry\n",
         ["kvtiers.tiers._factory.current_registry"]),
        ("from kvtiers.testing import _helpers as h\n", ["kvtiers.testing._helpers"]),
        ("import kvtiers\nkvtiers.tiers._factory.create_tier\n",
         ["kvtiers.tiers._factory.create_tier"]),
        ("from kvtiers.tier import TierContext\nTierContext._secret\n",
         ["kvtiers.tier.TierContext._secret"]),
        ("RECORD = 'kvtiers.tiers._factory:create_tier'\n", ["kvtiers.tiers._factory:create_tier"]),
        # Public names, dunders, the plugin's own private modules, other objects.
        ("from kvtiers import __version__, CONTRACT_VERSION\n", []),
        ("from kvtiers.tier import SecondaryTier\nfrom kvtiers_fs import _readmany\n", []),
        ("import kvtiers.tier as t\nself._x = t.TierContext\nobj._y\n", []),
        ("'kvtiers.tier:SecondaryTier'\n'see kvtiers._x for why'\n", []),
    ],
)  # fmt: skip
def test_the_checker(source: str, expected: list[str]) -> None:
    assert sorted({what for _, what in private_uses(source)}) == sorted(expected)


@pytest.mark.parametrize("tree", _trees(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_private_core_name_outside_the_core(tree: Path) -> None:
    uses = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _python_files(tree)
        for line, what in private_uses(path.read_text(), str(path))
    ]
    assert not uses, "private kvtiers names used outside kvtiers-core:\n" + "\n".join(uses)
