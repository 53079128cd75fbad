"""Block content derived from keys: fills and checks are exact, catch a single
flipped byte or another block's bytes, and agree with the canonical slot bytes that
the swapper writes into the pool."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from kvtiers.bench.content import key_words
from kvtiers.bench.engine import PageAllocator, StandInKV
from kvtiers.bench.presets import geometry_from
from kvtiers.swap import DeviceSwapper


def keys(n: int, salt: str = "") -> list[bytes]:
    return [hashlib.sha256(f"{salt}{i}".encode()).digest() + b"\0\0" for i in range(n)]


@pytest.mark.parametrize("layout", ["layer", "cross"])
def test_fill_then_check_is_exact_and_catches_any_wrong_byte(layout: str) -> None:
    geo = geometry_from("tiny")
    kv = StandInKV(geo, 40, torch.device("cpu"), layout)
    ks = keys(12)
    pages = np.random.default_rng(0).permutation(40)[:12]
    kv.content.fill(pages, ks)
    assert kv.content.check(pages, ks) == []
    # Another block's bytes in the right page: caught.
    assert kv.content.check(pages[[1, 0]], ks[:2]) == [0, 1]
    # One flipped byte, anywhere: caught, and only that block.
    frag = kv.tensor.view(torch.uint8)
    if layout == "layer":
        frag[1, 0, int(pages[5]), 3, 1, 7] ^= 1  # layer 1, K, page, token 3, head 1
    else:
        frag[int(pages[5]), 1, 0, 3, 1, 7] ^= 1
    assert kv.content.check(pages, ks) == [5]


def test_poison_makes_a_skipped_copy_visible() -> None:
    kv = StandInKV(geometry_from("tiny"), 8, torch.device("cpu"))
    ks = keys(4)
    pages = np.arange(4)
    kv.content.fill(pages, ks)
    kv.content.poison(pages[:2])  # a load that never happened leaves the poison
    assert kv.content.check(pages, ks) == [0, 1]


def test_pool_slots_hold_the_canonical_bytes_of_the_key() -> None:
    geo = geometry_from("tiny", layers=3)
    kv = StandInKV(geo, 16, torch.device("cpu"), "layer")
    pool = torch.zeros(8, 8192 * 2, dtype=torch.uint8)
    ks = keys(5, "p")
    pages = np.array([9, 2, 14, 0, 7])
    kv.content.fill(pages, ks)
    with DeviceSwapper(kv.layout, pool) as swap:
        swap.submit_store(1, pages, np.arange(5), keys=ks)
        assert swap.wait([1], timeout=30)
        (result,) = swap.get_finished()
        assert result.success
    for slot, key in enumerate(ks):
        expected = kv.content.expected_block(key)
        assert np.array_equal(pool[slot, : geo.block_bytes].numpy(), expected)


def test_key_words_handle_mixed_lengths_like_uniform_ones() -> None:
    ks = keys(3)
    uniform = key_words(ks)
    mixed = key_words([ks[0], ks[1] + b"x", ks[2]])
    assert uniform.tolist() == mixed.tolist()
    assert uniform[0] == int.from_bytes(ks[0][:8], "little", signed=True)


def test_page_allocator_reuses_freed_pages_last() -> None:
    alloc = PageAllocator(6)
    a = alloc.alloc(4)
    assert a is not None and a.tolist() == [0, 1, 2, 3] and alloc.free == 2
    assert alloc.alloc(3) is None
    alloc.release(a[:2])
    b = alloc.alloc(4)
    assert b is not None and b.tolist() == [4, 5, 0, 1]  # FIFO: the freshly freed pages come last
    with pytest.raises(AssertionError):
        alloc.release(np.arange(7))
