"""Third-party plugins, end to end: built as wheels, installed into a fresh venv,
found through their entry points, selected by a config, held to the conformance
suite, and (the guide's first tier, kvtiers-scratch) run under `kvtiers bench` below
a CPU pool, every loaded byte checked - what docs/plugins.md tells an author to run.

The fresh venv reuses this environment's packages (torch, pluggy, pytest, ...) through a
`.pth` line instead of reinstalling them, but gets its own kvtiers-core (a wheel of this
checkout) and sees the example plugins only because their wheels were installed in it.
A plain path line in a `.pth` file adds the outer site-packages to `sys.path` without
running the outer `.pth` files, so the outer editable kvtiers-core stays invisible.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..bench.conftest import BLOCK, TINY, small_pool

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ["examples/kvtiers-scratch", "examples/kvtiers-sqlite"]
SOURCES = ["kvtiers-core", *EXAMPLES, "examples/kvtiers-broken"]
PLUGINS = {"kvtiers_broken.plugin", "kvtiers_scratch.plugin", "kvtiers_sqlite.plugin"}


Proc = subprocess.CompletedProcess[str]


def run(*cmd: str | Path, env: dict[str, str], cwd: Path = REPO) -> Proc:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


def check(proc: Proc) -> str:
    """`proc`'s stdout, after asserting that it succeeded."""
    assert proc.returncode == 0, f"{proc.args}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@dataclass(frozen=True)
class Venv:
    root: Path
    site: Path
    env: dict[str, str]

    def run(self, program: str, *args: str | Path, cwd: Path = REPO) -> Proc:
        """Run a program of the venv (`python`, `kvtiers`, ...), capturing its output."""
        return run(self.root / "bin" / program, *args, env=self.env, cwd=cwd)

    def kvtiers_json(self, *args: str) -> Any:
        return json.loads(check(self.run("kvtiers", *args, "--json")))


