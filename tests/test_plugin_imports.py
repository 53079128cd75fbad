"""The plugin machinery sits below what it registers.

`kvtiers.plugins` loads the core's built-ins (`kvtiers.default_plugins`) by module
name, and records name code lazily, so loading the registry imports no command,
bench, manager, tier class or torch, and the CLI imports only the command it runs.
(That no import cycle passes through it, or anywhere: tests/test_architecture.py.)
"""

from __future__ import annotations

import subprocess
import sys
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
