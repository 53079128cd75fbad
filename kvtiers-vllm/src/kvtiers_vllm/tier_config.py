"""The options of a `{"type": "kvtiers", ...}` entry of vLLM's `secondary_tiers`.

    {"type": "kvtiers",                      # or "KvtiersTier" + "module_path"
     "tier": {"type": "fs", ...},            # a kvtiers tier section (required)
     "medium": "STORAGE",                    # vLLM's medium for events / hit source
     "locality": "LOCAL",                    # vLLM's locality (also its backpressure)
     "enable_kv_events": true,               # when vLLM's KV events are on
     "job_timeout_s": 30,                    # a promotion's deadline (vLLM 0.34+)
     "stats_interval_s": 1.0,                # how often vLLM's stats get the counters
     "backpressure": {...}}                  # vLLM's, handled by vLLM's factory

Every problem is a `kvtiers.ConfigError` (also a ValueError, what vLLM's factories
raise) whose paths start at vLLM's config: `kv_connector_extra_config.secondary_tiers
[1].tier.root_dir`. The entry's index is found by identity in the spec's config
(vLLM's factory passes a shallow copy, so the `tier` mapping is the very object).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers import ConfigError
from kvtiers.config import TierSection
from kvtiers.errors import ConfigProblem, UnknownNameError

EXTRA = "kv_connector_extra_config"
MEDIA = ("STORAGE", "CPU")
LOCALITIES = ("LOCAL", "REMOTE")
JOB_TIMEOUT_S = 30.0  # as kvtiers' manager's `job_timeout_s`
STATS_INTERVAL_S = 1.0  # as the spec's `kvtiers_stats_interval_s`

log = logging.getLogger(__name__)


class TierConfigError(ConfigError, ValueError):
    """A wrong `kvtiers` secondary-tier entry; one line per problem, each with its path."""


@dataclass(frozen=True)
class TierOptions:
    section: TierSection  # the kvtiers tier, its path that of the entry's "tier"
    path: str  # the entry's path in vLLM's config
    index: int | None  # the entry's index in secondary_tiers (None: not found)
    medium: str
    locality: str | None
    enable_kv_events: bool
    job_timeout_s: float = JOB_TIMEOUT_S
    stats_interval_s: float = STATS_INTERVAL_S


def entry_index(spec: Any, tier: object) -> int | None:
    """Index of the secondary_tiers entry whose "tier" is `tier` (by identity)."""
    entries = getattr(spec, "extra_config", {}).get("secondary_tiers", [])
    if isinstance(entries, list):
        for i, entry in enumerate(entries):
            if isinstance(entry, Mapping) and entry.get("tier") is tier:
                return i
    return None


def _choice(value: object, allowed: tuple[str, ...], path: str) -> ConfigProblem | None:
    if isinstance(value, str) and value.upper() in allowed:
        return None
    return ConfigProblem(path, f"kvtiers tier: expected one of {', '.join(allowed)}, got {value!r}")


def read_options(
    spec: Any,
    tier: object,
    medium: object = "STORAGE",
    locality: object = None,
    enable_kv_events: object = True,
    job_timeout_s: object = JOB_TIMEOUT_S,
    stats_interval_s: object = STATS_INTERVAL_S,
) -> TierOptions:
    """Check an entry's options; raise `TierConfigError` listing every problem."""
    index = entry_index(spec, tier)
    path = f"{EXTRA}.secondary_tiers[{'?' if index is None else index}]"
    problems: list[ConfigProblem] = []
    if tier is None:
        problems.append(
            ConfigProblem(
                f"{path}.tier",
                'kvtiers tier: missing "tier", the kvtiers tier section to run under vLLM '
                '(for example {"type": "fs", "root_dir": "/mnt/nvme0/kv", '
                '"capacity_bytes": 1000000000000})',
            )
        )
    elif not isinstance(tier, Mapping):
        problems.append(
            ConfigProblem(
                f"{path}.tier",
                f"kvtiers tier: expected an object (a kvtiers tier section), "
                f"got {type(tier).__name__} {tier!r:.100}",
            )
        )
    elif not isinstance(tier.get("type"), str) or not tier.get("type"):
        problems.append(
            ConfigProblem(
                f"{path}.tier.type",
                f'kvtiers tier: the tier section needs a "type" (a kvtiers '
                f"tier name, see `kvtiers plugins`), got {tier.get('type')!r}",
            )
        )
    if (p := _choice(medium, MEDIA, f"{path}.medium")) is not None:
        problems.append(p)
    if locality is not None and (p := _choice(locality, LOCALITIES, f"{path}.locality")):
        problems.append(p)
    if not isinstance(enable_kv_events, bool):
        problems.append(
            ConfigProblem(
                f"{path}.enable_kv_events",
                f"kvtiers tier: expected true or false, got {enable_kv_events!r}",
            )
        )
    if (
        isinstance(job_timeout_s, bool)
        or not isinstance(job_timeout_s, (int, float))
        or not 0 < job_timeout_s < 1e9
    ):
        problems.append(
            ConfigProblem(
                f"{path}.job_timeout_s",
                f"kvtiers tier: expected a number of seconds > 0, got {job_timeout_s!r}",
            )
        )
    if (
        isinstance(stats_interval_s, bool)
        or not isinstance(stats_interval_s, (int, float))
        or not 0 <= stats_interval_s < 1e9
    ):
        problems.append(
            ConfigProblem(
                f"{path}.stats_interval_s",
                f"kvtiers tier: expected a number of seconds >= 0, got {stats_interval_s!r}",
            )
        )
    if problems:
        raise TierConfigError(problems)
    assert isinstance(tier, Mapping)
    assert isinstance(job_timeout_s, (int, float)) and isinstance(stats_interval_s, (int, float))
    return TierOptions(
        section=read_section(tier, path),
        path=path,
        index=index,
        medium=str(medium).upper(),
        locality=None if locality is None else str(locality).upper(),
        enable_kv_events=bool(enable_kv_events),
        job_timeout_s=float(job_timeout_s),
        stats_interval_s=float(stats_interval_s),
    )


