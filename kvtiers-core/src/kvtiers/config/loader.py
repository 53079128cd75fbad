"""`load_config`: one JSON document in, a validated `KvtiersConfig` out, or one
`ConfigError` listing every problem found.

Steps: read the source (source.py); refuse numbers no option means (numbers.py);
find the kvtiers document inside a vLLM config (vllm.py); validate the document
and each tier section against its schema, filling defaults and looking tier and
policy names up in the plugin registry (sections.py); then the checks a schema
cannot express: no tier or directory listed twice (stack.py), what the config
puts in RAM fits this machine (machine.py), each tier's own machine check and, if
asked, every tier verifies checksums. Only the classes of tiers in
the config are imported, and only for that last check; validation itself imports
no tier code (and no torch).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtiers.config import machine, sglang, stack, vllm
from kvtiers.config.messages import found
from kvtiers.config.model import BreakerConfig, KvtiersConfig, MetricsConfig, TierSection
from kvtiers.config.numbers import MAX_INTEGER, covered, number_problems
from kvtiers.config.paths import ROOT, join, path_sort_key
from kvtiers.config.schema import CORE_SCHEMA
from kvtiers.config.sections import Checker
from kvtiers.config.source import ConfigSource, read_source
from kvtiers.errors import ConfigError, ConfigNote, ConfigProblem, ConfigWarning, PluginError
from kvtiers.plugins.registry import Registry, get_registry


class ConfigRejected(ConfigError):
    """A `ConfigError` that also carries the warnings and notes of the rejected
    document: in a vLLM config, "ignored: capacity_byte" explains "missing:
    capacity_bytes"."""

    def __init__(
        self, problems: list[ConfigProblem], warnings: list[str], notes: list[str] | None = None
    ):
        super().__init__(problems)
        self.warnings: tuple[str, ...] = tuple(warnings)
        self.notes: tuple[str, ...] = tuple(notes or ())


def load_config(
    source: ConfigSource,
    registry: Registry | None = None,
    *,
    check_machine: bool = True,
) -> KvtiersConfig:
    """Load and validate a config.

    `source`: a file path, an inline JSON string (starts with `{`), or a mapping; a
    kvtiers config, vLLM's kv_transfer_config (whole, or its
    kv_connector_extra_config) or SGLang's HiCache storage extra config
    (`kvtiers.config.sglang`), told apart automatically. `registry`: where tier
    and policy names are looked up (default: the installed plugins).
    `check_machine=False` skips the checks against this machine's memory, to
    validate a config meant for another machine.

    Raises `ConfigError` (every problem, each with its JSON path; a `ConfigRejected`
    with the warnings too once the document parsed) and nothing else, for any input.
    """
    try:
        return _load(source, get_registry() if registry is None else registry, check_machine)
    except RecursionError:
        raise ConfigError("the document nests too deeply to validate") from None


def _load(source: ConfigSource, registry: Registry, check_machine: bool) -> KvtiersConfig:
    document = read_source(source)
    if not isinstance(document.data, dict):
        raise ConfigError(
            "expected a JSON object (a kvtiers config, or vLLM's kv_transfer_config), "
            f"found {found(document.data)}"
        )
    # Numbers no option means are refused first; whatever else is said about the
    # same value afterwards ("expected an integer >= 1") says nothing new.
    numbers = number_problems(document.data, ROOT)
    refused = {p.path for p in numbers}
    checker = Checker(registry, check_machine=check_machine)
    if sglang.detect(document.data):
        unwrapped: vllm.Unwrapped | None = vllm.Unwrapped(
            sglang.unwrap(document.data, checker), ROOT, sglang.SGLANG_EXTRA)
    else:
        unwrapped = vllm.unwrap(document.data, checker)
    if unwrapped is None:
        raise ConfigRejected(
            _final(numbers, checker.problems, refused), checker.warnings, checker.notes
        )
    checker.vllm = unwrapped.source_format in (vllm.VLLM_TRANSFER, vllm.VLLM_EXTRA)
    base = unwrapped.base
    doc = checker.section(CORE_SCHEMA, unwrapped.doc, base, owner="")
    tiers = doc.get("secondary_tiers")
    sections = [t for t in tiers if isinstance(t, TierSection)] if isinstance(tiers, list) else []

    checker.problems.extend(stack.duplicate_problems(sections, registry))
    checker.problems.extend(stack.directory_problems(sections, registry, resolve=check_machine))
    pool = doc.get("cpu_bytes_to_use")
    if (
        check_machine
        and isinstance(pool, int)
        and not isinstance(pool, bool)
        and 1 <= pool <= MAX_INTEGER
    ):
        holders = [(p, n) for p, n in stack.ram_holders(sections, registry) if 0 < n <= MAX_INTEGER]
        problems, warnings = machine.check_ram(pool, join(base, "cpu_bytes_to_use"), holders)
        checker.problems.extend(problems)
        checker.warnings.extend(warnings)
    if doc.get("require_verified_tiers") is True:
        for section in sections:
            _check_verifies(section, registry, checker)
    if check_machine:
        # Every tier is checked, also when the document has other problems: one run
        # of `kvtiers validate` reports everything.
        said = {p.path for p in checker.problems}
        for section in sections:
            _check_tier_machine(section, registry, checker, said)

    if numbers or checker.problems:
        raise ConfigRejected(
            _final(numbers, checker.problems, refused), checker.warnings, checker.notes
        )
    config = _build(doc, checker.warnings, document.origin, unwrapped.source_format,
                    notes=checker.notes)
    return dataclasses.replace(config, vllm_spec=unwrapped.spec, vllm_runs=unwrapped.vllm_runs)


