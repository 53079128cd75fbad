"""`RequestRecency`: the pool's recency committed once per request, in prefix order, as
vLLM's CPU cache policies do (0.33 and 0.34 alike: `CachePolicy.on_request_finished`).

vLLM's connector never calls `touch()` (0.33 had it, unused; 0.34 removed it): a
manager learns what a request used only from its `prepare_load` and `prepare_store`
calls, and vLLM's own policies commit it when the request finishes
(`on_request_finished`, called right after the request's last `prepare_store`): every
chunk the request observed is refreshed, tail first, so that the head of its prefix
is the most recent and evicted last. A prefix whose head is evicted is worthless
(lookups stop at the first miss), so this order decides what a small pool keeps.

vLLM's policies keep a chunk's place while transfers pin it (a load or a store that
ends is no use); kvtiers' pool does the same where its policy has in-place pins
(`EvictionPolicy.keep_pinned_in_place`: LRU and ARC; the spec asks for them), and
refreshes recency only when told (`touch`, `reorder`). Here, per request (its state
kept in vLLM's `ReqContext`, dropped with it):

- observed: the keys of its `prepare_load` calls (reused), and of its
  `prepare_store` offers: those it stores (inserted) and those already readable in
  the pool (reused: blocks the GPU's prefix cache served, which vLLM offers again
  after a prefix hit). A key being stored or promoted for another request is not a
  use (vLLM: "ready chunks" only).
- with in-place pins, the keys a `prepare_store` gives slots are placed tail first
  (`place`: by recency alone), as vLLM ranks a request's chunks from their
  insertion on: a prefix whose request has not finished yet loses its tail first.
- at `finished`, with in-place pins: one `reorder` of all of them in prefix order,
  tail first (the head of a prefix becomes the newest), the reused keys counting
  as a use (ARC: T2), the inserted ones moving by recency alone (ARC: within T1, as
  vLLM's ARC keeps insertions there). Blocks still held move too.
- without in-place pins (SIEVE, a policy without the mode), one `touch` in that
  order: the reused keys (a use, for every policy), and, where `touch` only orders
  (`recency_only`: LRU), the inserted keys too. A held block keeps its place there
  and becomes the newest when its last hold ends, so a store that completes is
  touched tail first where a touch only orders (vLLM ranks a request's chunks tail
  first from their insertion on), and after `finished` (the request's last store
  jobs, built in the step it finished) the request's whole order is touched again.

Scheduler thread only (the adapter's callers). O(1) per key observed; `finished` sorts
the request's keys once (O(n log n), as vLLM does).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import OffloadKey, ReqContext

Touch = Callable[[Sequence[OffloadKey]], None]
#: `reorder(keys, used)`: `TieringOffloadingManager.reorder`
Reorder = Callable[[Sequence[OffloadKey], Container[OffloadKey]], None]


@dataclass(slots=True)
class _Access:
    """What one request observed (kept in its `ReqContext`)."""

    owner: object
    generation: int
    inserted: dict[OffloadKey, None] = field(default_factory=dict)
    reused: dict[OffloadKey, None] = field(default_factory=dict)
    #: set at `finished`: the keys touched, tail first
    order: list[OffloadKey] | None = None


class RequestRecency:
    """See the module docstring. `touch(keys)` refreshes `keys` in that order (the
    last one becomes the newest). `reorder` (`TieringOffloadingManager.reorder`)
    and `place` (the same, by recency alone, tiers not told): given where the
    pool's policy keeps pinned blocks in place, then used instead of `touch`.
    `recency_only`: the policy's touch orders only (LRU), so inserted keys are
    touched too."""

    def __init__(
        self,
        touch: Touch,
        *,
        recency_only: bool,
        reorder: Reorder | None = None,
        place: Touch | None = None,
    ) -> None:
        self._touch = touch
        self._reorder = reorder
        self._place = place
        self._recency_only = recency_only
        self._generation = 0

    def _access(self, ctx: ReqContext) -> _Access:
        state: _Access | None = ctx.get_state(_Access)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = _Access(self, self._generation)
            ctx.set_state(state)
        return state

    def loaded(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """`keys` are loaded for the request: reused."""
        state = self._access(ctx)
        if state.order is None:
            state.reused.update(dict.fromkeys(keys))

    def offered(
        self,
        stored: Sequence[OffloadKey],
        readable: Sequence[OffloadKey],
        ctx: ReqContext,
    ) -> None:
        """Of a `prepare_store` offer: `stored` get slots for this request, `readable`
        were already readable in the pool."""
        state = self._access(ctx)
        if state.order is not None:
            return
        if stored:
            state.inserted.update(dict.fromkeys(stored))
            if self._place is not None:  # ranked tail first from their insertion on
                self._place(stored[::-1])
        if readable:
            inserted, reused = state.inserted, state.reused
            for key in readable:
                # Re-offered after this request stored it (a preemption): not a reuse.
                if key not in inserted:
                    reused[key] = None

    def finished(self, ctx: ReqContext) -> None:
        """The request's last `prepare_store` was made: commit its recency."""
        state: _Access | None = ctx.get_state(_Access)
        if (
            state is None
            or state.owner is not self
            or state.generation != self._generation
            or state.order is not None
        ):
            return
        reused = state.reused
        keys = list(reused)
        if self._recency_only or self._reorder is not None:
            keys += [k for k in state.inserted if k not in reused]
        position = ctx.get_offload_key_position
        positions = [position(k) for k in keys]
        if None not in positions:
            order = [k for _, k in sorted(zip(positions, keys, strict=True),
                                          key=lambda pk: pk[0], reverse=True)]  # fmt: skip
        else:  # no positions (a caller outside vLLM's connector): as observed
            order = keys[::-1]
        state.order = order
        state.inserted.clear()
        if self._reorder is not None:
            if order:
                self._reorder(order, reused)
            reused.clear()
            return
        reused.clear()
        if order:
            self._touch(order)

    def stored(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """The request's store of `keys` (in prefix order) completed: its blocks just
        became the newest, in that order. Where a touch only orders (LRU) they are
        put tail first, head newest, as vLLM ranks a request's chunks from their
        insertion; after `finished`, the request's whole order is restored. (With
        in-place pins the end of a store is no use: nothing to do.)"""
        if not self._recency_only or not keys or self._reorder is not None:
            return
        state: _Access | None = ctx.get_state(_Access)
        if (
            state is not None
            and state.owner is self
            and state.generation == self._generation
            and state.order is not None
        ):
            if state.order:
                self._touch(state.order)
        else:
            self._touch(keys[::-1])

    def reset(self) -> None:
        """The pool was emptied: what requests observed before is forgotten."""
        self._generation += 1
