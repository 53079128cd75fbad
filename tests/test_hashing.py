"""The chained block hash: stable across processes and machines, seeded, chained,
extra keys and group index in the key, strict about its input."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from kvtiers.contract.keys import key_group, key_hash
from kvtiers.hashing import (
    DEFAULT_SEED,
    HASH_SIZE,
    NONE_HASH,
    block_hash,
    encode_extra_keys,
    prefix_block_hashes,
    root_hash,
)

TOKENS = list(range(1000, 1000 + 10 * 16 + 5))  # ten full blocks and a partial one


# --- an independent rendering of the documented encoding ---------------------------


def _ref_item(value: Any) -> bytes:
    if isinstance(value, str):
        data = value.encode()
        return b"s" + struct.pack("<I", len(data)) + data
    if isinstance(value, bytes):
        return b"b" + struct.pack("<I", len(value)) + value
    if isinstance(value, int):
        data = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
        return b"i" + struct.pack("<I", len(data)) + data
    assert isinstance(value, tuple)
    return b"t" + struct.pack("<I", len(value)) + b"".join(_ref_item(v) for v in value)


def _ref_block(parent: bytes, tokens: list[int], extra: tuple[Any, ...], seed: Any) -> bytes:
    packed = struct.pack(f"<{len(tokens)}I", *tokens)
    message = (
        b"kvtiers.block-hash.v1\x00"
        + _ref_item(seed)
        + parent
        + struct.pack("<I", len(packed))
        + packed
        + _ref_item(extra)
    )
    return hashlib.sha256(message).digest()


def test_matches_the_documented_encoding() -> None:
    root = hashlib.sha256(b"kvtiers.block-hash.v1\x00" + _ref_item(0) + b"root").digest()
    assert NONE_HASH == root == root_hash(DEFAULT_SEED)
    extra = ("lora", 7, b"\x00", ("mm", -1))
    keys = prefix_block_hashes(TOKENS, 16, seed="salt", extra_keys=extra, group=3)
    parent = root_hash("salt")
    for i, key in enumerate(keys):
        parent = _ref_block(parent, TOKENS[16 * i : 16 * (i + 1)], extra, "salt")
        assert key == parent + b"\x00\x00\x00\x03"


def test_known_answer() -> None:
    # Pinned values: if these change, every stored key in every deployment changes.
    assert NONE_HASH.hex() == "912d06638234cf201d72ea9fa340abeeb5b4b4dbec651fef3d75b4e13e359132"
    keys = prefix_block_hashes(list(range(40)), 16)
    assert [k.hex() for k in keys] == [
        "2d3e29de88d88efd4082d8da598798038c6f2a73020b2babad62f3d4d5b2208d00000000",
        "5371ad2db718a7ecb38b8405c296dfd01b4bb11bf145924024e776b2c8ba3da900000000",
    ]


# --- determinism ---------------------------------------------------------------------

_CHILD = """
import sys
from kvtiers.hashing import prefix_block_hashes
keys = prefix_block_hashes(list(range(1000, 1165)), 16, seed="s", extra_keys=("x", 1))
sys.stdout.write(",".join(k.hex() for k in keys))
"""


@pytest.mark.parametrize("hashseed", ["0", "12345", "random"])
def test_same_keys_in_another_process(hashseed: str) -> None:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
    ).stdout
    here = prefix_block_hashes(TOKENS, 16, seed="s", extra_keys=("x", 1))
    assert out.split(",") == [k.hex() for k in here]


def test_list_tuple_array_and_numpy_inputs_agree() -> None:
    expected = prefix_block_hashes(TOKENS, 16)
    assert prefix_block_hashes(tuple(TOKENS), 16) == expected
    assert prefix_block_hashes(range(1000, 1165), 16) == expected
    for dtype in (np.int64, np.int32, np.uint32, np.uint16):
        assert prefix_block_hashes(np.array(TOKENS, dtype=dtype), 16) == expected


# --- structure -----------------------------------------------------------------------


def test_full_blocks_only() -> None:
    assert len(prefix_block_hashes(TOKENS, 16)) == 10
    assert prefix_block_hashes(TOKENS[:15], 16) == []
    assert prefix_block_hashes([], 16) == []
    assert len(prefix_block_hashes(TOKENS, 1)) == len(TOKENS)


def test_seed_changes_every_key() -> None:
    base = prefix_block_hashes(TOKENS, 16)
    for seed in (1, "0", b"0", b"", "kvtiers"):
        other = prefix_block_hashes(TOKENS, 16, seed=seed)
        assert not set(base) & set(other)
    assert len({root_hash(s) for s in (0, 1, "0", b"0", b"")}) == 5
    assert prefix_block_hashes(TOKENS, 16, seed=99) == prefix_block_hashes(TOKENS, 16, seed=99)


def test_chaining() -> None:
    base = prefix_block_hashes(TOKENS, 16)
    early = prefix_block_hashes([TOKENS[0] + 1, *TOKENS[1:]], 16)
    # the first block feeds all the rest
    assert all(a != b for a, b in zip(base, early, strict=True))
    changed = list(TOKENS)
    changed[16 * 4 + 3] += 1  # inside block 4
    late = prefix_block_hashes(changed, 16)
    assert late[:4] == base[:4]
    assert all(a != b for a, b in zip(base[4:], late[4:], strict=True))


def test_block_hash_and_continuation_agree_with_prefix() -> None:
    keys = prefix_block_hashes(TOKENS, 16, extra_keys=("e",))
    parent = NONE_HASH
    for i, key in enumerate(keys):
        parent = block_hash(parent, TOKENS[16 * i : 16 * (i + 1)], ("e",))
        assert key_hash(key) == parent
    head = prefix_block_hashes(TOKENS[:48], 16, extra_keys=("e",))
    tail = prefix_block_hashes(TOKENS[48:], 16, extra_keys=("e",), parent=key_hash(head[-1]))
    assert head + tail == keys


def test_same_block_under_another_parent_gets_another_hash() -> None:
    block = TOKENS[:16]
    assert block_hash(NONE_HASH, block) != block_hash(block_hash(NONE_HASH, block), block)


def test_group_index_is_in_the_key() -> None:
    g0 = prefix_block_hashes(TOKENS, 16, group=0)
    g5 = prefix_block_hashes(TOKENS, 16, group=5)
    assert [key_group(k) for k in g5] == [5] * 10
    assert [key_hash(k) for k in g0] == [key_hash(k) for k in g5]
    assert all(len(k) == HASH_SIZE + 4 for k in g5)
    with pytest.raises(ValueError):
        prefix_block_hashes(TOKENS, 16, group=1 << 32)
    assert key_group(prefix_block_hashes(TOKENS, 16, group=(1 << 32) - 1)[0]) == (1 << 32) - 1
    with pytest.raises(ValueError):
        prefix_block_hashes(TOKENS, 16, group=-1)


# --- extra keys ----------------------------------------------------------------------


def test_extra_keys_change_the_key() -> None:
    plain = prefix_block_hashes(TOKENS, 16)
    assert prefix_block_hashes(TOKENS, 16, extra_keys=()) == plain
    assert prefix_block_hashes(TOKENS, 16, extra_keys=None) == plain
    variants = [
        ("a", "b"),
        ("ab",),
        (("a", "b"),),
        ("a", ("b",)),
        (b"ab",),
        (1,),
        ("1",),
        (-1,),
        (255,),
        (256,),
        (2**100,),
        (-(2**100),),
    ]
    firsts = {prefix_block_hashes(TOKENS, 16, extra_keys=v)[0] for v in variants}
    assert len(firsts) == len(variants)
    assert plain[0] not in firsts


def test_per_block_extra_keys() -> None:
    def salt_first(index: int) -> tuple[str, ...] | None:
        return ("salt",) if index == 0 else None

    salted = prefix_block_hashes(TOKENS, 16, extra_keys=salt_first)
    plain = prefix_block_hashes(TOKENS, 16)
    assert all(a != b for a, b in zip(salted, plain, strict=True))  # the salt reaches every block
    assert key_hash(salted[1]) == block_hash(key_hash(salted[0]), TOKENS[16:32])


def test_encoding_is_unambiguous() -> None:
    pairs = [(("a", "b"), ("ab",)), ((1,), ("1",)), ((b"s",), ("s",)), (((),), ())]
    for left, right in pairs:
        assert encode_extra_keys(left) != encode_extra_keys(right)


@pytest.mark.parametrize(
    "bad",
    [(True,), (1.5,), (None,), (["a"],), ({"a": 1},), (object(),), ("ok", (1, [2])), ["a"], "a"],
)
def test_bad_extra_keys_are_type_errors(bad: Any) -> None:
    with pytest.raises(TypeError):
        prefix_block_hashes(TOKENS, 16, extra_keys=bad)
    with pytest.raises(TypeError):
        block_hash(NONE_HASH, TOKENS[:16], bad)


# --- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [[1, -1], [2**32], np.array([5, -3]), np.array([2**32])])
def test_token_ids_out_of_range(tokens: Any) -> None:
    with pytest.raises(ValueError, match="0..2"):
        prefix_block_hashes(tokens, 1)


@pytest.mark.parametrize("tokens", [[1.0, 2.0], ["a"], np.array([1.0, 2.0])])
def test_token_ids_must_be_integers(tokens: Any) -> None:
    with pytest.raises(TypeError):
        prefix_block_hashes(tokens, 1)


def test_bad_block_size_parent_and_seed() -> None:
    with pytest.raises(ValueError):
        prefix_block_hashes(TOKENS, 0)
    for parent in (b"", b"x" * 31, NONE_HASH + b"\x00\x00", NONE_HASH.hex()):
        with pytest.raises(ValueError, match="parent"):
            block_hash(parent, TOKENS[:16])  # type: ignore[arg-type]
    for seed in (True, 1.0, None, ("a",)):
        with pytest.raises(TypeError):
            prefix_block_hashes(TOKENS, 16, seed=seed)  # type: ignore[arg-type]
