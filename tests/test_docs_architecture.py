"""docs/architecture.md names real things.

Every repository path and every dotted module name (`kvtiers.*`, `kvtiers_*.*`) the
page writes in backticks must exist: a path on disk, relative to the repository; a
dotted name as a module or package file under `kvtiers-*/src` or `examples/*/src`,
any remainder after the longest module prefix a name that module binds
(`kvtiers.sdk.JobEngine`). Its links lead somewhere, it names every package of the
core and every distribution and example, and every hook the plugin system declares.

Fenced blocks are not read; a span that is neither (`[2, P, T, H, D]`, `/dev/shm`,
`s3://`) is ignored. The checker is run on a planted bad name too, so that it cannot
pass by seeing nothing.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
CORE = REPO / "kvtiers-core" / "src" / "kvtiers"

FENCE = re.compile(r"^```.*?^```$", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: a relative repository path: words, dots and dashes between slashes
PATH = re.compile(r"[\w][\w.-]*(?:/[\w.-]+)*/?")
#: `kvtiers`, `kvtiers.sdk.JobEngine`, `kvtiers_fs.tier` (not `kvtiers-fs`, not a path,
#: not a hook: `kvtiers_register_tiers` is a function)
DOTTED = re.compile(r"(?<![\w./-])(?!kvtiers_register_)kvtiers(?:_\w+)?(?:\.\w+)*(?![\w-])")


def code_spans(text: str) -> list[str]:
    """The inline code spans of a Markdown text, fenced blocks left out."""
    return CODE_SPAN.findall(FENCE.sub("", text))


def named(text: str) -> tuple[list[str], list[str]]:
    """(repository paths, dotted module names) the text's code spans name, in order."""
    paths: list[str] = []
    dotted: list[str] = []
    for span in code_spans(text):
        if "/" in span and PATH.fullmatch(span):
            paths.append(span)
        else:
            dotted += DOTTED.findall(span)
    return paths, dotted


def _roots(repo: Path) -> list[Path]:
    found = [*repo.glob("kvtiers-*/src"), *repo.glob("examples/*/src")]
    return sorted(p for p in found if p.is_dir())


def module_file(dotted: str, repo: Path = REPO) -> Path | None:
    """The file of module `dotted`: a package's `__init__.py`, a module's `.py` (or
    `.pyi`), or a native module's C source; None when there is none."""
    parts = dotted.split(".")
    for root in _roots(repo):
        package = root.joinpath(*parts)
        candidates = [package / "__init__.py"]
        candidates += [package.parent / f"{parts[-1]}{ext}" for ext in (".py", ".pyi", ".c")]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
    return None


@cache
def bound_names(path: Path) -> frozenset[str]:
    """Names module `path` binds: its top-level definitions and assignments, every
    name it imports (lazily or for type checking too) and its `__all__`."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and \
                    isinstance(node.value, ast.List | ast.Tuple):
                names |= {e.value for e in node.value.elts
                          if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def dotted_problem(dotted: str, repo: Path = REPO) -> str | None:
    """Why `dotted` names nothing, or None: its longest prefix that is a module must
    bind the next part (deeper parts, attributes of attributes, are not checked)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:n]), repo)
        if path is None:
            continue
        if n == len(parts):
            return None
        module, name = ".".join(parts[:n]), parts[n]
        if path.suffix == ".c" or name not in bound_names(path):
            return f"`{dotted}`: {module} ({path.relative_to(repo)}) has no `{name}`"
        return None
    return f"`{dotted}`: no such module under kvtiers-*/src or examples/*/src"


def problems(text: str, repo: Path = REPO) -> list[str]:
    """One message per path or dotted name of `text` that names nothing."""
    paths, dotted = named(text)
    out = [f"`{p}`: no such path in the repository" for p in paths if not (repo / p).exists()]
    out += [m for d in dict.fromkeys(dotted) if (m := dotted_problem(d, repo)) is not None]
    return out


# ------------------------------------------------------------------ the page


def test_the_page_names_paths_and_modules() -> None:
    paths, dotted = named(DOC.read_text())
    assert len(paths) >= 10 and len(dotted) >= 30, (paths, dotted)


