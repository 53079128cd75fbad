"""The value of a block in Redis: a header naming what it is, then the block bytes.

Self-describing and verifiable on its own, so that a value is never served for
the wrong key, the wrong model or damaged - whoever wrote it. The header is the
SDK's block header (`kvtiers.sdk.BlockHeaderFormat`: key, namespace fingerprint,
block length and checksum, a checksum of its own) under this tier's magic.
`check_header` classifies any bytes, however short or mangled, and never raises.
The block checksum is checked last, by the caller, on the bytes in the pool slot.
"""

from __future__ import annotations

from kvtiers.sdk import BadHeader as Bad
from kvtiers.sdk import BlockHeaderFormat
from kvtiers.sdk import block_header_bytes as header_bytes

__all__ = ["FORMAT", "MAGIC", "Bad", "check_header", "encode", "header_bytes", "parse_header"]

MAGIC = b"KVTREDIS"
FORMAT = BlockHeaderFormat(MAGIC)

#: `encode(fingerprint, key, block)`: the value for `key`, header and block
encode = FORMAT.encode
#: `parse_header(value)`: its `BlockHeader` when this format and intact, else None
parse_header = FORMAT.parse
#: `check_header(value, fingerprint, key, block_bytes, length=None)`: None when the
#: value is `key`'s, else a `Bad` (FOREIGN and NAMESPACE: left alone; BROKEN: deleted)
check_header = FORMAT.judge
