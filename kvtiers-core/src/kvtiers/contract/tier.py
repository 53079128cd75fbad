"""The secondary-tier contract (version 2): what a storage tier plugin implements.

A tier never touches the GPU. Threads:

- **the scheduler thread** (the manager's caller) calls `lookup` (and
  `lookup_in_request`), `submit_store`, `submit_load`, `get_finished_jobs`,
  `touch`, `stats` and the request hooks. These
  must not block on I/O, the network or another process, nor do work that grows
  with the number of blocks the tier holds: dictionary work only, O(1) per key.
- **the tier's own threads** do every byte of I/O. A job is reported exactly once,
  through `get_finished_jobs()`, and only when none of the tier's I/O can still
  touch the job's slots. Failures are per-key `FailureReason`s, never exceptions.
- `drain` and `close` may block (shutdown, tests); `close` may be called from any
  thread, once or more.

What a tier needs besides its config comes from its `TierContext`: the pool, the
namespace, the clock, a logger, metrics, events, and the registry through
`make_policy` / `build_tier`. The SDK (`kvtiers.sdk`) has the hard parts: the job
engine and a bounded index with reference-counted pins.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvtiers.contract.clock import Clock, monotonic
from kvtiers.contract.events import TierEvents
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.contract.jobs import JobResult, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.metrics import MetricsSink, NullMetrics
from kvtiers.contract.namespace import Namespace
from kvtiers.contract.parent import ParentManager
from kvtiers.contract.pool_view import PoolView
from kvtiers.contract.section import TierSection
from kvtiers.contract.stats import TierStats
from kvtiers.errors import ConfigError, ConfigProblem, PluginError, UnknownNameError

if TYPE_CHECKING:
    from kvtiers.contract.inventory import TierInventory
    from kvtiers.contract.verification import Progress, VerifyReport
    from kvtiers.plugins.registry import Registry



@dataclass(frozen=True)
class TierContext:
    """Everything the core hands a tier besides its own config section.

    `registry` is the plugin registry the tier was built from (None: the
    process-wide one); a tier resolves the names in its config through
    `make_policy` and `build_tier`, never through the registry's internals.
    `events` is where a tier reports blocks that left it (evicted, found corrupt,
    removed): thread-safe, cheap, a no-op unless someone reads events.
    """

    pool: PoolView
    namespace: Namespace
    clock: Clock = monotonic
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("kvtiers.tier"))
    metrics: MetricsSink = field(default_factory=NullMetrics)
    name: str = ""  # the tier's name in the stack, e.g. "fs" or "fs#2"
    registry: Registry | None = None
    events: TierEvents = field(default_factory=TierEvents)

    @property
    def slot_bytes(self) -> int:
        return self.pool.slot_bytes

    @property
    def block_bytes(self) -> int:
        return self.pool.block_bytes

    def get_registry(self) -> Registry:
        """The registry names are resolved in (the process-wide one if none was given)."""
        if self.registry is not None:
            return self.registry
        from kvtiers.plugins.registry import get_registry

        return get_registry()

    def make_policy(self, name: str, capacity: int | None) -> EvictionPolicy:
        """A new instance of the registered eviction policy `name`, sized for
        `capacity` entries (None: unknown). An unknown name raises
        `UnknownNameError` listing the installed policies."""
        cls = self.get_registry().get_policy(name).record.load()
        policy = cls(capacity=capacity)
        if not isinstance(policy, EvictionPolicy):
            raise TypeError(
                f"policy {name!r} built a {type(policy).__name__}, not an EvictionPolicy"
            )
        return policy

    def build_tier(
        self, section: TierSection | Mapping[str, Any], *, suffix: str = "inner"
    ) -> SecondaryTier:
        """Build a nested tier (what a wrapper such as `faulty` wraps) from a loaded
        `TierSection` or a mapping with a "type", in this context's registry, with
        its own name (`<name>.<suffix>`); its removals are reported to this
        context's `events`."""

        if isinstance(section, Mapping) and not isinstance(section, TierSection):
            kind = section.get("type")
            if not isinstance(kind, str):
                raise ConfigError(ConfigProblem(
                    f"$.{suffix}", f"expected a tier section with a string 'type', got "
                    f"{dict(section)!r:.200}"))
            section = TierSection(
                kind, {k: v for k, v in section.items() if k != "type"}, f"$.{suffix}")
        if not isinstance(section, TierSection):
            raise ConfigError(ConfigProblem(
                f"$.{suffix}", f"expected a tier section with a 'type', got {section!r:.200}"))
        ctx = dataclasses.replace(
            self, name=f"{self.name}.{suffix}" if self.name else suffix)
        return create_tier(section, ctx)


