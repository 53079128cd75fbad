"""`MooncakeTier` (`{"type": "mooncake", ...}`): KV-cache blocks as objects in a
Mooncake Store - shared by every engine of the model that uses the same master,
tenant and prefix, verified, zero-copy from the CPU pool, bounded per engine.

Capacity: Mooncake's master places objects in the memory segments of its
clients and evicts by itself (above its high watermark). `capacity_bytes` is this
engine's quota: the block bytes of the objects it put and has not removed.
kvtiers evicts within it by `eviction_policy` and removes the evicted objects
(once their lease allows: until then they still count). Objects the master
evicts, or that were in a segment that went away, leave the index when a load or
the refresh (`admin_address`) finds them gone; they are misses meanwhile. Not
`persistent`: the tier keeps no index across restarts (objects it put stay in
the store for other engines until the master evicts them).

Threads and what they may do:

- the scheduler thread calls `lookup`, `submit_*`, `touch`, `get_finished_jobs`,
  `stats`: dictionary work on a `BoundedIndex`, a hand-off to the engine, never I/O;
- the `JobEngine`'s load and store threads make Mooncake's batch calls
  (`transfers.Transfers`);
- the probe thread (`AsyncProbe`) asks `batch_is_exist` about keys this engine
  has not stored (another engine may have): RETRY until it answers;
- the housekeeping thread removes evicted and damaged objects, and reconciles
  the index after an outage (`housekeeping.Housekeeper`).

Every thread that touches the network is started by the constructor.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

from kvtiers.errors import ConfigError, ConfigProblem, KvtiersError, UnknownNameError
from kvtiers.sdk import (
    AsyncProbe,
    BlockKey,
    BoundedIndex,
    ErrorCounts,
    IndexedTier,
    JobEngine,
    LookupResult,
    Progress,
    StatsRecorder,
    TierContext,
    TierInventory,
    TierStats,
    VerifyReport,
    probed_lookup,
    type_name,
)

from kvtiers_mooncake import admin, tools
from kvtiers_mooncake.breaker import Breaker
from kvtiers_mooncake.client import BreakerOpen, StartFailed, StoreClient
from kvtiers_mooncake.housekeeping import Housekeeper
from kvtiers_mooncake.names import Names
from kvtiers_mooncake.settings import MooncakeSettings, settings_from, split_address
from kvtiers_mooncake.transfers import Transfers

__all__ = ["MooncakeTier", "master_answers"]

#: a unit of a job (one Mooncake batch call) holds up to this many block bytes:
#: a unit's blocks are hashed before its put and after its get, so a job's first
#: put and its end wait for one unit's hashing; each call has a fixed cost, which
#: the other threads' calls hide (measured: 4-8 MiB best for 2 MiB blocks, 16 MiB
#: no better for 32 KiB ones; docs/benchmarks.md)
UNIT_BYTES = 8 << 20
#: probe verdicts: a hit is trusted this long (the master may evict any time; a
#: load of a block gone is a miss), a miss this long (another engine may store it)
PROBE_HIT_TTL_S = 5.0
PROBE_MISS_TTL_S = 0.5
VERIFY_PIECE = 256


def master_answers(address: str, timeout_s: float) -> OSError | None:
    """None when the master's RPC port takes a TCP connection, else why not."""
    host, port = split_address(address, "$.master_address")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc


