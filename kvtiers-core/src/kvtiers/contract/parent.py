"""What a tier that serves remote peers may call on the manager, and nothing more."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult


class ParentManager(ABC):
    """The manager as seen by a peer-serving tier. Thread-safe: peers are served
    from the tier's own threads."""

    @abstractmethod
    def lookup(self, key: BlockKey) -> LookupResult:
        """Where the block is, as the engine would be told."""

    @abstractmethod
    def create_store_job(self, keys: Sequence[BlockKey]) -> TransferJob | None:
        """Pin the CPU-pool slots of `keys` (all must be HIT) so their bytes can be
        shipped to a peer; None when any of them is not readable now."""

    @abstractmethod
    def complete_store_job(self, job_id: int) -> None:
        """The bytes of the job were shipped (or the attempt ended): unpin its slots."""

    def watch_removals(self, listener: Callable[[Sequence[BlockKey]], None]) -> bool:
        """Have `listener(keys)` called with the keys that leave the pool (evicted,
        dropped, reset) as they leave - before their slots can hold other bytes -
        from the thread that removes them (the manager's caller, under its lock):
        it must be O(1) per key, never block and never call the manager. What a
        server caches per key (a block's checksum) stays right this way. Returns
        False when this parent cannot report removals (the default): then nothing
        may be cached per key."""
        return False

    # Optional hooks, not abstract: a manager that keeps no per-request state needs neither.
    def on_request_start(  # noqa: B027 - an optional hook; the default does nothing
        self, request_id: str, params: Mapping[str, Any] | None = None
    ) -> None:
        """A peer's request started using this manager's blocks; `params` are its
        transfer parameters. Default: nothing."""

    def on_request_finished(self, request_id: str) -> None:  # noqa: B027 - as above
        """A peer's request finished. Default: nothing."""