class SecondaryTier(ABC):
    """A storage tier below the CPU pool. Construct with `(ctx, config)`, where
    `config` is the tier's config section (validated and with defaults filled in
    when it comes from a config document; resolve it with
    `kvtiers.config.options.resolve_options` to accept hand-written sections too).

    The constructor may block (open files, connect): it runs before serving."""

    # Capability flags. Read them from the instance, not the class: a wrapper (the
    # `faulty` tier) takes its inner tier's flags per instance.
    #: blocks survive a restart of the process (usage and recency too)
    persistent: bool = False
    #: several processes may use one store at once (lookup may answer RETRY)
    shared: bool = False
    #: implements `serve_external_requests`
    serves_peers: bool = False
    #: checksums every block on store and verifies it on load (`corrupt` on mismatch)
    verifies: bool = False

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        self.ctx = ctx
        self.config = config

    @abstractmethod
    def lookup(self, key: BlockKey) -> LookupResult:
        """Scheduler thread; never blocks. HIT only when a load submitted now would
        find the bytes; MISS; or RETRY (a probe was started: ask again next step)."""

    @abstractmethod
    def submit_store(self, job: TransferJob) -> None:
        """Scheduler thread; never blocks. Copy the job's slots into the tier on the
        tier's threads. A key already held succeeds without a copy; success means a
        complete, verifiable copy is committed."""

    @abstractmethod
    def submit_load(self, job: TransferJob) -> None:
        """Scheduler thread; never blocks. Copy the job's blocks into its slots on the
        tier's threads; what `lookup` called a HIT stays until the load ends (pinned);
        verified before success if `verifies`."""

    @abstractmethod
    def get_finished_jobs(self) -> list[JobResult]:
        """Scheduler thread; never blocks. Results of jobs that ended since the last
        call, each job exactly once."""

    @abstractmethod
    def drain(self, timeout: float | None = None) -> bool:
        """Any thread; blocks. Wait until every submitted job has ended (True) or
        `timeout` passed (False). Results stay queued for `get_finished_jobs`."""

    @abstractmethod
    def close(self) -> None:
        """Any thread; may block while running I/O ends. Stop the tier's threads and
        release its resources. Idempotent. Jobs that never ran are reported as
        failed with `closed`; later submissions too."""

    @abstractmethod
    def stats(self) -> TierStats:
        """Scheduler thread; never blocks. A snapshot of counters and usage."""

    # Optional parts of the contract (scheduler thread, never blocking).

    def touch(self, keys: Iterable[BlockKey]) -> None:  # noqa: B027 - optional, a no-op
        """The keys were used: refresh their recency. Default: nothing."""

    def lookup_in_request(self, key: BlockKey, request_id: str) -> LookupResult:
        """Scheduler thread; never blocks. `lookup` for a lookup that engine request
        `request_id` (the id `on_request_start` named) makes: a tier whose answer
        depends on the request (p2p: a request's `remote_prefiller` holds its
        blocks, so they are hits at once) overrides it. Same answers and duties as
        `lookup`. The manager calls it only where `answers_in_request()` is True,
        and only for lookups made for a request; every other lookup is `lookup`.
        Default: `self.lookup(key)`."""
        return self.lookup(key)

    def answers_in_request(self) -> bool:
        """Whether `lookup_in_request` is more than `lookup`, asked once when the
        manager is built (other tiers then pay nothing per lookup for it). Default:
        whether the tier's class overrides `lookup_in_request`; a wrapper that
        forwards both (`faulty`, the metrics' `MeteredTier`) answers for the tier
        it wraps."""
        return type(self).lookup_in_request is not SecondaryTier.lookup_in_request

    def on_request_start(  # noqa: B027 - optional, a no-op
        self, request_id: str, params: Mapping[str, Any] | None = None
    ) -> None:
        """An engine request started. `params` are the engine's per-request transfer
        parameters (vLLM's `kv_transfer_params`: peer roles and addresses for p2p),
        None when it has none. Default: nothing."""

    def on_request_finished(self, request_id: str) -> None:  # noqa: B027 - optional
        """An engine request finished. Default: nothing."""

    def inventory(self, *, ages: bool = False) -> TierInventory:
        """What the tier holds now: per namespace and place, its blocks (key, size,
        when stored) and its committed and reserved bytes (`kvtiers.contract.inventory`).
        With `ages`, fill in `stored_at` even where that costs a metadata read per
        block. For tests and tools (`kvtiers inspect` / `verify`): any thread but
        the scheduler's; it may block on I/O and takes time proportional to the
        blocks held. Default: NotImplementedError (the tier cannot enumerate)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list what it holds")

    @classmethod
    def survey(cls, config: Mapping[str, Any], *, name: str = "",
               ages: bool = False) -> TierInventory:
        """What the store `config` names holds, every namespace in it (ours and other
        models'), with each namespace's model and geometry where the tier records
        them - read WITHOUT building the tier: no writes, no locks others wait for,
        safe beside live engines (`kvtiers inspect`). `name`: the tier's name in the
        stack, for the result. Blocks on I/O; time proportional to the blocks held.
        Default: NotImplementedError (the tier cannot list its store)."""
        raise NotImplementedError(f"{cls.__name__} cannot survey its store")

    def verify_blocks(self, *, repair: bool = False,
                      progress: Progress | None = None) -> list[VerifyReport]:
        """Re-read and re-check every committed block of this tier's namespace (one
        report per place: root, bucket prefix), reporting each bad one by reason
        (`kvtiers.contract.verification`); with `repair`, remove the bad ones through the
        tier's own accounting, so usage stays exact. Safe beside live engines on a
        shared store: a block that another process evicts meanwhile is not bad.
        `progress(done, total)` is called from the calling thread. Any thread but the
        scheduler's; blocks; reads every byte. Default: NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} cannot verify its blocks")

    def serve_external_requests(self, parent: ParentManager) -> None:
        """Called once, from the thread that builds the manager, for `serves_peers`
        tiers: serve peers from `parent` on the tier's own threads. Must not block."""
        raise NotImplementedError(f"{type(self).__name__} does not serve peers")


