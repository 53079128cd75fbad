"""`NixlPlane`: the NIXL data plane (UCX backend) - one NIXL agent per tier, its
CPU pool registered once; a puller READs the server's pinned slots straight into
its own slots (one transfer request per fetch, not per block).

ZeroMQ stays the control plane: the `Hello`/`Welcome` carry each side's agent
metadata and pool base (`DataPlane`), a `TransferDone` names the server's slots
of the blocks it pinned, the puller READs them, verifies each block's xxh3 in its
slot and says `Landed` (the server unpins). NIXL is optional (`kvtiers-p2p[nixl]`):
`load_nixl` finds it (the `nixl` meta-package, or `nixl_cu12` / `nixl_cu13`
directly) or raises `NixlMissing` with what to install.

Threads: every agent call holds the plane's lock (an agent made without a listener
thread is not thread-safe); `read` blocks (it polls the transfer until it ends) and
runs on the tier's copier threads, never on the loop or the scheduler thread;
`progress` runs on the server's thread.
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

from kvtiers.pool_view import PoolView

from kvtiers_p2p.protocol import DataPlane

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
    naming what to install and why each candidate failed."""
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
    """A NIXL agent with `pool` registered (DRAM). `descriptor()` is what this side
    sends in its Hello or Welcome; `read` pulls blocks from a peer's pool.
    Raises `NixlMissing` without NIXL, RuntimeError when the agent or its UCX
    backend cannot be made."""

    def __init__(self, pool: PoolView, name: str = "", backends: Sequence[str] = ("UCX",)):
        api = load_nixl()
        self._pool = pool
        self._lock = threading.Lock()
        self.name = f"{name or 'kvtiers'}-{os.getpid()}-{next(_names)}"
        # No progress thread: NIXL's spins (half a core per idle agent). A puller
        # progresses its transfers as it polls them; a server calls `progress`
        # from its thread (UCX needs the target's for connection set-up only: the
        # READs themselves are one-sided).
        config = api.nixl_agent_config(enable_prog_thread=False, backends=list(backends))
        self._agent = api.nixl_agent(self.name, config)
        missing = [b for b in backends if b not in self._agent.backends]
        if missing:
            raise RuntimeError(f"NIXL has no {', '.join(missing)} backend here (plugins: "
                               f"{', '.join(self._agent.get_plugin_list())})")
        self.base = pool.address
        self._region = self._agent.get_reg_descs(
            [(self.base, pool.num_slots * pool.slot_bytes, 0, "")], "DRAM")
        self._agent.register_memory(self._region)
        self.metadata: bytes = self._agent.get_agent_metadata()
        self._remotes: dict[bytes, str] = {}
        self._closed = False
        self.reads = 0  # transfer requests completed (tests and benches read it)

    def descriptor(self) -> DataPlane:
        pool = self._pool
        return DataPlane("nixl", pool.num_slots, pool.slot_bytes,
                         agent_metadata=self.metadata, base_addr=self.base)

    def connect(self, plane: DataPlane) -> str:
        """Know the agent that `plane` (a peer's descriptor) describes; its name."""
        with self._lock:
            remote = self._remotes.get(plane.agent_metadata)
            if remote is None:
                remote = self._agent.add_remote_agent(plane.agent_metadata)
                if isinstance(remote, bytes):
                    remote = remote.decode()
                self._remotes[plane.agent_metadata] = remote
            return remote

    def read(self, remote: str, plane: DataPlane, pairs: Sequence[tuple[int, int]],
             timeout: float) -> str:
        """READ blocks from the peer `remote` (its descriptor `plane`): each (its slot,
        our slot) pair, one transfer request. Blocks until it ends: "DONE", "ERR",
        or "TIMEOUT" (the request is released: NIXL aborts it)."""
        bb = self._pool.block_bytes
        ours, theirs = self.base, plane.base_addr
        mine, peer = self._pool.slot_bytes, plane.slot_bytes
        with self._lock:
            if self._closed:
                return "ERR"
            agent = self._agent
            local = agent.get_xfer_descs([(ours + d * mine, bb, 0) for _, d in pairs], "DRAM")
            far = agent.get_xfer_descs([(theirs + s * peer, bb, 0) for s, _ in pairs], "DRAM")
            handle = agent.initialize_xfer("READ", local, far, remote)
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
        """Let the agent make progress as a target (the server's thread, every poll)."""
        with self._lock:
            if not self._closed:
                self._agent.get_new_notifs()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for remote in self._remotes.values():
                with contextlib.suppress(Exception):  # best effort at shutdown
                    self._agent.remove_remote_agent(remote)
            self._agent.deregister_memory(self._region)
            self._agent = None  # the agent's resources go with the object
