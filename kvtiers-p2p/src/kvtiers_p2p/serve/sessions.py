"""What a `PeerServer` keeps per peer and the limits it serves under (the server
thread's state only: nothing here is shared with another thread)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtiers.sdk import BlockKey

__all__ = ["ServeLimits", "Session", "Shipment", "StoreAnswer", "StoreSink"]


@dataclass(frozen=True, slots=True)
class StoreAnswer:
    """What a `StoreSink` did: per key a `State` (PRESENT: copied, HELD: held
    already, REFUSED: no room), the blocks its pool dropped to make room, and the
    bytes of blocks its pool holds now."""

    states: list[int]
    evicted: list[BlockKey] = field(default_factory=list)
    usage_bytes: int = 0


#: where a cache node keeps blocks peers push (`Store`): `sink(keys, blocks)`.
#: Called on the server thread with verified blocks; it copies them before it
#: returns.
StoreSink = Callable[[Sequence[BlockKey], Sequence[memoryview]], StoreAnswer]


@dataclass(frozen=True, slots=True)
class ServeLimits:
    keepalive_s: float = 1.0
    session_timeout_s: float = 5.0
    pin_timeout_s: float = 30.0
    max_pinned_share: float = 0.25
    max_sessions: int = 64


@dataclass(slots=True)
class Shipment:
    """Blocks shipped to a peer for its fetch `req`, pinned until it says they
    landed (`Landed`, or `Abort`), its session ends, or `until` in any case."""

    job_id: int
    blocks: int
    req: int
    until: float


@dataclass(slots=True)
class Session:
    """One peer's session: its pool size (from its Hello), when it was last heard,
    its data plane ("zmq" or "nixl"), how many blocks it holds pinned, and the
    shipments holding them."""

    peer_id: str
    num_slots: int
    heard: float
    plane: str = "zmq"
    pinned: int = 0
    shipments: list[Shipment] = field(default_factory=list)