def read_section(tier: Mapping[str, Any], path: str) -> TierSection:
    """The entry's kvtiers tier section read as `kvtiers validate` reads it in a vLLM
    config: checked against the tier's schema, and what vLLM's tier sections lack
    derived from the machine (an fs tier's `capacity_bytes` from the free space, as
    under `KvtiersOffloadingSpec`; the figure is logged). Problems are raised with
    their paths under `path` (the entry)."""
    from kvtiers import load_config  # the config layer: imported when a tier is built

    from kvtiers_vllm.plugin import TIER_TYPE

    wrapped = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 30,
               "secondary_tiers": [{"type": TIER_TYPE, "tier": dict(tier)}]}
    try:
        cfg = load_config(wrapped)
    except ConfigError as exc:
        entry = "$.secondary_tiers[0]"
        raise TierConfigError([
            ConfigProblem(path + p.path.removeprefix(entry) if p.path.startswith(entry)
                          else p.path, p.message)
            for p in exc.problems]) from exc
    (section,) = cfg.secondary_tiers
    if section.type != tier["type"]:  # the entry form is not registered: as written
        return TierSection(tier["type"], {k: v for k, v in tier.items() if k != "type"},
                           f"{path}.tier")
    for note in cfg.notes:
        if ".tier." in note:
            log.info("kvtiers tier %s: %s", path, note.split(": ", 1)[-1])
    return TierSection(section.type, dict(section.options), f"{path}.tier")


def _rebase(path: str, prefix: str) -> str:
    """A tier's own path ("$", "$.root_dir", "$[0]") under `prefix`."""
    if path.startswith(prefix):
        return path
    if path == "$":
        return prefix
    if path.startswith("$"):
        return prefix + path[1:]
    return f"{prefix}.{path}"


@contextlib.contextmanager
def under(prefix: str) -> Iterator[None]:
    """Re-raise the kvtiers config errors of building a tier with paths under `prefix`
    (a tier checks its options with paths from its own section: "$.root_dir")."""
    try:
        yield
    except ConfigError as exc:
        raise TierConfigError(
            [ConfigProblem(_rebase(p.path, prefix), p.message) for p in exc.problems]
        ) from exc
    except UnknownNameError as exc:
        message = str(exc)
        raise TierConfigError(
            [ConfigProblem(prefix + ".type", message.removeprefix(prefix + ": "))]
        ) from exc
