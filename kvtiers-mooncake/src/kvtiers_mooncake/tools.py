"""What `kvtiers inspect` and `kvtiers verify` ask of the `mooncake` tier.

- `inventory(...)`: what one tier's index holds (its quota's blocks).
- `survey_store(settings, name)`: every namespace under the prefix, all engines'
  blocks, from the master's admin listing (`admin.all_keys`: no object is read,
  no lease taken). Needs `admin_address`.
- `verify_keys(...)`: re-read whole objects through Mooncake's local buffer and
  re-check header and checksum. Reasons from `kvtiers.contract.verification`:
  `missing`, `header`, `foreign`, `truncated`, `checksum`, `unreadable`. Repair
  takes a bad block out of the index and removes the object when it is ours and
  damaged (once its lease allows); another program's object or another model's
  block is left alone.

Any thread but the scheduler's; blocking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvtiers.errors import KvtiersError
from kvtiers.sdk import (
    BadBlock,
    BlockRecord,
    BoundedIndex,
    NamespaceInventory,
    TierContext,
    TierInventory,
    checksum,
)

from kvtiers_mooncake import admin, record
from kvtiers_mooncake.client import NOT_FOUND, StoreClient
from kvtiers_mooncake.housekeeping import Housekeeper
from kvtiers_mooncake.names import Names, split
from kvtiers_mooncake.settings import MooncakeSettings

__all__ = ["diagnose", "inventory", "survey_store", "verify_keys"]


def inventory(ctx: TierContext, index: BoundedIndex[None], name: str,
              location: str) -> TierInventory:
    ns = ctx.namespace
    return TierInventory(name, (NamespaceInventory(
        namespace=ns.fingerprint, location=location,
        blocks=tuple(BlockRecord(k, size) for k, _, size in index.items()),
        committed_bytes=index.committed_bytes, reserved_bytes=index.reserved_bytes,
        reserved_blocks=index.reserved_bytes // ctx.block_bytes,
        capacity_bytes=index.capacity_bytes, model=ns.model, revision=ns.revision,
        geometry=tuple(dataclasses.asdict(g) for g in ns.groups)),))


def survey_store(settings: MooncakeSettings, name: str) -> TierInventory:
    if settings.admin_address is None:
        raise KvtiersError(
            f"mooncake tier {name}: set admin_address (the master's --metrics_host:"
            "--metrics_port) to list the store; Mooncake has no listing of its own")
    try:
        names = admin.all_keys(settings.admin_address, settings.timeout_s)
    except OSError as exc:
        raise KvtiersError(f"mooncake tier {name}: the master's admin address "
                           f"{settings.admin_address} does not answer ({exc})") from None
    found: dict[str, list[bytes]] = {}
    for item in names:
        parsed = split(settings.prefix, item)
        if parsed is not None:
            found.setdefault(parsed[0], []).append(parsed[1])
    # Sizes are not listed: each block counts as an object of unknown size (0).
    return TierInventory(name, tuple(
        NamespaceInventory(namespace=fp, location=settings.where(),
                           blocks=tuple(BlockRecord(k, 0) for k in keys), committed_bytes=0)
        for fp, keys in sorted(found.items())))


def diagnose(data: bytes, fingerprint: str, key: bytes,
             block_bytes: int) -> tuple[str, str, bool] | None:
    """(reason, detail, ours) for a bad object, None for a good one."""
    bad = record.judge(data[:record.AREA_BYTES], fingerprint, key, block_bytes, len(data))
    if bad is record.Bad.FOREIGN:
        return "header", "not a kvtiers-mooncake object (another program's)", False
    if bad is record.Bad.NAMESPACE:
        return "foreign", "another model's block", False
    header = record.parse_header(data)
    if header is None:
        return "header", "the header is damaged", True
    if header.key != key:
        return "foreign", f"the object is for key {header.key.hex()}", True
    if bad is not None:
        return "truncated", (f"{len(data) - header.length} block bytes, expected "
                             f"{block_bytes}"), True
    if checksum(memoryview(data)[header.length:]) != header.block_sum:
        return "checksum", "the block's bytes changed", True
    return None


def verify_keys(client: StoreClient, index: BoundedIndex[None], house: Housekeeper,
                names: Names, block_bytes: int, keys: Sequence[bytes], location: str, *,
                repair: bool) -> tuple[list[BadBlock], int, int]:
    """(bad blocks, vanished, bytes removed from the index) for `keys`."""
    bad: list[BadBlock] = []
    vanished = removed = 0
    for key in keys:
        name = names.block(key)
        try:
            size = client.size(name)
            data = client.read(name, size) if size > 0 else b""
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            bad.append(BadBlock(key, "unreadable", f"{type(exc).__name__}: {exc}", location))
            continue
        if size == NOT_FOUND or (size < 0 and key not in index):
            vanished += 1
            if repair and index.size_of(key) is not None:
                index.remove(key)
                removed += block_bytes
            continue
        if size < 0 or len(data) != size:
            bad.append(BadBlock(key, "unreadable", f"code {size}", location))
            continue
        found = diagnose(data, names.fingerprint, key, block_bytes)
        if found is None:
            continue
        reason, detail, ours = found
        gone = False
        if repair:
            held = index.size_of(key) is not None
            if held:
                index.remove(key)
                removed += block_bytes
            if ours:  # damaged: removed once its lease allows (our read took one)
                house.remove([name], block_bytes if held else 0, damaged=True)
            gone = held or ours
        bad.append(BadBlock(key, reason, detail, location, removed=gone))
    return bad, vanished, removed
