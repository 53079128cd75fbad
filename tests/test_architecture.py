"""Fitness tests of the repository's structure (tests/architecture.py reads it).

1. No import cycle anywhere: every distribution, example, test and bench module,
   every import statement (function-level and `TYPE_CHECKING` ones included), no
   strongly connected component of more than one module.
2. Each distribution and example imports the core through its faces only: tier code
   `kvtiers.sdk`, `kvtiers.plugins`, `kvtiers.errors`; its tests (and bench scripts)
   `kvtiers.testing` besides; the applications listed in `APPS` the engine face
   `kvtiers` and the named packages `kvtiers.config`, `.manager`, `.pool`,
   `.metrics`, `.ops` besides. A violation names the face to use.

Each check is also run on a planted violation, so that it cannot pass by seeing
nothing.
"""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

import pytest

from tests.architecture import (
    APP_FACES,
    REPO,
    TEST_FACES,
    TIER_FACES,
    Rules,
    cycles,
    describe_cycle,
    import_graph,
    modules,
    outside_trees,
    python_files,
    source_roots,
    surface_violations,
)

#: applications shipped inside distributions, by path (files or directories)
APPS = frozenset({
    "kvtiers-vllm/src/kvtiers_vllm",  # the vLLM adapter: an engine integration
    "kvtiers-sglang/src/kvtiers_sglang",  # the SGLang adapter: an engine integration
    "kvtiers-p2p/src/kvtiers_p2p/node",  # `kvtiers serve`: a node runs a manager, its CLI
    "examples/embedding",  # an engine embedding kvtiers
})  # fmt: skip

RULES = Rules(APPS)


def _exports() -> dict[str, set[str]]:
    return {face: set(importlib.import_module(face).__all__) for face in APP_FACES}


# ------------------------------------------------------------------ cycles


def test_the_graph_covers_the_repository() -> None:
    found = modules()
    assert {"kvtiers.contract.tier", "kvtiers_fs", "kvtiers_p2p", "kvtiers_scratch.tier",
            "tests.test_architecture", "bench.fs_bench"} <= set(found)  # fmt: skip
    graph = import_graph(found)
    # a lazy import inside a function counts, and so does one for type checking only
    assert "kvtiers.plugins.registry" in graph["kvtiers.contract.tier"]
    assert "kvtiers.config.loader" in graph["kvtiers.config"]
    # importing a module imports its packages
    assert "kvtiers.sdk" in graph["kvtiers_scratch.tier"]


def test_no_import_cycle_anywhere() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe_cycle(c, graph) for c in found)


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.mark.parametrize(
    "files",
    [
        # at module level
        {"kvtiers-x/src/pkg/__init__.py": "", "kvtiers-x/src/pkg/a.py": "from pkg import b\n",
         "kvtiers-x/src/pkg/b.py": "import pkg.a\n"},
        # inside a function
        {"kvtiers-x/src/pkg/__init__.py": "", "kvtiers-x/src/pkg/a.py": "import pkg.b\n",
         "kvtiers-x/src/pkg/b.py": "def f():\n    from pkg.a import x\n"},
        # for type checking only
        {"kvtiers-x/src/pkg/__init__.py": "", "kvtiers-x/src/pkg/a.py": "import pkg.b\n",
         "kvtiers-x/src/pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from pkg.a import x\n"},
        # through a package's face: b imports pkg.sub.c, so it runs pkg/sub/__init__
        {"kvtiers-x/src/pkg/__init__.py": "", "kvtiers-x/src/pkg/b.py": "from pkg.sub.c import y\n",
         "kvtiers-x/src/pkg/sub/__init__.py": "from pkg.sub.d import z\n",
         "kvtiers-x/src/pkg/sub/c.py": "", "kvtiers-x/src/pkg/sub/d.py": "from pkg import b\n"},
        # relative imports, across two distributions' roots
        {"kvtiers-x/src/pkg/__init__.py": "", "kvtiers-x/src/pkg/a.py": "from . import b\n",
         "kvtiers-x/src/pkg/b.py": "from other import c\n",
         "examples/y/src/other/__init__.py": "", "examples/y/src/other/c.py": "import pkg.a\n"},
    ],
    ids=["module-level", "in-a-function", "type-checking", "through-a-face", "relative"],
)  # fmt: skip
def test_a_planted_cycle_is_found(tmp_path: Path, files: dict[str, str]) -> None:
    _plant(tmp_path, files)
    graph = import_graph(modules(tmp_path))
    found = cycles(graph)
    assert len(found) == 1 and len(found[0]) >= 2, found


