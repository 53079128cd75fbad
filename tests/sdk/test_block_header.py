"""`BlockHeaderFormat`: every object found at a tier's names is classified - ours,
another model's, another program's, ours and damaged - whatever its bytes, for the
magic of each tier that uses it; the fast packer writes the same bytes."""

from __future__ import annotations

import os
import random

import pytest
from kvtiers.sdk import (
    BadHeader,
    BlockHeaderFormat,
    block_header_bytes,
    checksum,
)

FP = "0123456789abcdef0123456789abcdef"
OTHER_FP = "f" * 32
KEY = os.urandom(32) + bytes(4)
BLOCK = os.urandom(4096)
#: the tiers' magics (kvtiers-mooncake, kvtiers-redis) and one of nobody's
MAGICS = [b"KVTMOONC", b"KVTREDIS", b"\x00\xffANY\x01\x02\x03"]


@pytest.fixture(params=MAGICS, ids=lambda m: m.decode("latin-1"))
def fmt(request: pytest.FixtureRequest) -> BlockHeaderFormat:
    return BlockHeaderFormat(request.param)


def obj(fmt: BlockHeaderFormat, fp: str = FP, key: bytes = KEY,
        block: bytes = BLOCK) -> bytes:
    return fmt.pack(fp, key, len(block), checksum(block)) + block


def test_an_intact_object_is_ours(fmt: BlockHeaderFormat) -> None:
    data = obj(fmt)
    assert data == fmt.encode(FP, KEY, BLOCK) == fmt.encode(FP, KEY, memoryview(BLOCK))
    header = fmt.parse(data)
    assert header is not None
    assert (header.fingerprint, header.key, header.block_bytes, header.block_sum,
            header.length) == (FP, KEY, len(BLOCK), checksum(BLOCK),
                               block_header_bytes(len(KEY)))
    assert data[header.length:] == BLOCK
    assert fmt.judge(data, FP, KEY, len(BLOCK)) is None
    assert fmt.judge(data, FP, KEY, len(BLOCK), len(data)) is None
    # only the start of it (a scan reads headers alone), the whole length given
    assert fmt.judge(data[:header.length], FP, KEY, len(BLOCK), len(data)) is None
    assert fmt.judge(bytearray(data), FP, KEY, len(BLOCK)) is None


def test_other_programs_and_other_models_are_left_alone(fmt: BlockHeaderFormat) -> None:
    n = len(BLOCK)
    assert fmt.judge(os.urandom(len(obj(fmt))), FP, KEY, n) is BadHeader.FOREIGN
    assert fmt.judge(b"not-kvtiers" + BLOCK, FP, KEY, n) is BadHeader.FOREIGN
    for short in range(8):  # too short to say it is ours, even a prefix of the magic
        assert fmt.judge(fmt.magic[:short], FP, KEY, n) is BadHeader.FOREIGN, short
    later = bytearray(obj(fmt))
    later[8] = 2  # a later format version: not ours to judge
    assert fmt.judge(bytes(later), FP, KEY, n) is BadHeader.FOREIGN
    assert fmt.judge(obj(fmt, fp=OTHER_FP), FP, KEY, n) is BadHeader.NAMESPACE
    # another tier's format at our name: another program's
    other = BlockHeaderFormat(bytes(b ^ 0x01 for b in fmt.magic))
    assert fmt.judge(obj(other), FP, KEY, n) is BadHeader.FOREIGN
    assert fmt.parse(obj(other)) is None


def test_ours_damaged_or_cut_short_is_broken(fmt: BlockHeaderFormat) -> None:
    data = obj(fmt)
    n, hlen = len(BLOCK), block_header_bytes(len(KEY))
    assert fmt.judge(obj(fmt, key=os.urandom(36)), FP, KEY, n) is BadHeader.BROKEN
    assert fmt.judge(obj(fmt, block=BLOCK[:-1]), FP, KEY, n) is BadHeader.BROKEN
    assert fmt.judge(data, FP, KEY, n, len(data) - 1) is BadHeader.BROKEN
    assert fmt.judge(data + b"x", FP, KEY, n) is BadHeader.BROKEN  # bytes past the end
    for cut in (8, 9, 10, 40, hlen - 1, hlen, len(data) - 1):  # truncated objects
        assert fmt.judge(data[:cut], FP, KEY, n) is BadHeader.BROKEN, cut
    for cut in range(8, hlen):  # a header cut short is never parsed
        assert fmt.parse(data[:cut]) is None, cut
    for at in range(8, hlen):  # any flipped bit of the header after the magic
        for bit in (0x01, 0x10, 0x80):
            damaged = bytearray(data)
            damaged[at] ^= bit
            assert fmt.parse(bytes(damaged)) is None, (at, bit)
            # (the version bytes changed: a later format's, not ours to judge)
            want = BadHeader.FOREIGN if at in (8, 9) else BadHeader.BROKEN
            assert fmt.judge(bytes(damaged), FP, KEY, n) is want, (at, bit)


def test_judge_never_raises_on_random_bytes(fmt: BlockHeaderFormat) -> None:
    rnd = random.Random(7)
    data = obj(fmt)
    for _ in range(2000):
        mangled = bytearray(data[: rnd.randrange(len(data) + 1)])
        for _ in range(rnd.randrange(4)):
            if mangled:
                mangled[rnd.randrange(len(mangled))] = rnd.randrange(256)
        got = fmt.judge(bytes(mangled), FP, KEY, len(BLOCK), rnd.choice((None, len(data))))
        assert got is None or isinstance(got, BadHeader)
        if got is None:  # only ever the intact object (or its intact header)
            assert bytes(mangled[:block_header_bytes(len(KEY))]) == \
                data[:block_header_bytes(len(KEY))]


def test_the_fast_packer_writes_the_same_headers(fmt: BlockHeaderFormat) -> None:
    """`packer(fp, block_bytes).pack` is `pack`, byte for byte, for any key length;
    a header it packs for another key, checksum, namespace or block size differs;
    one packer per (namespace, block size)."""
    packer = fmt.packer(FP, 4096)
    assert fmt.packer(FP, 4096) is packer
    assert fmt.packer(FP, 8192) is not packer and fmt.packer(OTHER_FP, 4096) is not packer
    for length in (0, 1, 36, 194):
        key = os.urandom(length)
        block_sum = int.from_bytes(os.urandom(8), "little")
        head = packer.pack(key, block_sum)
        assert head == fmt.pack(FP, key, 4096, block_sum), length
        assert len(head) == block_header_bytes(length)
        assert head != packer.pack(key, block_sum ^ 1)
        assert head != fmt.packer(OTHER_FP, 4096).pack(key, block_sum)
        assert head != fmt.packer(FP, 8192).pack(key, block_sum)
        if length:
            assert head != packer.pack(bytes([key[0] ^ 1]) + key[1:], block_sum)


@pytest.mark.parametrize("magic", [b"", b"KVT", b"KVTMOONCX"])
def test_a_magic_is_eight_bytes(magic: bytes) -> None:
    with pytest.raises(ValueError, match="8 bytes"):
        BlockHeaderFormat(magic)
