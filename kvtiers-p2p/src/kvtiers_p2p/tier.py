"""`P2PTier`: the `p2p` tier - pull KV blocks from peers' CPU pools, serve ours.

Pulling (the tier's lookups and loads):
- `lookup` answers from `AsyncProbe` verdicts: an unknown key is RETRY while a
  background probe asks the peers (one batched `Lookup` per peer and step, in the
  order of `peers`); the first peer that holds it is remembered for the load.
- `submit_load` runs on an `AsyncJobEngine`: one `Fetch` per peer per job (not per
  block); each block lands in its slot and is verified there (`verifies`). A peer
  that dies mid-transfer fails its keys (`io`, or `timeout` at the job's deadline or
  `fetch_timeout_s`, whichever is sooner): misses, never a stall past the deadline.
- `submit_store` copies nothing by default: a block stored in this engine's pool is
  what peers pull, for as long as the pool holds it; it succeeds at once. With
  `push`, it sends the blocks (with checksums) to the first ready peer that takes
  stores - a `kvtiers serve` cache node - which verifies and keeps them
  (`kvtiers_p2p.pull.pushes`).

Serving (`serve_external_requests(parent)`, with a `port`): a `PeerServer` answers
peers from the manager through `ParentManager` (pin, ship, unpin), bounded by the
limits of the config. A server that cannot listen (the port taken, say) costs the
engine its serving only: logged once with the address and why, counted in
`stats().errors` ("serve.EADDRINUSE"); the tier still pulls (`serve_error`).

Per-tier roles (`role`): `remote_kv_source` (the default with peers) probes;
`remote_prefiller` (P/D decode side) answers HIT at once while a peer is connected
and pulls from it; `remote_decoder` (P/D prefill side) pulls nothing and serves.

Per-request roles (vLLM's `kv_transfer_params`): a request naming a
`remote_kv_source` or `remote_prefiller` (`remote_host`, `remote_port`) adds that
peer for this tier's probes and loads. A request's `remote_prefiller` holds its
blocks: the request's own lookups (`lookup_in_request`) answer HIT at once while
that peer's link is ready (not for a key whose fetch failed within `miss_ttl_s`)
and its loads pull from that peer; every other lookup (other requests, no request)
probes as before. `remote_decoder` needs nothing here (the server serves whoever
asks). What a request named is forgotten when it finishes.

Threads: lookup/submit/take/stats/request hooks are the scheduler thread's and
never block (a dictionary lookup, a queue hand-off). Probes run on the probe's
thread; sessions and transfers on the engine's loop; the server on its own thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import itertools
import os
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq
import zmq.asyncio
from kvtiers.errors import ConfigError, ConfigProblem
from kvtiers.sdk import (
    AsyncJobEngine,
    AsyncJobHooks,
    AsyncProbe,
    BlockKey,
    ErrorCounts,
    FailureReason,
    Job,
    JobResult,
    LookupResult,
    Outcome,
    ParentManager,
    SecondaryTier,
    StatsRecorder,
    TierContext,
    TierStats,
    TransferJob,
    errno_name,
    resolve_options,
    type_name,
)

from kvtiers_p2p.pull.link import PeerLink
from kvtiers_p2p.pull.prefills import Prefills
from kvtiers_p2p.pull.pushes import Pushes
from kvtiers_p2p.pull.session import LinkOptions
from kvtiers_p2p.schema import P2P_SCHEMA
from kvtiers_p2p.serve.server import ListenError, PeerServer, ServeLimits, StoreSink
from kvtiers_p2p.wire.handshake import Identity, describe_namespace, seed_fingerprint
from kvtiers_p2p.wire.nixl_plane import NixlPlane
from kvtiers_p2p.wire.protocol import MAX_KEYS, DataPlane, State
from kvtiers_p2p.wire.security import CurveKeys

__all__ = ["P2PTier"]

#: peers a tier may know (configured and named by requests together)
MAX_PEERS = 256
#: keys whose holder is remembered between a probe and a load
MAX_REMEMBERED = 1 << 20
_HOST = re.compile(r"^[A-Za-z0-9.\-:\[\]]{1,253}$")


def _endpoint(host: Any, port: Any) -> str | None:
    """`tcp://host:port` from request parameters, or None when they are not sane."""
    if not isinstance(host, str) or not _HOST.match(host):
        return None
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    return f"tcp://{host}:{port}"


class P2PTier(SecondaryTier):
    """See the module docstring. Config: `kvtiers_p2p.schema.P2P_SCHEMA`."""

    persistent = False
    shared = False
    serves_peers = True
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        options = resolve_options(P2P_SCHEMA, config, "p2p")
        super().__init__(ctx, options)
        self._log = ctx.logger
        self._nixl = self._make_nixl(options["data_plane"], ctx)
        self._kinds: tuple[str, ...] = ("zmq",)
        if self._nixl is not None:
            self._kinds = ("nixl",) if options["data_plane"] == "nixl" else ("nixl", "zmq")
        peer_id = options["peer_id"] or f"{socket.gethostname()}:{os.getpid()}"
        self.identity = Identity(peer_id, ctx.namespace.fingerprint,
                                 seed_fingerprint(options["hash_seed"]), ctx.block_bytes,
                                 self._kinds, describe_namespace(ctx.namespace))
        curve = options["curve"]
        self._curve = CurveKeys.from_config(curve) if curve else None
        keepalive, reconnect = options["keepalive"], options["reconnect"]
        self._link_options = LinkOptions(
            keepalive_s=keepalive["interval_s"], timeout_s=keepalive["timeout_s"],
            reconnect_min_s=reconnect["min_s"], reconnect_max_s=reconnect["max_s"],
            lookup_timeout_s=options["lookup_timeout_s"], lease_s=options["lease_s"])
        self._fetch_timeout_s: float = options["fetch_timeout_s"]
        self._pending_wait_s: float = options["pending_wait_s"]
        self._push: bool = options["push"]
        # Pushing into a cache node, this tier is one of its writers: the node's pool
        # is storage several engines share (the conformance suite's sibling).
        self.shared = self._push
        self._role: str | None = options["role"]
        self._miss_ttl_s: float = options["miss_ttl_s"]
        self._failed: dict[BlockKey, float] = {}  # remote_prefiller: key -> miss until
        self._sink: StoreSink | None = None
        self._stats = StatsRecorder()
        # Problems met outside a job (a server that cannot listen): `stats().errors`
        self._errors = ErrorCounts(self._log, f"kvtiers-p2p {ctx.name or 'p2p'}")
        self._serve_error: Exception | None = None
        self._closed = False
        self._server: PeerServer | None = None
        self._links: dict[str, PeerLink] = {}
        self._where: dict[BlockKey, PeerLink] = {}  # written on the loop only
        # Per-request remote_prefillers (`lookup_in_request`): written on the
        # scheduler thread only, read on the loop (`_load_batch`).
        self._prefills = Prefills()
        self._zctx = zmq.asyncio.Context()
        # Slot copies (arriving blocks landed and verified, pushed blocks read) run
        # here, off the loop: the loop keeps receiving while a thread copies.
        self._copier = ThreadPoolExecutor(max_workers=options["num_threads"],
                                          thread_name_prefix=f"kvtiers-{ctx.name or 'p2p'}-copy")
        self._probe = AsyncProbe(self._probe_peers, clock=ctx.clock,
                                 hit_ttl_s=options["hit_ttl_s"],
                                 miss_ttl_s=options["miss_ttl_s"],
                                 name=f"kvtiers-{ctx.name or 'p2p'}-probe")
        self._pushes = Pushes(push=self._push, pool=ctx.pool, links=self._links,
                              copier=self._copier, probe=self._probe, stats=self._stats,
                              remember=self._remember,
                              forget=lambda key: self._where.pop(key, None),
                              timeout=self._timeout)
        self._engine = AsyncJobEngine(
            ctx,
            load=AsyncJobHooks(block=self._load_one, batch=self._load_batch),
            store=self._pushes.hooks,
            load_concurrency=options["num_threads"], store_concurrency=1,
            stats=self._stats, batch_bytes=MAX_KEYS * ctx.block_bytes,
            on_close=self._close_links, name=f"kvtiers-{ctx.name or 'p2p'}")
        for endpoint in options["peers"]:
            self.add_peer(endpoint)

    # Peers.

    def add_peer(self, endpoint: str) -> bool:
        """Pull from the server at `endpoint` too ("tcp://HOST:PORT"); any thread,
        never blocks. False when it is known already or too many peers are."""
        if self._closed or endpoint in self._links or len(self._links) >= MAX_PEERS:
            return False
        if self._nixl is not None:
            plane = self._nixl.descriptor()
        else:
            plane = DataPlane("zmq", self.ctx.pool.num_slots, self.ctx.pool.slot_bytes)
        link = PeerLink(endpoint, self.identity.hello(plane), self.ctx.pool,
                        context=self._zctx, options=self._link_options, curve=self._curve,
                        logger=self._log, lander=self._copier, nixl=self._nixl)
        self._links[endpoint] = link
        self._engine.loop.call_soon_threadsafe(link.start)
        return True

    def _make_nixl(self, choice: str, ctx: TierContext) -> NixlPlane | None:
        """The NIXL plane for `data_plane` "nixl" (required: a ConfigError saying
        what is missing or failed) or "auto" (when NIXL imports and its agent
        starts; any error otherwise means ZeroMQ frames, never an exception into
        the engine). NIXL's agents listen on no port (no listener thread)."""
        if choice == "zmq":
            return None
        try:
            return NixlPlane(ctx.pool, name=f"kvtiers-{ctx.name or 'p2p'}",
                             backends=self.config["backends"],
                             streams=min(self.config["transfer_streams"],
                                         self.config["num_threads"]))
        except Exception as exc:  # NIXL's and UCX's own errors too
            if choice == "nixl":
                raise ConfigError(ConfigProblem(
                    "$.data_plane", str(exc) or type(exc).__name__)) from exc
            self._log.info("p2p: NIXL data plane unavailable (%s); using ZeroMQ frames",
                           str(exc)[:300])
            return None

    @property
    def nixl(self) -> NixlPlane | None:
        """The NIXL plane, when this tier has one."""
        return self._nixl

    @property
    def data_planes(self) -> tuple[str, ...]:
        """The data planes this tier offers, preferred first."""
        return self._kinds

    @property
    def links(self) -> Mapping[str, PeerLink]:
        return self._links

    @property
    def server(self) -> PeerServer | None:
        return self._server

    # Scheduler thread.

    def lookup(self, key: BlockKey) -> LookupResult:
        if self._closed or not self._links or self._role == "remote_decoder":
            self._stats.lookup(False)
            return LookupResult.MISS
        if self._role == "remote_prefiller":
            # P/D: the prefill node holds this engine's blocks; no probe (a block it
            # lacks fails its fetch: a miss one step later).
            hit = not self._failing(key) and any(link.ready for link in self._links.values())
            self._stats.lookup(hit)
            return LookupResult.HIT if hit else LookupResult.MISS
        answer = self._probe.check(key)
        if answer is not LookupResult.RETRY:
            self._stats.lookup(answer is LookupResult.HIT)
        return answer

    def lookup_in_request(self, key: BlockKey, request_id: str) -> LookupResult:
        """For a request whose params named a `remote_prefiller`: HIT at once while
        that peer's link is ready (the load pulls from it), unless the key's fetch
        failed within `miss_ttl_s`; otherwise (and for every other request) as
        `lookup`. O(1): dictionary work."""
        link = self._prefills.link(request_id)
        if link is None or not link.ready or self._closed or self._role == "remote_decoder":
            return self.lookup(key)
        if self._failing(key) or not self._prefills.name(request_id, key):
            return self.lookup(key)
        self._stats.lookup(True)
        return LookupResult.HIT

    def submit_load(self, job: TransferJob) -> None:
        self._engine.submit_load(job)

    def submit_store(self, job: TransferJob) -> None:
        self._engine.submit_store(job)

    def get_finished_jobs(self) -> list[JobResult]:
        return self._engine.take_finished()

    def drain(self, timeout: float | None = None) -> bool:
        return self._engine.drain(timeout)

    def stats(self) -> TierStats:
        """Pushing: the usage and capacity of the node's pool (as it last said)."""
        if not self._push:
            snap = self._stats.snapshot(usage_bytes=0)
        else:
            capacity = max((x.capacity_bytes for x in self._links.values()
                            if x.accepts_stores), default=0)
            snap = dataclasses.replace(
                self._stats.snapshot(usage_bytes=self._pushes.usage_bytes),
                capacity_bytes=capacity)
        snap.errors.update(self._errors.snapshot())
        return snap

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """Pushing: tell the nodes the blocks were used (their pools' recency)."""
        if self._push and not self._closed:
            keys = list(keys)
            self._engine.loop.call_soon_threadsafe(self._touch, keys)

    def on_request_start(self, request_id: str,
                         params: Mapping[str, Any] | None = None) -> None:
        if not params:
            return
        for role in ("remote_kv_source", "remote_prefiller"):
            sub = params.get(role)
            if isinstance(sub, Mapping):
                endpoint = _endpoint(sub.get("remote_host"), sub.get("remote_port"))
                if endpoint is None:
                    continue
                self.add_peer(endpoint)
                link = self._links.get(endpoint)
                if role == "remote_prefiller" and link is not None:
                    self._prefills.start(request_id, link)

    def on_request_finished(self, request_id: str) -> None:
        self._prefills.finish(request_id)

    @property
    def prefills(self) -> Prefills:
        """The requests whose remote_prefiller holds their blocks (tests, tools)."""
        return self._prefills

    def accept_stores(self, sink: StoreSink) -> None:
        """Keep the blocks peers push (`Store`) through `sink`: what a `kvtiers
        serve` cache node, which owns its manager, does. Call before
        `serve_external_requests`."""
        self._sink = sink

    def serve_external_requests(self, parent: ParentManager) -> None:
        """Serve this engine's pool to peers when a `port` is configured (0: any
        free one; see `server.endpoint`). Binds now. A server that cannot start (the
        port in use, an address not this machine's, ...) costs this engine nothing
        but its serving (DESIGN invariant 5): the tier serves no peers, says why
        once in the log (the address, the reason) and counts it in
        `stats().errors` ("serve.EADDRINUSE"); its pulls from peers go on. See
        `serve_error`; `start_serving` raises instead."""
        try:
            self.start_serving(parent)
        except Exception as exc:  # noqa: BLE001 - invariant 5: counted and logged
            self._serve_error = exc
            if isinstance(exc, ListenError):
                tier = f"tier {self.ctx.name or 'p2p'!r}"
                self._errors.count(
                    f"serve.{errno_name(exc)}",
                    f"{exc}; this engine serves no peers (its pulls from peers go on): "
                    + exc.what_to_do(f"the `port` of {tier}", f"the `host` of {tier}"))
            else:
                self._errors.count(f"serve.{type_name(exc)}",
                                   f"cannot serve peers: {exc!r}; this engine serves no "
                                   "peers (its pulls from peers go on)")

    @property
    def serve_error(self) -> Exception | None:
        """Why `serve_external_requests` could not serve (a `ListenError` when the
        address could not be bound), or None."""
        return self._serve_error

    def start_serving(self, parent: ParentManager) -> None:
        """`serve_external_requests`, raising when the server cannot start:
        `ListenError` (a `KvtiersError`) when its address cannot be bound. For a
        `kvtiers serve` node, whose only work is serving."""
        if self._server is not None or self._closed:
            return
        port = self.config["port"]
        if port is None:
            self._log.info("p2p: no port configured; serving no peers")
            return
        address = f"tcp://{self.config['host']}:{port}"
        if port:
            port += self.config["data_parallel_rank"]
            address = f"tcp://{self.config['host']}:{port}"
            if port > 65535:  # ZeroMQ would bind the port modulo 65536
                raise ListenError(address, OSError(
                    errno.EINVAL, "the port plus data_parallel_rank is above 65535"))
        keepalive = self.config["keepalive"]
        limits = ServeLimits(
            keepalive_s=keepalive["interval_s"], session_timeout_s=keepalive["timeout_s"],
            pin_timeout_s=self.config["unbound_store_timeout_s"],
            max_pinned_share=self.config["limits"]["max_pinned_share"],
            max_sessions=self.config["limits"]["max_sessions"])
        server = PeerServer(parent, self.ctx.pool, self.identity,
                            bind=address, limits=limits,
                            curve=self._curve, sink=self._sink, logger=self._log,
                            nixl=self._nixl)
        server.start()
        self._server = server

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._probe.close()
        if self._server is not None:
            self._server.close()
        self._engine.close(timeout=2.0)
        self._copier.shutdown(wait=False)
        if self._nixl is not None:
            self._nixl.close()

    # The probe's thread.

    def _probe_peers(self, keys: Sequence[BlockKey]) -> set[BlockKey]:
        opt = self._link_options
        return self._engine.run(self._ask(list(keys)),
                                timeout=len(self._links) * (opt.lookup_timeout_s + 1)
                                + self._pending_wait_s + 1)

    # The engine's loop.

    async def _ask(self, keys: list[BlockKey]) -> set[BlockKey]:
        loop = asyncio.get_running_loop()
        found: set[BlockKey] = set()
        todo = keys
        for link in list(self._links.values()):
            if not todo:
                break
            until = loop.time() + self._pending_wait_s
            for first in range(0, len(todo), MAX_KEYS):
                chunk = todo[first:first + MAX_KEYS]
                while chunk:
                    states = await link.lookup(chunk)
                    if states is None:
                        break
                    pending = []
                    for key, state in zip(chunk, states, strict=True):
                        if state == State.PRESENT:
                            found.add(key)
                            self._remember(key, link)
                        elif state == State.PENDING:
                            pending.append(key)
                    if not pending or loop.time() >= until:
                        break
                    chunk = pending  # being written into the peer's pool: ask again
                    await asyncio.sleep(0.005)
            todo = [k for k in todo if k not in found]
        return found

    def _failing(self, key: BlockKey) -> bool:
        """`key` failed a fetch from a prefiller within `miss_ttl_s` (any thread)."""
        failed = self._failed.get(key)
        return failed is not None and failed >= self.ctx.clock()

    def _remember_failed(self, key: BlockKey) -> None:
        """remote_prefiller (the tier's role or a request's): `key` failed its
        fetch; a miss for `miss_ttl_s`."""
        failed = self._failed
        if key not in failed and len(failed) >= MAX_REMEMBERED:
            failed.pop(next(iter(failed)))
        failed[key] = self.ctx.clock() + self._miss_ttl_s

    def _remember(self, key: BlockKey, link: PeerLink) -> None:
        where = self._where
        if key not in where and len(where) >= MAX_REMEMBERED:
            where.pop(next(iter(where)))
        where[key] = link

    async def _load_batch(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        keys = job.keys
        by_link: dict[PeerLink, list[int]] = {}
        eager = None
        if self._role == "remote_prefiller":
            eager = next((x for x in self._links.values() if x.ready), None)
        # The prefiller a request's lookup named for a key (`lookup_in_request`),
        # unless a fetch from a prefiller failed it lately (another lookup placed it).
        # (Per-key work here is a few dictionary reads: a load of 32 KiB blocks
        # has thousands of keys, and the first fetch waits for this.)
        named: list[PeerLink | None]
        if self._prefills.named:
            holder, failing = self._prefills.holder, self._failing
            named = [None if failing(keys[i]) else holder(keys[i]) for i in indices]
        else:
            named = [None] * len(indices)
            # (`range` equality is O(1): the engine hands a whole job as one range)
            whole = isinstance(indices, range) and indices == range(len(keys))
            mine = keys if whole else [keys[i] for i in indices]
            links = list(map(self._where.get, mine, itertools.repeat(eager)))
            if links and links[0] is not None and links.count(links[0]) == len(links):
                # The common case: every key placed, all at one peer.
                order = indices if whole else list(indices)
                return await self._fetch_from({links[0]: order}, job, order, set(), eager,
                                              whole=whole)
        where = self._where
        if eager is None:
            # A key no probe placed (a load with no lookup before it, or a verdict
            # older than the memory of holders): ask the peers first.
            unknown = [keys[i] for i, link in zip(indices, named, strict=True)
                       if link is None and keys[i] not in where]
            if unknown:
                await self._ask(unknown)
        unprobed: set[int] = set()  # pulled from a request's prefiller, unprobed
        for i, link in zip(indices, named, strict=True):
            if link is None:
                link = where.get(keys[i], eager)
            else:
                unprobed.add(i)
            if link is not None:
                group = by_link.get(link)
                if group is None:
                    by_link[link] = [i]
                else:
                    group.append(i)
        return await self._fetch_from(by_link, job, indices, unprobed, eager)

    async def _fetch_from(self, by_link: Mapping[PeerLink, Sequence[int]], job: Job,
                          indices: Sequence[int], unprobed: set[int],
                          eager: PeerLink | None, *, whole: bool = False) -> list[Outcome]:
        """Pull each link's keys (indices into the job) from it: the outcome of
        each of `indices` (MISSING where no link has it), and what a miss does to
        the probe's verdicts and the prefiller's failures. `whole`: the caller knows
        `by_link` is one link with every key of the job, in order."""
        keys, slots = job.keys, job.slots
        timeout = self._timeout(job)
        groups = list(by_link.items())
        # (without `whole`, every group is a list)
        alone = whole or len(groups) == 1 and groups[0][1] == list(indices)
        everything = whole or alone and len(indices) == len(keys) and (  # the whole job
            groups[0][1] == list(range(len(keys))))
        results = await asyncio.gather(*(
            link.fetch(keys, slots, timeout) if everything else
            link.fetch([keys[i] for i in idx], [slots[i] for i in idx], timeout)
            for link, idx in groups))
        if alone and results[0].count(None) == len(results[0]):
            return list(results[0])  # every key landed: nothing to remember
        out: dict[int, Outcome] = dict.fromkeys(indices, FailureReason.MISSING)
        for (_, idx), outcomes in zip(groups, results, strict=True):
            for i, outcome in zip(idx, outcomes, strict=True):
                out[i] = outcome
                if outcome is FailureReason.REJECTED:  # over the peer's budget now
                    self._where.pop(keys[i], None)
                    self._probe.forget(keys[i])
                elif outcome is not None:  # a miss for a while, not a probe and a retry
                    self._where.pop(keys[i], None)
                    self._probe.record(keys[i], False)
                    if eager is not None or i in unprobed:
                        self._remember_failed(keys[i])
        return [out[i] for i in indices]

    async def _load_one(self, job: Job, i: int) -> Outcome:
        return (await self._load_batch(job, [i]))[0]

    def _touch(self, keys: list[BlockKey]) -> None:
        for link in self._links.values():
            link.touch(keys)

    def _timeout(self, job: Job) -> float:
        timeout = self._fetch_timeout_s
        deadline = job.transfer.deadline
        if deadline is not None:
            timeout = min(timeout, deadline - self.ctx.clock())
        return timeout

    async def _close_links(self) -> None:
        for link in list(self._links.values()):
            await link.close()
        self._zctx.destroy(linger=0)

