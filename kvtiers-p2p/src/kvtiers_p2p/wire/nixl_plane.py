"""`NixlPlane`: the NIXL data plane (UCX backend) - NIXL agents of a tier (one, or
one per transfer stream), the CPU pool registered with each once; a puller READs
the server's pinned slots straight into its own slots (one transfer request per
fetch, not per block), several fetches at once on several streams.

Descriptors are prepared once, not per transfer: this side's pool (a descriptor
per slot) when the plane is made, a peer's pool when it is first connected; a
READ names slots by index into the two prepared lists (`make_prepped_xfer`), so
a fetch costs NIXL no per-block descriptor building or checking.

ZeroMQ stays the control plane: the `Hello`/`Welcome` carry each side's agent
metadata and pool base (`DataPlane`), a `TransferDone` names the server's slots
of the blocks it pinned, the puller READs them, verifies each block's xxh3 in its
slot and says `Landed` (the server unpins). NIXL is optional (`kvtiers-p2p[nixl]`):
`load_nixl` finds it (the `nixl` meta-package, or `nixl_cu12` / `nixl_cu13`
directly) or raises `NixlMissing` with what to install. Before the import it keeps
UCX's EFA module out where there is no EFA device (`ucx_modules`: with the host's
RDMA libraries installed, that module makes every process die at exit).

Threads: every call into an agent holds that agent's lock (an agent made without
a listener thread is not thread-safe); `read` blocks (it polls the transfer until
it ends) and runs on the tier's copier threads, one per stream at a time, never on
the loop or the scheduler thread; `progress` runs on the server's thread.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from kvtiers.sdk import PoolView

from kvtiers_p2p.wire.protocol import DataPlane
from kvtiers_p2p.wire.ucx_modules import keep_efa_module_out

__all__ = ["NixlMissing", "NixlPlane", "load_nixl", "nixl_available"]

#: where NIXL's Python API lives: the meta-package first, then the CUDA builds
#: (nixl_cu12 imports on a machine without CUDA; the meta-package needs torch)
_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")
_POLL_S = 20e-6  # between checks of a transfer's state
_names = itertools.count(1)


class NixlMissing(ImportError):
    """NIXL cannot be imported here."""


def load_nixl() -> Any:
    """NIXL's `_api` module (`nixl_agent`, `nixl_agent_config`), or `NixlMissing`
    naming what to install and why each candidate failed. Sets `UCX_MODULES` first
    where it is unset and no EFA device exists (`keep_efa_module_out`)."""
    keep_efa_module_out()
    why = []
    raise_exceptions = logging.raiseExceptions
    for name in _MODULES:
        try:
            api = importlib.import_module(name)
        except ImportError as exc:  # also a backend library that failed to load
            why.append(f"{name.split('.')[0]}: {exc}")
            continue
        finally:
            logging.raiseExceptions = raise_exceptions  # NIXL's import turns it off
        _tame_logging()
        return api
    raise NixlMissing(
        "the nixl data plane needs NIXL: pip install 'kvtiers-p2p[nixl]' (or nixl-cu12 "
        "on a machine without CUDA 13; install a pinned torch first) - "
        + "; ".join(why))


def _tame_logging() -> None:
    """NIXL's import points its "nixl" logger at stdout at INFO (a line per agent):
    send it through the process's logging instead, at WARNING unless
    NIXL_LOG_LEVEL says otherwise (a command's stdout is its own)."""
    log = logging.getLogger("nixl")
    for handler in list(log.handlers):
        log.removeHandler(handler)
    log.propagate = True
    if not os.environ.get("NIXL_LOG_LEVEL"):
        log.setLevel(logging.WARNING)


def nixl_available() -> bool:
    try:
        load_nixl()
    except NixlMissing:
        return False
    return True


class NixlPlane:
    """NIXL agents with `pool` registered (DRAM): `streams` of them, each READing on
    its own (a copy within one host is CPU work: two streams use two cores). The
    first also serves: `descriptor()` (what this side sends in its Hello or
    Welcome) describes it, and `progress` lets it answer as a target. `read` pulls
    blocks from a peer's pool on the stream it is given. Raises `NixlMissing`
    without NIXL, RuntimeError when an agent or its backend cannot be made."""

    def __init__(self, pool: PoolView, name: str = "", backends: Sequence[str] = ("UCX",),
                 streams: int = 1):
        if streams < 1:
            raise ValueError(f"streams must be at least 1, got {streams}")
        api = load_nixl()
        self._pool = pool
        self.name = f"{name or 'kvtiers'}-{os.getpid()}-{next(_names)}"
        self.base = pool.address
        self._agents: list[_Agent] = []
        try:
            for i in range(streams):
                self._agents.append(_Agent(api, self.name if i == 0 else f"{self.name}.{i}",
                                           pool, backends))
        except BaseException:
            self.close()
            raise
        self.metadata: bytes = self._agents[0].metadata

    @property
    def streams(self) -> int:
        """How many READs may move at once (one per stream)."""
        return len(self._agents)

    @property
    def reads(self) -> int:
        """Transfer requests completed, every stream together (tests, benches)."""
        return sum(self.stream_reads)

    @property
    def stream_reads(self) -> tuple[int, ...]:
        """Transfer requests completed on each stream."""
        return tuple(a.reads for a in self._agents)

    def descriptor(self) -> DataPlane:
        pool = self._pool
        return DataPlane("nixl", pool.num_slots, pool.slot_bytes,
                         agent_metadata=self.metadata, base_addr=self.base)

    def connect(self, plane: DataPlane) -> str:
        """Know the agent that `plane` (a peer's descriptor) describes, on every
        stream, and prepare its pool's slots (once per agent); its name."""
        names = {agent.connect(plane) for agent in self._agents}
        if len(names) != 1:
            raise RuntimeError(f"NIXL named one peer agent differently: {sorted(names)}")
        return names.pop()

    def read(self, remote: str, plane: DataPlane, pairs: Sequence[tuple[int, int]],
             timeout: float, stream: int = 0) -> str:
        """READ blocks from the peer `remote` (connected with its descriptor
        `plane`) on `stream`: each (its slot, our slot) pair, one transfer request.
        Blocks until it ends: "DONE", "ERR" (also: a slot outside either pool, or a
        peer not connected), or "TIMEOUT" (the request is released: NIXL aborts
        it). One READ at a time per stream (its lock)."""
        if not pairs:
            return "DONE"
        index = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        return self._agents[stream].read(remote, index[:, 0], index[:, 1], timeout)

    def read_slots(self, remote: str, theirs: Sequence[int], ours: Sequence[int],
                   timeout: float, stream: int = 0) -> str:
        """`read` of the pairs (theirs[i], ours[i]): two lists of slot numbers of
        one length (a fetch's, as they came)."""
        if len(theirs) != len(ours):
            return "ERR"
        if not ours:
            return "DONE"
        return self._agents[stream].read(remote, np.asarray(theirs, dtype=np.int64),
                                         np.asarray(ours, dtype=np.int64), timeout)

    def progress(self) -> None:
        """Let the serving agent make progress as a target (the server's thread,
        every poll)."""
        if self._agents:
            self._agents[0].progress()

    def close(self) -> None:
        for agent in self._agents:
            agent.close()


class _Agent:
    """One NIXL agent of a plane: its pool registration, prepared descriptors and
    the peers it knows. Every call holds its lock (an agent made without a
    listener thread is not thread-safe)."""

    def __init__(self, api: Any, name: str, pool: PoolView, backends: Sequence[str]):
        self._pool = pool
        self._lock = threading.Lock()
        self._closed = False
        # No progress thread: NIXL's spins (half a core per idle agent). A puller
        # progresses its transfers as it polls them; a server calls `progress`
        # from its thread (UCX needs the target's for connection set-up only: the
        # READs themselves are one-sided).
        config = api.nixl_agent_config(enable_prog_thread=False, backends=list(backends))
        self._agent = api.nixl_agent(name, config)
        missing = [b for b in backends if b not in self._agent.backends]
        if missing:
            raise RuntimeError(f"NIXL has no {', '.join(missing)} backend here (plugins: "
                               f"{', '.join(self._agent.get_plugin_list())})")
        base = pool.address
        self._region = self._agent.get_reg_descs(
            [(base, pool.num_slots * pool.slot_bytes, 0, "")], "DRAM")
        self._agent.register_memory(self._region)
        self.metadata: bytes = self._agent.get_agent_metadata()
        # This pool's slots, prepared once: a READ's destination, by slot index.
        self._local = self._agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", _slot_descs(base, pool.num_slots, pool.slot_bytes,
                                           pool.block_bytes), "DRAM")
        self._remotes: dict[bytes, str] = {}
        self._prepped: dict[str, tuple[Any, int]] = {}  # remote -> its pool's list, slots
        self.reads = 0

    def connect(self, plane: DataPlane) -> str:
        with self._lock:
            if self._closed:
                raise RuntimeError("the NIXL plane is closed")
            remote = self._remotes.get(plane.agent_metadata)
            if remote is None:
                remote = self._agent.add_remote_agent(plane.agent_metadata)
                if isinstance(remote, bytes):
                    remote = remote.decode()
                self._remotes[plane.agent_metadata] = remote
            if remote not in self._prepped:
                descs = _slot_descs(plane.base_addr, plane.num_slots, plane.slot_bytes,
                                    self._pool.block_bytes)
                self._prepped[remote] = (self._agent.prep_xfer_dlist(remote, descs, "DRAM"),
                                         plane.num_slots)
            return str(remote)

    def read(self, remote: str, theirs: Any, ours: Any, timeout: float) -> str:
        """READ theirs[i] into ours[i] (numpy integer arrays of one length, not
        empty); see `NixlPlane.read`."""
        if min(int(theirs.min()), int(ours.min())) < 0 or (
                int(ours.max()) >= self._pool.num_slots):
            return "ERR"
        top = int(theirs.max())  # checked against their pool before any narrowing
        theirs = np.ascontiguousarray(theirs, dtype=np.int32)
        ours = np.ascontiguousarray(ours, dtype=np.int32)
        with self._lock:
            if self._closed:
                return "ERR"
            agent = self._agent
            far, slots = self._prepped.get(remote, (None, 0))
            if far is None or top >= slots:
                return "ERR"
            handle = agent.make_prepped_xfer("READ", self._local, ours, far, theirs)
            state = agent.transfer(handle)
        end = time.monotonic() + timeout
        try:
            while state not in ("DONE", "ERR"):
                if time.monotonic() > end:
                    return "TIMEOUT"
                time.sleep(_POLL_S)
                with self._lock:
                    if self._closed:  # close released the agent's resources
                        return "ERR"
                    state = agent.check_xfer_state(handle)
            if state == "DONE":
                self.reads += 1
            return str(state)
        finally:
            # A request NIXL could not abort raises: nothing more to do with it.
            with self._lock, contextlib.suppress(Exception):
                if not self._closed:
                    agent.release_xfer_handle(handle)

    def progress(self) -> None:
        with self._lock:
            if not self._closed:
                self._agent.get_new_notifs()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for handle, _ in self._prepped.values():
                with contextlib.suppress(Exception):  # best effort at shutdown
                    self._agent.release_dlist_handle(handle)
            with contextlib.suppress(Exception):
                self._agent.release_dlist_handle(self._local)
            for remote in self._remotes.values():
                with contextlib.suppress(Exception):
                    self._agent.remove_remote_agent(remote)
            self._agent.deregister_memory(self._region)
            self._agent = None  # the agent's resources go with the object


def _slot_descs(base: int, slots: int, stride: int, length: int) -> Any:
    """NIXL descriptors (an N x 3 array: address, length, device) of `slots` slots
    `stride` bytes apart from `base`, `length` bytes each."""
    descs = np.zeros((slots, 3), dtype=np.uint64)
    descs[:, 0] = base + np.arange(slots, dtype=np.uint64) * np.uint64(stride)
    descs[:, 1] = length
    return descs
