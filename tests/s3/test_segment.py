"""The packed segment format: index and ranged reads of single records."""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kvtiers_s3.jobs.ranges import coalesce
from kvtiers_s3.layout.codec import FormatError, Reason, header_bytes
from kvtiers_s3.layout.segment import (
    SEGMENT_MAGIC,
    decode_index,
    decode_member,
    encode_segment,
    plan_segments,
    segment_bytes,
)

FP = "0123456789abcdef0123456789abcdef"
OTHER_FP = "fedcba9876543210fedcba9876543210"

blocks_st = st.dictionaries(st.binary(min_size=1, max_size=64), st.binary(max_size=512),
                            min_size=1, max_size=20)


def _segment(n: int = 8, size: int = 300) -> tuple[bytearray, list[tuple[bytes, bytes]]]:
    blocks = [(os.urandom(36), os.urandom(size)) for _ in range(n)]
    buf, _ = encode_segment(FP, blocks)
    return buf, blocks


@given(blocks_st)
def test_a_segment_round_trips_through_its_index_and_ranged_reads(
        blocks: dict[bytes, bytes]) -> None:
    items = list(blocks.items())
    buf, index = encode_segment(FP, items)
    assert len(buf) == index.object_bytes
    # one block size per segment in the tier; mixed sizes work too
    if len({len(p) for p in blocks.values()}) == 1:
        assert len(buf) == segment_bytes(list(blocks), len(items[0][1]))
    parsed = decode_index(buf[: index.index_bytes], FP, object_bytes=len(buf))
    assert parsed == index
    assert [e.key for e in parsed.entries] == list(blocks)
    for entry, (key, payload) in zip(parsed.entries, items, strict=True):
        header, data = decode_member(buf[entry.offset:entry.end], entry, FP)
        assert header.key == key and bytes(data) == payload


@given(st.binary(max_size=400))
@example(b"")
@example(SEGMENT_MAGIC + bytes(56))
def test_any_bytes_are_an_index_or_a_format_error(data: bytes) -> None:
    for fp in (None, FP):
        try:
            decode_index(data, fp)
        except FormatError as exc:
            assert isinstance(exc.reason, Reason)


@settings(max_examples=300)
@given(st.data())
def test_every_changed_index_byte_is_rejected(data: st.DataObject) -> None:
    buf, _ = _segment(n=data.draw(st.integers(1, 6)), size=50)
    ilen = decode_index(buf, FP).index_bytes
    pos = data.draw(st.integers(0, ilen - 1))
    buf[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(FormatError):
        decode_index(buf, FP)


@settings(max_examples=100)
@given(st.data())
def test_a_short_prefix_says_how_much_to_read(data: st.DataObject) -> None:
    buf, _ = _segment(n=data.draw(st.integers(1, 40)), size=10)
    ilen = decode_index(buf, FP).index_bytes
    cut = data.draw(st.integers(0, ilen - 1))
    with pytest.raises(FormatError) as info:
        decode_index(buf[:cut], FP)
    assert info.value.reason is Reason.TRUNCATED
    assert info.value.need is not None and cut < info.value.need <= ilen
    # reading what it asks for, repeatedly, ends with the whole index
    need = info.value.need
    while True:
        try:
            assert decode_index(buf[:need], FP).index_bytes == ilen
            break
        except FormatError as exc:
            assert exc.reason is Reason.TRUNCATED and exc.need is not None and exc.need > need
            need = exc.need


def test_an_object_shorter_or_longer_than_its_index_says_is_rejected() -> None:
    buf, _ = _segment()
    with pytest.raises(FormatError) as info:
        decode_index(buf, FP, object_bytes=len(buf) - 1)
    assert info.value.reason is Reason.TRUNCATED
    with pytest.raises(FormatError) as info:
        decode_index(buf, FP, object_bytes=len(buf) + 1)
    assert info.value.reason is Reason.LENGTH


def test_another_namespace_is_rejected_by_name() -> None:
    buf, _ = encode_segment(OTHER_FP, [(b"k" * 36, os.urandom(10))])
    with pytest.raises(FormatError) as info:
        decode_index(buf, FP)
    assert info.value.reason is Reason.NAMESPACE


def test_a_ranged_read_must_be_the_record_the_index_names() -> None:
    buf, blocks = _segment(n=3)
    index = decode_index(buf, FP)
    first, second = index.entries[0], index.entries[1]
    # the bytes of another record, or a read that came back short or shifted
    with pytest.raises(FormatError) as info:
        decode_member(buf[second.offset:second.end], first, FP)
    assert info.value.reason is Reason.KEY
    with pytest.raises(FormatError) as info:
        decode_member(buf[first.offset:first.end - 1], first, FP)
    assert info.value.reason is Reason.TRUNCATED
    with pytest.raises(FormatError):
        decode_member(buf[first.offset + 1:first.end + 1], first, FP)
    corrupt = bytearray(buf[first.offset:first.end])
    corrupt[-5] ^= 0x40
    with pytest.raises(FormatError) as info:
        decode_member(corrupt, first, FP)
    assert info.value.reason is Reason.CORRUPT
    assert first.length == header_bytes(36) + len(blocks[0][1])


def test_the_encoder_refuses_duplicates_and_empty_segments() -> None:
    with pytest.raises(ValueError):
        encode_segment(FP, [])
    with pytest.raises(ValueError):
        encode_segment(FP, [(b"k", b"1"), (b"k", b"2")])


@given(st.integers(0, 3000), st.integers(1, 4 << 20), st.integers(1, 64),
       st.integers(1 << 20, 32 << 20))
def test_a_job_splits_into_few_balanced_segments_within_the_limit(
        n: int, payload: int, klen: int, limit: int) -> None:
    groups = plan_segments(n, payload, klen, limit)
    assert [i for g in groups for i in g] == list(range(n))
    if not groups:
        return
    sizes = [len(g) for g in groups]
    assert max(sizes) - min(sizes) <= 1
    one = segment_bytes([b"k" * klen], payload)
    for g in groups:
        assert segment_bytes([b"k" * klen] * len(g), payload) <= limit or len(g) == 1
    if one <= limit:  # as few segments as fit: one fewer would overflow
        fewer = len(groups) - 1
        if fewer:
            biggest = -(-n // fewer)
            assert segment_bytes([b"k" * klen] * biggest, payload) > limit


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), min_size=0, max_size=60),
       st.integers(0, 300), st.integers(1, 2000))
def test_coalesced_reads_cover_each_record_once_within_their_limits(
        layout: list[tuple[int, int]], max_gap: int, max_read: int) -> None:
    """Records laid out with gaps (gap, length); every record comes back from
    exactly one read, at the right place, and reads respect gap and size limits."""
    wanted, pos = [], 0
    for i, (gap, length) in enumerate(layout):
        pos += gap
        wanted.append((i, pos, length))
        pos += length
    reads = coalesce(list(reversed(wanted)), max_gap=max_gap, max_read=max_read)
    seen = {}
    for r in reads:
        assert r.members and r.start < r.end
        assert r.end - r.start <= max_read or len(r.members) == 1
        for item, rel, length in r.members:
            assert rel >= 0 and rel + length <= r.end - r.start
            seen[item] = (r.start + rel, length)
        gaps = [b[1] - (a[1] + a[2]) for a, b in zip(r.members, r.members[1:], strict=False)]
        assert all(0 <= g <= max_gap for g in gaps)
    assert seen == {i: (off, n) for i, off, n in wanted}
    starts = [r.start for r in reads]
    assert starts == sorted(starts)
