"""Credentials out of what kvtiers prints: options a schema marks `"writeOnly":
true` (JSON Schema's word for "never returned") become `***` in every rendering of
a config - `kvtiers validate`'s summary, `--show` and `--json`, and the config
`kvtiers bench --json` records. Imports no tier code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.config.schema import TIER_MARK, TIER_MARK_VALUE, properties
from kvtiers.plugins.registry import Registry

__all__ = ["REDACTED", "is_secret", "redact", "redact_config", "redact_section"]

REDACTED = "***"


def is_secret(schema: Any) -> bool:
    return isinstance(schema, Mapping) and schema.get("writeOnly") is True


def redact(value: Any, schema: Any, registry: Registry) -> Any:
    """`value` (JSON data) with every option its schema marks `writeOnly` as `***`;
    nested tier sections are redacted by their own tier's schema."""
    if is_secret(schema):
        return REDACTED
    if isinstance(value, Mapping):
        if isinstance(schema, Mapping) and schema.get(TIER_MARK) == TIER_MARK_VALUE:
            return redact_section(value, registry)
        props = properties(schema)
        return {k: redact(v, props.get(k), registry) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema, Mapping):
        return [redact(v, schema.get("items"), registry) for v in value]
    return value


def redact_section(section: Any, registry: Registry) -> Any:
    """A tier section as JSON data (`{"type": ..., **options}`), redacted."""
    if not isinstance(section, Mapping):
        return section
    reg = registry.tiers.get(str(section.get("type")))
    schema = reg.record.schema if reg is not None else {}
    return redact(section, schema, registry)


def redact_config(doc: dict[str, Any], registry: Registry) -> dict[str, Any]:
    """A `KvtiersConfig.to_dict()` with its tier sections redacted."""
    tiers = doc.get("secondary_tiers")
    if isinstance(tiers, list):
        doc = {**doc, "secondary_tiers": [redact_section(t, registry) for t in tiers]}
    return doc
