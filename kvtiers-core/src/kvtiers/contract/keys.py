"""Block keys: the block's content hash followed by its KV-group index.

A key is plain `bytes` so it hashes and compares at C speed and costs no Python
object beyond itself. The group index is the last `GROUP_BYTES` bytes, an unsigned
big-endian integer: byte for byte vLLM's `OffloadKey` (`make_offload_key` in vLLM
0.33), so an engine adapter passes keys through untouched.
The chained hash that derives block hashes from tokens lives in `kvtiers.hashing`.
"""

from __future__ import annotations

BlockKey = bytes

GROUP_BYTES = 4
MAX_GROUP = (1 << (8 * GROUP_BYTES)) - 1


def make_key(block_hash: bytes, group: int = 0) -> BlockKey:
    """Key of the block with hash `block_hash` in KV-cache group `group`."""
    if not 0 <= group <= MAX_GROUP:
        raise ValueError(f"KV group index must be in 0..{MAX_GROUP}, got {group}")
    if not block_hash:
        raise ValueError("block hash must not be empty")
    return bytes(block_hash) + group.to_bytes(GROUP_BYTES, "big")


def key_group(key: BlockKey) -> int:
    """The KV-cache group index carried by `key`."""
    return int.from_bytes(key[-GROUP_BYTES:], "big")


def key_hash(key: BlockKey) -> bytes:
    """The block hash part of `key` (without the group index)."""
    return key[:-GROUP_BYTES]
