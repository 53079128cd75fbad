"""The object header and names. The header is the SDK's (`BlockHeaderFormat`, whose
classification of any bytes tests/sdk/test_block_header.py checks) under this
tier's magic: the bytes stored so far stay readable, byte for byte."""

from __future__ import annotations

import os

from kvtiers.sdk import checksum
from kvtiers_mooncake import record
from kvtiers_mooncake.names import Names, split

FP = "0123456789abcdef0123456789abcdef"
KEY = os.urandom(32) + bytes(4)

#: the header of `GOLDEN_KEY`'s block `GOLDEN_BLOCK` in namespace FP, as written by
#: every kvtiers-mooncake release so far
GOLDEN_KEY = bytes(range(20)) + b"\x00\x00\x00\x07"
GOLDEN_BLOCK = bytes(range(256)) * 2
GOLDEN = bytes.fromhex(
    "4b56544d4f4f4e4301005e00303132333435363738396162636465663031323334353637383961"
    "6263646566000200000000000009fa9bd15a1059101800000102030405060708090a0b0c0d0e0f"
    "10111213000000079a22533375d503d8")


def test_the_header_bytes_are_the_format_stored_so_far() -> None:
    block_sum = checksum(GOLDEN_BLOCK)
    head = record.pack_header(FP, GOLDEN_KEY, len(GOLDEN_BLOCK), block_sum)
    assert head == GOLDEN
    assert record.FORMAT.packer(FP, len(GOLDEN_BLOCK)).pack(GOLDEN_KEY, block_sum) == GOLDEN
    data = GOLDEN + GOLDEN_BLOCK
    assert record.judge(data, FP, GOLDEN_KEY, len(GOLDEN_BLOCK), len(data)) is None
    header = record.parse_header(data)
    assert header is not None and header.key == GOLDEN_KEY and header.block_sum == block_sum
    assert header.length == record.header_bytes(len(GOLDEN_KEY)) == len(GOLDEN)
    assert record.judge(data, FP, GOLDEN_KEY, len(GOLDEN_BLOCK), len(data) - 1) is \
        record.Bad.BROKEN
    # the longest key's header fits the slot's header area, one byte more does not
    assert record.header_bytes(record.MAX_KEY_BYTES) == record.AREA_BYTES


def test_names_round_trip_and_stay_in_their_namespace() -> None:
    names = Names("kv", FP)
    name = names.block(KEY)
    assert name == f"kv/{FP}/{KEY.hex()}" and names.key_of(name) == KEY
    assert split("kv", name) == (FP, KEY)
    assert Names("kv", "f" * 32).key_of(name) is None
    assert names.key_of(f"kv/{FP}/xyz") is None and split("kv", "kv/short/00") is None
