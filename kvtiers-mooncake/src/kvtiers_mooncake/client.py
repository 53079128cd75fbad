"""`StoreClient`: one tier's Mooncake client - set up, the pool registered once,
and the batch calls the tier makes, behind the tier's breaker.

Zero-copy: the whole CPU pool is registered with Mooncake (`register_buffer`) at
start-up, and so is a small header area of `record.AREA_BYTES` per pool slot. A
store is one `batch_put_from_multi_buffers` call per unit of a job: each object
is gathered from its header (in the slot's area) and its block (in the slot); a
load is one `batch_get_into_multi_buffers` that scatters each object back the
same way. No block byte is copied by kvtiers.

Return codes are Mooncake's (`ErrorCode`): the ones the tier acts on are named
here. Calls block, bounded by Mooncake's RPC time-out (`MC_RPC_TIMEOUT_MS`, 60 s
unless set): a connection is set up with it at the tier's `timeout_s` unless the
environment sets it, so a master that stops answering (frozen, partitioned) fails a
call within `timeout_s` instead of a minute. They run on the tier's I/O threads,
never the scheduler's. `close` once, after the I/O threads stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from kvtiers.sdk import PoolView

from kvtiers_mooncake import record
from kvtiers_mooncake.breaker import Breaker
from kvtiers_mooncake.native import load_store_module
from kvtiers_mooncake.settings import MooncakeSettings

__all__ = ["EXISTS", "HAS_LEASE", "NOT_FOUND", "NOT_READY", "NO_SPACE", "BreakerOpen",
           "StartFailed", "StoreClient", "close_connections", "connect", "failure_of"]

NO_SPACE = -200  # NO_AVAILABLE_HANDLE: no segment has room
BAD_PARAMS = -600  # INVALID_PARAMS: a buffer smaller than the object, ...
NOT_READY = -703  # REPLICA_IS_NOT_READY: its put has not ended
NOT_FOUND = -704  # OBJECT_NOT_FOUND
EXISTS = -705  # OBJECT_ALREADY_EXISTS
HAS_LEASE = -706  # OBJECT_HAS_LEASE: read recently; a remove must wait
TRANSFER_FAIL = -800  # the bytes did not move (segment owner gone, sizes differ)
RPC_FAIL = -900  # the master did not answer
TENANT_QUOTA = -1700  # TENANT_QUOTA_EXCEEDED (a multi-tenant master)
TENANT_UNKNOWN = -1701  # TENANT_NOT_REGISTERED: not in the master's tenant quota policy
#: Mooncake reads its RPC time-out from the environment when a client is set up
RPC_TIMEOUT_ENV = "MC_RPC_TIMEOUT_MS"

_NAMES = {NO_SPACE: "no space", BAD_PARAMS: "invalid parameters", NOT_FOUND: "not found",
          NOT_READY: "not ready",
          EXISTS: "exists", HAS_LEASE: "has a lease", TRANSFER_FAIL: "transfer failed",
          RPC_FAIL: "master unreachable", TENANT_QUOTA: "tenant quota exceeded",
          TENANT_UNKNOWN: "tenant not registered with the master"}


def failure_of(code: int) -> str:
    """A short name of a Mooncake return code, for error counts."""
    return f"{_NAMES.get(code, 'error')} ({code})"


class BreakerOpen(Exception):
    """The breaker refused the call (the store was away moments ago)."""


class StartFailed(Exception):
    """Mooncake's `setup` (or a registration) returned an error code."""


