"""The shared conformance suite, with every capability hook: the fs tier is
persistent (restart), verifying (corrupt) and shared (sibling); `stored_bytes`
walks the namespace's block files."""

from __future__ import annotations

import os

from kvtiers import SecondaryTier, TierContext
from kvtiers.testing import TierConformance
from kvtiers_fs.tier import FsTier


class TestFsTierConformance(TierConformance):
    block_bytes = 16384

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        root = self.tmp_path / "root"
        root.mkdir(exist_ok=True)
        return FsTier(ctx, {"root_dir": str(root), "capacity_bytes": capacity_bytes,
                            "threads": {"load": 2, "store": 2}})

    def restart(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        tier.close()
        return FsTier(ctx, tier.config)

    def corrupt(self, tier: SecondaryTier, key: bytes) -> None:
        """Flip one byte of the block bytes in the file, behind the tier's back."""
        assert isinstance(tier, FsTier)
        fd = os.open(tier.block_path(key), os.O_RDWR)
        try:
            at = 4096 + self.block_bytes // 2
            (byte,) = os.pread(fd, 1, at)
            os.pwrite(fd, bytes([byte ^ 0xFF]), at)
        finally:
            os.close(fd)

    def stored_bytes(self, tier: SecondaryTier) -> int:
        """Every file under the namespace's `blocks/` (block files, and temporaries
        a store left behind), by a walk of the root: what the tier counts against
        its capacity is the size of its block files."""
        blocks = self.tmp_path / "root" / tier.ctx.namespace.fingerprint / "blocks"
        return sum(path.lstat().st_size for path in blocks.rglob("*") if path.is_file())

    def sibling(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        """A second instance on the same root: its own writer id, journal reader,
        lock descriptors - what another process has."""
        return FsTier(ctx, tier.config)
