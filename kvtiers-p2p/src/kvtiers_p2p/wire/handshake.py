"""The handshake: who a side is, and why a peer is refused.

Two sides exchange blocks only when a key means the same bytes on both: the same
protocol version, namespace fingerprint (model, revision, geometry, format
version), hash seed and block size. A mismatch is refused with a reason that names
both sides' values - the namespaces in words (model, revision, geometry), not only
their fingerprints - so that a cross-seed or cross-model peer is a logged refusal
a user can act on, never a silent 0% hit rate.

Each side reads the reason in its own words (`Refusal`): the server logs the
puller as "peer 'ID'" and itself as "this node" (or "this engine"); the puller
gets, in `Refused`, itself as "this engine" and the server as "the node at
ADDRESS".

The seed itself never travels: `seed_fingerprint` sends a digest of it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvtiers.sdk import Namespace

from kvtiers_p2p.wire.protocol import PROTOCOL_VERSION, DataPlane, Hello

__all__ = ["Identity", "Refusal", "choose_plane", "describe_namespace", "refusal",
           "seed_fingerprint"]

#: the longest namespace description a side sends (a Hello's field holds 2048)
_DESCRIBED_MAX = 600
#: the longest reason a `Refused` carries (its field holds 2048)
REASON_MAX = 2048
#: the namespace `kvtiers bench` stores its blocks under (kvtiers.bench.stack, not
#: imported: a tier sees the core through its faces only) - a node of another
#: model is the usual reason a bench's p2p tier is refused, so its reason says how
_BENCH_MODEL = "kvtiers-bench"
_BENCH_REVISION = "content-v1"


def seed_fingerprint(seed: str) -> str:
    """What a Hello carries for the hash seed: 16 hex digits of its SHA-256."""
    return hashlib.sha256(b"kvtiers-p2p.seed\x00" + seed.encode()).hexdigest()[:16]


def describe_namespace(namespace: Namespace) -> str:
    """`namespace` in the words a user compares and the flags `kvtiers serve` takes:
    "model M revision R, geometry layers=32 kv_heads=8 head_size=128
    dtype=bfloat16 tokens_per_block=16 tp_size=1, format 2"."""
    geometry = " + ".join(
        f"layers={g.layers} kv_heads={g.kv_heads} head_size={g.head_size} "
        f"dtype={g.dtype} tokens_per_block={g.tokens_per_block} tp_size={g.tp_size}"
        for g in namespace.groups)
    text = (f"model {namespace.model} revision {namespace.revision or '(none)'}, "
            f"geometry {geometry}, format {namespace.format_version}")
    return text if len(text) <= _DESCRIBED_MAX else text[:_DESCRIBED_MAX - 3] + "..."


@dataclass(frozen=True, slots=True)
class Identity:
    """What one side tells the other about itself.

    `capabilities`: the data planes this side can use, preferred first
    ("nixl", "zmq"). `described`: its namespace in words (`describe_namespace`),
    for refusals; empty: named by its fingerprint."""

    peer_id: str
    namespace: str  # fingerprint
    hash_seed: str  # `seed_fingerprint` of the seed
    block_bytes: int
    capabilities: tuple[str, ...]
    described: str = ""

    def hello(self, plane: DataPlane) -> Hello:
        return Hello(PROTOCOL_VERSION, self.peer_id, self.namespace, self.hash_seed,
                     self.block_bytes, list(self.capabilities), plane, self.described)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a server refuses a puller, worded for each side: `for_server` (the
    server's log: "peer 'ID'" and "this node"), `for_puller` (sent in `Refused`:
    "this engine" and "the node at ADDRESS")."""

    for_server: str
    for_puller: str


def choose_plane(ours: tuple[str, ...], theirs: list[str]) -> str | None:
    """The data plane of a session: the puller's most preferred one that the
    server has too; None when they share none."""
    for kind in theirs:
        if kind in ours:
            return kind
    return None


def refusal(ours: Identity, hello: Hello, *, endpoint: str = "",
            node: bool = False) -> Refusal | None:
    """Why the server `ours` (listening on `endpoint`; `node`: a `kvtiers serve`
    cache node, else an engine) refuses the puller that sent `hello`; None:
    accepted. Each wording names both sides' values (the seed by its
    fingerprint, a namespace in words)."""
    what = "node" if node else "engine"
    at = f" at {endpoint}" if endpoint else ""
    for_server = _mismatch(ours, hello, puller=f"peer {hello.peer_id[:100]!r}",
                           server=f"this {what}")
    if for_server is None:
        return None
    for_puller = _mismatch(ours, hello, puller="this engine",
                           server=f"the {'node' if node else 'peer'}{at}")
    assert for_puller is not None
    return Refusal(for_server, for_puller[:REASON_MAX])


def _mismatch(ours: Identity, hello: Hello, *, puller: str, server: str) -> str | None:
    """The first check `hello` fails against `ours`, with the sides named `puller`
    and `server`; None when it passes them all."""
    if hello.version != PROTOCOL_VERSION:
        return (f"protocol version mismatch: {puller} speaks version {hello.version}; "
                f"{server}, version {PROTOCOL_VERSION}: upgrade the older side")
    if hello.namespace != ours.namespace:
        of_puller = hello.described or f"namespace {hello.namespace} (not described)"
        of_server = ours.described or f"namespace {ours.namespace} (not described)"
        if of_puller == of_server:  # what the words leave out differs: the fingerprints
            of_puller = f"{of_puller} (namespace {hello.namespace})"
            of_server = f"{of_server} (namespace {ours.namespace})"
        hint = ""
        if f"model {_BENCH_MODEL} revision" in of_puller + of_server:
            hint = (f" (`kvtiers bench` runs as model {_BENCH_MODEL} revision "
                    f"{_BENCH_REVISION}: serve it with `kvtiers serve --model "
                    f"{_BENCH_MODEL} --revision {_BENCH_REVISION}` and the bench's "
                    "geometry; docs/tiers/p2p.md)")
        return (f"namespace mismatch: {puller}: {of_puller}; {server}: {of_server}. A "
                "key of one names other bytes in the other, so nothing is exchanged: "
                f"give both the same model, revision and KV geometry{hint}")
    if hello.hash_seed != ours.hash_seed:
        return (f"hash seed mismatch: {puller} hashes with seed fingerprint "
                f"{hello.hash_seed}; {server}, with {ours.hash_seed}: the same tokens "
                "make other keys on each side (every lookup would miss); set one "
                "hash_seed on every engine and node")
    if hello.block_bytes != ours.block_bytes:
        return (f"block size mismatch: {puller} has blocks of {hello.block_bytes} "
                f"bytes; {server}, of {ours.block_bytes}")
    if hello.data_plane.slot_bytes and hello.data_plane.slot_bytes < hello.block_bytes:
        return (f"{puller} describes slots of {hello.data_plane.slot_bytes} bytes for "
                f"blocks of {hello.block_bytes}")
    if choose_plane(ours.capabilities, hello.capabilities) is None:
        return (f"no common data plane: {puller} offers "
                f"{', '.join(hello.capabilities) or 'none'}; {server}, "
                f"{', '.join(ours.capabilities)}")
    return None
