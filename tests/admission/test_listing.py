"""Admission policies are listed like the other registry kinds: `kvtiers plugins`
shows them, `kvtiers plugins --options NAME` their options, `kvtiers validate`
each tier's policy (and `--show` its options, defaults marked). Run as a user
runs them: subprocesses, stdout checked."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.clirun import run_kvtiers

REPO = Path(__file__).resolve().parents[2]


def kvtiers(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m kvtiers ARGS` in a process of its own (tests/clirun.py)."""
    return run_kvtiers(args, cwd=REPO, env={**os.environ, "COLUMNS": "200"}, timeout=120)


def _config(tmp_path: Path) -> str:
    doc = {"cpu_bytes_to_use": 1 << 24, "secondary_tiers": [
        {"type": "memory", "capacity_bytes": 1 << 24,
         "admission": {"policy": "second_touch", "bits_per_key": 12}},
        {"type": "memory", "capacity_bytes": 1 << 24},
        {"type": "memory", "capacity_bytes": 1 << 24, "admission": "second_touch"},
    ]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_plugins_lists_admission_policies_and_their_options() -> None:
    listing = json.loads(kvtiers("plugins", "--json").stdout)
    found = {r["name"]: r for r in listing if r["kind"] == "admission"}
    assert set(found) >= {"all", "second_touch"}
    assert all(r["status"] == "ok" for r in found.values())

    done = kvtiers("plugins", "--options", "second_touch")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("admission policy 'second_touch' from kvtiers-core ")
    assert "window_blocks: integer from 1 to 16777216 or null; default null" in lines
    assert "bits_per_key: integer from 4 to 32; default 10" in lines
    schema = json.loads(kvtiers("plugins", "--options", "second_touch", "--json").stdout)
    assert set(schema["properties"]) == {"window_blocks", "bits_per_key"}

    plain = kvtiers("plugins", "--options", "all")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[1:] == ["no options"]

    typo = kvtiers("plugins", "--options", "secnd_touch")
    assert typo.returncode == 2
    assert "(did you mean 'second_touch'?)" in typo.stderr
    assert "installed tiers, policies and admission policies: " in typo.stderr


def test_validate_shows_each_tiers_admission(tmp_path: Path) -> None:
    config = _config(tmp_path)
    show = kvtiers("validate", "--show", "--skip-machine-checks", config)
    assert show.returncode == 0, show.stderr
    lines = show.stdout.splitlines()
    tiers = [i for i, line in enumerate(lines) if line.startswith("  [")]
    assert len(tiers) == 3
    first = lines[tiers[0]:tiers[1]]
    assert any(line.startswith('    admission             "second_touch" (kvtiers-core ')
               for line in first), first
    assert "    admission.window_blocks null  (default)" in first
    assert "    admission.bits_per_key 12" in first
    second = lines[tiers[1]:tiers[2]]
    assert '    admission             "all"  (default)' in second
    third = lines[tiers[2]:]
    assert "    admission.bits_per_key 10  (default)" in third

    summary = kvtiers("validate", "--skip-machine-checks", config)
    assert summary.returncode == 0, summary.stderr
    out = summary.stdout.splitlines()
    assert out.count("       admission: second_touch bits_per_key=12") == 1
    assert out.count("       admission: second_touch") == 1  # defaults are not repeated
    assert sum("admission" in line for line in out) == 2  # `all` is not mentioned
