"""SGLang page hashes as kvtiers keys, one-to-one.

SGLang names each page by a string (a hex digest of the chained token hash). A
kvtiers key is bytes: the block hash, then a 4-byte group index. The hash part is
the page hash, decoded: `0x01` + the digest's bytes for a lowercase hex string of
even length, `0x02` + its UTF-8 bytes for any other string; the tag byte keeps the
two forms apart, so different strings never share a key. The group index says
which part of the page the block holds: a page of an MHA model is two blocks,
its K half (group 0) and its V half (group 1), since SGLang's host pool keeps the
two halves apart; an MLA page is one block (group 0).

Pure functions of the page hash: two processes, or two machines, map one page to
the same keys.
"""

from __future__ import annotations

import string

from kvtiers import BlockKey, make_key

_HEX = frozenset(string.hexdigits.lower())
HEX_TAG = b"\x01"
TEXT_TAG = b"\x02"


def page_hash(page_key: str) -> bytes:
    """The block-hash bytes of SGLang page key `page_key` (a non-empty string)."""
    if not isinstance(page_key, str) or not page_key:
        raise ValueError(f"an SGLang page key is a non-empty string, got {page_key!r:.80}")
    if len(page_key) % 2 == 0 and _HEX.issuperset(page_key):
        return HEX_TAG + bytes.fromhex(page_key)
    return TEXT_TAG + page_key.encode("utf-8", "surrogatepass")


def block_keys(page_key: str, parts: int) -> list[BlockKey]:
    """The kvtiers keys of the page's `parts` blocks (2: K and V; 1: MLA)."""
    digest = page_hash(page_key)
    return [make_key(digest, part) for part in range(parts)]
