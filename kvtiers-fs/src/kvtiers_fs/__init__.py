"""kvtiers-fs: the `fs` tier - KV-cache blocks as files on local or shared
filesystems. Registered through the `kvtiers` entry point (`kvtiers_fs.plugin`).

- `FsTier`: the tier (import it lazily: `kvtiers_fs.tier`).
(Its dual-queue thread pool is the core's: `kvtiers.sdk.DualQueueThreadPool`.)
- `list_namespaces(root)`: the models that keep blocks under a root directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtiers_fs.namespaces import NamespaceInfo, list_namespaces

if TYPE_CHECKING:
    from kvtiers_fs.tier import FsTier

__all__ = ["FsTier", "NamespaceInfo", "list_namespaces"]


def __getattr__(name: str) -> Any:
    if name == "FsTier":
        from kvtiers_fs.tier import FsTier

        return FsTier
    raise AttributeError(f"module 'kvtiers_fs' has no attribute {name!r}")
