"""kvtiers-core without torch (issue 10, item 11), in child interpreters that cannot
import it (blocker.py, installed as their `sitecustomize`): the scheduler side, the
CLI, the config, the plugin system and every tier (kvtiers-fs's too) run; the worker
side and the bench fail where they are used, with an error naming the extra."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from kvtiers.extras import BENCH_EXTRA, TORCH_EXTRA

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Modules that need torch, each imported only once a feature that needs it is used:
# the swapper's backends (imported by DeviceSwapper after its own check) and the bench.
NEED_TORCH = {
    "kvtiers.swap.cpu_backend",
    "kvtiers.swap.cuda_backend",
    "kvtiers.swap.triton_copy",
}
BENCH_MODULES = {
    "kvtiers.bench.content",
    "kvtiers.bench.engine",
    "kvtiers.bench.hf.decoder",
    "kvtiers.bench.hf.limits",
    "kvtiers.bench.hf.multiturn",
    "kvtiers.bench.hf.offload",
    "kvtiers.bench.hf.paged",
    "kvtiers.bench.hf.ttft",
    "kvtiers.bench.model",
    "kvtiers.bench.model_check",
    "kvtiers.bench.runner",
    "kvtiers.bench.stack",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """This environment, with the blocker first on the path as `sitecustomize`."""
    site = tmp_path_factory.mktemp("no-torch-site")
    shutil.copy(HERE / "blocker.py", site / "sitecustomize.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVTIERS_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


Proc = subprocess.CompletedProcess[str]


def python(env: dict[str, str], *args: str | Path, cwd: Path = REPO) -> Proc:
    return subprocess.run(
        [sys.executable, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip


def result(proc: Proc) -> object:
    """The JSON a child printed, after asserting that it succeeded."""
    assert proc.returncode == 0, f"{proc.args}:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def assert_names_the_extra(message: str, extra: str) -> None:
    assert f"kvtiers-core[{extra}]" in message, message
    # ... and the install order that avoids the multi-GB CUDA build
    assert "install torch first" in message and "pip install torch==<version>" in message


def test_the_child_really_cannot_import_torch(env: dict[str, str]) -> None:
    """Otherwise every other test here would pass for the wrong reason."""
    proc = python(env, "-c", "import torch")
    assert proc.returncode != 0 and "No module named 'torch' (blocked)" in proc.stderr
    proc = python(env, "-c", "import triton")
    assert proc.returncode != 0 and "(blocked)" in proc.stderr


def test_every_module_but_the_worker_side_and_the_bench_imports(env: dict[str, str]) -> None:
    code = (
        "import importlib, json, pkgutil, sys, kvtiers, kvtiers_fs\n"
        "failed = {}\n"
        "for package in (kvtiers, kvtiers_fs):\n"
        "    for m in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        if m.name.endswith('.__main__'):\n"
        "            continue\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except Exception as e:\n"
        "            failed[m.name] = [type(e).__name__, str(e)]\n"
        "seen = sorted(sys.modules)\n"
        "print(json.dumps({'failed': failed, 'modules': seen}))\n"
    )
    out = result(python(env, "-c", code))
    assert isinstance(out, dict)
    failed: dict[str, list[str]] = out["failed"]
    assert set(failed) == NEED_TORCH | BENCH_MODULES, failed
    for name in BENCH_MODULES:
        kind, message = failed[name]
        assert kind == "MissingExtraError", (name, kind, message)
        assert message.startswith("kvtiers bench needs torch")
        assert_names_the_extra(message, BENCH_EXTRA)
    for name in NEED_TORCH:
        assert failed[name][0] in ("MissingExtraError", "ModuleNotFoundError"), failed[name]
    # The walk really went everywhere the scheduler side lives.
    for name in ("kvtiers.manager", "kvtiers.tiers", "kvtiers.testing", "kvtiers.config",
                 "kvtiers.plugins", "kvtiers.cli", "kvtiers.swap.swapper", "kvtiers_fs.plugin"):
        assert name in out["modules"], name  # fmt: skip


def test_a_manager_with_memory_and_fs_tiers_moves_bytes(
    env: dict[str, str], tmp_path: Path
) -> None:
    out = result(python(env, HERE / "child.py", tmp_path))
    assert out == {"loaded": 20, "wrong": [], "pinned": False, "imported": []}
    assert list(tmp_path.iterdir()), "the fs tier wrote nothing under its root"


def test_kvtiers_plugins_lists_every_tier(env: dict[str, str]) -> None:
    rows = result(python(env, "-m", "kvtiers", "plugins", "--json"))
    assert isinstance(rows, list)
    by_name = {(r["kind"], r["name"]): r for r in rows}
    for kind, name, dist in (("tier", "memory", "kvtiers-core"), ("tier", "faulty", "kvtiers-core"),
                             ("tier", "fs", "kvtiers-fs"), ("policy", "lru", "kvtiers-core"),
                             ("command", "bench", "kvtiers-core")):  # fmt: skip
        row = by_name[kind, name]
        assert (row["distribution"], row["status"]) == (dist, "ok"), row
    ours = [r for r in rows if r["distribution"] in ("kvtiers-core", "kvtiers-fs")]
    assert all(r["status"] == "ok" for r in ours), ours


def test_kvtiers_validate_checks_a_config_with_memory_and_fs(
    env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "cpu_bytes_to_use": 1 << 26,
        "secondary_tiers": [
            {"type": "memory", "capacity_bytes": 1 << 26},
            {"type": "fs", "root_dir": str(tmp_path), "capacity_bytes": 1 << 30},
        ],
    }))  # fmt: skip
    proc = python(env, "-m", "kvtiers", "validate", config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0. memory (kvtiers-core" in proc.stdout and "1. fs (kvtiers-fs" in proc.stdout
    # A refused config is still refused with its JSON path, not an import error.
    config.write_text(json.dumps({"cpu_bytes_to_use": 1 << 26,
                                  "secondary_tiers": [{"type": "fs", "root_dir": "relative"}]}))
    proc = python(env, "-m", "kvtiers", "validate", config)
    assert proc.returncode == 2 and "$.secondary_tiers[0]" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [(), ("--model-check",)], ids=["replay", "model-check"])
def test_kvtiers_bench_names_the_extra(env: dict[str, str], args: tuple[str, ...]) -> None:
    proc = python(env, "-m", "kvtiers", "bench", "--no-progress", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: kvtiers bench needs torch"), proc.stderr
    assert_names_the_extra(proc.stderr, BENCH_EXTRA)


def test_the_worker_side_fails_where_it_is_used(env: dict[str, str]) -> None:
    code = (
        "import json\n"
        "from kvtiers.errors import MissingExtraError\n"
        "from kvtiers.pool import CpuPool, PinError\n"
        "from kvtiers.swap import DeviceSwapper, KVLayout\n"  # importing is fine
        "out = {}\n"
        "pool = CpuPool(4096, 1 << 20)\n"
        "out['auto_pinned'] = pool.pinned\n"
        "for name, use in [('swapper', lambda: DeviceSwapper(None, pool)),\n"
        "                  ('layout', lambda: KVLayout([], 'KPTHD')),\n"
        "                  ('tensor', pool.tensor),\n"
        "                  ('pin', lambda: CpuPool(4096, 1 << 20, pin=True))]:\n"
        "    try:\n"
        "        use()\n"
        "        out[name] = None\n"
        "    except Exception as e:\n"
        "        out[name] = [type(e).__name__, isinstance(e, ImportError),\n"
        "                     getattr(e, 'extra', None), str(e)]\n"
        "pool.close()\n"
        "print(json.dumps(out))\n"
    )
    out = result(python(env, "-c", code))
    assert isinstance(out, dict)
    assert out.pop("auto_pinned") is False
    for name, what in (("swapper", "DeviceSwapper"), ("layout", "KVLayout"),
                       ("tensor", "CpuPool.tensor()")):  # fmt: skip
        kind, is_import_error, extra, message = out[name]
        assert (kind, is_import_error, extra) == ("MissingExtraError", True, TORCH_EXTRA)
        assert message.startswith(f"{what} needs torch"), message
        assert_names_the_extra(message, TORCH_EXTRA)
    kind, _, _, message = out["pin"]
    assert kind == "PinError" and message.startswith("pin=True needs CUDA"), message
    assert_names_the_extra(message, TORCH_EXTRA)


def test_a_tier_plugins_ci_runs_the_conformance_suite_without_torch(env: dict[str, str]) -> None:
    proc = python(env, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  "tests/fs/test_conformance.py", "tests/tiers/test_memory.py")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_the_metadata_declares_torch_as_an_extra_only() -> None:
    core = tomllib.loads((REPO / "kvtiers-core" / "pyproject.toml").read_text())["project"]
    fs = tomllib.loads((REPO / "kvtiers-fs" / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip()
                for r in requirements}  # fmt: skip

    assert "torch" not in names(core["dependencies"])
    assert "torch" not in names(fs["dependencies"])
    extras = core["optional-dependencies"]
    # The extras the errors name exist, and bring torch unpinned (users bring their build).
    for extra in (TORCH_EXTRA, BENCH_EXTRA):
        assert "torch>=2.4" in extras[extra], extras
