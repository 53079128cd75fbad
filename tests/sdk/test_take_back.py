"""`kvtiers.sdk.take_back`: a write of unknown outcome is deleted until the server
answers, then once more after the settle pause; failures are counted, never raised."""

from __future__ import annotations

import asyncio
import logging

from kvtiers.sdk import ErrorCounts, take_back


def counts() -> ErrorCounts:
    return ErrorCounts(logging.getLogger("test"), "test", kind=lambda exc: type(exc).__name__)


class FlakyServer:
    """A delete endpoint that refuses its first `refusals` calls, recording when each
    call came (loop time)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls: list[float] = []

    async def delete(self) -> None:
        self.calls.append(asyncio.get_running_loop().time())
        if len(self.calls) <= self.refusals:
            raise ConnectionError("server away")


def test_deletes_until_answered_then_once_more_after_settling() -> None:
    server = FlakyServer(refusals=2)
    errors = counts()
    asyncio.run(take_back(server.delete, errors, settle_s=0.05))
    assert len(server.calls) == 4  # two refused, one answered, one after settling
    assert server.calls[3] - server.calls[2] >= 0.05
    assert server.calls[2] - server.calls[1] >= server.calls[1] - server.calls[0]
    assert errors.snapshot().get("retract.ConnectionError") == 2


def test_a_failing_second_delete_is_counted_not_raised() -> None:
    class SecondFails(FlakyServer):
        async def delete(self) -> None:
            await super().delete()
            if len(self.calls) == 2:
                raise TimeoutError("lost")

    server = SecondFails(refusals=0)
    errors = counts()
    asyncio.run(take_back(server.delete, errors, settle_s=0.01))
    assert len(server.calls) == 2
    assert sum(errors.snapshot().values()) == 1


def test_cancellation_goes_through() -> None:
    server = FlakyServer(refusals=10**6)

    async def main() -> None:
        task = asyncio.create_task(take_back(server.delete, counts()))
        await asyncio.sleep(0.3)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return
        raise AssertionError("take_back swallowed its cancellation")

    asyncio.run(main())
    assert server.calls
