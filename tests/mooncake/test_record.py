"""The object header and names: every object at our names is classified - ours,
another model's, another program's, ours and damaged - whatever its bytes."""

from __future__ import annotations

import os

from kvtiers.sdk import checksum
from kvtiers_mooncake import record
from kvtiers_mooncake.names import Names, split

FP = "0123456789abcdef0123456789abcdef"
KEY = os.urandom(32) + bytes(4)
BLOCK = os.urandom(4096)


def obj(fp: str = FP, key: bytes = KEY, block: bytes = BLOCK) -> bytes:
    return record.pack_header(fp, key, len(block), checksum(block)) + block


def test_an_intact_object_is_ours() -> None:
    data = obj()
    header = record.parse_header(data)
    assert header is not None and header.key == KEY and header.length == \
        record.header_bytes(len(KEY))
    assert record.judge(data, FP, KEY, len(BLOCK), len(data)) is None


def test_every_other_object_is_classified() -> None:
    data = obj()
    hlen = record.header_bytes(len(KEY))
    assert record.judge(os.urandom(len(data)), FP, KEY, 4096, len(data)) is record.Bad.FOREIGN
    assert record.judge(b"", FP, KEY, 4096, 0) is record.Bad.FOREIGN
    assert record.judge(obj(fp="f" * 32), FP, KEY, 4096, len(data)) is record.Bad.NAMESPACE
    assert record.judge(obj(key=os.urandom(36)), FP, KEY, 4096, len(data)) is record.Bad.BROKEN
    assert record.judge(data, FP, KEY, 4096, len(data) - 1) is record.Bad.BROKEN  # cut short
    assert record.judge(data[:hlen - 1], FP, KEY, 4096, hlen - 1) is record.Bad.BROKEN
    for at in range(8, hlen):  # any flipped bit of the header after the magic
        damaged = bytearray(data)
        damaged[at] ^= 0x10
        assert record.judge(bytes(damaged), FP, KEY, 4096, len(data)) in (
            record.Bad.BROKEN, record.Bad.FOREIGN), at


def test_names_round_trip_and_stay_in_their_namespace() -> None:
    names = Names("kv", FP)
    name = names.block(KEY)
    assert name == f"kv/{FP}/{KEY.hex()}" and names.key_of(name) == KEY
    assert split("kv", name) == (FP, KEY)
    assert Names("kv", "f" * 32).key_of(name) is None
    assert names.key_of(f"kv/{FP}/xyz") is None and split("kv", "kv/short/00") is None


def test_the_fast_packer_writes_the_same_headers() -> None:
    """`Expected.pack` (the store and load paths) is `pack_header`, byte for byte,
    for any key length; a header it packs for another key, checksum, namespace or
    block size differs."""
    expected = record.Expected(FP, 4096)
    for length in (0, 1, 36, record.MAX_KEY_BYTES):
        key = os.urandom(length)
        block_sum = int.from_bytes(os.urandom(8), "little")
        head = expected.pack(key, block_sum)
        assert head == record.pack_header(FP, key, 4096, block_sum), length
        assert len(head) == record.header_bytes(length)
        assert head != expected.pack(key, block_sum ^ 1)
        assert head != record.Expected("f" * 32, 4096).pack(key, block_sum)
        assert head != record.Expected(FP, 8192).pack(key, block_sum)
        if length:
            assert head != expected.pack(bytes([key[0] ^ 1]) + key[1:], block_sum)
