"""The header in front of every block object: what makes a hit verifiable.

An object is `header + block bytes`, the header the SDK's block header
(`kvtiers.sdk.BlockHeaderFormat`: key, namespace fingerprint, block length and
checksum, a checksum of its own) under the magic b"KVTMOONC", so that any object
found at one of our names is classified as ours, another model's, another
program's, or ours and damaged - whoever wrote it.

The header of a key has one length, so a load asks Mooncake for exactly
`header_bytes(len(key)) + block_bytes` bytes: the header into a small registered
area (`AREA_BYTES` per pool slot), the block straight into its pool slot. Pure
functions, any thread.
"""

from __future__ import annotations

from kvtiers.sdk import BadHeader as Bad
from kvtiers.sdk import BlockHeader as Header
from kvtiers.sdk import BlockHeaderFormat, HeaderPacker
from kvtiers.sdk import block_header_bytes as header_bytes

__all__ = ["AREA_BYTES", "FORMAT", "MAGIC", "MAX_KEY_BYTES", "Bad", "Header", "HeaderPacker",
           "header_bytes", "judge", "pack_header", "parse_header"]

MAGIC = b"KVTMOONC"
FORMAT = BlockHeaderFormat(MAGIC)
#: bytes of header area per pool slot (registered with Mooncake once)
AREA_BYTES = 256
#: the longest key whose header fits the area
MAX_KEY_BYTES = AREA_BYTES - header_bytes(0)

pack_header = FORMAT.pack
parse_header = FORMAT.parse
#: `judge(data, fingerprint, key, block_bytes, length)`: None when ours and intact
judge = FORMAT.judge
