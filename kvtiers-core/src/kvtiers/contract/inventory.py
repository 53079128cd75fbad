"""What a tier holds: typed records for `SecondaryTier.inventory()`.

For tests, and for tools that inspect or verify a persistent tier (`kvtiers
inspect`, `kvtiers verify`): which blocks a tier holds (key, size, when stored), and
per namespace and place (a root directory, a bucket prefix) how much is committed,
how much is reserved by stores in flight, and the capacity bound.

`SecondaryTier.survey(config)` (a class method) lists every namespace of the store
a config names - ours and other models' - without opening the tier, with each
namespace's model and geometry where the tier records them.

An inventory is a snapshot taken at one moment; the tier may change right after.
Building one may block on I/O and takes time proportional to the blocks held:
call it from a tool or a test, never from the scheduler thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtiers.contract.keys import BlockKey


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """One block a tier holds."""

    key: BlockKey
    #: bytes the block takes in the tier (what counts against its capacity)
    size: int
    #: when its bytes were stored (POSIX seconds), None if the tier does not know
    stored_at: float | None = None


@dataclass(frozen=True, slots=True)
class NamespaceInventory:
    """One namespace's blocks in one place of a tier."""

    #: `Namespace.fingerprint`
    namespace: str
    #: where, in the tier's own terms (a root directory, a bucket prefix, a peer)
    location: str
    #: committed blocks, in no particular order unless `eviction_order`
    blocks: tuple[BlockRecord, ...]
    #: bytes of the committed blocks
    committed_bytes: int
    #: bytes reserved for stores in flight (any process's), not committed yet
    reserved_bytes: int = 0
    #: blocks reserved for stores in flight
    reserved_blocks: int = 0
    #: the capacity bound of this place, None if unbounded
    capacity_bytes: int | None = None
    #: committed blocks whose key could not be recovered (not in `blocks`)
    unnamed_blocks: int = 0
    #: objects (files) in this place that hold no block the tier can read - damaged
    #: ones, another program's or another format's - and their bytes: they take
    #: room, so `usage_bytes` counts them (not in `committed_bytes`)
    unreadable_objects: int = 0
    unreadable_bytes: int = 0
    #: whose namespace it is, as the tier recorded it (None: not known)
    model: str | None = None
    revision: str | None = None
    #: the geometry of each KV group (`BlockGeometry` fields), as recorded
    geometry: tuple[Mapping[str, Any], ...] = ()
    #: why this namespace could not be read fully (its numbers may be partial)
    error: str | None = None
    #: True: `blocks` are in the tier's eviction order here, its next victim first
    #: and its hottest (most recently used, for LRU) last - `kvtiers snapshot save`
    #: keeps the hottest by it; False: no order (newest by `stored_at` stands in)
    eviction_order: bool = False

    @property
    def usage_bytes(self) -> int:
        return self.committed_bytes + self.reserved_bytes + self.unreadable_bytes

    def keys(self) -> set[BlockKey]:
        return {b.key for b in self.blocks}


@dataclass(frozen=True, slots=True)
class TierInventory:
    """Everything one tier holds, per namespace and place."""

    #: the tier's name in the stack ("fs", "fs#2")
    tier: str
    namespaces: tuple[NamespaceInventory, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[BlockRecord]:
        for ns in self.namespaces:
            yield from ns.blocks

    def keys(self) -> set[BlockKey]:
        return {b.key for ns in self.namespaces for b in ns.blocks}

    @property
    def blocks(self) -> int:
        return sum(len(ns.blocks) + ns.unnamed_blocks for ns in self.namespaces)

    @property
    def committed_bytes(self) -> int:
        return sum(ns.committed_bytes for ns in self.namespaces)

    @property
    def reserved_bytes(self) -> int:
        return sum(ns.reserved_bytes for ns in self.namespaces)

    @property
    def reserved_blocks(self) -> int:
        return sum(ns.reserved_blocks for ns in self.namespaces)


__all__ = ["BlockRecord", "NamespaceInventory", "TierInventory"]
