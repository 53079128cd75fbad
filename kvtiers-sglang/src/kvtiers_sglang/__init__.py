"""kvtiers-sglang: every kvtiers tier as SGLang HiCache's L3 storage.

SGLang loads `kvtiers_sglang.backend.KvtiersHiCacheStorage` through its `dynamic`
storage backend (docs/sglang.md). Importing this package imports neither SGLang nor
torch; `kvtiers_sglang.backend` needs both (and checks SGLang's version first).

Modules, one concept each: `versions` (which SGLang), `options` (the extra config as
a kvtiers config), `keys` (page hashes as kvtiers keys), `pages` (the host pool as
kvtiers' pool), `identity` (the namespace), `build` (the tiers), `stack` (tiers
answering synchronous calls within deadlines), `backend` (SGLang's interface).
"""

from __future__ import annotations

from kvtiers_sglang.versions import SUPPORTED_TEXT, UnsupportedSglangError, require_sglang

BACKEND_MODULE = "kvtiers_sglang.backend"
BACKEND_CLASS = "KvtiersHiCacheStorage"

__all__ = [
    "BACKEND_CLASS",
    "BACKEND_MODULE",
    "SUPPORTED_TEXT",
    "UnsupportedSglangError",
    "require_sglang",
]
