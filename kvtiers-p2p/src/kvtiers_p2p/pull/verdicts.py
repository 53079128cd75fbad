"""What a fetch's reply and the puller's verification say per key: the outcomes
both data planes report (`PeerLink._land` for frames, `NixlReads` for READs).

Pure functions on lists: any thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtiers.sdk import FailureReason, Outcome

from kvtiers_p2p.wire.protocol import State

__all__ = ["mark_corrupt", "outcomes_of"]


def outcomes_of(states: bytes) -> list[Outcome]:
    """Per key of a `TransferDone`: None (shipped: to be landed and verified),
    REJECTED (refused for the pin budget), MISSING (not held there)."""
    present = State.PRESENT
    if states.count(present) == len(states):
        return [None] * len(states)
    return [None if st == present else FailureReason.REJECTED if st == State.REFUSED
            else FailureReason.MISSING for st in states]


def mark_corrupt(out: list[Outcome], keys: Sequence[int], got: Sequence[int],
                 want: Sequence[int]) -> int:
    """`out[keys[j]] = CORRUPT` where the sum taken in the slot (`got[j]`) is not
    the one the server sent (`want[j]`); how many were."""
    if list(got) == list(want):
        return 0
    bad = 0
    for i, have, wanted in zip(keys, got, want, strict=True):
        if have != wanted:
            out[i] = FailureReason.CORRUPT
            bad += 1
    return bad
