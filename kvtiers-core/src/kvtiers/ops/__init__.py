"""Operating persistent tiers and pools: what `kvtiers inspect`, `verify`,
`snapshot` and `serve` build on, for applications that do the same.

- `targets`: the persistent tiers of a config, and a tier opened for one of the
  namespaces its store holds;
- `summary`: an inventory as plain data (usage, ages, oldest and newest blocks);
- `snapshot_store`, `snapshot`: a tier's blocks to and from a zarr v3 store on any
  fsspec URL (`SnapshotReader`, `save_tier`, `load_tier`; needs zarr:
  `kvtiers-core[snapshot]`, checked by `require_zarr`);
- `pool_snapshot`: the same for a running CPU pool (`save_pool`, `load_pool`);
- `snapshot_target`: where a snapshot may be saved (`check_snapshot_target`: absent,
  empty, or a kvtiers snapshot to replace by request; never a user's other files)
  and how a new one replaces an old one only once complete;
- `storage_options`: fsspec storage options from `KEY=VALUE` strings.

Names are imported on first use: a command pays only for what it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtiers.lazy import lazy_names

if TYPE_CHECKING:
    from kvtiers.ops.pool_snapshot import load_pool, save_pool
    from kvtiers.ops.snapshot import SnapshotResult, load_tier, save_tier
    from kvtiers.ops.snapshot_store import (
        SnapshotError,
        SnapshotReader,
        SnapshotWriter,
        require_zarr,
    )
    from kvtiers.ops.snapshot_target import (
        SnapshotTargetError,
        check_snapshot_target,
        same_place,
    )
    from kvtiers.ops.storage_options import parse_storage_options

__all__ = [
    "SnapshotError",
    "SnapshotReader",
    "SnapshotResult",
    "SnapshotTargetError",
    "SnapshotWriter",
    "check_snapshot_target",
    "load_pool",
    "load_tier",
    "parse_storage_options",
    "require_zarr",
    "same_place",
    "save_pool",
    "save_tier",
]

# name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "load_pool": "kvtiers.ops.pool_snapshot",
    "save_pool": "kvtiers.ops.pool_snapshot",
    "SnapshotResult": "kvtiers.ops.snapshot",
    "load_tier": "kvtiers.ops.snapshot",
    "save_tier": "kvtiers.ops.snapshot",
    "SnapshotError": "kvtiers.ops.snapshot_store",
    "SnapshotReader": "kvtiers.ops.snapshot_store",
    "SnapshotWriter": "kvtiers.ops.snapshot_store",
    "require_zarr": "kvtiers.ops.snapshot_store",
    "SnapshotTargetError": "kvtiers.ops.snapshot_target",
    "check_snapshot_target": "kvtiers.ops.snapshot_target",
    "same_place": "kvtiers.ops.snapshot_target",
    "parse_storage_options": "kvtiers.ops.storage_options",
}


__getattr__ = lazy_names(__name__, _LAZY)
