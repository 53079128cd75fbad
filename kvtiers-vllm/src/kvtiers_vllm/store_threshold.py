"""vLLM's `store_threshold` for `KvtiersOffloadingSpec`: a block is stored into the
CPU pool only once it has been offered `store_threshold` times, as vLLM's own
`CPUOffloadingManager` does (`kv_connector_extra_config`: `"store_threshold": N`,
N >= 2 turns it on; `"max_tracker_size"`, default 64000, bounds how many blocks'
offer counts are kept, the least recently offered forgotten first).

The counts are kept per key in an LRU-ordered dict, as vLLM keeps them: offering a
block again moves it to the end; a new key makes room by forgetting the oldest
one not offered in this same call (vLLM's rule: a call never forgets its own keys).
A block already resident in the pool is never filtered (its offer is a reuse).

Scheduler thread only (under vLLM's manager lock); O(1) per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

THRESHOLD_KEY = "store_threshold"
TRACKER_KEY = "max_tracker_size"
DEFAULT_TRACKER_SIZE = 64_000


class StoreThreshold:
    """Offer counts and the filter. `skipped` counts the store candidates held back
    so far (vLLM's `stores_skipped` counter)."""

    def __init__(self, threshold: int, max_tracker_size: int = DEFAULT_TRACKER_SIZE):
        if threshold < 2:
            raise ValueError(f"{THRESHOLD_KEY} {threshold} filters nothing (use 2 or more)")
        if max_tracker_size < 1:
            raise ValueError(f"{TRACKER_KEY} must be at least 1, got {max_tracker_size}")
        self.threshold = threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[bytes, int] = OrderedDict()
        self.skipped = 0

    def offer(self, keys: Sequence[bytes], resident: Callable[[bytes], Any]) -> list[bytes]:
        """Count one offer of each key; the keys to hand to the pool: those resident
        (`resident(key)` not None: the pool skips them itself) and those offered
        `threshold` times, in the order given."""
        counts = self.counts
        protected = 0
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                protected += 1
        unprotected = len(counts) - protected
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1
        out = []
        threshold = self.threshold
        for key in keys:
            if resident(key) is not None or counts.get(key, 0) >= threshold:
                out.append(key)
            else:
                self.skipped += 1
        return out

    def clear(self) -> None:
        self.counts.clear()


def from_extra_config(extra: dict[str, Any], owner: str) -> StoreThreshold | None:
    """The filter the extra config asks for, None when off (absent, 0 or 1);
    `ValueError` naming the key for a value that is not a non-negative integer."""
    threshold = _count(extra, THRESHOLD_KEY, 0, owner)
    if threshold < 2:
        return None
    return StoreThreshold(threshold, _count(extra, TRACKER_KEY, DEFAULT_TRACKER_SIZE, owner))


def _count(extra: dict[str, Any], key: str, default: int, owner: str) -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}: {key} must be a non-negative integer, got {value!r}")
    return value
