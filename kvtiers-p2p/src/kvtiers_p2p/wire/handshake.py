"""The handshake: who a side is, and why a peer is refused.

Two sides exchange blocks only when a key means the same bytes on both: the same
protocol version, namespace fingerprint (model, geometry, format version), hash
seed and block size. A mismatch is refused with a reason that names both values,
so that a cross-seed peer is a logged refusal, never a silent 0% hit rate.

The seed itself never travels: `seed_fingerprint` sends a digest of it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvtiers_p2p.wire.protocol import PROTOCOL_VERSION, DataPlane, Hello

__all__ = ["Identity", "choose_plane", "refusal", "seed_fingerprint"]


def seed_fingerprint(seed: str) -> str:
    """What a Hello carries for the hash seed: 16 hex digits of its SHA-256."""
    return hashlib.sha256(b"kvtiers-p2p.seed\x00" + seed.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Identity:
    """What one side tells the other about itself.

    `capabilities`: the data planes this side can use, preferred first
    ("nixl", "zmq")."""

    peer_id: str
    namespace: str  # fingerprint
    hash_seed: str  # `seed_fingerprint` of the seed
    block_bytes: int
    capabilities: tuple[str, ...]

    def hello(self, plane: DataPlane) -> Hello:
        return Hello(PROTOCOL_VERSION, self.peer_id, self.namespace, self.hash_seed,
                     self.block_bytes, list(self.capabilities), plane)


def choose_plane(ours: tuple[str, ...], theirs: list[str]) -> str | None:
    """The data plane of a session: the puller's most preferred one that the
    server has too; None when they share none."""
    for kind in theirs:
        if kind in ours:
            return kind
    return None


def refusal(ours: Identity, hello: Hello) -> str | None:
    """Why the server `ours` refuses the puller that sent `hello`; None: accepted.
    The reason names the field and both values (the seed by its fingerprint)."""
    them = f"peer {hello.peer_id!r}"
    if hello.version != PROTOCOL_VERSION:
        return (f"protocol version mismatch: {them} speaks version {hello.version}, "
                f"this side {PROTOCOL_VERSION}; upgrade one side")
    if hello.namespace != ours.namespace:
        return (f"namespace mismatch: {them} has {hello.namespace}, this side "
                f"{ours.namespace} (another model, revision, block geometry or format "
                "version): their keys name other bytes, so nothing is exchanged")
    if hello.hash_seed != ours.hash_seed:
        return (f"hash seed mismatch: {them} hashes with seed fingerprint "
                f"{hello.hash_seed}, this side {ours.hash_seed}: the same tokens make "
                "other keys on each side (every lookup would miss); set one hash_seed "
                "on every engine")
    if hello.block_bytes != ours.block_bytes:
        return (f"block size mismatch: {them} has blocks of {hello.block_bytes} bytes, "
                f"this side {ours.block_bytes}")
    if hello.data_plane.slot_bytes and hello.data_plane.slot_bytes < hello.block_bytes:
        return (f"{them} describes slots of {hello.data_plane.slot_bytes} bytes for "
                f"blocks of {hello.block_bytes}")
    if choose_plane(ours.capabilities, hello.capabilities) is None:
        return (f"no common data plane: {them} offers {', '.join(hello.capabilities) or 'none'}, "
                f"this side {', '.join(ours.capabilities)}")
    return None
