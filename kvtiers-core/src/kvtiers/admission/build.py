"""Building a tier section's admission policy for the manager."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.admission.base import AdmissionPolicy
from kvtiers.errors import PluginError
from kvtiers.plugins.registry import Registry

__all__ = ["ADMIT_ALL", "build_admission"]

ADMIT_ALL = "all"


def build_admission(registry: Registry, name: str, options: Mapping[str, Any],
                    capacity_blocks: int | None) -> AdmissionPolicy | None:
    """The policy `name` with `options`, or None for `all` (the manager then
    cascades every block without asking)."""
    if name == ADMIT_ALL and not options:
        return None
    cls = registry.get_admission(name).record.load()
    if not (isinstance(cls, type) and issubclass(cls, AdmissionPolicy)):
        raise PluginError(f"admission {name!r} is a {getattr(cls, '__name__', cls)!r}, "
                          "not an AdmissionPolicy")
    policy: AdmissionPolicy = cls(capacity_blocks=capacity_blocks, **dict(options))
    return policy
