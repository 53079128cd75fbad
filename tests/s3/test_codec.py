"""The block record format: round trips, and strict, total parsing of anything."""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kvtiers.sdk.integrity import verify
from kvtiers_s3.layout.codec import (
    FIXED_BYTES,
    MAGIC,
    MAX_KEY_BYTES,
    FormatError,
    Reason,
    decode_header,
    decode_record,
    encode_header,
    encode_record,
    header_bytes,
)

FP = "0123456789abcdef0123456789abcdef"
OTHER_FP = "fedcba9876543210fedcba9876543210"

keys = st.binary(min_size=1, max_size=MAX_KEY_BYTES)
payloads = st.binary(min_size=0, max_size=4096)
fingerprints = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)


def _record(key: bytes = b"k" * 36, payload: bytes | None = None) -> bytes:
    return bytes(encode_record(FP, key, os.urandom(1000) if payload is None else payload))


@given(fingerprints, keys, payloads)
def test_a_record_round_trips(fp: str, key: bytes, payload: bytes) -> None:
    buf = encode_record(fp, key, payload)
    assert len(buf) == header_bytes(len(key)) + len(payload)
    header, data = decode_record(buf, fp, key=key, payload_bytes=len(payload))
    assert bytes(data) == payload
    assert (header.key, header.fingerprint, header.payload_bytes) == (key, fp, len(payload))
    assert verify(data, header.checksum)


@given(st.binary(max_size=600))
@example(b"")
@example(MAGIC)
@example(MAGIC + bytes(FIXED_BYTES))
def test_any_bytes_are_a_record_or_a_format_error(data: bytes) -> None:
    for fp in (None, FP):
        try:
            decode_record(data, fp)
        except FormatError as exc:
            assert isinstance(exc.reason, Reason)


@given(st.binary(max_size=200))
def test_bytes_after_a_valid_magic_never_crash_the_parser(tail: bytes) -> None:
    with pytest.raises(FormatError):
        decode_record(MAGIC + tail, FP)


@settings(max_examples=200)
@given(st.data())
def test_every_truncation_is_rejected_as_truncated(data: st.DataObject) -> None:
    buf = _record(payload=data.draw(st.binary(min_size=1, max_size=300)))
    cut = data.draw(st.integers(0, len(buf) - 1))
    with pytest.raises(FormatError) as info:
        decode_record(buf[:cut], FP)
    assert info.value.reason is Reason.TRUNCATED
    assert info.value.need is not None and info.value.need > cut


@settings(max_examples=300)
@given(st.data())
def test_every_changed_byte_is_rejected(data: st.DataObject) -> None:
    """Flip any bits of any byte: the header checksum, the checksum of the block
    or a field check catches it - never another block's bytes served."""
    buf = bytearray(_record(payload=data.draw(st.binary(min_size=1, max_size=300))))
    pos = data.draw(st.integers(0, len(buf) - 1))
    buf[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(FormatError) as info:
        decode_record(buf, FP, key=b"k" * 36)
    if pos >= header_bytes(36):
        assert info.value.reason is Reason.CORRUPT


def test_a_block_of_another_namespace_is_rejected_by_name() -> None:
    buf = encode_record(OTHER_FP, b"k" * 36, os.urandom(64))
    with pytest.raises(FormatError) as info:
        decode_record(buf, FP)
    assert info.value.reason is Reason.NAMESPACE


def test_another_key_or_length_is_rejected() -> None:
    buf = _record()
    with pytest.raises(FormatError) as info:
        decode_record(buf, FP, key=b"x" * 36)
    assert info.value.reason is Reason.KEY
    with pytest.raises(FormatError) as info:
        decode_record(buf, FP, payload_bytes=999)
    assert info.value.reason is Reason.LENGTH
    with pytest.raises(FormatError) as info:
        decode_record(buf + b"\x01", FP)
    assert info.value.reason is Reason.LENGTH


def test_foreign_objects_and_other_versions_are_named() -> None:
    with pytest.raises(FormatError) as info:
        decode_record(b"PK\x03\x04" + os.urandom(100), FP)
    assert info.value.reason is Reason.FOREIGN
    buf = bytearray(_record())
    buf[8] = 9  # the version field; the header checksum does not matter: it is read first
    with pytest.raises(FormatError) as info:
        decode_record(buf, FP)
    assert info.value.reason is Reason.VERSION


def test_a_checksum_left_to_the_caller_is_still_exposed() -> None:
    payload = os.urandom(256)
    buf = bytearray(encode_record(FP, b"k" * 36, payload))
    buf[-1] ^= 1
    header, data = decode_record(buf, FP, verify=False)
    assert not verify(data, header.checksum)
    with pytest.raises(FormatError):
        decode_record(buf, FP)


def test_the_header_alone_is_enough_to_parse_it() -> None:
    payload = os.urandom(5000)
    buf = encode_record(FP, b"k" * 36, payload)
    header = decode_header(buf[: header_bytes(36)], FP)
    assert header.payload_bytes == 5000 and header.record_bytes == len(buf)


def test_the_encoder_refuses_what_the_parser_would() -> None:
    with pytest.raises(ValueError):
        encode_header(FP, b"", 1, 0)
    with pytest.raises(ValueError):
        encode_header(FP, b"k" * (MAX_KEY_BYTES + 1), 1, 0)
    with pytest.raises(ValueError):
        encode_header("NOT-HEX" * 5, b"k", 1, 0)