def test_no_cycle_without_one(tmp_path: Path) -> None:
    _plant(tmp_path, {"kvtiers-x/src/pkg/__init__.py": "from pkg.a import x\n",
                      "kvtiers-x/src/pkg/a.py": "import os\nimport pkg.b\n",
                      "kvtiers-x/src/pkg/b.py": "from pkg import c\n",
                      "kvtiers-x/src/pkg/c.py": ""})  # fmt: skip
    assert [r.name for r, _ in source_roots(tmp_path)] == ["src"]
    assert cycles(import_graph(modules(tmp_path))) == []


# ------------------------------------------------------------------ faces


def _violations(tree: Path, exports: dict[str, set[str]]) -> list[str]:
    out = []
    for path in python_files(tree):
        rel = str(path.relative_to(REPO))
        for line, message in surface_violations(
                path.read_text(), RULES.faces_for(rel), exports, str(path)):
            out.append(f"{rel}:{line}: {message}")
    return out


def test_the_apps_exist() -> None:
    assert all((REPO / app).exists() for app in APPS), [a for a in APPS if not (REPO / a).exists()]


@pytest.mark.parametrize("tree", outside_trees(), ids=lambda p: str(p.relative_to(REPO)))
def test_outside_the_core_only_faces_are_imported(tree: Path) -> None:
    found = _violations(tree, _exports())
    assert not found, "imports past the core's faces:\n" + "\n".join(found)


def test_the_rules() -> None:
    assert RULES.faces_for("kvtiers-fs/src/kvtiers_fs/tier.py") == TIER_FACES
    assert RULES.faces_for("examples/kvtiers-scratch/tests/test_x.py") == TEST_FACES
    assert RULES.faces_for("examples/kvtiers-redis/bench/throughput.py") == TEST_FACES
    assert RULES.faces_for("kvtiers-vllm/src/kvtiers_vllm/spec.py") == APP_FACES
    assert RULES.faces_for("kvtiers-vllm/src/kvtiers_vllmx/spec.py") == TIER_FACES


@pytest.mark.parametrize(
    ("source", "faces", "expected"),
    [
        ("from kvtiers.contract.keys import BlockKey\n", TIER_FACES,
         ["`from kvtiers.contract.keys import BlockKey`: use `from kvtiers.sdk import BlockKey`"]),
        ("def f():\n    from kvtiers.manager import build_manager\n", TIER_FACES,
         ["`from kvtiers.manager import build_manager`: allowed here: kvtiers.errors, "
          "kvtiers.plugins, kvtiers.sdk"]),
        ("import kvtiers.sdk.index\n", TIER_FACES,
         ["`import kvtiers.sdk.index`: allowed here: kvtiers.errors, kvtiers.plugins, "
          "kvtiers.sdk"]),
        ("from kvtiers.sdk import _private\n", TIER_FACES,
         ["`from kvtiers.sdk import _private`: a private name of the core"]),
        ("from kvtiers.sdk import NoSuchName\n", TIER_FACES,
         ["`from kvtiers.sdk import NoSuchName`: kvtiers.sdk does not export NoSuchName"]),
        ("from kvtiers.testing import make_context\n", TIER_FACES,
         ["`from kvtiers.testing import make_context`: allowed here: kvtiers.errors, "
          "kvtiers.plugins, kvtiers.sdk"]),
        ("from kvtiers import build_manager\n", TIER_FACES,
         ["`from kvtiers import build_manager`: allowed here: kvtiers.errors, "
          "kvtiers.plugins, kvtiers.sdk"]),
        ("from kvtiers.sdk import TierContext\nTierContext._registry\n", TIER_FACES,
         ["`TierContext._registry`: a private name of the core"]),
        # allowed
        ("from kvtiers.sdk import TierContext\nTierContext.__name__\nself._x = 1\n",
         TIER_FACES, []),
        ("from kvtiers.sdk import BlockKey, SecondaryTier\nfrom kvtiers.errors import "
         "ConfigError\nimport kvtiers_fs._x\nimport kvtiersx\n", TIER_FACES, []),
        ("from kvtiers.testing import make_context\n", TEST_FACES, []),
        ("from kvtiers import build_manager\nfrom kvtiers.pool import CpuPool\n", APP_FACES, []),
    ],
)  # fmt: skip
def test_the_surface_check(source: str, faces: frozenset[str], expected: list[str]) -> None:
    assert [m for _, m in surface_violations(source, faces, _exports())] == expected


def test_a_planted_violation_in_a_distribution_is_named(tmp_path: Path) -> None:
    tree = REPO / "kvtiers-fs"
    planted = tree / "src" / "kvtiers_fs" / "_planted_violation.py"
    planted.write_text("from kvtiers.manager.build import build_manager\n")
    try:
        found = _violations(tree, _exports())
    finally:
        planted.unlink()
    assert found == ["kvtiers-fs/src/kvtiers_fs/_planted_violation.py:1: "
                     "`from kvtiers.manager.build import build_manager`: allowed here: "
                     "kvtiers.errors, kvtiers.plugins, kvtiers.sdk"]
