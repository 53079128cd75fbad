"""Turning schema violations into sentences: where, what was found, what is allowed.

jsonschema's own messages speak Python (`'10G' is not of type 'integer'`); a person
editing a JSON file wants `expected an integer >= 1, found "10G" (string)`, the
unknown key's closest allowed name, and the missing key's meaning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from jsonschema.exceptions import ValidationError

from kvtiers.config.paths import PathParts, join, rename
from kvtiers.config.schema import is_tier_array_schema, is_tier_schema, properties
from kvtiers.errors import ConfigProblem
from kvtiers.humanize import closest_name

_SHOW_LIMIT = 60

_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "an object",
    "array": "an array",
    "null": "null",
}

# Keywords whose failure is best told as "expected <the schema in words>, found X".
_DESCRIBED = {
    "type",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "oneOf",
}


def show(value: Any) -> str:
    """A value as JSON text, shortened."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 3] + "..."


def json_type(value: Any) -> str:
    """The JSON type name of a value (Python's name for what JSON cannot hold)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def found(value: Any) -> str:
    """`"10G" (string)`, `null`: what a message says was found."""
    return "null" if value is None else f"{show(value)} ({json_type(value)})"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean "x"?)` or ``."""
    close = closest_name(word, choices)
    return f' (did you mean "{close}"?)' if close is not None else ""


def describe(schema: Any) -> str:
    """What a subschema allows, in words: `an integer >= 1`, `one of "a", "b"`."""
    if schema is True or schema == {}:
        return "any value"
    if not isinstance(schema, Mapping):
        return "nothing (the schema allows no value here)"
    if is_tier_schema(schema):
        return 'a tier section (an object with "type" and that tier\'s options)'
    if "const" in schema:
        return f"exactly {show(schema['const'])}"
    if "enum" in schema:
        return "one of " + ", ".join(show(v) for v in schema["enum"])
    for combinator in ("anyOf", "oneOf"):
        if isinstance(schema.get(combinator), list):
            return " or ".join(describe(branch) for branch in schema[combinator])
    types = schema.get("type")
    names = [types] if isinstance(types, str) else list(types or [])
    if not names:
        return "a value matching the schema"
    return " or ".join(_describe_type(name, schema) for name in names)


_BOUNDS = (
    ("minimum", ">="),
    ("exclusiveMinimum", ">"),
    ("maximum", "<="),
    ("exclusiveMaximum", "<"),
)


def numeric_bounds(schema: Mapping[str, Any], show: Any = str) -> list[str]:
    """A number schema's bounds as `>= 1`, `< 10`, ... (each value through `show`)."""
    return [f"{sign} {show(schema[key])}" for key, sign in _BOUNDS if key in schema]


def _describe_type(name: str, schema: Mapping[str, Any]) -> str:
    title = schema.get("title")
    if isinstance(title, str) and title and name != "object":
        # A value's title says what it is in the user's words ("an absolute path"),
        # which a pattern such as /^// does not.
        return title
    words = _TYPE_WORDS.get(name, name)
    limits: list[str] = []
    if name in ("integer", "number"):
        limits.extend(numeric_bounds(schema, show))
        if "multipleOf" in schema:
            limits.append(f"a multiple of {show(schema['multipleOf'])}")
    elif name == "string":
        if schema.get("minLength") == 1 and "maxLength" not in schema:
            words = "a non-empty string"
        else:
            if "minLength" in schema:
                limits.append(f"at least {schema['minLength']} characters long")
            if "maxLength" in schema:
                limits.append(f"at most {schema['maxLength']} characters long")
        if "pattern" in schema:
            limits.append(f"matching /{schema['pattern']}/")
    elif name == "array" and is_tier_array_schema(schema):
        words = "an array of tier sections"
    return " ".join([words, " and ".join(limits)]) if limits else words


def summary(schema: Any) -> str:
    """The first sentence of a subschema's description, for a missing key: up to
    the first full stop that ends a sentence (followed by a capital letter or the
    end, outside parentheses), so "e.g. {...}" does not cut it short."""
    raw = schema.get("description", "") if isinstance(schema, Mapping) else ""
    text = " ".join(str(raw).split())
    depth = 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "." and depth == 0:
            rest = text[i + 1 :]
            if not rest or (rest[0] == " " and rest[1:2].isupper()):
                return text[:i]
    return text.rstrip(".")


