"""Credentials out of what kvtiers prints: options a schema marks `"writeOnly":
true` (JSON Schema's word for "never returned") become `***` in every rendering of
a config - `kvtiers validate`'s summary, `--show` and `--json`, and the config
`kvtiers bench --json` records. Imports no tier code.

Free-form options no schema describes (fsspec's `storage_options`, a client's
keyword arguments) are recognised by name instead: `credential_values(options)`
collects every string held under a credential-looking name (key, secret, token,
password, ... at any depth) and `scrub(text, values)` blanks each one in a message.
An endpoint URL, a region or a bucket stays readable: a user needs them to act on
the message."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kvtiers.config.schema import TIER_MARK, TIER_MARK_VALUE, properties
from kvtiers.plugins.registry import Registry

__all__ = ["REDACTED", "credential_values", "is_secret", "redact", "redact_config",
           "redact_section", "scrub"]

REDACTED = "***"
#: a shorter value is no credential, and blanking it would leave nothing readable
MIN_SECRET_CHARS = 4

# Option names that hold credentials, in any fsspec filesystem's or client's options.
_SECRET_NAME = re.compile(
    r"^(key|secret|token)$|secret|token|passw|credential|access_key|account_key|"
    r"sas|connection_string|private",
    re.IGNORECASE,
)


def credential_values(options: Any, name: str = "") -> list[str]:
    """Every string held under a credential-looking name in `options` (mappings
    and lists at any depth), in order, without repeats."""
    found: list[str] = []
    if isinstance(options, Mapping):
        for k, v in options.items():
            found += credential_values(v, str(k))
    elif isinstance(options, (list, tuple)):
        for v in options:
            found += credential_values(v, name)
    elif isinstance(options, str) and options and _SECRET_NAME.search(name):
        found.append(options)
    return list(dict.fromkeys(found))


def scrub(text: str, values: Iterable[str]) -> str:
    """`text` with each of `values` replaced by `***`, longest first (a secret that
    contains another goes whole); values shorter than `MIN_SECRET_CHARS` stay."""
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= MIN_SECRET_CHARS:
            text = text.replace(value, REDACTED)
    return text


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