class MooncakeTier(IndexedTier[None]):
    """See the module doc; config: `kvtiers_mooncake.schema.SCHEMA`. `IndexedTier`
    does the scheduler side's hand-offs (`submit_*`, `touch`, `get_finished_jobs`,
    `drain`)."""

    engine: JobEngine
    persistent = False
    shared = True
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        settings = settings_from(config)
        super().__init__(ctx, config)
        self.settings = settings
        self.name = ctx.name or "mooncake"
        self.names = Names(settings.prefix, ctx.namespace.fingerprint)
        try:
            policy = ctx.make_policy(settings.eviction_policy,
                                     max(1, settings.capacity_bytes // ctx.block_bytes))
        except UnknownNameError as exc:
            raise ConfigError(ConfigProblem("$.eviction_policy", f"mooncake tier: {exc}")) \
                from None
        self.index: BoundedIndex[None] = BoundedIndex(
            policy, settings.capacity_bytes, on_removed=ctx.events.removed)
        self._stats = StatsRecorder(settings.capacity_bytes)
        self._errors = ErrorCounts(ctx.logger, f"kvtiers-mooncake {self.name}",
                                   kind=type_name,
                                   describe=lambda exc: f"{type(exc).__name__}: {exc}")
        self._closed = False
        why = master_answers(settings.master_address, settings.timeout_s)
        if why is not None:
            raise KvtiersError(f"mooncake tier {self.name}: the master at "
                               f"{settings.master_address} does not answer ({why}); start "
                               "mooncake_master, or check master_address")
        self.breaker = Breaker(ctx.clock, settings.retry_s)
        try:
            self.client = StoreClient(settings, ctx.pool, self.breaker)
        except StartFailed as exc:
            raise KvtiersError(f"mooncake tier {self.name}: {exc}") from None
        self.house = Housekeeper(
            self.client, self.index, self.names, self._errors, name=f"kvtiers-{self.name}",
            refresh_s=settings.refresh_s, admin_address=settings.admin_address,
            timeout_s=settings.timeout_s)
        self._io = Transfers(ctx, self.client, self.index, self.names, self._stats,
                             self._errors, self.house, self.house.reconcile)
        self.engine = JobEngine(
            ctx, load=self._io.load, store=self._io.store,
            load_threads=settings.load_threads, store_threads=settings.store_threads,
            stats=self._stats, batch_bytes=max(UNIT_BYTES, ctx.block_bytes),
            name=f"kvtiers-{self.name}", on_crash=lambda exc: self._errors.record("task", exc))
        self._probe = AsyncProbe(self._probe_keys, clock=ctx.clock,
                                 hit_ttl_s=PROBE_HIT_TTL_S, miss_ttl_s=PROBE_MISS_TTL_S,
                                 name=f"kvtiers-{self.name}-probe")
        ctx.logger.info("kvtiers-mooncake %s: %s as %s, quota %d bytes, segment %d bytes, "
                        "pool of %d bytes registered", self.name, settings.where(),
                        self.client.hostname, settings.capacity_bytes,
                        settings.segment_bytes, ctx.pool.nbytes)

    def __repr__(self) -> str:
        return f"MooncakeTier({self.settings.where()}, capacity_bytes=" \
               f"{self.settings.capacity_bytes})"

    @property
    def location(self) -> str:
        return f"{self.settings.where()} namespace={self.names.fingerprint}"

    # -- scheduler side: memory only ---------------------------------------------------

    def lookup(self, key: BlockKey) -> LookupResult:
        if self._closed:
            return LookupResult.MISS
        return probed_lookup(key, key in self.index, self._probe, self._stats)

    def stats(self) -> TierStats:
        snap = self._stats.snapshot(
            usage_bytes=self.index.committed_bytes + self.house.leaving_bytes)
        snap.errors.update({f"mooncake.{k}": v for k, v in self._errors.snapshot().items()})
        return snap

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._probe.close(self.settings.timeout_s)
        self.engine.close(timeout=self.settings.timeout_s)
        self.house.close(self.settings.timeout_s)
        self.client.close()

    # -- the probe thread ----------------------------------------------------------------

    def _probe_keys(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        names = [self.names.block(k) for k in keys]
        try:
            codes = self.client.exist(names)
        except BreakerOpen:
            return []
        except Exception as exc:  # noqa: BLE001 - a failed probe is a miss
            self._errors.record("probe", exc)
            return []
        return [k for k, n, c in zip(keys, names, codes, strict=True)
                if c == 1 and n not in self.house]

    # -- tools (`kvtiers inspect` / `verify`): any thread but the scheduler's ------------

    def inventory(self, *, ages: bool = False) -> TierInventory:
        """What this engine's quota holds (store times are not recorded)."""
        return tools.inventory(self.ctx, self.index, self.name, self.location)

    @classmethod
    def survey(cls, config: Mapping[str, Any], *, name: str = "",
               ages: bool = False) -> TierInventory:
        """Every namespace under the prefix, from the master's admin listing."""
        settings: MooncakeSettings = settings_from(config)
        return tools.survey_store(settings, name or "mooncake")

    def verify_blocks(self, *, repair: bool = False,
                      progress: Progress | None = None) -> list[VerifyReport]:
        """Every block of this engine's quota re-read whole and re-checked; with
        `admin_address`, every block of the namespace the master lists (other
        engines' too). With `repair`, damaged objects of this format are removed
        (once their leases allow) and leave the index; others' are left alone."""
        keys = [k for k, _, _ in self.index.items()]
        if self.settings.admin_address is not None:
            held = set(keys)
            keys += [k for n in admin.all_keys(self.settings.admin_address,
                                               self.settings.timeout_s)
                     if (k := self.names.key_of(n)) is not None and k not in held]
        bad, vanished, removed = [], 0, 0
        for at in range(0, len(keys), VERIFY_PIECE):
            b, v, r = tools.verify_keys(self.client, self.index, self.house, self.names,
                                        self.ctx.block_bytes, keys[at:at + VERIFY_PIECE],
                                        self.location, repair=repair)
            bad += b
            vanished += v
            removed += r
            if progress is not None:
                progress(min(at + VERIFY_PIECE, len(keys)), len(keys))
        return [VerifyReport(self.name, self.ctx.namespace.fingerprint, self.location,
                             checked=len(keys), bad=tuple(bad), vanished=vanished,
                             removed_bytes=removed)]
