"""kvtiers-scratch's tests: the shared conformance suite, and what is particular to
a scratch directory."""

from __future__ import annotations

from pathlib import Path

from kvtiers.sdk import CHECKSUM_BYTES, SecondaryTier, TierContext
from kvtiers.testing import JobTracker, TierConformance, fill_slots, make_context, random_keys
from kvtiers_scratch.tier import ScratchTier


class TestScratchTier(TierConformance):
    # Two threads that take either kind of job: a store runs while a load is held.
    concurrent_jobs = True

    def make_tier(
        self, ctx: TierContext, capacity_bytes: int, eviction_policy: str = "lru"
    ) -> SecondaryTier:
        # Every tier of one test opens the same directory (self.tmp_path is per test).
        config = {
            "root_dir": str(self.tmp_path / "scratch"),
            "capacity_bytes": capacity_bytes,
            "eviction_policy": eviction_policy,
        }
        return ScratchTier(ctx, config)

    def corrupt(self, tier: SecondaryTier, key: bytes) -> None:
        """Flip one byte of the stored block, behind the tier's back."""
        path = self._path(tier, key)
        data = bytearray(path.read_bytes())
        data[CHECKSUM_BYTES + len(data) // 2] ^= 0xFF
        path.write_bytes(data)

    def truncate(self, tier: SecondaryTier, key: bytes) -> None:
        """Keep the checksum and the first half of the block, as a torn write would."""
        path = self._path(tier, key)
        keep = CHECKSUM_BYTES + tier.ctx.block_bytes // 2
        path.write_bytes(path.read_bytes()[:keep])

    def stored_bytes(self, tier: SecondaryTier) -> int:
        """What the block files in the directory hold, less each file's checksum:
        the tier counts block bytes against its capacity."""
        files = (self.tmp_path / "scratch").glob("*.kv")
        return sum(path.stat().st_size - CHECKSUM_BYTES for path in files)

    @staticmethod
    def _path(tier: SecondaryTier, key: bytes) -> Path:
        assert isinstance(tier, ScratchTier)
        path = tier.path_of(key)
        assert path is not None, "the tier does not hold the key"
        return path


def test_block_files_live_as_long_as_the_tier(tmp_path: Path) -> None:
    """Opening deletes the block files a crashed run left (and nothing else);
    closing deletes the tier's own."""
    root = tmp_path / "scratch"
    root.mkdir()
    (root / "left-by-a-crash.kv").write_bytes(b"torn")
    (root / "notes.txt").write_text("not a block file: kept")
    ctx = make_context()
    tier = ScratchTier(ctx, {"root_dir": str(root), "capacity_bytes": 1 << 20})
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]

    fill_slots(ctx.pool, range(3))
    assert JobTracker(tier).run_store(random_keys(3), range(3)).success
    assert len(list(root.glob("*.kv"))) == 3
    tier.close()
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]
