"""Object names: where one namespace's blocks live in Mooncake's flat key space.

    <prefix>/<namespace fingerprint>/<key as hex>

Engines of one model (one fingerprint) share names, so one engine's block is
another's hit; another model or block layout has another fingerprint and never
sees them. Mooncake's `tenant_id` separates tenants below that where the master
enforces tenants (`--enable_multi_tenants`); otherwise distinct prefixes do. Pure;
any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Names", "split"]

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class Names:
    prefix: str
    fingerprint: str
    base: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", f"{self.prefix}/{self.fingerprint}/")

    def block(self, key: bytes) -> str:
        return self.base + key.hex()

    def key_of(self, name: str) -> bytes | None:
        """The key `name` holds, or None when it is not one of our block names."""
        if not name.startswith(self.base):
            return None
        text = name[len(self.base):]
        if not text or len(text) % 2 or not set(text) <= _HEX:
            return None
        return bytes.fromhex(text)


def split(prefix: str, name: str) -> tuple[str, bytes] | None:
    """(fingerprint, key) of a block name under `prefix`, any namespace's; None for
    a name that is not one."""
    head = prefix + "/"
    if not name.startswith(head):
        return None
    fp, sep, text = name[len(head):].partition("/")
    if not sep or len(fp) != 32 or not set(fp) <= _HEX:
        return None
    key = Names(prefix, fp).key_of(name)
    return None if key is None else (fp, key)
