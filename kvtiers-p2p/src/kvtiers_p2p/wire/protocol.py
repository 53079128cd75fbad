"""The wire protocol between peers: every message a msgspec Struct, never pickle.

One ZeroMQ message is one protocol message: its first frame is the msgpack of a
Struct below (an array whose first element is the type tag); a `TransferDone` of
the ZeroMQ data plane is followed by one frame per block it ships.

A session, puller (DEALER) to server (ROUTER):

1. the puller sends `Hello` (protocol version, namespace fingerprint, hash seed,
   block size, capabilities, its data-plane descriptor, its namespace in words
   for a refusal's reason); the server answers
   `Welcome` (the data plane chosen, its keep-alive interval) or `Refused` with a
   reason, which both sides log. Anything but `Hello` from a peer without a
   session gets `Disconnect` ("no session"): the puller says hello again.
2. `Lookup(req, keys)` -> `LookupReply(req, states)`: one state byte per key.
   On the NIXL plane a lookup may ask for a lease (`lease_s`): the server pins the
   keys it holds right away and says their slots and checksums, so the puller's
   load READs them with no fetch round trip; `Landed(req)` or `Abort(req)` of the
   lookup's `req` ends the lease, and the server ends it after `lease_s` anyway
   (a block changed since fails its checksum at the puller: a miss).
3. `Fetch(req, keys, slots)`: ship these blocks into these slots of the puller's
   pool -> `TransferDone(req, states, checksums)` (+ block frames on the ZeroMQ
   data plane). `Abort(req)`: the puller gave up; the server releases what it
   holds for it.
4. `Store(req, keys, checksums)` + one frame per block, to a server that
   `accepts_stores` (a cache node): it verifies and keeps them -> `StoreDone`.
5. `KeepAlive` both ways; a side that hears nothing for its timeout drops the
   session. `Disconnect` ends it at once.

The limits are part of the protocol: a decoder (`kvtiers_p2p.wire.codec`) rejects a
message past them before it is used, so a hostile peer cannot make a side
allocate, pin or touch more than they allow.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from kvtiers.sdk import GROUP_BYTES

__all__ = [
    "MAX_CAPABILITIES",
    "MAX_CONTROL_BYTES",
    "MAX_KEYS",
    "MAX_KEY_BYTES",
    "MAX_SLOTS",
    "PROTOCOL_VERSION",
    "Abort",
    "ClientMessage",
    "DataPlane",
    "Disconnect",
    "ErrorReply",
    "Fetch",
    "Hello",
    "KeepAlive",
    "Landed",
    "Lookup",
    "LookupReply",
    "Refused",
    "ServerMessage",
    "State",
    "Store",
    "StoreDone",
    "Touch",
    "TransferDone",
    "Welcome",
]

#: bumped on any change of a message's fields or meaning; peers of other versions
#: are refused at the handshake
PROTOCOL_VERSION = 4

#: keys in one Lookup or Fetch (one job is at most the manager's max_job_blocks)
MAX_KEYS = 4096
#: a key: a block hash (1..128 bytes; kvtiers' is 32) and the group index
MAX_KEY_BYTES = 128 + GROUP_BYTES
#: slots in a pool a peer may name (2**31 slots of 4 KiB are 8 TiB)
MAX_SLOTS = 1 << 31
MAX_CAPABILITIES = 16
#: the largest control frame either side decodes (MAX_KEYS keys of the largest
#: size with their slots fit, with room to spare); larger frames are dropped unread
MAX_CONTROL_BYTES = 1 << 20

_Key = Annotated[bytes, msgspec.Meta(min_length=GROUP_BYTES + 1, max_length=MAX_KEY_BYTES)]
_Keys = Annotated[list[_Key], msgspec.Meta(max_length=MAX_KEYS)]
_Slot = Annotated[int, msgspec.Meta(ge=0, lt=MAX_SLOTS)]
_Req = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
_U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgpack ints stop at 2**64 - 1
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_SLOTS)]
_Size = Annotated[int, msgspec.Meta(ge=0, lt=1 << 40)]
_Name = Annotated[str, msgspec.Meta(max_length=256)]
_Reason = Annotated[str, msgspec.Meta(max_length=2048)]
_Capabilities = Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]],
                          msgspec.Meta(max_length=MAX_CAPABILITIES)]
#: one byte per key (`State`)
_States = Annotated[bytes, msgspec.Meta(max_length=MAX_KEYS)]
_Seconds = Annotated[float, msgspec.Meta(gt=0, le=3600)]


class State:
    """Per-key state bytes of `LookupReply.states` and `TransferDone.states`."""

    ABSENT = 0  # not held (or not readable) there
    PRESENT = 1  # readable now (lookup) / shipped (transfer)
    PENDING = 2  # being written into the server's pool: ask again soon (lookup)
    REFUSED = 3  # over the puller's pin budget, no room, or not accepted (transfer, store)
    CORRUPT = 4  # a pushed block failed verification on arrival (store)
    HELD = 5  # held there already: kept as it was, nothing copied (store)
    MAX = 5


class _Message(msgspec.Struct, array_like=True, forbid_unknown_fields=True, tag_field="t"):
    """Base of every message: encoded as an array whose first element is the tag."""


class DataPlane(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """How blocks reach a side's pool. `kind` "zmq": in frames after a
    `TransferDone` on the control connection (`endpoint` unused). "nixl": the
    puller READs them from the server's registered pool (`agent_metadata`,
    `base_addr`: the server's, in its Welcome)."""

    kind: Literal["zmq", "nixl"]
    num_slots: _Count
    slot_bytes: _Size
    endpoint: _Name = ""
    agent_metadata: Annotated[bytes, msgspec.Meta(max_length=1 << 18)] = b""
    base_addr: _U64 = 0