def create_tier(
    section: TierSection, ctx: TierContext, registry: Registry | None = None
) -> SecondaryTier:
    """Build the tier `section.type` as `cls(ctx, section.options)`.

    Names resolve in `registry`, else in `ctx.registry`, else in the process-wide
    registry; the tier gets a context that carries that registry, so the names in
    its own config (policies, nested tiers: `ctx.make_policy`, `ctx.build_tier`)
    resolve in the same one. Unknown names raise `UnknownNameError` (listing the
    installed tiers, with a did-you-mean and an install hint); a plugin that cannot
    be used raises `PluginError`; both name the section's JSON path. Errors the
    tier's constructor raises (`ConfigError` for a bad option) propagate unchanged.
    """
    if registry is not None and ctx.registry is not registry:
        ctx = dataclasses.replace(ctx, registry=registry)
    reg = ctx.get_registry()
    try:
        registered = reg.get_tier(section.type)
        cls = registered.record.load()
    except (PluginError, UnknownNameError) as exc:
        raise type(exc)(f"{section.path}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, SecondaryTier)):
        raise PluginError(
            f"{section.path}: tier {section.type!r} from {registered.distribution} names "
            f"{cls!r}, which is not a kvtiers.SecondaryTier subclass"
        )
    return cls(ctx, section.options)
