"""The value format. The header is the SDK's (`BlockHeaderFormat`, whose
classification of any bytes tests/sdk/test_block_header.py checks) under this
tier's magic: the values stored so far stay readable, byte for byte."""

from __future__ import annotations

from kvtiers.sdk import checksum
from kvtiers_redis import record

FP = "0123456789abcdef0123456789abcdef"
#: the value of `KEY`'s block `BLOCK` in namespace FP is GOLDEN + BLOCK, as written
#: by every kvtiers-redis release so far
KEY = bytes(range(20)) + b"\x00\x00\x00\x07"
BLOCK = bytes(range(256)) * 2
GOLDEN = bytes.fromhex(
    "4b5654524544495301005e00303132333435363738396162636465663031323334353637383961"
    "6263646566000200000000000009fa9bd15a1059101800000102030405060708090a0b0c0d0e0f"
    "101112130000000762176aacdabd244c")


def test_values_are_the_format_stored_so_far() -> None:
    value = record.encode(FP, KEY, BLOCK)
    assert value == GOLDEN + BLOCK
    header = record.parse_header(value)
    assert header is not None and header.key == KEY and header.block_sum == checksum(BLOCK)
    assert header.length == record.header_bytes(len(KEY)) == len(GOLDEN)
    assert record.check_header(value, FP, KEY, len(BLOCK)) is None
    assert record.check_header(GOLDEN, FP, KEY, len(BLOCK), length=len(value)) is None
    assert record.check_header(value[:-1], FP, KEY, len(BLOCK)) is record.Bad.BROKEN
    assert record.check_header(value, "f" * 32, KEY, len(BLOCK)) is record.Bad.NAMESPACE
