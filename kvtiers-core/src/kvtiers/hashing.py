"""The chained block hash: a block's hash covers its parent's hash, its token ids and
its extra keys, so one hash names a whole prefix.

Same tokens, same seed -> same keys in every process, on every machine and Python
version: nothing here uses the builtin `hash()` (salted per process), pickle or
`repr`. Everything hashed has one canonical byte encoding:

- the seed and extra keys: a tagged, length-prefixed encoding of `str` (UTF-8),
  `bytes` (or bytearray), `int` (any size, two's complement) and tuples of these
  (extra keys only), nested freely.
  Anything else - bool, float, None inside a tuple, list, dict, objects - is a
  `TypeError`: their byte form is either ambiguous (True == 1) or not canonical.
- token ids: little-endian uint32, so ids must be in 0..2**32-1 (`ValueError`).

Why SHA-256 and not xxhash: a key collision would make a hit serve another prefix's
KV bytes, and the block checksum cannot catch that (the bytes are intact, just not
ours). Prompts come from users, so collisions must be hard to find on purpose, not
just unlikely by chance: that needs a cryptographic hash. The price is small: a
16-token block is ~100 bytes, and `prefix_block_hashes` does up to ~2 M blocks/s
(0.3 ms for a 10 000-token prompt, one core with SHA-NI), about a third of what
xxh3 would do, and far less than recomputing the prefix it finds.

The seed is mixed into every block hash, and `NONE_HASH` - the parent of a prefix's
first block - is derived from it too: changing the seed changes every key.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Union

from kvtiers.contract.keys import BlockKey, make_key

if TYPE_CHECKING:
    from _hashlib import HASH

    import numpy as np
    import numpy.typing as npt

HASH_SIZE = 32  # bytes of a block hash (SHA-256 digest)

# Bumped if the encoding ever changes, so old and new keys cannot meet.
_DOMAIN = b"kvtiers.block-hash.v1\x00"

ExtraKey = str | bytes | int | tuple[Any, ...]  # tuples of ExtraKey, nested
ExtraKeys = tuple[ExtraKey, ...] | None
Seed = int | str | bytes
# numpy is only named for type checkers (importing it would slow the CLI's start), and
# a string cannot be an operand of `|` at run time: hence Union.
TokenIds = Union[Sequence[int], "npt.NDArray[np.integer[Any]]"]

DEFAULT_SEED: Seed = 0

if array("I").itemsize != 4:  # pragma: no cover - true on every CPython platform we know
    raise ImportError("kvtiers.hashing needs a 4-byte C unsigned int")
_BIG_ENDIAN = sys.byteorder == "big"


def _encode(value: Any, out: bytearray) -> None:
    """Append the canonical encoding of one extra key to `out`."""
    # Check bool before int: bool is an int subclass, and True must not equal 1 here.
    if isinstance(value, bool) or value is None:
        raise TypeError(f"extra keys must be str, bytes, int or tuples of them, not {value!r}")
    if isinstance(value, str):
        data = value.encode("utf-8")
        out += b"s" + len(data).to_bytes(4, "little") + data
    elif isinstance(value, (bytes, bytearray)):
        out += b"b" + len(value).to_bytes(4, "little") + value
    elif isinstance(value, int):
        data = int(value).to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
        out += b"i" + len(data).to_bytes(4, "little") + data
    elif isinstance(value, tuple):
        out += b"t" + len(value).to_bytes(4, "little")
        for item in value:
            _encode(item, out)
    else:
        raise TypeError(
            f"extra keys must be str, bytes, int or tuples of them, not {type(value).__name__}"
        )


def encode_extra_keys(extra_keys: ExtraKeys) -> bytes:
    """Canonical bytes of a block's extra keys; `None` and `()` are the same."""
    if extra_keys is None:
        extra_keys = ()
    if not isinstance(extra_keys, tuple):
        raise TypeError(f"extra_keys must be a tuple or None, not {type(extra_keys).__name__}")
    out = bytearray()
    _encode(extra_keys, out)
    return bytes(out)