class _Connection:
    """One `MooncakeDistributedStore`, set up once per process and set of options
    (`connect`), shared by the tiers that use them. Mooncake's `close` joins
    threads that sleep a second at a time and holds the GIL meanwhile (~2 s), so
    a connection no tier uses stays open for the next tier with the same options
    and is closed at exit. Registrations are counted per address."""

    def __init__(self, settings: MooncakeSettings):
        store_mod = load_store_module()
        self.store: Any = store_mod.MooncakeDistributedStore()
        with _rpc_timeout(settings.timeout_s):
            code = self.store.setup(
                settings.local_hostname, settings.metadata_server, settings.segment_bytes,
                settings.buffer_bytes, settings.protocol, settings.rdma_devices,
                settings.master_address, tenant_id=settings.tenant)
        if code != 0:
            raise StartFailed(f"setup against master {settings.master_address} returned "
                              f"{failure_of(code)}")
        self.hostname = str(self.store.get_hostname())
        self.config = store_mod.ReplicateConfig()
        self.config.replica_num = settings.replicas
        if settings.prefer_local_segment and settings.segment_bytes > 0:
            self.config.preferred_segment = self.hostname
        self._lock = threading.Lock()
        self._registered: dict[int, int] = {}  # address -> registrations

    def register(self, address: int, nbytes: int) -> None:
        with self._lock:
            if address not in self._registered:
                code = self.store.register_buffer(address, nbytes)
                if code != 0:
                    raise StartFailed(f"register_buffer of {nbytes} bytes returned "
                                      f"{failure_of(code)}")
            self._registered[address] = self._registered.get(address, 0) + 1

    def idle(self) -> bool:
        """No memory of any tier is registered with it."""
        with self._lock:
            return not self._registered

    def unregister(self, address: int) -> None:
        with self._lock:
            left = self._registered.get(address, 0) - 1
            if left > 0:
                self._registered[address] = left
            elif address in self._registered:
                del self._registered[address]
                self.store.unregister_buffer(address)


@contextlib.contextmanager
def _rpc_timeout(timeout_s: float) -> Iterator[None]:
    """`MC_RPC_TIMEOUT_MS` at `timeout_s` while a client is set up, unless the
    environment sets it (callers hold `_connections_lock`: one setup at a time)."""
    if RPC_TIMEOUT_ENV in os.environ:
        yield
        return
    os.environ[RPC_TIMEOUT_ENV] = str(max(1, round(timeout_s * 1000)))
    try:
        yield
    finally:
        os.environ.pop(RPC_TIMEOUT_ENV, None)


_connections: dict[tuple[Any, ...], _Connection] = {}
_connections_lock = threading.Lock()


def _options_key(settings: MooncakeSettings) -> tuple[Any, ...]:
    return (settings.local_hostname, settings.metadata_server, settings.segment_bytes,
            settings.buffer_bytes, settings.protocol, settings.rdma_devices,
            settings.master_address, settings.tenant, settings.replicas,
            settings.prefer_local_segment, settings.timeout_s)


def connect(settings: MooncakeSettings) -> _Connection:
    """This process's connection for `settings`' options (set up on first use)."""
    key = _options_key(settings)
    with _connections_lock:
        conn = _connections.get(key)
        if conn is None:
            conn = _Connection(settings)
            _connections[key] = conn
        return conn


def close_connections(master_address: str | None = None) -> int:
    """Close this process's connections (to one master, or all) that no tier
    has registered memory with; returns how many. Each takes Mooncake ~2 s, with
    the GIL held. Called at exit; tests call it before they stop a master."""
    with _connections_lock:
        doomed = [(k, c) for k, c in _connections.items()
                  if (master_address is None or k[6] == master_address) and c.idle()]
        for key, _ in doomed:
            del _connections[key]
    for _, conn in doomed:
        conn.store.close()
    return len(doomed)


atexit.register(close_connections)


