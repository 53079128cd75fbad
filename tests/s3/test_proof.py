"""Telling a damaged object of the tier's from another program's (`layout.proof`), and
the verdicts that keep a bad object a miss until it changes (`holdings.verdicts`)."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st
from kvtiers_s3.client.objects import ObjectInfo
from kvtiers_s3.holdings.verdicts import Verdicts
from kvtiers_s3.layout.codec import MAGIC, FormatError, Reason, decode_header, encode_record
from kvtiers_s3.layout.proof import record_is_ours, segment_index_is_ours
from kvtiers_s3.layout.segment import SEGMENT_MAGIC, decode_index, encode_segment

FP = "0123456789abcdef0123456789abcdef"
OTHER_FP = "fedcba9876543210fedcba9876543210"
KEY = b"k" * 36


def _damaged(buf: bytes | bytearray, at: int, flip: int) -> bytes:
    out = bytearray(buf)
    out[at] ^= flip
    return bytes(out)


@given(st.integers(0, len(MAGIC) - 1), st.integers(1, 255))
def test_a_record_whose_magic_alone_is_damaged_is_provably_ours(at: int, flip: int) -> None:
    record = _damaged(encode_record(FP, KEY, os.urandom(512)), at, flip)
    try:
        decode_header(record, FP)
    except FormatError as exc:
        assert exc.reason is Reason.FOREIGN
    assert record_is_ours(record, FP, KEY)
    assert not record_is_ours(record, OTHER_FP, KEY)  # another namespace's: not ours
    assert not record_is_ours(record, FP, b"j" * 36)  # another key's name: not this one


@given(st.integers(len(MAGIC), 110 - 1), st.integers(1, 255))
def test_damage_past_the_magic_too_is_no_proof(at: int, flip: int) -> None:
    record = _damaged(_damaged(encode_record(FP, KEY, os.urandom(512)), 0, 0xFF), at, flip)
    assert not record_is_ours(record, FP, KEY)


@given(st.binary(min_size=0, max_size=300))
def test_another_programs_bytes_are_not_ours(data: bytes) -> None:
    assert not record_is_ours(data, FP, KEY)
    try:
        assert not segment_index_is_ours(data, FP)
    except FormatError as exc:  # asks for more of the object: never a proof by itself
        assert exc.need is not None and exc.need > len(data)


@given(st.integers(0, len(SEGMENT_MAGIC) - 1), st.integers(1, 255))
def test_a_segment_whose_magic_alone_is_damaged_is_provably_ours(at: int, flip: int) -> None:
    buf, _ = encode_segment(FP, [(bytes([i]) * 36, os.urandom(256)) for i in range(1, 4)])
    damaged = _damaged(buf, at, flip)
    try:
        decode_index(damaged, FP)
    except FormatError as exc:
        assert exc.reason is Reason.FOREIGN
    assert segment_index_is_ours(damaged, FP)
    assert not segment_index_is_ours(damaged, OTHER_FP)
    assert not segment_index_is_ours(_damaged(damaged, 40, 0x01), FP)  # the index too


def _info(size: int = 100, mtime: float | None = 1.0, etag: str | None = "a") -> ObjectInfo:
    return ObjectInfo("bucket/p/x", size, mtime, etag)


def test_a_verdict_holds_until_the_object_changes() -> None:
    verdicts = Verdicts()
    verdicts.remember(_info(), Reason.FOREIGN)
    assert verdicts.judge(_info(mtime=2.0)) is not None  # the same ETag: the same bytes
    assert verdicts.judge(_info(etag="b")) is None  # rewritten: judged afresh
    assert "bucket/p/x" not in verdicts
    verdicts.remember(_info(etag=None), Reason.FOREIGN)
    assert verdicts.judge(_info(etag=None)) is not None
    assert verdicts.judge(_info(etag=None, mtime=5.0)) is None  # stored again
    verdicts.remember(_info(mtime=None, etag=None), Reason.FOREIGN)
    assert verdicts.judge(_info(mtime=None, etag=None)) is not None
    assert verdicts.judge(_info(size=99)) is None  # another size: another object


def test_verdicts_are_bounded_oldest_first() -> None:
    verdicts = Verdicts(limit=2)
    for i in range(3):
        verdicts.remember(ObjectInfo(f"b/{i}", 1, None, str(i)), Reason.FOREIGN)
    assert len(verdicts) == 2 and "b/0" not in verdicts and "b/2" in verdicts
