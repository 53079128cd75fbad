"""Checks that span tier sections: a tier listed twice, a directory two tiers
claim, and the RAM the tiers hold (summed with the pool by `machine.check_ram`).

They read what each tier's schema declares (`"x-kvtiers": "own_directory"`,
`"x-kvtiers": "ram_bytes"`), so a plugin's tier takes part by marking its schema;
no tier code is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvtiers.config.model import TierSection, thaw
from kvtiers.config.paths import join
from kvtiers.config.schema import (
    is_own_directory_schema,
    is_ram_schema,
    is_tier_array_schema,
    properties,
)
from kvtiers.errors import ConfigProblem
from kvtiers.plugins.registry import Registry


def _schema(section: TierSection, registry: Registry) -> Mapping[str, Any]:
    reg = registry.tiers.get(section.type)
    return reg.record.schema if reg is not None else {}


def duplicate_problems(
    tiers: Sequence[TierSection], registry: Registry
) -> list[ConfigProblem]:
    """A tier section equal to an earlier one in the same list (the top-level
    `secondary_tiers`, or a tier's own list of tier sections): every block would be
    stored and looked up twice. Wrapped sections are not compared with unwrapped
    ones: a `faulty` tier around a copy of another tier is a test, not a mistake."""
    problems: list[ConfigProblem] = []
    lists: list[Sequence[TierSection]] = [tiers]
    for section in (s for t in tiers for s in t.walk()):
        for key, sub in properties(_schema(section, registry)).items():
            value = section.options.get(key)
            if is_tier_array_schema(sub) and isinstance(value, tuple):
                lists.append([v for v in value if isinstance(v, TierSection)])
    for group in lists:
        seen: dict[str, str] = {}
        for section in group:
            text = json.dumps(section.to_dict(), sort_keys=True, default=str)
            if text in seen:
                problems.append(
                    ConfigProblem(
                        section.path,
                        f"the same tier as {seen[text]}: every block would be stored and "
                        "looked up twice; remove one",
                    )
                )
            else:
                seen[text] = section.path
    return problems


def _paths(value: Any, where: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if isinstance(item, str):
                yield join(where, i), item


def _normal(path: str, resolve: bool) -> str:
    """One spelling per directory: `/a/`, `/a/./` and `/b/../a` are `/a`; with
    `resolve` (machine checks on), symlinks above it are followed too."""
    if "\x00" in path:
        return path
    normal = os.path.normpath(path)
    if resolve:
        with contextlib.suppress(OSError, ValueError):
            normal = os.path.realpath(normal)
    return normal


def directory_problems(
    tiers: Sequence[TierSection], registry: Registry, *, resolve: bool
) -> list[ConfigProblem]:
    """A directory that two places claim (two tier sections, or one section's list
    spelling one directory twice): the tiers would evict and overwrite each other's
    blocks, each blind to the other's capacity."""
    problems: list[ConfigProblem] = []
    owner: dict[str, tuple[str, str]] = {}
    for section in (s for t in tiers for s in t.walk()):
        for key, sub in properties(_schema(section, registry)).items():
            if not is_own_directory_schema(sub):
                continue
            for where, raw in _paths(thaw(section.options.get(key)), join(section.path, key)):
                normal = _normal(raw, resolve)
                if normal not in owner:
                    owner[normal] = (where, raw)
                    continue
                first, first_raw = owner[normal]
                same = "" if first_raw == raw else f" (as {first_raw!r})"
                problems.append(
                    ConfigProblem(
                        where,
                        f"{raw!r} is already the directory of {first}{same}: two tiers on "
                        "one directory evict and overwrite each other's blocks; give each "
                        "its own",
                    )
                )
    return problems


def ram_holders(tiers: Sequence[TierSection], registry: Registry) -> list[tuple[str, int]]:
    """`(JSON path, bytes)` of every option, in every tier section, that counts
    bytes the tier keeps in RAM."""
    out: list[tuple[str, int]] = []
    for section in (s for t in tiers for s in t.walk()):
        for key, sub in properties(_schema(section, registry)).items():
            value = section.options.get(key)
            if is_ram_schema(sub) and isinstance(value, int) and not isinstance(value, bool):
                out.append((join(section.path, key), value))
    return out
