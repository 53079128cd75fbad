"""`WriteVerdict`: what a store job learns about each of its blocks from the namespace
index, at reservation time or when it stops waiting for another writer."""

from __future__ import annotations

import enum


class WriteVerdict(enum.Enum):
    GRANTED = "granted"  # reserved: write the block, then commit or abort it
    # granted, and an evicted block's file waits at the temporary name: overwrite it
    RECYCLED = "recycled"
    PRESENT = "present"  # committed already (by this job's writer or another): done
    # another intent (another process's, or another job's here) is writing it: wait
    # for it to commit or end (`RootStore.await_intent`) - never "done" before that
    PENDING = "pending"
    FULL = "full"  # cannot fit: nothing evictable left
    # what a wait can end with besides the above
    TIMEOUT = "timeout"  # the job's deadline passed while the other write was in flight
    CLOSED = "closed"  # the store closed
    ERROR = "error"  # the journal could not be read or appended
