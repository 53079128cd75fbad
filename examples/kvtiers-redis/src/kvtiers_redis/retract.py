"""`Retractions`: taking back the SETs of a store whose outcome is unknown.

A pipeline of SETs that timed out or lost its connection may still be carried out:
a server that was frozen (SIGSTOP) or slow past the job's deadline reads the
requests it holds in its socket buffers once it runs again, and writes the values -
while the tier reported those keys not stored and never counts them. So the tier
deletes (UNLINK) their names with `kvtiers.sdk.take_back`: until the server answers a
delete, then once more a second later, for requests it was still holding when it
resumed (they came on another connection; the server orders nothing across
connections). A refusal by
the server (an error reply) changed nothing and is not taken back.

Until a key's retraction ends the key is as good as gone: a new store of it waits
(`settled`), so the late delete never takes the new value; the start-up scan does
not take its name in.

Threads: everything on the loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from kvtiers.sdk import ErrorCounts, take_back

from kvtiers_redis.names import Names

__all__ = ["Retractions"]


class Retractions:
    """`retract(keys, unlink)` starts taking keys back; `settled(keys)` waits for it."""

    def __init__(self, names: Names, errors: ErrorCounts,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]):
        self.names = names
        self.errors = errors
        self.spawn = spawn
        self.pending: dict[bytes, asyncio.Event] = {}  # key -> set once taken back

    def __contains__(self, key: object) -> bool:
        return key in self.pending

    def retract(self, keys: list[bytes],
                unlink: Callable[[list[bytes]], Awaitable[object]]) -> None:
        """Take back the values of `keys` (call once their request has ended);
        `unlink(names)` is one UNLINK, bounded by the client's own timeouts - no
        `wait_for` around it: a delete cut short could itself land late, after a
        new store of the key."""
        if not keys:
            return
        done = asyncio.Event()
        for key in keys:
            self.pending[key] = done
        self.spawn(self._run(keys, [self.names.block(k) for k in keys], unlink, done))

    async def settled(self, keys: Iterable[bytes]) -> None:
        """Wait until none of `keys` is being taken back."""
        for key in keys:
            while (done := self.pending.get(key)) is not None:
                await done.wait()

    async def _run(self, keys: list[bytes], names: list[bytes],
                   unlink: Callable[[list[bytes]], Awaitable[object]],
                   done: asyncio.Event) -> None:
        try:
            await take_back(lambda: unlink(names), self.errors)
        finally:
            for key in keys:
                if self.pending.get(key) is done:
                    del self.pending[key]
            done.set()
