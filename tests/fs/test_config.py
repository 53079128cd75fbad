"""The fs tier's `shared` option."""

from __future__ import annotations

from pathlib import Path

from kvtiers.config.model import TierSection
from kvtiers.contract import create_tier
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import make_context, random_keys


def test_a_private_root_answers_miss_at_once_and_a_shared_one_probes(tmp_path: Path) -> None:
    """`shared: false`: the index is the whole truth, no scheduler step is spent on a
    probe; the default probes (RETRY) so other writers' blocks become visible."""
    root = tmp_path / "root"
    root.mkdir()
    ctx = make_context()
    options = {"root_dir": str(root), "capacity_bytes": 1 << 24, "eviction_policy": "lru",
               "threads": {"load": 1, "store": 1}, "o_direct": "auto", "durable": False}
    private = create_tier(TierSection("fs", {**options, "shared": False}), ctx)
    shared = create_tier(TierSection("fs", {**options, "shared": True}), ctx)
    try:
        (key,) = random_keys(1)
        assert private.shared is False and shared.shared is True
        assert private.lookup(key) is LookupResult.MISS
        assert shared.lookup(key) is LookupResult.RETRY
    finally:
        private.close()
        shared.close()
