"""The admission-policy interface: the manager asks it, per tier, whether a block
it is about to cascade to that tier goes there.

Contract (every policy):
- built once per tier section as `cls(capacity_blocks=N | None, **options)`:
  `capacity_blocks` is how many blocks the tier holds (its `capacity_bytes` over
  the block size; None when the tier does not say), `options` the section's
  admission options, validated against the record's schema;
- `admit(key)` is called on the scheduler thread, under the manager's lock, each
  time the manager would queue a copy of the block to the tier (write_through: the
  block was stored in the CPU pool; write_back: the pool is evicting it, dirty). It
  returns whether to queue it. It must be O(1) and never block; its memory must be
  bounded whatever the number of keys offered;
- `used(key)` is called on the same thread, under the same lock, at each use of a
  block: a hit in the CPU pool (`lookup` / `lookup_prefix`). A policy that counts
  touches counts it; the default ignores it. Same bounds as `admit`;
- a block refused is simply not copied (counted as `cascades_not_admitted`); under
  write_back the victim then leaves the pool at once, as when no tier takes it.
  Under write_through the refused block stays in the pool: the manager offers it
  again (`admit`, once) at its next pool hit, so a block whose reuse is proven
  while it is resident still reaches the tier.

`all` (`AdmitAll`) is never called: the manager skips the hook for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from kvtiers.contract.keys import BlockKey


class AdmissionPolicy(ABC):
    name: ClassVar[str]

    def __init__(self, capacity_blocks: int | None = None):
        self.capacity_blocks = capacity_blocks

    @abstractmethod
    def admit(self, key: BlockKey) -> bool:
        """Whether the block `key`, offered now, is copied to the tier."""

    def used(self, key: BlockKey) -> None:  # noqa: B027 - optional hook, a no-op by default
        """The block `key` was used (a hit in the CPU pool)."""


class AdmitAll(AdmissionPolicy):
    """Every block is admitted (the manager does not even ask)."""

    name = "all"

    def admit(self, key: BlockKey) -> bool:
        return True
