"""The master's HTTP admin listener (`--metrics_host`/`--metrics_port`): the one
place that lists the store's keys without touching them.

`all_keys(address)` reads `GET /get_all_keys` (one name per line; it grants no
lease, unlike `batch_is_exist`, `get_size` or a get) and `allocated(address)`
the master's own count of allocated bytes and keys (`GET /metrics`). Blocking,
bounded by `timeout_s`; any thread.
"""

from __future__ import annotations

import urllib.request

__all__ = ["MasterView", "all_keys", "master_view"]


def _get(address: str, path: str, timeout_s: float) -> str:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout_s) as reply:
        return str(reply.read().decode("utf-8", "replace"))


def all_keys(address: str, timeout_s: float = 5.0) -> list[str]:
    """Every object name the master holds (all tenants)."""
    return [line.strip() for line in _get(address, "/get_all_keys", timeout_s).splitlines()
            if line.strip()]


class MasterView:
    """What the master reports of itself: allocated bytes, keys, capacity."""

    def __init__(self, allocated_bytes: int, key_count: int, capacity_bytes: int):
        self.allocated_bytes = allocated_bytes
        self.key_count = key_count
        self.capacity_bytes = capacity_bytes


def master_view(address: str, timeout_s: float = 5.0) -> MasterView:
    values: dict[str, int] = {}
    for line in _get(address, "/metrics", timeout_s).splitlines():
        name, _, value = line.partition(" ")
        if name in ("master_allocated_bytes", "master_key_count",
                    "master_total_capacity_bytes"):
            values[name] = int(float(value))
    return MasterView(values.get("master_allocated_bytes", 0),
                      values.get("master_key_count", 0),
                      values.get("master_total_capacity_bytes", 0))
