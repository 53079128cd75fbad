"""Options of a tier (or any config section): validate against a schema, fill defaults.

One resolver for the config layer and for tiers alike. The config loader fills a
section read from a document with `fill_defaults`; a tier resolves its section with
`resolve_options`, so one built directly from Python (tests, embedding code) gets
the same checks and the same defaults, nested objects included, and a bad value is
a `ConfigError` naming the field, never a crash deep inside a worker thread.

Defaults: `properties` are followed into objects and `items` into arrays; `$ref`,
`allOf` and friends are not, so a default must sit on the property itself. A
missing object property with no default of its own but properties that have
defaults is created, so `{"threads": {"load": 2}}` and `{}` both come out with
every thread count. A nested tier section (`"x-kvtiers": "tier"`) gets its default
set when missing but is not descended into: its own tier's schema fills it.
Integral floats where the schema asks for an integer become ints.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvtiers.config.schema import is_tier_array_schema, is_tier_schema, properties
from kvtiers.errors import ConfigError, ConfigProblem

__all__ = ["fill_defaults", "resolve_options"]


def fill_defaults(schema: Any, section: dict[str, Any]) -> None:
    """Fill `section` (a dict the schema accepted) in place, nested objects too."""
    for key, sub in properties(schema).items():
        if not isinstance(sub, Mapping):
            continue
        if key not in section:
            if "default" in sub:
                section[key] = copy.deepcopy(sub["default"])
            elif _has_nested_defaults(sub):
                section[key] = {}
            else:
                continue
        if is_tier_schema(sub) or is_tier_array_schema(sub):
            continue
        section[key] = _fill(sub, section[key])


def _has_nested_defaults(schema: Mapping[str, Any]) -> bool:
    if is_tier_schema(schema) or schema.get("type") != "object" or schema.get("required"):
        return False
    return any(isinstance(p, Mapping) and ("default" in p or _has_nested_defaults(p))
               for p in properties(schema).values())


def _fill(schema: Mapping[str, Any], value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and _says_integer(schema):
        return int(value)
    if isinstance(value, dict):
        fill_defaults(schema, value)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [_fill(items, v) for v in value]
    return value


def _says_integer(schema: Mapping[str, Any]) -> bool:
    types = schema.get("type")
    return types == "integer" or (
        isinstance(types, list) and "integer" in types and "number" not in types
    )


def _is_nested_tier(prop: Any) -> bool:
    return is_tier_schema(prop) or is_tier_array_schema(prop)


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
    # Values come back as given (a loaded config's read-only views stay read-only);
    # only a missing value, or an object missing some of its defaults, is filled.
    out: dict[str, Any] = dict(config)
    filled = copy.deepcopy(plain)
    fill_defaults(plain_schema, filled)
    for name, value in filled.items():
        if name not in config or (isinstance(value, dict) and value != plain.get(name)):
            out[name] = value
    for name in nested:
        if name not in config and isinstance(props[name], Mapping) and "default" in props[name]:
            out[name] = copy.deepcopy(props[name]["default"])
    return out