class Hello(_Message, tag="hello"):
    """Puller -> server, first message of a session."""

    version: Annotated[int, msgspec.Meta(ge=0, lt=1 << 16)]
    peer_id: _Name
    namespace: _Name  # the fingerprint of the puller's namespace
    hash_seed: _Name
    block_bytes: _Size
    capabilities: _Capabilities  # data planes the puller can use, preferred first
    data_plane: DataPlane
    #: the puller's namespace in words (model, revision, geometry), for the reason
    #: of a refusal; empty from a puller that does not say (named by fingerprint)
    described: _Reason = ""


class Welcome(_Message, tag="welcome"):
    """Server -> puller: the handshake succeeded; `data_plane.kind` is the plane
    chosen, the rest describes the server's side of it."""

    peer_id: _Name
    keepalive_s: _Seconds
    data_plane: DataPlane
    #: blocks one Fetch may ask for (the puller's pin budget here); more are REFUSED
    max_fetch: Annotated[int, msgspec.Meta(ge=1, le=MAX_KEYS)] = MAX_KEYS
    #: the server takes `Store`s into its pool (a `kvtiers serve` cache node)
    accepts_stores: bool = False
    #: with `accepts_stores`: the bytes of blocks its pool holds (what a pushing
    #: tier reports as its capacity)
    capacity_bytes: _Size = 0


class Refused(_Message, tag="refused"):
    """Server -> puller: the handshake failed, and why (both sides log it), worded
    for the puller: "this engine" is the puller, the server is "the node (or peer)
    at ADDRESS"."""

    reason: _Reason


class Lookup(_Message, tag="lookup"):
    """`lease_s` > 0 (NIXL sessions): pin the PRESENT keys for that long (at most
    the server's pin timeout) and say where they are - a lease the puller's load
    READs under; 0: states only."""

    req: _Req
    keys: _Keys
    lease_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0


