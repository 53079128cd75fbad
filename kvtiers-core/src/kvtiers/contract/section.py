"""`TierSection`: one tier of a config, as tiers, the manager and engines share it.

It lives in the contract (not in `kvtiers.config`) because a tier builds the tiers
it wraps from sections (`TierContext.build_tier`), and the contract must not depend
on the config loader. Frozen: decided once, then only read, from several threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["TierSection", "freeze", "thaw"]


@dataclass(frozen=True)
class TierSection:
    """One validated tier section: its `type` (a registered tier name), its options
    (validated against the tier's schema, defaults filled in, nested tier sections
    such as the `faulty` tier's `inner` turned into `TierSection`s), and the JSON path
    it came from (for messages)."""

    type: str
    options: Mapping[str, Any]
    path: str = "$"
    #: the admission policy of an entry of `secondary_tiers` (`kvtiers.admission`)
    #: and its options, defaults filled in; "all" on nested sections
    admission: str = "all"
    admission_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        """The section as JSON data: `{"type": ..., **options}`, with `admission`
        unless it is the default."""
        out = {"type": self.type, **thaw(self.options)}
        if self.admission_options:
            out["admission"] = {"policy": self.admission, **thaw(self.admission_options)}
        elif self.admission != "all":
            out["admission"] = self.admission
        return out

    def walk(self) -> list[TierSection]:
        """This section and every section nested in its options, outermost first."""
        out = [self]
        for value in self.options.values():
            items = value if isinstance(value, tuple) else (value,)
            for item in items:
                if isinstance(item, TierSection):
                    out.extend(item.walk())
        return out



def freeze(value: Any) -> Any:
    """Read-only copy of JSON data: dicts become mappingproxies, lists tuples."""
    if isinstance(value, Mapping) and not isinstance(value, MappingProxyType):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain JSON data back from `freeze`d data (and tier sections)."""
    if isinstance(value, TierSection):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value
