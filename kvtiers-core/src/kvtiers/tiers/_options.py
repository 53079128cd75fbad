"""Reading a built-in tier's options: validate against its schema, fill defaults.

The config loader already does this for sections read from a document; tiers built
directly from Python (tests, embedding code) get the same checks and the same
defaults here, so a bad value is a `ConfigError` naming the field, never a crash
deep inside a worker thread.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvtiers.errors import ConfigError, ConfigProblem

TIER_MARK = "x-kvtiers"


def _is_nested_tier(prop: Any) -> bool:
    return isinstance(prop, Mapping) and prop.get(TIER_MARK) == "tier"


def _as_json(value: Any) -> Any:
    """Plain dicts and lists from a loaded (frozen) config: MappingProxyType and
    tuples, which JSON Schema would not call objects and arrays."""
    if isinstance(value, Mapping):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


def resolve_options(
    schema: Mapping[str, Any], config: Mapping[str, Any], tier: str
) -> dict[str, Any]:
    """`config` checked against `schema`, with every missing default filled in.

    Properties marked `"x-kvtiers": "tier"` (nested tier sections) are passed through
    unchecked: they are a `TierSection` once loaded, and the nested tier checks its
    own options when it is built. Values are returned as given (a loaded config's
    read-only views stay read-only).
    """
    from jsonschema import Draft202012Validator  # only when a tier is built

    props: Mapping[str, Any] = schema.get("properties", {})
    nested = {name for name, prop in props.items() if _is_nested_tier(prop)}
    plain_schema = {
        **schema,
        "properties": {k: v for k, v in props.items() if k not in nested},
        "required": [r for r in schema.get("required", ()) if r not in nested],
    }
    plain = {k: _as_json(v) for k, v in config.items() if k not in nested}
    problems: list[ConfigProblem] = []
    for err in Draft202012Validator(plain_schema).iter_errors(plain):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        if err.validator == "required":  # point at the missing field itself
            problems += [
                ConfigProblem(f"{path}.{name}", f"{tier} tier: {name!r} is a required property")
                for name in err.validator_value
                if name not in err.instance
            ]
        else:
            problems.append(ConfigProblem(path, f"{tier} tier: {err.message}"))
    problems += [
        ConfigProblem(f"$.{name}", f"{tier} tier: {name!r} is a required property")
        for name in sorted(nested & set(schema.get("required", ())))
        if config.get(name) is None
    ]
    if problems:
        raise ConfigError(problems)
    out = {
        name: copy.deepcopy(prop["default"])
        for name, prop in props.items()
        if isinstance(prop, Mapping) and "default" in prop
    }
    out.update(config)
    return out
