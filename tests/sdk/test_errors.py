"""ErrorCounts: every problem counted by kind, the first of each kind logged once,
scrubbed; counting from many threads loses nothing."""

from __future__ import annotations

import logging
import threading

import pytest
from kvtiers.sdk import ErrorCounts


def test_counts_every_problem_and_logs_the_first_of_each_kind_scrubbed(
        caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("kvtiers.test.errors")
    errors = ErrorCounts(log, "tier t", scrub=lambda m: m.replace("s3cr3t", "***"))
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert errors.count("load.ConnectionError", "load failed: refused (key s3cr3t)")
        assert not errors.count("load.ConnectionError", "load failed: refused again")
        assert errors.count("store.ENOSPC", "store failed: no space")
    assert errors.snapshot() == {"load.ConnectionError": 2, "store.ENOSPC": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("tier t: load failed: refused (key ***)")
    assert "later load.ConnectionError are only counted" in lines[0]
    assert not any("s3cr3t" in line for line in lines)


def test_counting_from_many_threads_loses_nothing() -> None:
    errors = ErrorCounts(logging.getLogger("kvtiers.test.errors"), "t")

    def work(n: int) -> None:
        for i in range(2000):
            errors.count(f"op.kind{(i + n) % 3}", "x")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(errors.snapshot().values()) == 8000