def test_every_path_and_module_the_page_names_exists() -> None:
    found = problems(DOC.read_text())
    assert not found, "docs/architecture.md names what does not exist:\n" + "\n".join(found)


def test_the_pages_links_lead_somewhere() -> None:
    links = LINK.findall(FENCE.sub("", DOC.read_text()))
    assert links
    for link in links:
        if link.startswith(("http://", "https://", "#")):
            continue
        assert (DOC.parent / link.split("#")[0]).exists(), f"{link} does not exist"


def test_the_page_names_every_package_distribution_and_example() -> None:
    """A package, distribution or example added is added to the map too."""
    text = DOC.read_text()
    _, dotted = named(text)
    packages = {f"kvtiers.{p.parent.name}" for p in CORE.glob("*/__init__.py")}
    missing = sorted(packages - set(dotted))
    trees = [p for p in REPO.glob("kvtiers-*") if p.is_dir() and p.name != "kvtiers-core"]
    trees += [p for p in (REPO / "examples").iterdir() if p.is_dir()]
    spans = set(code_spans(text))
    missing += sorted(
        str(t.relative_to(REPO)) for t in trees
        if not {str(t.relative_to(REPO)), f"{t.relative_to(REPO)}/"} & spans
    )  # fmt: skip
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_page_names_every_hook() -> None:
    tree = ast.parse((CORE / "plugins" / "hookspecs.py").read_text())
    hooks = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
             and any(isinstance(d, ast.Name) and d.id == "hookspec" for d in node.decorator_list)]
    assert len(hooks) >= 3
    spans = set(code_spans(DOC.read_text()))
    missing = [h for h in hooks if h not in spans]
    assert not missing, f"hooks the page does not name: {missing}"


# ------------------------------------------------------------------ the checker


def test_the_checker_catches_planted_bad_names() -> None:
    text = (
        "Good: `kvtiers`, `kvtiers.sdk`, `kvtiers.sdk.JobEngine`, `kvtiers.manager.MeteredTier`,"
        " `kvtiers.sdk.integrity.checksum_bytes`, `kvtiers_fs`, `kvtiers-core/src/kvtiers/`,"
        " `tests/test_architecture.py`, `from kvtiers.plugins import hookimpl`,"
        " `kvtiers-fs`, `kvtiers_register_tiers`, `/dev/shm`, `s3://bucket/prefix`,"
        " `[2, P, T, H, D]`.\n"
        "Bad: `kvtiers.tier`, `kvtiers.sdk.NoSuchEngine`, `kvtiers_nosuch.plugin`,"
        " `kvtiers-core/src/kvtiers/keys.py`, `run kvtiers.jobs.TransferJob here`.\n"
        "```\nkvtiers.not_read_in_a_fence  `kvtiers.nor_here`\n```\n"
    )
    paths, dotted = named(text)
    assert paths == ["kvtiers-core/src/kvtiers/", "tests/test_architecture.py",
                     "kvtiers-core/src/kvtiers/keys.py"]  # fmt: skip
    assert "kvtiers.not_read_in_a_fence" not in dotted and "kvtiers.nor_here" not in dotted
    assert problems(text) == [
        "`kvtiers-core/src/kvtiers/keys.py`: no such path in the repository",
        "`kvtiers.tier`: kvtiers (kvtiers-core/src/kvtiers/__init__.py) has no `tier`",
        "`kvtiers.sdk.NoSuchEngine`: kvtiers.sdk (kvtiers-core/src/kvtiers/sdk/__init__.py)"
        " has no `NoSuchEngine`",
        "`kvtiers_nosuch.plugin`: no such module under kvtiers-*/src or examples/*/src",
        "`kvtiers.jobs.TransferJob`: kvtiers (kvtiers-core/src/kvtiers/__init__.py) has no"
        " `jobs`",
    ]


def test_a_lazily_exported_name_counts_and_a_module_attribute_is_checked() -> None:
    # AsyncJobEngine is imported for type checking only and served by __getattr__.
    assert dotted_problem("kvtiers.sdk.AsyncJobEngine") is None
    assert dotted_problem("kvtiers.MeteredTier") == (
        "`kvtiers.MeteredTier`: kvtiers (kvtiers-core/src/kvtiers/__init__.py) has no "
        "`MeteredTier`")
