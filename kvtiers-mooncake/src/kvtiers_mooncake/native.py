"""Loading Mooncake's Python module, with one clear message for each way it fails.

Both builds of the wheel (`mooncake-transfer-engine`, CUDA, and
`mooncake-transfer-engine-non-cuda`) install the package `mooncake`; its native
`store` module links against `libibverbs.so.1` even for TCP, which Debian ships
as `libibverbs1`. `load_store_module()` imports it or raises `MooncakeMissing`
with what to install. Any thread; the import happens once.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from kvtiers.errors import KvtiersError

__all__ = ["INSTALL_HINT", "VERBS_HINT", "MooncakeMissing", "load_store_module"]

INSTALL_HINT = (
    "install Mooncake's wheel: `pip install kvtiers-mooncake[cpu]` (the non-CUDA build, "
    "mooncake-transfer-engine-non-cuda) or `kvtiers-mooncake[cuda]` "
    "(mooncake-transfer-engine)"
)
VERBS_HINT = (
    "Mooncake needs the RDMA verbs library libibverbs.so.1 even over TCP: install the "
    "Debian/Ubuntu package libibverbs1 (`apt-get install libibverbs1` as root; "
    "rdma-core-libs / libibverbs on other distributions)"
)


class MooncakeMissing(KvtiersError):
    """Mooncake's module cannot be loaded on this machine; the message says why
    and what to install."""


def load_store_module() -> ModuleType:
    """`mooncake.store`, or MooncakeMissing naming the wheel or libibverbs1."""
    try:
        store = importlib.import_module("mooncake.store")
    except ImportError as exc:
        text = str(exc)
        if "libibverbs" in text:
            raise MooncakeMissing(f"{VERBS_HINT} ({text})") from None
        if getattr(exc, "name", None) in ("mooncake", "mooncake.store") or "mooncake" in text:
            raise MooncakeMissing(f"the mooncake package cannot be imported ({text}): "
                                  f"{INSTALL_HINT}") from None
        raise MooncakeMissing(f"Mooncake's native module failed to load: {text}") from None
    return store
