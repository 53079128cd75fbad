"""The built-in eviction policies: `lru`, `arc` and `sieve`."""

from __future__ import annotations

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import PolicyRecord
from kvtiers.plugins.version import CONTRACT_VERSION


@hookimpl
def kvtiers_register_policies() -> list[PolicyRecord]:
    return [
        PolicyRecord(
            "lru",
            "kvtiers.policies.lru:LRUPolicy",
            "least recently used; pinned entries are never walked",
            CONTRACT_VERSION,
        ),
        PolicyRecord(
            "arc",
            "kvtiers.policies.arc:ARCPolicy",
            "adaptive replacement cache: balances recency and frequency, ghost lists"
            " bounded by capacity",
            CONTRACT_VERSION,
        ),
        PolicyRecord(
            "sieve",
            "kvtiers.policies.sieve:SievePolicy",
            "SIEVE: FIFO with visited bits; scan-resistant, a hit only sets a bit, no ghosts",
            CONTRACT_VERSION,
        ),
    ]
