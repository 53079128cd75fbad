"""A plugin written for contract 1 is refused with a message naming both versions,
and `kvtiers plugins` shows it; plugin commands are lazy records the CLI resolves
only to run them.

The plugins are real entry points of fake distributions (conftest.FakePlugins); the
CLI runs in a child process that finds them on its path like installed ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kvtiers import __version__
from kvtiers.contract import CONTRACT_VERSION
from kvtiers.errors import PluginError
from kvtiers.plugins import CommandRecord

from .conftest import FakePlugins, tier_module

REPO = Path(__file__).resolve().parents[2]
OLD = 1
assert OLD < CONTRACT_VERSION


def kvtiers(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="400")  # a table wide enough not to wrap
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    env.pop("KVTIERS_PLUGINS_ALLOW", None)
    env["KVTIERS_PLUGINS_DISABLE"] = "kvtiers-fs"  # only the fakes and the built-ins
    return subprocess.run(
        [sys.executable, "-m", "kvtiers", *args], capture_output=True, text=True,
        timeout=120, cwd=REPO, env=env,
    )  # fmt: skip


def test_a_record_for_contract_1_names_both_versions(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-vintage", {"vintage": tier_module("vintage", contract_version=OLD)})
    reg = fake_plugins.load()
    [failure] = reg.failures
    assert (failure.kind, failure.name) == ("tier", "vintage")
    assert failure.distribution == "kvtiers-vintage"
    assert failure.reason == (
        f"written for contract version {OLD}, but this kvtiers-core ({__version__}) needs "
        f"version {CONTRACT_VERSION}: upgrade kvtiers-vintage to a release written for "
        f"contract version {CONTRACT_VERSION}"
    )
    with pytest.raises(PluginError, match=f"tier 'vintage' from kvtiers-vintage is unusable: "
                       f"written for contract version {OLD}"):  # fmt: skip
        reg.get_tier("vintage")


def test_kvtiers_plugins_reports_the_contract_1_record(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-vintage", {"vintage": tier_module("vintage", contract_version=OLD)})
    fake_plugins.add("kvtiers-today", {"today": tier_module("today")})
    listed = kvtiers(fake_plugins.root, "plugins", "--json")
    assert listed.returncode == 1, listed.stderr  # a broken plugin is installed
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["today"]["status"] == "ok"
    vintage = rows["vintage"]
    assert (vintage["status"], vintage["kind"], vintage["distribution"]) == (
        "error", "tier", "kvtiers-vintage"
    )
    assert f"written for contract version {OLD}" in vintage["error"]
    assert f"needs version {CONTRACT_VERSION}" in vintage["error"]
    human = kvtiers(fake_plugins.root, "plugins")
    assert human.returncode == 1, human.stderr
    [line] = [ln for ln in human.stdout.splitlines() if "vintage" in ln]
    assert "kvtiers-vintage" in line and "error" in line
    assert f"written for contract version {OLD}, but" in line
    assert f"needs version {CONTRACT_VERSION}" in line


COMMAND_PLUGIN = textwrap.dedent(
    f"""
    from kvtiers.plugins import CommandRecord, hookimpl

    @hookimpl
    def kvtiers_register_commands():
        return [
            CommandRecord("hello", "say hello", "kvt_hello_cmd:add_arguments",
                          "kvt_hello_cmd:run", {CONTRACT_VERSION}),
            CommandRecord("broken", "never loads", "kvt_no_such_module:add_arguments",
                          "kvt_no_such_module:run", {CONTRACT_VERSION}),
        ]
    """
)
HELLO_CMD = textwrap.dedent(
    """
    import sys

    print("hello module imported", file=sys.stderr)

    def add_arguments(parser):
        parser.add_argument("--name", default="world")

    def run(args):
        print(f"hello, {args.name}")
        return 3
    """
)


def test_plugin_commands_load_only_when_run(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-hello", {"hello": COMMAND_PLUGIN})
    (fake_plugins.root / "kvt_hello_cmd.py").write_text(HELLO_CMD)
    helped = kvtiers(fake_plugins.root, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "say hello" in helped.stdout and "never loads" in helped.stdout
    assert "hello module imported" not in helped.stderr  # listed, not loaded
    listed = kvtiers(fake_plugins.root, "plugins", "--json")
    assert listed.returncode == 0 and "hello module imported" not in listed.stderr
    ran = kvtiers(fake_plugins.root, "hello", "--name", "kv")
    assert (ran.returncode, ran.stdout) == (3, "hello, kv\n")
    assert "hello module imported" in ran.stderr
    broken = kvtiers(fake_plugins.root, "broken")
    assert broken.returncode == 2
    assert broken.stderr.strip() == (
        "error: cannot import 'kvt_no_such_module': No module named 'kvt_no_such_module'"
    )


def test_a_command_record_still_takes_functions() -> None:
    calls: list[str] = []
    rec = CommandRecord("x", "x", lambda p: calls.append("args"), lambda a: 0, CONTRACT_VERSION)
    rec.load_add_arguments()(None)  # type: ignore[arg-type]
    assert rec.load_run()(None) == 0 and calls == ["args"]  # type: ignore[arg-type]
    bad = CommandRecord("y", "y", "kvtiers.cli:EXIT_USAGE", "nocolon", CONTRACT_VERSION)
    with pytest.raises(PluginError, match="is a int, not a function"):
        bad.load_add_arguments()
    with pytest.raises(PluginError, match="must look like 'package.module:function'"):
        bad.load_run()