def clean_env() -> dict[str, str]:
    """This process's environment minus anything that would change what the venv sees."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    env = {
        k: v for k, v in os.environ.items()
        if k not in drop and not k.startswith(("KVTIERS_", "PYTEST_"))
    }
    env.update(PYTHONNOUSERSITE="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    tmp = tmp_path_factory.mktemp("third-party")
    env = clean_env()

    # Wheels, built from copies: an in-tree build writes build/ and *.egg-info next to
    # sources that other people are editing. No network: --no-index, --no-deps.
    ignore = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".*cache")
    copies = [tmp / "src" / Path(source).name for source in SOURCES]
    for source, copy in zip(SOURCES, copies, strict=True):
        shutil.copytree(REPO / source, copy, ignore=ignore)
    wheels = tmp / "wheels"
    check(run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "--no-index", "-w", wheels, *copies, env=env))

    # A bare venv whose .pth line reaches this environment's packages (pip included).
    root = tmp / "venv"
    check(run(sys.executable, "-m", "venv", "--without-pip", root, env=env))
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    venv = Venv(root, Path(check(run(root / "bin" / "python", "-c", where, env=env)).strip()), env)
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (venv.site / "_kvtiers_outer_env.pth").write_text("".join(f"{p}\n" for p in outer))

    # --ignore-installed: pip sees the outer kvtiers-core too, and must not touch it.
    check(venv.run("python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                   "--ignore-installed", *sorted(wheels.glob("*.whl"))))
    return venv


def test_the_outer_environment_does_not_have_the_plugin() -> None:
    """Otherwise the venv could be finding the plugin through the .pth line."""
    for dist in ("kvtiers-scratch", "kvtiers-sqlite", "kvtiers-broken"):
        module = dist.replace("-", "_")
        with contextlib.suppress(md.PackageNotFoundError):
            md.distribution(dist)
            pytest.fail(f"{dist} is installed in {sys.prefix}: uninstall it, or these tests "
                        "cannot show that the venv found it through its own wheel")
        assert importlib.util.find_spec(module) is None, f"{module} importable from outside"


def outer_plugins() -> set[str]:
    """Entry points of the plugin distributions installed in this (the outer)
    environment's site-packages, which the venv's .pth line makes visible."""
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    return {
        ep.value
        for dist in md.distributions(path=list(outer))
        if dist.metadata["Name"] != "kvtiers-core"
        for ep in dist.entry_points
        if ep.group == "kvtiers"
    }


def test_the_venv_uses_its_own_installed_copies(venv: Venv) -> None:
    probe = (
        "import importlib.metadata as md, json, kvtiers, kvtiers_sqlite\n"
        "print(json.dumps([kvtiers.__file__, kvtiers_sqlite.__file__,\n"
        "    str(md.distribution('kvtiers-core').locate_file('')),\n"
        "    sorted(ep.value for ep in md.entry_points(group='kvtiers'))]))\n"
    )
    proc = venv.run("python", "-c", probe, cwd=venv.root)
    check(proc)
    core_file, plugin_file, core_dist, entry_points = json.loads(proc.stdout)
    for path in (core_file, plugin_file, core_dist):
        assert Path(path).is_relative_to(venv.site), path
    # The outer environment's own plugin distributions (kvtiers-fs, kvtiers-s3, ...:
    # whichever `make setup` installed editable there) are visible through the .pth
    # line; the example plugins only through the wheels, so nothing else may appear.
    assert set(entry_points) >= PLUGINS
    assert set(entry_points) - PLUGINS <= outer_plugins()


def test_kvtiers_plugins_lists_the_plugin_and_the_broken_one(venv: Venv) -> None:
    # The broken plugin makes the exit status 1 (for CI); the listing is complete.
    proc = venv.run("kvtiers", "plugins", "--json")
    assert proc.returncode == 1, proc.stderr
    rows = json.loads(proc.stdout)
    by_name = {(r["kind"], r["name"]): r for r in rows}

    sqlite = by_name["tier", "sqlite"]
    assert sqlite["distribution"] == "kvtiers-sqlite" and sqlite["version"] == "0.1.0"
    assert sqlite["status"] == "ok" and sqlite["error"] is None and sqlite["description"]
    scratch = by_name["tier", "scratch"]
    assert scratch["distribution"] == "kvtiers-scratch" and scratch["status"] == "ok"

    broken = by_name["plugin", "broken"]
    assert broken["distribution"] == "kvtiers-broken" and broken["status"] == "error"
    assert "ModuleNotFoundError" in broken["error"]
    assert "kvtiers_missing_dependency" in broken["error"]

    # The core's built-ins are unaffected by the broken plugin.
    builtins = [r for r in rows if r["distribution"] == "kvtiers-core"]
    assert builtins and all(r["status"] == "ok" for r in builtins)
    assert ("policy", "lru") in by_name and ("command", "plugins") in by_name


def test_the_human_listing_works_too(venv: Venv) -> None:
    proc = venv.run("kvtiers", "plugins")
    assert proc.returncode == 1, proc.stderr  # kvtiers-broken is installed
    assert "sqlite" in proc.stdout and "broken" in proc.stdout


def test_listing_plugins_imports_neither_the_tier_nor_torch(venv: Venv) -> None:
    probe = (
        "import sys\n"
        "from kvtiers.plugins import get_registry\n"
        "assert {'scratch', 'sqlite'} <= set(get_registry().tiers)\n"
        "tiers = ('kvtiers_scratch.tier', 'kvtiers_sqlite.tier', 'torch')\n"
        "print(sorted(m for m in tiers if m in sys.modules))\n"
    )
    proc = venv.run("python", "-c", probe, cwd=venv.root)
    check(proc)
    assert proc.stdout.strip() == "[]"


def _config(tmp: Path, *, verified: bool = False, **section: Any) -> Path:
    doc: dict[str, Any] = {
        "cpu_bytes_to_use": 1 << 30,
        "secondary_tiers": [{"type": "sqlite", "path": str(tmp / "kv.sqlite"), **section}],
    }
    if verified:
        doc["require_verified_tiers"] = True
    path = tmp / "config.json"
    path.write_text(json.dumps(doc))
    return path


def test_kvtiers_validate_accepts_a_config_selecting_the_plugin(
    venv: Venv, tmp_path: Path
) -> None:
    proc = venv.run("kvtiers", "validate", _config(tmp_path, capacity_bytes=1 << 20))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kvtiers-sqlite" in proc.stdout
    # Demanding verifying tiers makes validate import the class from the wheel.
    proc = venv.run("kvtiers", "validate", _config(tmp_path, verified=True, capacity_bytes=4096))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kvtiers_validate_checks_the_plugin_schema(venv: Venv, tmp_path: Path) -> None:
    proc = venv.run("kvtiers", "validate", _config(tmp_path, capacity_bytes="1 MiB"))
    assert proc.returncode != 0
    assert "secondary_tiers[0]" in proc.stderr and "capacity_bytes" in proc.stderr


def test_kvtiers_validate_names_the_broken_plugin(venv: Venv, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 30,
                                "secondary_tiers": [{"type": "broken"}]}))
    proc = venv.run("kvtiers", "validate", path)
    assert proc.returncode != 0
    assert "broken" in proc.stderr


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_passes_its_conformance_tests_in_the_venv(venv: Venv, example: str) -> None:
    proc = venv.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{example}/tests")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed[1]) >= 10, proc.stdout[-2000:]  # the suite, not 0 tests


SCRATCH_CONFIG = REPO / "examples" / "kvtiers-scratch" / "config.json"
# 128 blocks: too few for the tiny workload (the tier evicts), enough to serve hits.
CAPACITY = 128 * BLOCK


def test_kvtiers_validate_accepts_the_guides_config(venv: Venv) -> None:
    proc = venv.run("kvtiers", "validate", SCRATCH_CONFIG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "scratch (kvtiers-scratch 0.1.0)" in proc.stdout


def test_kvtiers_bench_runs_the_guides_tier_below_the_pool(venv: Venv, tmp_path: Path) -> None:
    """docs/plugins.md's last step, on a workload of seconds: the guide's config with
    a pool too small for the workload, so the tier stores, evicts and serves."""
    doc = json.loads(SCRATCH_CONFIG.read_text())
    [section] = doc["secondary_tiers"]
    root = tmp_path / "scratch"
    section.update(root_dir=str(root), capacity_bytes=CAPACITY)
    doc["cpu_bytes_to_use"] = small_pool()
    config, out = tmp_path / "config.json", tmp_path / "out.json"
    config.write_text(json.dumps(doc))
    proc = venv.run("kvtiers", "bench", "--config", config, *TINY, "--json", out)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "scratch (promoted)" in proc.stdout and "all match" in proc.stdout
    run = json.loads(out.read_text())["result"]
    assert run["verified"]["blocks"] > 0 and run["verified"]["mismatches"] == 0
    tier = run["tiers"]["scratch"]
    assert tier["promoted_hits"] > 0 and tier["bytes_read"] > 0 and tier["bytes_written"] > 0
    assert tier["evictions"] > 0 and tier["usage_bytes"] <= CAPACITY  # bounded
    assert tier["errors"] == {} and tier["tier_errors"] == {}
    assert list(root.glob("*.kv")) == []  # closed at the end: its files went with it
