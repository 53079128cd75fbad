"""`SwapJob`: one job of the DeviceSwapper as its backends see it (GPU pages <->
pool slots), its `SwapResult` (a contract `JobResult`) and the swapper's counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtiers.contract.jobs import FailureReason, JobResult
from kvtiers.swap.plan import BlockCheck

__all__ = ["SwapResult", "SwapStats"]


@dataclass(slots=True)
class SwapResult(JobResult):
    """A `JobResult` plus what the swapper did: `direction` ("store" or "load"),
    `method` (the copy method that ran, see `kvtiers.swap.methods`), `group` (KV
    group) and `error` (why the job failed, in words; empty on success).

    Blocks are named by the keys passed at submit, or by their index in the job when
    no keys were passed. Invalid blocks fail with `rejected`, a copy that failed
    with `io`, a job submitted after `close()` with `closed`."""

    direction: str = ""
    method: str = ""
    group: int = 0
    error: str = ""


@dataclass
class SwapStats:
    """Counters since the swapper was created (read with `DeviceSwapper.stats()`)."""

    jobs: dict[str, int] = field(default_factory=dict)  # "store"/"load" -> finished jobs
    failed_jobs: int = 0
    blocks: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    methods: dict[str, int] = field(default_factory=dict)  # method -> jobs

    def record(self, result: SwapResult) -> None:
        d = result.direction
        self.jobs[d] = self.jobs.get(d, 0) + 1
        self.blocks[d] = self.blocks.get(d, 0) + len(result.ok)
        self.bytes[d] = self.bytes.get(d, 0) + result.bytes_moved
        self.seconds[d] = self.seconds.get(d, 0.0) + result.seconds
        if result.method:
            self.methods[result.method] = self.methods.get(result.method, 0) + 1
        if result.failed:
            self.failed_jobs += 1

    def throughput(self, direction: str) -> float:
        """Bytes per second of busy time in one direction (0 before any job)."""
        s = self.seconds.get(direction, 0.0)
        return self.bytes.get(direction, 0) / s if s > 0 else 0.0


class SwapJob:
    """One submitted job. Created on the submitting thread; a backend fills in
    `method`, `seconds` and, on failure, `error`, then marks it done."""

    __slots__ = (
        "job_id", "direction", "group", "keys", "check", "nbytes", "method",
        "seconds", "error", "started", "done", "payload", "closed",
    )  # fmt: skip

    def __init__(
        self,
        job_id: int,
        direction: str,
        group: int,
        keys: Sequence[Any] | None,
        check: BlockCheck,
        nbytes: int,
    ):
        self.job_id = job_id
        self.direction = direction
        self.group = group
        self.keys = keys
        self.check = check
        self.nbytes = nbytes
        self.method = ""
        self.seconds = 0.0
        self.error = ""
        self.closed = False
        self.started = time.perf_counter()
        self.done = threading.Event()
        self.payload: Any = None  # backend's: what must live until the copy ends

    def result(self) -> SwapResult:
        check = self.check
        names: Sequence[Any] = self.keys if self.keys is not None else range(check.n_blocks)
        if not (self.closed or self.error or check.problem):  # every block moved
            return SwapResult(
                self.job_id, list(names), {}, self.nbytes if check.n_blocks else 0,
                self.seconds, direction=self.direction, method=self.method,
                group=self.group,
            )  # fmt: skip
        valid = check.valid
        ok_idx: Sequence[int]
        bad_idx: Sequence[int]
        if self.closed:
            reason, ok_idx, bad_idx = FailureReason.CLOSED, [], range(check.n_blocks)
        elif self.error:
            reason, ok_idx, bad_idx = FailureReason.IO, [], range(check.n_blocks)
        else:
            reason = FailureReason.REJECTED
            ok_idx = np.flatnonzero(valid).tolist()
            bad_idx = np.flatnonzero(~valid).tolist()
        failed: dict[Any, FailureReason] = {}
        # Invalid blocks keep their own reason even when the copy of the others failed.
        if self.error and not self.closed:
            for i in np.flatnonzero(~valid).tolist():
                failed[names[i]] = FailureReason.REJECTED
            bad_idx = np.flatnonzero(valid).tolist()
        for i in bad_idx:
            failed.setdefault(names[i], reason)
        ok = [names[i] for i in ok_idx]
        error = self.error or ("closed" if self.closed else check.problem)
        return SwapResult(
            self.job_id,
            ok,
            failed,
            self.nbytes if ok else 0,
            self.seconds,
            direction=self.direction,
            method=self.method,
            group=self.group,
            error=error,
        )