class StoreClient:
    """One tier's view of its connection: its pool and header area registered.
    Built on the tier's constructor thread; every other method from any thread."""

    def __init__(self, settings: MooncakeSettings, pool: PoolView, breaker: Breaker):
        self.settings = settings
        self.breaker = breaker
        self.conn = connect(settings)
        self._store = self.conn.store
        self.hostname = self.conn.hostname
        self.config = self.conn.config
        self.pool = pool
        self.pool_address = pool.address
        self.slot_bytes = pool.slot_bytes
        size = max(pool.num_slots * record.AREA_BYTES, mmap.PAGESIZE)
        self.area = mmap.mmap(-1, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
        self.area_view = memoryview(self.area)
        self.area_address = PoolView(self.area, mmap.PAGESIZE).address
        self._registered: list[int] = []
        self._scratch: mmap.mmap | None = None
        self._scratch_address = 0
        self._scratch_lock = threading.Lock()
        try:
            for address, nbytes in ((self.pool_address, pool.nbytes),
                                    (self.area_address, len(self.area))):
                self.conn.register(address, nbytes)
                self._registered.append(address)
        except BaseException:
            self.close()
            raise

    # Addresses of a slot's block and header area.

    def slot_address(self, slot: int) -> int:
        return self.pool_address + slot * self.slot_bytes

    def header_address(self, slot: int) -> int:
        return self.area_address + slot * record.AREA_BYTES

    def header_view(self, slot: int, length: int) -> memoryview:
        start = slot * record.AREA_BYTES
        return self.area_view[start:start + length]

    # Calls, through the breaker. Each raises BreakerOpen when refused.

    def _enter(self) -> None:
        if not self.breaker.allow():
            raise BreakerOpen

    def _buffers(self, slots: Sequence[int], header_lengths: Sequence[int],
                 block_bytes: int) -> tuple[list[list[int]], list[list[int]]]:
        """Per object its two buffers (the slot's header area, the block) and their
        sizes, as Mooncake's multi-buffer calls take them."""
        pool, stride = self.pool_address, self.slot_bytes
        area, at = self.area_address, record.AREA_BYTES
        buffers = [[area + s * at, pool + s * stride] for s in slots]
        first = header_lengths[0] if header_lengths else 0
        if header_lengths.count(first) == len(header_lengths):  # (keys of one length)
            return buffers, [[first, block_bytes]] * len(header_lengths)
        return buffers, [[h, block_bytes] for h in header_lengths]

    def put(self, names: Sequence[str], slots: Sequence[int], header_lengths: Sequence[int],
            block_bytes: int) -> list[int]:
        """One object per name, gathered from the slot's header area and block."""
        self._enter()
        buffers, sizes = self._buffers(slots, header_lengths, block_bytes)
        return list(self._store.batch_put_from_multi_buffers(
            list(names), buffers, sizes, self.config))

    def get(self, names: Sequence[str], slots: Sequence[int], header_lengths: Sequence[int],
            block_bytes: int) -> list[int]:
        """Each object scattered into the slot's header area and block; per name
        the bytes read or a (negative) code."""
        self._enter()
        buffers, sizes = self._buffers(slots, header_lengths, block_bytes)
        return list(self._store.batch_get_into_multi_buffers(list(names), buffers, sizes))

    def exist(self, names: Sequence[str]) -> list[int]:
        """1, 0, or a negative code per name (a read: it grants each a lease)."""
        self._enter()
        return list(self._store.batch_is_exist(list(names)))

    def remove(self, names: Sequence[str]) -> list[int]:
        """0 or a negative code per name (HAS_LEASE: read recently, try later)."""
        self._enter()
        return list(self._store.batch_remove(list(names), False))

    def size(self, name: str) -> int:
        self._enter()
        return int(self._store.get_size(name))

    def read(self, name: str, size: int) -> bytes:
        """The first `size` bytes of an object of that size (checks and tools
        only), through a registered scratch buffer of the tier's own: one read at
        a time. Empty when it could not be read (gone, another size)."""
        self._enter()
        with self._scratch_lock:
            if self._scratch is None or len(self._scratch) < size:
                self._drop_scratch()
                self._scratch = mmap.mmap(-1, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
                self._scratch_address = PoolView(self._scratch, mmap.PAGESIZE).address
                self.conn.register(self._scratch_address, len(self._scratch))
            got = self._store.batch_get_into([name], [self._scratch_address], [size])[0]
            return bytes(self._scratch[:got]) if got == size else b""

    def _drop_scratch(self) -> None:
        if self._scratch is not None:
            self.conn.unregister(self._scratch_address)
            self._scratch = None

    def close(self) -> None:
        """Unregister the pool and header area: after this, Mooncake touches neither.
        The connection stays open for the process (`_Connection`)."""
        for address in self._registered:
            self.conn.unregister(address)
        self._registered.clear()
        with self._scratch_lock:
            self._drop_scratch()
