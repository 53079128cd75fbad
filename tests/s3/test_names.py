"""Object names under the prefix: what the tier writes, and what it will parse back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from kvtiers_s3.layout.names import (
    BLOCKS,
    SEGMENTS,
    block_name,
    namespace_root,
    parse_name,
    segment_name,
    shard_prefixes,
)

FP = "0123456789abcdef0123456789abcdef"
NS = namespace_root("bucket/prod", FP)


@given(st.binary(min_size=1, max_size=256))
def test_block_names_parse_back_to_their_key(key: bytes) -> None:
    name = block_name(NS, key)
    parsed = parse_name(NS, name)
    assert parsed is not None and parsed.kind == BLOCKS and parsed.key == key
    assert any(name.startswith(p) for p in shard_prefixes(NS, BLOCKS))
    assert parse_name(NS, "/" + name) == parsed  # as some filesystems list them


@given(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 48) - 1))
def test_segment_names_parse_back(writer: int, seq: int) -> None:
    parsed = parse_name(NS, segment_name(NS, writer, seq))
    assert parsed is not None
    assert (parsed.kind, parsed.writer, parsed.seq) == (SEGMENTS, writer, seq)


def test_names_the_tier_did_not_make_are_ignored() -> None:
    good = block_name(NS, b"\x01" * 36)
    shard = good.split("/")[-2]
    wrong_shard = f"{int(shard, 16) ^ 1:02x}"
    for name in [
        f"{NS}/NAMESPACE.json",
        f"{NS}/b/{shard}",
        good.replace(f"/{shard}/", f"/{wrong_shard}/"),
        good + ".tmp",
        good.replace(f"{NS}/b/", f"{NS}/x/"),
        good.replace(FP, "f" * 32),  # another namespace
        f"{NS}/s/00/not-a-segment",
        good[:-1],  # odd number of hex digits
        "elsewhere/" + good,
    ]:
        assert parse_name(NS, name) is None, name


def test_every_shard_prefix_is_distinct_and_under_the_namespace() -> None:
    prefixes = shard_prefixes(NS, BLOCKS)
    assert len(set(prefixes)) == 256 and all(p.startswith(NS + "/b/") for p in prefixes)
    assert namespace_root("", FP) == FP