def _fits_type(schema: Any, value: Any) -> bool:
    """Whether a branch of anyOf/oneOf is meant for a value of this JSON type."""
    if not isinstance(schema, Mapping) or "type" not in schema:
        return True
    types = schema["type"]
    names = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else []
    kind = json_type(value)
    return kind in names or (kind == "integer" and "number" in names)


def _branch_errors(error: ValidationError) -> list[ValidationError]:
    """The errors inside the one anyOf/oneOf branch meant for the value's type
    (`["/a", "rel"]` against "a path or an array of paths": the array branch's
    complaint about item 1), or [] when no single branch is."""
    branches = error.validator_value
    if not isinstance(branches, list) or not error.context:
        return []
    fitting = [i for i, b in enumerate(branches) if _fits_type(b, error.instance)]
    if len(fitting) != 1:
        return []
    return [
        e
        for e in error.context
        if e.relative_schema_path and e.relative_schema_path[0] == fitting[0]
    ]


def _duplicate(items: Any) -> Any:
    seen: list[Any] = []
    for item in items if isinstance(items, list) else ():
        if item in seen:
            return item
        seen.append(item)
    return None


def _items_message(keyword: str, expected: Any, instance: Any) -> str:
    if keyword == "uniqueItems":
        return f"lists {show(_duplicate(instance))} twice; give each value once"
    n = len(instance) if isinstance(instance, list) else 0
    if keyword == "minItems":
        want = "a non-empty array" if expected == 1 else f"at least {expected} items"
    else:
        want = f"at most {expected} items"
    return f"expected {want}, found {n} item{'' if n == 1 else 's'}: {show(instance)}"


def problems_from_error(
    error: ValidationError,
    base: str,
    *,
    owner: str,
    renames: Mapping[PathParts, PathParts],
    aliases: Mapping[str, str],
) -> list[ConfigProblem]:
    """The problems one jsonschema error stands for (an object missing two keys is
    two problems). `owner` names the section in unknown-key messages ("tier
    "memory""); `aliases` are vLLM key names to hint at when one is used here."""
    where = rename(error.absolute_path, renames)
    path = join(base, *where)
    keyword = error.validator
    # jsonschema types these as "maybe unset"; for a raised error they are set.
    schema: Any = error.schema
    expected: Any = error.validator_value
    if keyword == "required" and isinstance(error.instance, Mapping):
        props = properties(schema)
        out = []
        for key in expected:
            if key in error.instance:
                continue
            about = summary(props.get(key))
            meaning = f" ({about})" if about else ""
            out.append(
                ConfigProblem(
                    join(path, key), f"missing; expected {describe(props.get(key))}{meaning}"
                )
            )
        return out
    if keyword == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = sorted(properties(schema))
        patterns = list((schema.get("patternProperties") or {}).keys())
        out = []
        for key in error.instance:
            if key in allowed or any(re.search(p, key) for p in patterns):
                continue
            out.append(
                ConfigProblem(join(path, key), unknown_key_message(key, allowed, owner, aliases))
            )
        return out
    if keyword in ("anyOf", "oneOf"):
        inner = _branch_errors(error)
        if inner:
            return [
                p
                for e in inner
                for p in problems_from_error(
                    e, base, owner=owner, renames=renames, aliases=aliases
                )
            ]
    if keyword in ("minItems", "maxItems", "uniqueItems"):
        return [ConfigProblem(path, _items_message(keyword, expected, error.instance))]
    if keyword in _DESCRIBED:
        # A credential (`"writeOnly": true`) is never repeated back, not even a wrong one.
        what = "a value not shown here" if schema.get("writeOnly") is True else found(
            error.instance)
        message = f"expected {describe(schema)}, found {what}"
        if keyword == "enum" and isinstance(error.instance, str):
            message += did_you_mean(error.instance, [v for v in expected if isinstance(v, str)])
        return [ConfigProblem(path, message)]
    return [ConfigProblem(path, error.message)]


def unknown_key_message(
    key: str, allowed: Iterable[str], owner: str, aliases: Mapping[str, str] | None = None
) -> str:
    allowed = sorted(allowed)
    if aliases and key in aliases:
        return (
            f'unknown key: "{key}" is vLLM\'s name for "{aliases[key]}"; write '
            f'"{aliases[key]}" here (vLLM names are mapped only in a vLLM kv_transfer_config)'
        )
    where = f" for {owner}" if owner else ""
    return (
        f"unknown key{where}{did_you_mean(key, allowed)}; "
        f"allowed keys: {', '.join(allowed) or '(none)'}"
    )
