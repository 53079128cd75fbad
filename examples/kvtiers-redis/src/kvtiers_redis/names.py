"""Redis key names: where one namespace's blocks and manifests live.

    <prefix>:<fingerprint>:b:<key as hex>   a block (value: `record`)
    <prefix>:<fingerprint>:m:recency        the recency order written at close (JSON)
    <prefix>:<fingerprint>:m:namespace      what the namespace is (JSON, for people)

One namespace per fingerprint, so a SCAN of `<prefix>:<fingerprint>:b:*` finds
exactly one model's blocks, and another model's tier never sees them. Hex keeps
names printable (redis-cli, `SCAN MATCH`); the prefix is escaped in the pattern,
so a prefix with glob characters matches only itself. Pure; any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Names", "escape", "split"]

_GLOB = frozenset(b"*?[]\\")
_HEX = frozenset(b"0123456789abcdef")


def escape(text: bytes) -> bytes:
    """`text` with the glob characters of `SCAN MATCH` escaped."""
    escaped = bytearray()
    for byte in text:
        if byte in _GLOB:
            escaped.append(ord("\\"))
        escaped.append(byte)
    return bytes(escaped)


def split(prefix: str, name: bytes) -> tuple[str, bytes, bytes] | None:
    """(fingerprint, kind b"b" or b"m", the rest) of a name under `prefix`, any
    namespace's; None for a name that is not one of this layout's."""
    head = prefix.encode() + b":"
    if not name.startswith(head):
        return None
    parts = name[len(head):].split(b":", 2)
    if len(parts) != 3 or len(parts[0]) != 32 or not set(parts[0]) <= _HEX:
        return None
    if parts[1] not in (b"b", b"m"):
        return None
    return parts[0].decode(), parts[1], parts[2]


@dataclass(frozen=True, slots=True)
class Names:
    prefix: str
    fingerprint: str

    @property
    def base(self) -> bytes:
        return f"{self.prefix}:{self.fingerprint}:".encode()

    @property
    def blocks(self) -> bytes:
        return self.base + b"b:"

    def block(self, key: bytes) -> bytes:
        return self.blocks + bytes(key).hex().encode()

    def key_of(self, name: bytes) -> bytes | None:
        """The block key `name` is for, or None when it is not one of our block names."""
        head = self.blocks
        if not name.startswith(head):
            return None
        text = name[len(head):]
        try:
            key = bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return None
        return key if key and key.hex().encode() == text else None

    def pattern(self) -> bytes:
        """`SCAN MATCH` pattern of our block names."""
        return escape(self.blocks) + b"*"

    @property
    def recency(self) -> bytes:
        return self.base + b"m:recency"

    @property
    def namespace(self) -> bytes:
        return self.base + b"m:namespace"
