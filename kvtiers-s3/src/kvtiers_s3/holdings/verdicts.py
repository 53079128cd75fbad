"""`Verdicts`: objects under the namespace prefix that failed verification, each
remembered with what identifies its bytes (size, store time, ETag), so that a probe
or a listing that finds the same object again leaves it out - a miss, never a HIT
that fails once more - until the object changes (rewritten: another ETag, size or
time; deleted). Bounded: the oldest verdicts are forgotten first.

What is remembered: every block object a load found bad - ours and broken
(`corrupt`: being deleted, but a delete may fail) or not provably ours (`foreign`,
`namespace`, `version`: quarantined, never deleted) - and every object a listing
or probe found not provably ours (a segment, a block object of the wrong size).
An object the tier writes itself under a name is judged afresh (`forget`).

Loop thread only (probes, listings and loads all run on the tier's event loop).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvtiers_s3.client.objects import ObjectInfo
from kvtiers_s3.layout.codec import Reason

__all__ = ["MAX_VERDICTS", "Verdict", "Verdicts"]

#: verdicts kept at most (a few hundred bytes each)
MAX_VERDICTS = 16384


@dataclass(frozen=True, slots=True)
class Verdict:
    size: int
    mtime: float | None
    etag: str | None
    reason: Reason

    def matches(self, info: ObjectInfo) -> bool:
        """Whether `info` is the object judged (the same bytes, as far as the store
        tells): its ETag where both are known, else its store time; the size always."""
        if info.size != self.size:
            return False
        if self.etag is not None and info.etag is not None:
            return self.etag == info.etag
        if self.mtime is not None and info.mtime is not None:
            return abs(self.mtime - info.mtime) < 1e-3
        return True  # nothing else to tell them apart: the same until it changes size


class Verdicts:
    """See the module doc."""

    def __init__(self, limit: int = MAX_VERDICTS):
        self.limit = max(1, limit)
        self._bad: OrderedDict[str, Verdict] = OrderedDict()

    def remember(self, info: ObjectInfo, reason: Reason) -> None:
        self._bad[info.name] = Verdict(info.size, info.mtime, info.etag, reason)
        self._bad.move_to_end(info.name)
        while len(self._bad) > self.limit:
            self._bad.popitem(last=False)

    def get(self, name: str) -> Verdict | None:
        return self._bad.get(name)

    def judge(self, info: ObjectInfo) -> Verdict | None:
        """The verdict on the object `info` describes, or None: none was given, or
        the object changed since (then the old verdict is forgotten)."""
        verdict = self._bad.get(info.name)
        if verdict is None:
            return None
        if verdict.matches(info):
            return verdict
        del self._bad[info.name]
        return None

    def forget(self, name: str) -> None:
        self._bad.pop(name, None)

    def __len__(self) -> int:
        return len(self._bad)

    def __contains__(self, name: object) -> bool:
        return name in self._bad
