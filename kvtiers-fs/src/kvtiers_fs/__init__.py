"""kvtiers-fs: the `fs` tier - KV-cache blocks as files on local or shared
filesystems. Registered through the `kvtiers` entry point (`kvtiers_fs.plugin`).

- `FsTier`: the tier (import it lazily: `kvtiers_fs.tier`).
(Its dual-queue thread pool is the core's: `kvtiers.sdk.DualQueueThreadPool`.)
- `list_namespaces(root)`: the models that keep blocks under a root directory.

Modules: `plugin` (the entry point: the tier's record only), `schema` (the config
schema and the checks it cannot express), `tier` (`FsTier`: the scheduler side and
the job hooks), `pacing` (work that grows with the number of blocks, in pieces:
every layer below uses it). Below them, each layer importing only those after it:
`tools/` (`kvtiers inspect`, `kvtiers verify`), `namespace/` (a namespace on a
root, shared by processes: `RootStore`), `journal/` (the shared index: journal,
snapshots, their fold, recovery), `disk/` (the tree under a root, block files).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtiers_fs.namespace.listing import NamespaceInfo, list_namespaces

if TYPE_CHECKING:
    from kvtiers_fs.tier import FsTier

__all__ = ["FsTier", "NamespaceInfo", "list_namespaces"]


def __getattr__(name: str) -> Any:
    if name == "FsTier":
        from kvtiers_fs.tier import FsTier

        return FsTier
    raise AttributeError(f"module 'kvtiers_fs' has no attribute {name!r}")
