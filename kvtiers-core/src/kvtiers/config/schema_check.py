"""Is a plugin's config schema sound? Checked against the JSON Schema metaschema
(the draft its `$schema` names, 2020-12 by default) and for kvtiers' own marks, so
that `kvtiers plugins` reports a broken schema when the plugin is listed, not when
a config first selects it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kvtiers.config.schema import DERIVE_MARK, MARK_VALUES, TIER_MARK


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot validate a config section, or None."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    if not isinstance(schema, Mapping):
        return f"a schema is a JSON object, not {type(schema).__name__}"
    try:
        cls = validator_for(schema, default=Draft202012Validator)
        cls.check_schema(dict(schema))
    except SchemaError as exc:
        where = "".join(f"[{p!r}]" for p in exc.path)
        return f"not valid JSON Schema: {exc.message}" + (f" (at {where})" if where else "")
    except (TypeError, ValueError) as exc:
        return f"not valid JSON Schema: {exc}"
    for where, sub in _subschemas(schema, "$"):
        mark = sub.get(TIER_MARK)
        if mark is not None and mark not in MARK_VALUES:
            allowed = ", ".join(f'"{v}"' for v in MARK_VALUES)
            return f'{where}: "{TIER_MARK}" is {mark!r}; kvtiers knows {allowed}'
        derive = sub.get(DERIVE_MARK)
        if derive is not None and not (
            isinstance(derive, Mapping)
            and isinstance(derive.get("function"), str)
            and ":" in derive["function"]
            and isinstance(derive.get("rule"), str)
        ):
            return (
                f'{where}: "{DERIVE_MARK}" must be {{"function": "module:function", '
                '"rule": "..."}'
            )
    return None


def _subschemas(schema: Mapping[str, Any], where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every subschema reached through properties, items and the combinators."""
    stack: list[tuple[str, Any]] = [(where, schema)]
    while stack:
        path, sub = stack.pop()
        if not isinstance(sub, Mapping):
            continue
        yield path, sub
        props = sub.get("properties")
        if isinstance(props, Mapping):
            stack.extend((f"{path}.properties.{k}", v) for k, v in props.items())
        if isinstance(sub.get("items"), Mapping):
            stack.append((f"{path}.items", sub["items"]))
        for key in ("anyOf", "oneOf", "allOf"):
            branches = sub.get(key)
            if isinstance(branches, list):
                stack.extend((f"{path}.{key}[{i}]", b) for i, b in enumerate(branches))
