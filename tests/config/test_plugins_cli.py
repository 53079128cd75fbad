"""`kvtiers plugins` for CI and for users of third-party tiers: the exit status and
`--check` report broken plugins (one that does not import, a schema that is not
JSON Schema or uses an unknown mark); `--options NAME` lists any tier's options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import REPO

PLUGIN = textwrap.dedent(
    """
    from kvtiers.plugins import TierRecord, hookimpl
    from kvtiers.contract import CONTRACT_VERSION

    GOOD = {"type": "object", "properties": {
        "size_bytes": {"type": "integer", "minimum": 1, "default": 4096,
                       "description": "how big. Really."},
        "mode": {"enum": ["a", "b"], "description": "which mode"}},
        "required": ["mode"]}

    @hookimpl
    def kvtiers_register_tiers():
        return [
            TierRecord("goodtier", "nowhere:Good", GOOD, "a fine tier", CONTRACT_VERSION),
            TierRecord("badschema", "nowhere:Bad", {"type": 12}, "broken", CONTRACT_VERSION),
            TierRecord("badmark", "nowhere:Mark",
                       {"type": "object", "properties": {"x": {"x-kvtiers": "tire"}}},
                       "typo in a mark", CONTRACT_VERSION),
        ]
    """
)


def _plugins(root: Path) -> Path:
    site = root / "site"
    site.mkdir()
    (site / "kvt_cli_fake.py").write_text(PLUGIN)
    (site / "kvt_cli_broken.py").write_text("raise ImportError('no such thing here')\n")
    for dist, ep, module in (("kvtiers-fake", "fake", "kvt_cli_fake"),
                             ("kvtiers-broken-one", "broken", "kvt_cli_broken")):
        info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[kvtiers]\n{ep} = {module}\n")
    return site


def kvtiers(site: Path | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.environ.get("PYTHONPATH", "")
    if site is not None:
        path = f"{site}{os.pathsep}{path}" if path else str(site)
    return subprocess.run(
        [sys.executable, "-m", "kvtiers", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200", **env},
    )


def test_broken_plugins_make_the_exit_status_nonzero(tmp_path: Path) -> None:
    site = _plugins(tmp_path)
    done = kvtiers(site, "plugins", "--check")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        "error: tier 'badmark' (kvtiers-fake 1.0): its config schema is unusable (a bug in the "
        "plugin): $.properties.x: \"x-kvtiers\" is 'tire'; kvtiers knows \"tier\", \"policy\", "
        "\"ram_bytes\", \"own_directory\"",
        "error: tier 'badschema' (kvtiers-fake 1.0): its config schema is unusable (a bug in "
        "the plugin): not valid JSON Schema: 12 is not valid under any of the given schemas "
        "(at ['type'])",
        "error: plugin 'broken' (kvtiers-broken-one 1.0): ImportError: no such thing here",
    ]
    listing = kvtiers(site, "plugins", "--json")
    assert listing.returncode == 1
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    assert rows["goodtier"]["status"] == "ok" and rows["badschema"]["status"] == "error"
    assert kvtiers(site, "plugins").returncode == 1
    # Only what works: exit 0, and --check prints nothing.
    fine = kvtiers(site, "plugins", "--check", KVTIERS_PLUGINS_DISABLE="kvtiers-fake,broken")
    assert (fine.returncode, fine.stdout) == (0, "")


def test_options_of_an_installed_tier(tmp_path: Path) -> None:
    site = _plugins(tmp_path)
    done = kvtiers(site, "plugins", "--options", "goodtier")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "tier 'goodtier' from kvtiers-fake 1.0: a fine tier\n"
        "\n"
        "size_bytes: integer >= 1; default 4096\n"
        "    how big. Really.\n"
        "\n"
        'mode: one of "a", "b"; required\n'
        "    which mode\n"
    )
    schema = json.loads(kvtiers(site, "plugins", "--options", "goodtier", "--json").stdout)
    assert schema["required"] == ["mode"]
    missing = kvtiers(None, "plugins", "--options", "memroy")
    assert missing.returncode == 2
    assert missing.stderr.startswith(
        "error: unknown tier 'memroy' (did you mean 'memory'?); installed tiers, policies and "
        "admission policies: "
    )


def test_the_listing_fits_a_narrow_terminal_with_every_name_whole(tmp_path: Path) -> None:
    site = _plugins(tmp_path)
    rows = json.loads(kvtiers(site, "plugins", "--json").stdout)
    for columns in (80, 60):
        done = kvtiers(site, "plugins", COLUMNS=str(columns))
        lines = done.stdout.splitlines()
        assert max(len(line) for line in lines) <= columns, done.stdout
        starts = [line.split()[0] for line in lines[1:] if line and not line.startswith(" ")]
        assert starts == [r["name"] for r in rows]  # a line per entry, its name whole
        # each entry's line, then its description (or error) under it
        assert len(lines) <= 1 + sum(1 + -(-len(r["description"] or r["error"] or "x")
                                         // (columns - 25)) for r in rows)
        broken = next(i for i, line in enumerate(lines) if line.startswith("broken "))
        assert lines[broken].split()[-1] == "error"
        assert "ImportError: no such thing here" in " ".join(lines[broken + 1:broken + 3])
