"""`kvtiers_p2p.pull.verdicts`: the outcome per key both data planes report."""

from __future__ import annotations

from kvtiers.contract.jobs import FailureReason
from kvtiers_p2p.pull.verdicts import mark_corrupt, outcomes_of
from kvtiers_p2p.wire.protocol import State


def test_a_reply_says_shipped_refused_or_missing_per_key() -> None:
    states = bytes([State.PRESENT, State.REFUSED, State.ABSENT, State.PENDING, State.PRESENT])
    assert outcomes_of(states) == [None, FailureReason.REJECTED, FailureReason.MISSING,
                                   FailureReason.MISSING, None]
    assert outcomes_of(bytes([State.PRESENT]) * 3) == [None] * 3
    assert outcomes_of(b"") == []


def test_only_blocks_whose_sums_differ_are_corrupt() -> None:
    out = outcomes_of(bytes([State.PRESENT, State.ABSENT, State.PRESENT, State.PRESENT]))
    assert mark_corrupt(out, [0, 2, 3], [11, 22, 33], [11, 99, 33]) == 1
    assert out == [None, FailureReason.MISSING, FailureReason.CORRUPT, None]
    assert mark_corrupt(out, range(0), [], []) == 0
