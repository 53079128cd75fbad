"""`Prefills`: the requests whose `remote_prefiller` holds their blocks (P/D).

A request's vLLM `kv_transfer_params` may name the prefill node that computed its
blocks (`remote_prefiller`). Its lookups are then hits at once, pulled from that
peer (`P2PTier.lookup_in_request`): this is what the tier remembers for it - the
peer's link, and which keys those lookups answered - until the request finishes.

Written on the scheduler thread only; the engine's loop reads `holder(key)` (a
dictionary read, safe beside the scheduler's writes). Bounded: `MAX_REQUESTS`
requests (the oldest forgotten), `MAX_REQUEST_KEYS` keys per request, and
`MAX_NAMED` keys in all (the oldest forgotten: then probed at the load).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtiers.sdk import BlockKey

from kvtiers_p2p.pull.link import PeerLink

__all__ = ["MAX_NAMED", "MAX_REQUESTS", "MAX_REQUEST_KEYS", "Prefills"]

#: requests remembered (the oldest forgotten beyond)
MAX_REQUESTS = 1 << 16
#: keys one request's prefiller may have answered (beyond: its further keys are
#: probed); a 1M-token prompt of 16-token blocks fits
MAX_REQUEST_KEYS = 1 << 16
#: keys named by all requests together (the oldest forgotten beyond)
MAX_NAMED = 1 << 20


@dataclass(eq=False)
class _Prefill:
    link: PeerLink
    keys: dict[BlockKey, None] = field(default_factory=dict)


class Prefills:
    """See the module docstring."""

    __slots__ = ("_named", "_requests")

    def __init__(self) -> None:
        self._requests: dict[str, _Prefill] = {}
        self._named: dict[BlockKey, _Prefill] = {}

    def __len__(self) -> int:
        """Requests remembered."""
        return len(self._requests)

    @property
    def named(self) -> int:
        """Keys remembered, all requests together."""
        return len(self._named)

    def start(self, request_id: str, link: PeerLink) -> None:
        """Request `request_id`'s blocks are `link`'s peer's (scheduler thread)."""
        self.finish(request_id)
        requests = self._requests
        if len(requests) >= MAX_REQUESTS:
            self.finish(next(iter(requests)))
        requests[request_id] = _Prefill(link)

    def link(self, request_id: str) -> PeerLink | None:
        """The prefiller of `request_id`, if it named one (scheduler thread)."""
        prefill = self._requests.get(request_id)
        return None if prefill is None else prefill.link

    def name(self, request_id: str, key: BlockKey) -> bool:
        """Remember that `key` is pulled from `request_id`'s prefiller (scheduler
        thread); False (nothing remembered) when the request named none or holds
        `MAX_REQUEST_KEYS` keys already. O(1)."""
        prefill = self._requests.get(request_id)
        if prefill is None:
            return False
        if key not in prefill.keys:
            if len(prefill.keys) >= MAX_REQUEST_KEYS:
                return False
            prefill.keys[key] = None
        named = self._named
        if key not in named and len(named) >= MAX_NAMED:
            named.pop(next(iter(named)))
        named[key] = prefill
        return True

    def holder(self, key: BlockKey) -> PeerLink | None:
        """The prefiller a live request's lookup named for `key` (any thread)."""
        prefill = self._named.get(key)
        return None if prefill is None else prefill.link

    def finish(self, request_id: str) -> None:
        """Forget the request and the keys it named (scheduler thread): O(its keys)."""
        prefill = self._requests.pop(request_id, None)
        if prefill is None:
            return
        named = self._named
        for key in prefill.keys:
            if named.get(key) is prefill:
                del named[key]
