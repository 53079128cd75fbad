"""An inventory as plain data for `kvtiers inspect`: per namespace its model and
geometry, blocks and bytes, usage committed vs reserved vs capacity, an age
histogram and the oldest and newest blocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtiers.contract.inventory import BlockRecord, NamespaceInventory

#: age histogram buckets: upper bounds in seconds, and their names
AGE_BUCKETS: tuple[tuple[float, str], ...] = (
    (60.0, "1m"), (600.0, "10m"), (3600.0, "1h"), (86400.0, "1d"), (7 * 86400.0, "7d"),
    (30 * 86400.0, "30d"), (float("inf"), "older"))


def age_histogram(blocks: Sequence[BlockRecord], now: float) -> list[dict[str, Any]]:
    """Blocks per age bucket (not cumulative): `{"le": name, "le_s": seconds,
    "blocks": n}`; blocks without a `stored_at` are left out."""
    counts = [0] * len(AGE_BUCKETS)
    for b in blocks:
        if b.stored_at is None:
            continue
        age = max(0.0, now - b.stored_at)
        for i, (bound, _) in enumerate(AGE_BUCKETS):
            if age <= bound:
                counts[i] += 1
                break
    return [{"le": name, "le_s": None if bound == float("inf") else bound, "blocks": n}
            for (bound, name), n in zip(AGE_BUCKETS, counts, strict=True)]


def _block(b: BlockRecord | None, now: float) -> dict[str, Any] | None:
    if b is None or b.stored_at is None:
        return None
    return {"key": b.key.hex(), "stored_at": b.stored_at, "age_s": max(0.0, now - b.stored_at),
            "bytes": b.size}


def namespace_summary(ns: NamespaceInventory, *, ours: bool, now: float) -> dict[str, Any]:
    """The JSON form of one namespace of one place (`kvtiers inspect --json`)."""
    dated = [b for b in ns.blocks if b.stored_at is not None]
    oldest = min(dated, key=lambda b: b.stored_at or 0.0, default=None)
    newest = max(dated, key=lambda b: b.stored_at or 0.0, default=None)
    return {
        "namespace": ns.namespace,
        "location": ns.location,
        "ours": ours,
        "model": ns.model,
        "revision": ns.revision,
        "geometry": [dict(g) for g in ns.geometry],
        "blocks": len(ns.blocks) + ns.unnamed_blocks,
        "unnamed_blocks": ns.unnamed_blocks,
        "committed_bytes": ns.committed_bytes,
        "reserved_bytes": ns.reserved_bytes,
        "reserved_blocks": ns.reserved_blocks,
        "unreadable_objects": ns.unreadable_objects,
        "unreadable_bytes": ns.unreadable_bytes,
        "usage_bytes": ns.usage_bytes,
        "capacity_bytes": ns.capacity_bytes,
        "age_histogram": age_histogram(ns.blocks, now),
        "oldest": _block(oldest, now),
        "newest": _block(newest, now),
        "error": ns.error,
    }


def describe_geometry(geometry: Sequence[Any]) -> str:
    """`2 layers x 2 kv heads x 64, float16, 16 tokens/block` per group."""
    parts = []
    for g in geometry:
        try:
            tp = f", tp {g['tp_size']}" if g.get("tp_size", 1) != 1 else ""
            parts.append(f"{g['layers']} layers x {g['kv_heads']} kv heads x "
                         f"{g['head_size']}, {g['dtype']}, {g['tokens_per_block']} "
                         f"tokens/block{tp}")
        except (KeyError, TypeError, AttributeError):
            parts.append("?")
    return "; ".join(parts) or "unknown geometry"


__all__ = ["AGE_BUCKETS", "age_histogram", "describe_geometry", "namespace_summary"]
