"""`kvtiers validate --show`: the resolved stack, every option with its value, the
defaults filled in and marked, in the order of the schemas (the top level, then
each tier, nested tiers indented under their wrapper; each entry of
`secondary_tiers` ends with its admission policy and that policy's options)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvtiers.config import KvtiersConfig, TierSection
from kvtiers.config.model import thaw
from kvtiers.config.redact import REDACTED, is_secret
from kvtiers.config.schema import ADMISSION_SCHEMA, CORE_SCHEMA, is_tier_schema, properties
from kvtiers.humanize import format_bytes
from kvtiers.plugins.registry import Registry

_WIDTH = 26


def render(config: KvtiersConfig, registry: Registry) -> str:
    """The lines of `--show`, without a trailing newline."""
    doc = config.to_dict()
    lines: list[str] = []
    for key, sub in properties(CORE_SCHEMA).items():
        if key == "secondary_tiers":
            continue
        lines.extend(_option(key, doc.get(key), sub, ""))
    tiers = config.secondary_tiers
    lines.append(f"{'secondary_tiers':<{_WIDTH}}{len(tiers)} tier{'' if len(tiers) == 1 else 's'}")
    for i, tier in enumerate(tiers):
        lines.extend(_tier(f"[{i}]", tier, registry, "  "))
        lines.extend(_admission(tier, registry, "    "))
    return "\n".join(lines)


def _admission(tier: TierSection, registry: Registry, indent: str) -> list[str]:
    """The admission policy of an entry of `secondary_tiers` (nested sections have
    none: the manager never cascades to them), its options under it."""
    reg = registry.admissions.get(tier.admission)
    origin = f"{reg.distribution} {reg.version}" if reg is not None else "not installed"
    text = json.dumps(tier.admission)
    if tier.admission == ADMISSION_SCHEMA.get("default") and not tier.admission_options:
        text += "  (default)"
    else:
        text += f" ({origin})"
    lines = [f"{indent}{'admission':<{_WIDTH - len(indent) - 1}} {text}"]
    props = properties(reg.record.schema) if reg is not None else {}
    options = thaw(tier.admission_options)
    keys = [*props, *(k for k in options if k not in props)]
    for key in keys:
        if key in options:
            lines.extend(_option(f"admission.{key}", options[key], props.get(key), indent))
    return lines


def _tier(label: str, tier: TierSection, registry: Registry, indent: str) -> list[str]:
    reg = registry.tiers.get(tier.type)
    origin = f"{reg.distribution} {reg.version}" if reg is not None else "not installed"
    props = properties(reg.record.schema) if reg is not None else {}
    lines = [f"{indent}{label:<{_WIDTH - len(indent)}}{tier.type} ({origin})"]
    inner = indent + "  "
    keys = [*props, *(k for k in tier.options if k not in props)]
    for key in keys:
        if key not in tier.options:
            continue
        value = tier.options[key]
        if isinstance(value, TierSection):
            lines.extend(_tier(key, value, registry, inner))
        elif isinstance(value, tuple) and value and all(isinstance(v, TierSection) for v in value):
            for i, item in enumerate(value):
                lines.extend(_tier(f"{key}[{i}]", item, registry, inner))
        else:
            lines.extend(_option(key, thaw(value), props.get(key), inner))
    return lines


def _option(key: str, value: Any, schema: Any, indent: str) -> list[str]:
    sub = schema if isinstance(schema, Mapping) else {}
    nested = properties(sub)
    if isinstance(value, dict) and nested and not is_tier_schema(sub):
        out: list[str] = []
        for name, part in nested.items():
            if name in value:
                out.extend(_option(f"{key}.{name}", value[name], part, indent))
        for name in value:
            if name not in nested:
                out.extend(_option(f"{key}.{name}", value[name], {}, indent))
        return out
    if is_secret(sub):  # a credential: never shown
        return [f"{indent}{key:<{_WIDTH - len(indent) - 1}} \"{REDACTED}\""]
    text = json.dumps(value, separators=(", ", ": "))
    if "bytes" in key.rsplit(".", 1)[-1] and isinstance(value, int) and not isinstance(value, bool):
        text += f" ({format_bytes(value)})"
    if "default" in sub and value == sub["default"]:
        text += "  (default)"
    return [f"{indent}{key:<{_WIDTH - len(indent) - 1}} {text}"]
