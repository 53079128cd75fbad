"""A secondary tier's job results as the installed vLLM takes them.

vLLM 0.34 added `JobResult.deferred_release`: a failed promotion may hand vLLM a
`threading.Event`, and vLLM's tiering manager then fails the keys at once but keeps
their primary chunks out of its free pool until the event is set (the tier's I/O may
still write into them). vLLM 0.33 has no such field: there a tier may report a
promotion only once its I/O has ended.

Pure; any thread.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Collection
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.tiering.base import JobResult

#: Whether this vLLM can hold a failed promotion's chunks until the tier lets go.
DEFERRED_RELEASE = "deferred_release" in {f.name for f in dataclasses.fields(JobResult)}


def job_result(
    job_id: int,
    success: bool,
    *,
    successful_keys: Collection[OffloadKey] | None = None,
    transfer_time: float | None = None,
    transfer_bytes: int | None = None,
) -> JobResult:
    """A finished job, its I/O over."""
    return JobResult(
        job_id=job_id,
        success=success,
        successful_keys=successful_keys,
        transfer_time=transfer_time,
        transfer_bytes=transfer_bytes,
    )


def failed_while_writing(job_id: int, release: threading.Event) -> JobResult:
    """A promotion reported failed while the tier may still write its chunks;
    `release` is set once it no longer can. Only where `DEFERRED_RELEASE`."""
    if not DEFERRED_RELEASE:
        raise RuntimeError(
            "this vLLM has no JobResult.deferred_release: a promotion must be reported "
            "once its I/O ended"
        )
    extra: dict[str, Any] = {"deferred_release": release}  # a 0.34 field
    return JobResult(job_id=job_id, success=False, **extra)