def _final(
    numbers: list[ConfigProblem], problems: list[ConfigProblem], refused: set[str]
) -> list[ConfigProblem]:
    """Every problem once, in document order; none about a value refused as a number."""
    rest = [p for p in problems if not covered(p.path, refused)]
    unique = list(dict.fromkeys([*numbers, *rest]))
    return sorted(unique, key=lambda p: path_sort_key(p.path))


def _check_verifies(section: TierSection, registry: Registry, checker: Checker) -> None:
    """Refuse tiers whose class does not verify checksums. The class is imported
    here, for tiers in the config only; a wrapper and what it wraps must both
    verify, since either could hand back unchecked bytes."""
    for s in section.walk():
        record = registry.get("tier", s.type).record
        where = join(s.path, "type")
        try:
            cls = record.load()
        except PluginError as exc:
            checker.problem(
                where, f"tier {s.type!r} cannot be loaded to check that it verifies: {exc}"
            )
            continue
        except Exception as exc:  # noqa: BLE001 - a plugin's module may raise anything
            checker.problem(
                where,
                f"tier {s.type!r} cannot be loaded to check that it verifies: "
                f"{type(exc).__name__}: {exc}",
            )
            continue
        if not getattr(cls, "verifies", False):
            checker.problem(
                where,
                f"tier {s.type!r} ({cls.__module__}.{cls.__qualname__}) does not verify "
                "block checksums, and require_verified_tiers is true; use a verifying "
                "tier or set require_verified_tiers to false",
            )


def _check_tier_machine(
    section: TierSection, registry: Registry, checker: Checker, said: set[str]
) -> None:
    """Each tier's own checks against this machine (`TierRecord.check`), for the
    tiers in the config only; their problems' paths are rebased onto the section.
    A problem where the schema already found one is left out (it would say the same
    thing twice), and so is a check that fails on a section with problems of its
    own (it was given options its schema refused)."""
    for s in section.walk():
        record = registry.get("tier", s.type).record
        try:
            check = record.load_check()
            problems = check(s.options) if check is not None else []
        except Exception as exc:  # noqa: BLE001 - a plugin's check may raise anything
            if not any(covered(p, {s.path}) for p in said):
                checker.problem(
                    s.path,
                    f"tier {s.type!r}: its machine check failed: {type(exc).__name__}: {exc}",
                )
            continue
        for problem in problems:
            rel = str(getattr(problem, "path", "$"))
            rel = rel[1:] if rel.startswith("$") else "." + rel
            path = s.path + rel
            message = str(getattr(problem, "message", problem))
            if isinstance(problem, ConfigWarning):
                checker.warnings.append(f"{path}: {message}")
            elif isinstance(problem, ConfigNote):
                checker.notes.append(f"{path}: {message}")
            elif not covered(path, said):
                checker.problem(path, message)


def _build(doc: dict[str, Any], warnings: list[str], origin: str, fmt: str,
           notes: list[str] | None = None) -> KvtiersConfig:
    breaker = doc["breaker"]
    return KvtiersConfig(
        cpu_bytes_to_use=int(doc["cpu_bytes_to_use"]),
        eviction_policy=doc["eviction_policy"],
        write_policy=doc["write_policy"],
        secondary_tiers=tuple(doc["secondary_tiers"]),
        require_verified_tiers=doc["require_verified_tiers"],
        cascade_queue_blocks=doc["cascade_queue_blocks"],
        job_timeout_s=float(doc["job_timeout_s"]),
        breaker=BreakerConfig(
            failures=int(breaker["failures"]), cooldown_s=float(breaker["cooldown_s"])
        ),
        metrics=MetricsConfig(
            scheduler_call_timing=bool(doc["metrics"]["scheduler_call_timing"])),
        hash_seed=int(doc["hash_seed"]),
        model=doc["model"],
        enable_kv_events=doc["enable_kv_events"],
        warnings=tuple(warnings),
        notes=tuple(notes or ()),
        source=origin,
        source_format=fmt,
    )