class LookupReply(_Message, tag="found"):
    """`lease_s` > 0: the PRESENT keys are pinned for that long from when the server
    answered (the lease `req`); `source_slots[j]` and `checksums[j]` are the
    server's slot and the xxh3-64 of the j-th PRESENT block. 0: no lease (both
    lists empty)."""

    req: _Req
    states: _States  # one `State` per key, in order
    lease_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0
    source_slots: Annotated[list[_Slot], msgspec.Meta(max_length=MAX_KEYS)] = (
        msgspec.field(default_factory=list))
    checksums: Annotated[list[_U64], msgspec.Meta(max_length=MAX_KEYS)] = (
        msgspec.field(default_factory=list))


class Fetch(_Message, tag="fetch"):
    """Ship `keys[i]` into slot `slots[i]` of the puller's pool."""

    req: _Req
    keys: _Keys
    slots: Annotated[list[_Slot], msgspec.Meta(max_length=MAX_KEYS)]


class TransferDone(_Message, tag="done"):
    """The end of a `Fetch`: per key a `State`; `checksums[j]` is the xxh3-64 of
    the j-th PRESENT block (kvtiers.sdk.integrity), verified by the puller in its slot
    before the key succeeds. On the ZeroMQ plane, one frame per PRESENT key follows,
    in order; on the NIXL plane, `source_slots` say where the puller reads them."""

    req: _Req
    states: _States
    checksums: Annotated[list[_U64], msgspec.Meta(max_length=MAX_KEYS)]
    #: NIXL plane: the server's slot of the j-th PRESENT block (pinned until the
    #: puller's `Landed`), which the puller READs; no frames follow
    source_slots: Annotated[list[_Slot], msgspec.Meta(max_length=MAX_KEYS)] = (
        msgspec.field(default_factory=list))


class Store(_Message, tag="store"):
    """Puller -> a server that `accepts_stores`: keep these blocks (a cascade into a
    cache node). One frame per key follows, in order; `checksums[i]` is the
    xxh3-64 of block i, verified by the server before it keeps the block."""

    req: _Req
    keys: _Keys
    checksums: Annotated[list[_U64], msgspec.Meta(max_length=MAX_KEYS)]


class StoreDone(_Message, tag="stored"):
    """Per key of a `Store`: PRESENT (copied, held now), HELD (held already, kept as
    it was), REFUSED (no room, or the server takes no stores) or CORRUPT (its bytes
    did not match its checksum). `evicted`: the blocks the server's pool dropped to
    make room for these; `usage_bytes`: the bytes of blocks its pool holds now."""

    req: _Req
    states: _States
    evicted: _Keys = msgspec.field(default_factory=list)
    usage_bytes: _Size = 0


class Touch(_Message, tag="touch"):
    """Puller -> a server that `accepts_stores`: these blocks were used; refresh
    their recency in its pool (no reply; unknown keys are ignored)."""

    keys: _Keys


class Abort(_Message, tag="abort"):
    """Puller -> server: it gave up on `req` (deadline), or does not need the
    lease of lookup `req` any more; a late `TransferDone` for it is dropped. The
    blocks shipped or leased for it are unpinned."""

    req: _Req


class Landed(_Message, tag="landed"):
    """Puller -> server: the blocks of fetch `req` (or leased by lookup `req`) are
    in its slots (verified or not): the server unpins them. Until then they stay
    pinned (at most its pin timeout, or the lease's time): what a lookup called a
    hit stays until the load has read it."""

    req: _Req


class KeepAlive(_Message, tag="ping"):
    """Either way. `reply`: answer with a KeepAlive of the same `seq`."""

    seq: _Req
    reply: bool = False


class Disconnect(_Message, tag="bye"):
    reason: _Reason = ""


class ErrorReply(_Message, tag="error"):
    """Server -> puller: a message was rejected (`req` 0 when it had none)."""

    req: _Req
    reason: _Reason


#: what a server accepts
ClientMessage = (
    Hello | Lookup | Fetch | Store | Touch | Landed | Abort | KeepAlive | Disconnect
)
#: what a puller accepts
ServerMessage = (
    Welcome | Refused | LookupReply | TransferDone | StoreDone | KeepAlive | Disconnect
    | ErrorReply
)
