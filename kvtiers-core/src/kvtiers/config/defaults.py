"""Filling schema defaults into a validated section (jsonschema checks, it never
fills).

Follows `properties` (into objects) and `items` (into arrays) only; `$ref`, `allOf`
and friends are not followed, so a default must sit on the property itself. A
nested tier section gets its default set when missing but is not descended into:
its own tier's schema fills it. Integral floats where the schema asks for an
integer (`1.0`, which JSON Schema accepts as an integer) become ints, so typed code
downstream sees the type the schema promised.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvtiers.config.schema import is_tier_array_schema, is_tier_schema, properties


def fill_defaults(schema: Any, section: dict[str, Any]) -> None:
    """Fill `section` (a dict the schema accepted) in place."""
    for key, sub in properties(schema).items():
        if not isinstance(sub, Mapping):
            continue
        if key not in section:
            if "default" not in sub:
                continue
            section[key] = copy.deepcopy(sub["default"])
        if is_tier_schema(sub) or is_tier_array_schema(sub):
            continue
        section[key] = _fill(sub, section[key])


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
