"""`CacheNode`: a standalone cache node - a CPU pool, its manager and secondary
tiers, serving engines through a p2p tier (what `kvtiers serve` runs).

Engines pull from it like from any peer, and cascade into it: its p2p tier takes
pushed blocks (`Store`), verified, into the node's pool through `store_blocks`,
and the node's manager cascades them further down (an fs tier, say) by its write
policy. A promotion from those tiers starts when a peer's lookup reaches them
(the peer's probe sees PENDING and asks again).

Threads: `step` on the node's main thread (the manager's scheduler thread);
`store_blocks` on the p2p server's thread - the manager serialises the two (it
takes a lock when a tier serves peers).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kvtiers.config import KvtiersConfig
from kvtiers.errors import ConfigError, ConfigProblem, KvtiersError
from kvtiers.manager import TieringOffloadingManager, num_slots_for, tier_names
from kvtiers.plugins import Registry, get_registry
from kvtiers.pool import CpuPool
from kvtiers.sdk import (
    AdmissionPolicy,
    BlockKey,
    EvictionPolicy,
    LabelledSink,
    MetricsSink,
    Namespace,
    NullMetrics,
    SecondaryTier,
    TierContext,
    create_tier,
    monotonic,
)

from kvtiers_p2p.serve.server import ListenError
from kvtiers_p2p.serve.sessions import StoreAnswer
from kvtiers_p2p.tier import P2PTier
from kvtiers_p2p.wire.protocol import State

__all__ = ["CacheNode", "CannotListen"]


class CannotListen(KvtiersError):
    """`kvtiers serve` cannot listen on a p2p tier's address (the port in use,
    say): the message names the address, why, and what to change. `kvtiers.cli`
    prints it and exits 2, without a traceback."""

    def __init__(self, cause: ListenError, index: int):
        self.address = cause.address
        self.reason = cause.reason
        self.errno = cause.errno
        field = f"the config's secondary_tiers[{index}]"
        super().__init__(f"kvtiers serve: {cause}; "
                         + cause.what_to_do(f"{field}.port", f"{field}.host"))


class _NoCopies(AdmissionPolicy):
    """For the node's own p2p tiers that do not push: their store copies nothing
    (peers pull from this pool), so a cascade to them would only pin a block
    until the next step - and make eviction skip it."""

    name = "none"

    def admit(self, key: BlockKey) -> bool:
        return False


class CacheNode:
    """Build the node for `config` (a kvtiers config with at least one p2p tier
    with a `port`) and `namespace` (the model whose blocks it holds): the pool is
    allocated (refused when larger than the machine), the tiers are built and the
    p2p tiers start serving (`CannotListen` when one cannot bind its address:
    unlike an engine's tier, a node that cannot serve has nothing to do). `close`
    ends everything. `metrics`: each tier reports to it labelled with its name and
    is wrapped in a `MeteredTier` (what `build_manager` does for an engine), so
    `kvtiers serve --metrics-port` shows the tiers' lookups and jobs too."""

    def __init__(self, config: KvtiersConfig, namespace: Namespace, *,
                 registry: Registry | None = None, logger: logging.Logger | None = None,
                 metrics: MetricsSink | None = None):
        registry = registry or get_registry()
        self.log = logger or logging.getLogger("kvtiers.serve")
        self.namespace = namespace
        block_bytes = sum(g.block_bytes for g in namespace.groups[:1])
        if len(namespace.groups) != 1:
            raise ConfigError(ConfigProblem(
                "$", "kvtiers serve holds one KV-cache group's blocks per node"))
        self.pool = CpuPool(block_bytes, config.cpu_bytes_to_use, shared=False, pin=False)
        tiers: list[SecondaryTier] = []  # as built (the manager gets them metered)
        try:
            for name, section in zip(tier_names(config), config.secondary_tiers, strict=True):
                sink = NullMetrics() if metrics is None else LabelledSink(metrics, tier=name)
                ctx = TierContext(self.pool.view, namespace, monotonic,
                                  self.log.getChild(name), sink, name, registry)
                tiers.append(create_tier(section, ctx, registry))
            self.p2p = [t for t in tiers if isinstance(t, P2PTier) and t.config["port"] is not None]
            if not self.p2p:
                raise ConfigError(ConfigProblem(
                    "$.secondary_tiers", "kvtiers serve needs a p2p tier with a port to "
                    'serve on, e.g. {"type": "p2p", "host": "0.0.0.0", "port": 5710}'))
            slots = num_slots_for(config, block_bytes)
            policy = registry.get_policy(config.eviction_policy).record.load()
            if not issubclass(policy, EvictionPolicy):
                raise ConfigError(ConfigProblem(
                    "$.eviction_policy", f"{config.eviction_policy!r} is not an eviction policy"))
            managed = tiers
            if metrics is not None:
                from kvtiers.manager import MeteredTier  # it imports the manager

                managed = [MeteredTier(t, name, metrics)
                           for t, name in zip(tiers, tier_names(config), strict=True)]
            self.manager = TieringOffloadingManager(
                slots, policy.for_slots(slots), managed, write_policy=config.write_policy,
                job_timeout_s=config.job_timeout_s,
                cascade_queue_blocks=config.cascade_queue_blocks,
                breaker_failures=config.breaker.failures,
                breaker_cooldown_s=config.breaker.cooldown_s,
                require_verified_tiers=config.require_verified_tiers,
                tier_names=tier_names(config),
                admissions=[_NoCopies() if isinstance(t, P2PTier) and not t.config["push"]
                            else None for t in tiers])
            where = {id(t): i for i, t in enumerate(tiers)}
            for tier in self.p2p:
                tier.accept_stores(self.store_blocks)
                try:
                    tier.start_serving(self.manager)  # a node that cannot serve stops
                except ListenError as exc:
                    raise CannotListen(exc, where[id(tier)]) from exc
        except BaseException:
            manager = getattr(self, "manager", None)
            if manager is not None:
                manager.close()  # its tiers (the metered wrappers) with it
            else:
                for built in tiers:
                    built.close()
            self.pool.close()
            raise
        self.stored = 0  # blocks peers pushed that the node kept

    @property
    def endpoints(self) -> list[str]:
        return [t.server.endpoint for t in self.p2p if t.server is not None]

    def store_blocks(self, keys: Sequence[BlockKey], blocks: Sequence[memoryview]) -> StoreAnswer:
        """The p2p server's sink: keep verified pushed blocks in the pool (keys held
        already are kept as they are: HELD). When the pool cannot take them all, as
        many as it can, in order, without evicting a block of this push (halving
        the chunk it asks room for; a key that fits alone in no room is REFUSED)."""
        mgr = self.manager
        n = len(keys)
        states = [State.REFUSED] * n
        evicted: list[BlockKey] = []
        held: list[BlockKey] = []  # this push's keys held now: protected from eviction
        view = self.pool.view
        i, step = 0, n
        while i < n:
            chunk = list(keys[i:i + step])
            out = mgr.prepare_store(held + chunk)
            if out is None:
                if step == 1:
                    i += 1
                else:
                    step = max(1, step // 2)
                continue
            fresh = dict(zip(out.keys, out.slots, strict=True))
            for j, key in enumerate(chunk, i):
                slot = fresh.get(key)
                if slot is not None:
                    view.block(slot)[:] = blocks[j]
                states[j] = State.HELD if slot is None else State.PRESENT
            mgr.complete_store(out.keys, True)
            self.stored += len(out.keys)
            evicted += out.evicted
            held += chunk
            i += len(chunk)
        bb = self.namespace.groups[0].block_bytes
        return StoreAnswer(states, evicted,
                           usage_bytes=mgr.stats(tiers=False)["pool"]["resident"] * bb)

    def step(self) -> None:
        self.manager.step()

    def status(self) -> str:
        """One line: peers, pool use, traffic."""
        stats = self.manager.stats()
        pool = stats["pool"]
        peers = sum(t.server.sessions for t in self.p2p if t.server is not None)
        shipped = sum(t.server.counters["blocks_shipped"] + t.server.counters["blocks_leased"]
                      for t in self.p2p if t.server is not None)
        return (f"peers {peers}  pool {pool['resident']}/{pool['num_slots']} blocks "
                f"({pool['pinned']} pinned)  shipped {shipped}  stored {self.stored}")

    def close(self) -> None:
        """Stop serving (peers are told), end the tiers' jobs, free the pool."""
        self.manager.drain(timeout=10.0)
        self.manager.close()
        self.pool.close()
