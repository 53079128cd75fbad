"""Namespaces of other models on the same root: listed, never touched."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import random_keys, resolve_lookup
from kvtiers_fs import list_namespaces

from tests.fs.helpers import FILE, context, load_and_check, ns_dir, open_tier, store_keys


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_other_namespaces_are_listed_and_never_touched(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    ctx_b = context(model="model-b")
    other = open_tier(ctx_b, root, capacity_blocks=8)
    b_keys = random_keys(6)
    assert store_keys(other, b_keys).success
    other.close()
    frozen = _tree(ns_dir(root, ctx_b))

    ctx_a = context(model="model-a")
    tier = open_tier(ctx_a, root, capacity_blocks=4)
    try:
        a_keys = b_keys + random_keys(10)  # the same keys too
        for key in b_keys:
            assert resolve_lookup(tier, key) is LookupResult.MISS
        for i in range(0, len(a_keys), 4):  # overfill: evictions in namespace a only
            assert store_keys(tier, a_keys[i : i + 4]).success
        assert tier.stats().evictions > 0
    finally:
        tier.close()
    assert _tree(ns_dir(root, ctx_b)) == frozen, "another namespace was touched"

    listed = {n.fingerprint: n for n in list_namespaces(str(root))}
    assert set(listed) == {ctx_a.namespace.fingerprint, ctx_b.namespace.fingerprint}
    b = listed[ctx_b.namespace.fingerprint]
    assert b.model == "model-b" and b.error is None
    assert (b.blocks, b.bytes) == (6, 6 * FILE)

    reopened = open_tier(context(model="model-b"), root, capacity_blocks=8)
    try:
        assert load_and_check(reopened, b_keys).success
    finally:
        reopened.close()


def test_list_namespaces_reports_damage_without_raising(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / ("0" * 32)).mkdir()
    (root / "not-a-namespace").mkdir()
    (root / ("1" * 32)).symlink_to(tmp_path, target_is_directory=True)
    listed = list_namespaces(str(root))
    assert [n.fingerprint for n in listed] == ["0" * 32, "1" * 32]
    assert all(n.error for n in listed)


def test_kvtiers_validate_lists_the_namespaces_on_a_root(tmp_path: Path) -> None:
    from tests.config.test_cli import kvtiers

    root = tmp_path / "root"
    root.mkdir()
    ctx_b = context(model="model-b")
    other = open_tier(ctx_b, root, capacity_blocks=8)
    assert store_keys(other, random_keys(3)).success
    other.close()
    config = ('{"cpu_bytes_to_use": 1048576, "secondary_tiers": [{"type": "fs", '
              f'"root_dir": "{root}", "capacity_bytes": 1048576}}]}}')
    done = kvtiers("validate", config)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1, done.stderr
    assert "$.secondary_tiers[0].root_dir" in notes[0] and "model-b" in notes[0]
    assert ctx_b.namespace.fingerprint in notes[0] and "3 blocks" in notes[0]
    # --json output stays one JSON document (notes go to stderr)
    assert kvtiers("validate", "--json", config).stdout.lstrip().startswith("{")
