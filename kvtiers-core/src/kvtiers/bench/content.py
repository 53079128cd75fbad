"""What a block holds in the bench: bytes derived from its key, so that every block
loaded back can be checked against what was stored without keeping a copy.

A block's canonical bytes are `[layer][K, V][token][kv_head][head_dim]`; the bench
sees them as `F = 2 * layers` fragments (one per layer and K/V) of `W` words each.
Block `key` holds, in fragment `f`, word `i`:

    base[f, i] XOR h(key)

where `base` is one random buffer of a block's size (drawn once from a fixed seed)
and `h(key)` the key's first 8 bytes as a 64-bit word (the key is a SHA-256 hash).
So two blocks differ in every word, a block's words differ from each other (base is
random), and a single flipped bit anywhere shows. The same formula holds in the
engine's paged cache (a page's fragment is contiguous there) and in a pool slot.

Cost: one pass of writing to fill a job's pages, one gather + XORs + a reduction to
check them, vectorised over the whole job in chunks of a few MiB (so temporaries
stay in cache): ~10-17 GB/s on one core here, no Python loop over bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtiers.contract.keys import BlockKey
from kvtiers.extras import BENCH_EXTRA, missing_torch

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc

# Bytes handled per vectorised step: big enough to amortise the call, small enough
# for the temporaries to stay in the CPU's caches.
CHUNK_BYTES = 4 << 20
CUDA_CHUNK_BYTES = 256 << 20
# Written into the first and last word of each fragment of a page before a load into
# it, so that a copy that silently skipped a fragment cannot pass on stale bytes
# that happened to be right (pages are reused; the same block may have been there).
POISON = -0x5A5A5A5A5A5A5A5B

_WORD_DTYPES = {
    8: (np.int64, torch.int64),
    4: (np.int32, torch.int32),
    2: (np.int16, torch.int16),
    1: (np.uint8, torch.uint8),
}


def key_words(keys: Sequence[BlockKey], dtype: Any = np.int64) -> np.ndarray:
    """h(key) of each key: its first 8 bytes (little-endian), as `dtype` words."""
    n = len(keys)
    if n == 0:
        return np.empty(0, dtype)
    width = len(keys[0])
    if width >= 8 and all(len(k) == width for k in keys):
        raw = np.frombuffer(b"".join(keys), np.uint8).reshape(n, width)[:, :8]
        words = np.ascontiguousarray(raw).view("<i8").reshape(n)
    else:  # keys of mixed or short length: slower, still correct
        words = np.array(
            [int.from_bytes(bytes(k[:8]).ljust(8, b"\0"), "little", signed=True) for k in keys],
            np.int64,
        )
    return words.astype(dtype, copy=False) if dtype is not np.int64 else words


class BlockContent:
    """Fills and checks blocks in a paged KV cache `[fragments, pages, fragment_bytes]`
    (any dtype; viewed as words). `seed` draws `base`."""

    def __init__(self, kv: torch.Tensor, seed: int = 0):
        if kv.dim() != 3:
            raise ValueError("kv must be [fragments, pages, fragment elements]")
        frag_bytes = kv.shape[2] * kv.element_size()
        word = math.gcd(frag_bytes, 8)
        np_dtype, torch_dtype = _WORD_DTYPES[word]
        self.word_bytes = word
        self.np_dtype = np_dtype
        # dtype views only (no reshape), so a strided view (a cross-layer cache seen
        # as [fragments, pages, ...]) works as well as a contiguous one.
        u8 = kv.view(torch.uint8)
        self.words = u8.view(torch_dtype) if word > 1 else u8
        self.device = kv.device
        self.fragments, self.num_pages, self.width = self.words.shape
        self.block_bytes = self.fragments * frag_bytes
        gen = np.random.default_rng(seed)
        base = gen.integers(0, 256, self.fragments * frag_bytes, dtype=np.uint8)
        self.base_np = base.view(np_dtype).reshape(self.fragments, self.width)
        self.cuda = kv.device.type == "cuda"
        if self.cuda:
            self.base_t = torch.from_numpy(self.base_np.copy()).to(kv.device)
        else:
            self.words_np = self.words.numpy()
        self._per_chunk = max(
            1, (CUDA_CHUNK_BYTES if self.cuda else CHUNK_BYTES) // self.block_bytes
        )

    # ------------------------------------------------------------------ filling

    def fill(self, pages: np.ndarray, keys: Sequence[BlockKey]) -> None:
        """Write each key's content into its page (`pages[i]` holds `keys[i]`)."""
        if len(keys) == 0:
            return
        h = key_words(keys, self.np_dtype)
        step = self._per_chunk
        for i in range(0, len(h), step):  # chunks of the job, not blocks
            p, hh = pages[i : i + step], h[i : i + step]
            if self.cuda:
                pt = torch.from_numpy(np.ascontiguousarray(p)).to(self.device)
                ht = torch.from_numpy(hh.copy()).to(self.device)
                src = self.base_t[:, None, :] ^ ht[None, :, None]
                self.words.index_copy_(1, pt, src)
            else:
                self.words_np[:, p, :] = self.base_np[:, None, :] ^ hh[None, :, None]

    def poison(self, pages: np.ndarray) -> None:
        """Mark the first and last word of each fragment of `pages` (before a load)."""
        if len(pages) == 0:
            return
        value = np.array(POISON, np.int64).astype(self.np_dtype)[()]
        if self.cuda:
            pt = torch.from_numpy(np.ascontiguousarray(pages)).to(self.device)
            self.words[:, pt, 0] = int(value)
            self.words[:, pt, -1] = int(value)
        else:
            self.words_np[:, pages, 0] = value
            self.words_np[:, pages, -1] = value

    # ------------------------------------------------------------------ checking

    def check(self, pages: np.ndarray, keys: Sequence[BlockKey]) -> list[int]:
        """Indices `i` whose page `pages[i]` does not hold exactly `keys[i]`'s bytes."""
        if len(keys) == 0:
            return []
        h = key_words(keys, self.np_dtype)
        bad: list[np.ndarray] = []
        step = self._per_chunk
        for i in range(0, len(h), step):
            p, hh = pages[i : i + step], h[i : i + step]
            if self.cuda:
                pt = torch.from_numpy(np.ascontiguousarray(p)).to(self.device)
                ht = torch.from_numpy(hh.copy()).to(self.device)
                got = self.words.index_select(1, pt)
                got ^= self.base_t[:, None, :]
                got ^= ht[None, :, None]
                wrong: Any = got.ne(0).any(dim=2).any(dim=0).cpu().numpy()
            else:
                sel = self.words_np[:, p, :]  # a copy (gather)
                np.bitwise_xor(sel, self.base_np[:, None, :], out=sel)
                np.bitwise_xor(sel, hh[None, :, None], out=sel)
                wrong = sel.any(axis=(0, 2))
            if wrong.any():
                bad.append(np.flatnonzero(wrong) + i)
        return np.concatenate(bad).tolist() if bad else []

    def expected_block(self, key: BlockKey) -> np.ndarray:
        """The canonical bytes of `key`'s block (tests, pool checks)."""
        h = key_words([key], self.np_dtype)[0]
        block: np.ndarray = (self.base_np ^ h).view(np.uint8).reshape(-1)
        return block