@lru_cache(maxsize=16, typed=True)
def _seeded(seed: Seed) -> HASH:
    """A SHA-256 state that has absorbed the domain and the seed; copied per block."""
    if not isinstance(seed, (int, str, bytes)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, str or bytes, not {type(seed).__name__}")
    out = bytearray(_DOMAIN)
    _encode(seed, out)
    return hashlib.sha256(out)


def root_hash(seed: Seed = DEFAULT_SEED) -> bytes:
    """The parent hash of a prefix's first block under `seed`."""
    h = _seeded(seed).copy()
    h.update(b"root")
    return h.digest()


NONE_HASH = root_hash(DEFAULT_SEED)


def token_bytes(token_ids: TokenIds) -> bytes:
    """Token ids as little-endian uint32. Takes any sequence of ints; a numpy integer
    array is converted without a Python loop."""
    ids: Any = token_ids
    if hasattr(ids, "dtype") and hasattr(ids, "astype"):  # numpy, without importing it
        if ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, not dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):
            raise ValueError("token ids must be in 0..2**32-1")
        data: bytes = ids.astype("<u4").tobytes()
        return data
    try:
        packed = array("I", ids)
    except OverflowError as exc:
        raise ValueError(f"token ids must be in 0..2**32-1 ({exc})") from None
    if _BIG_ENDIAN:  # pragma: no cover - no big-endian CI
        packed.byteswap()
    return packed.tobytes()


def _check_parent(parent: bytes) -> None:
    if not isinstance(parent, bytes) or len(parent) != HASH_SIZE:
        raise ValueError(
            f"parent must be a {HASH_SIZE}-byte block hash (a key's hash part: "
            f"kvtiers.contract.keys.key_hash), got {parent!r:.60}"
        )


def block_hash(
    parent: bytes,
    token_ids: TokenIds,
    extra_keys: ExtraKeys = (),
    seed: Seed = DEFAULT_SEED,
) -> bytes:
    """Hash of one block whose predecessor hashes to `parent` (`root_hash(seed)`, i.e.
    `NONE_HASH` for the default seed, for a prefix's first block).

    The message is seed state + parent + len(token bytes) + token bytes + extra keys.
    The parent has a fixed size and the rest is length-prefixed or tagged, so it
    parses one way only: distinct inputs are distinct messages."""
    _check_parent(parent)
    packed = token_bytes(token_ids)
    h = _seeded(seed).copy()
    h.update(parent)
    h.update(len(packed).to_bytes(4, "little"))
    h.update(packed)
    h.update(encode_extra_keys(extra_keys))
    return h.digest()


def prefix_block_hashes(
    token_ids: TokenIds,
    block_size: int,
    *,
    seed: Seed = DEFAULT_SEED,
    extra_keys: ExtraKeys | Callable[[int], ExtraKeys] = None,
    group: int = 0,
    parent: bytes | None = None,
) -> list[BlockKey]:
    """Keys of the full blocks of `token_ids` in KV group `group` (a trailing partial
    block gets no key); the same hashes as chaining `block_hash` block by block.

    `extra_keys` is one tuple for every block, or a function of the block index
    (0 = the first block hashed here) returning that block's extra keys: multimodal
    inputs, a salt on the first block only. `parent` continues a chain: the hash of
    the block just before `token_ids[0]` (default `root_hash(seed)`).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    seeded = _seeded(seed)
    if parent is None:
        parent = root_hash(seed)
    _check_parent(parent)
    packed = token_bytes(token_ids)
    step = 4 * block_size
    header = step.to_bytes(4, "little")  # every full block has the same length prefix
    # make_key's layout, computed once: one bytes concatenation per block beats a call
    suffix = make_key(b"\x00", group)[1:]
    extras_of: Callable[[int], ExtraKeys] | None = None
    if callable(extra_keys):
        extras_of, extra = extra_keys, b""
    else:
        extra = encode_extra_keys(extra_keys)
    keys: list[BlockKey] = []
    for i in range(len(packed) // step):
        if extras_of is not None:
            extra = encode_extra_keys(extras_of(i))
        # block_hash's message, inlined: this loop runs for every block of every
        # prompt, and the calls cost a third of its time.
        h = seeded.copy()
        h.update(parent)
        h.update(header)
        h.update(packed[i * step : (i + 1) * step])
        h.update(extra)
        parent = h.digest()
        keys.append(parent + suffix)
    return keys
