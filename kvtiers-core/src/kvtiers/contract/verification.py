"""What `SecondaryTier.verify_blocks()` reports: every block of a persistent tier
re-read and re-checksummed (`kvtiers verify`).

Reasons a block is bad, in the tier's terms but from this shared vocabulary where
they fit: `missing` (indexed, no file), `truncated` (shorter or longer than its
size), `checksum` (bytes changed), `header` (no valid header), `foreign` (the file
holds another namespace's or another key's block), `not_regular` (a directory, a
link, a device at the block's name), `unreadable` (an I/O error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvtiers.contract.keys import BlockKey

REASONS = ("missing", "truncated", "checksum", "header", "foreign", "not_regular",
           "unreadable")

#: `progress(done, total)`: blocks checked so far, of how many (the caller's thread)
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class BadBlock:
    """One block that failed verification."""

    #: the key, None when it cannot be named (a long key whose file is damaged)
    key: BlockKey | None
    #: one of `REASONS`
    reason: str
    #: what exactly, for people ("file 4096 bytes, expected 12288")
    detail: str
    #: where, in the tier's terms (a path, an object name)
    location: str
    #: whether `repair` removed it (through the tier's accounting)
    removed: bool = False


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """One namespace of one tier, verified."""

    tier: str
    #: `Namespace.fingerprint`
    namespace: str
    #: where, in the tier's terms (a root directory, a bucket prefix)
    location: str
    #: blocks checked (every committed block, as the index listed them at the start)
    checked: int
    bad: tuple[BadBlock, ...] = ()
    #: blocks that went away while being checked (evicted by a live engine): not bad
    vanished: int = 0
    #: bytes of the blocks removed by `repair`
    removed_bytes: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.bad

    def by_reason(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.bad:
            out[b.reason] = out.get(b.reason, 0) + 1
        return out


__all__ = ["REASONS", "BadBlock", "Progress", "VerifyReport"]
