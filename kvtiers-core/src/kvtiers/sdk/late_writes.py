"""`take_back`: undoing a write whose outcome is unknown, for tiers on remote stores.

A request that timed out, or whose connection dropped, may still be carried out: a
server that was frozen (SIGSTOP) or slow past the job's deadline handles the requests
it holds in its buffers once it runs again, and writes the value - while the tier
reported the key not stored and never counts it. `take_back(delete, errors)` deletes
until the server answers a delete, then once more `settle_s` later, for requests it
was still holding when it resumed (they may come on another connection, and a
server orders nothing across connections).

The caller keeps the name "as good as gone" until the coroutine returns: no lookup,
probe or listing takes it in, and a new store of it waits, so the late delete never
takes a new value. `delete` must be bounded by the client's own timeouts, with no
`wait_for` around it: a delete cut short could itself land late, after a new store.

Threads: a coroutine for the tier's event loop; errors are counted in `errors` under
"retract" (a server that stays away is retried with a growing pause; the tier's close
cancels what is left, and the next start-up's listing counts a late object).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kvtiers.sdk.error_counts import ErrorCounts

__all__ = ["PAUSE_MAX_S", "PAUSE_S", "SETTLE_S", "take_back"]

#: after a delete is answered, the wait for requests the server still held
SETTLE_S = 1.0
#: first and longest pause between deletes the server did not answer
PAUSE_S = 0.25
PAUSE_MAX_S = 5.0


async def take_back(delete: Callable[[], Awaitable[object]], errors: ErrorCounts, *,
                    settle_s: float = SETTLE_S) -> None:
    """Delete until answered, then once more `settle_s` later; never raises (but
    lets cancellation through)."""
    try:
        pause = PAUSE_S
        while True:
            try:
                await delete()
                break
            except Exception as exc:  # noqa: BLE001 - the server is away: again, later
                errors.record("retract", exc)
                await asyncio.sleep(pause)
                pause = min(2 * pause, PAUSE_MAX_S)
        await asyncio.sleep(settle_s)
        await delete()
    except Exception as exc:  # noqa: BLE001 - answered once: a late one is rare
        errors.record("retract", exc)
