"""Reading a config source: a file path, an inline JSON document, or a mapping
already parsed.

Everything that can go wrong before validation (no such file, not JSON, a key
twice in one object, NaN) becomes a `ConfigError` with a position, never a
traceback: a config is untrusted input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtiers.config.numbers import parse_integer
from kvtiers.config.paths import ROOT
from kvtiers.errors import ConfigError, ConfigProblem

ConfigSource = str | os.PathLike[str] | Mapping[str, Any]

INLINE = "<inline JSON>"
MAPPING = "<mapping>"


@dataclass(frozen=True)
class Document:
    """A parsed config document and where it came from (a path, or INLINE/MAPPING)."""

    data: Any
    origin: str


def read_source(source: ConfigSource) -> Document:
    """Parse `source`. A string whose first non-blank character is `{` or `[` is
    inline JSON; any other string is a file path."""
    if isinstance(source, Mapping):
        return Document(_plain(source), MAPPING)
    if isinstance(source, str) and source.lstrip()[:1] in ("{", "["):
        return Document(parse_json(source, INLINE), INLINE)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"a config is a file path, a JSON string or a mapping, not {type(source).__name__}"
        )
    text_path = os.fspath(source)
    if isinstance(text_path, str) and not text_path.strip():
        raise ConfigError(
            "the config is an empty string: pass the path of a JSON file, or the JSON "
            "document itself"
        )
    if "\x00" in str(text_path):
        raise ConfigError(
            f"{str(text_path)!r} is not a file path (it contains a NUL character); pass the "
            "path of a JSON file, or the JSON document itself"
        )
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file not found: {str(path)!r} (pass the path of a JSON file, or the "
            "JSON document itself)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{str(path)!r} is a directory, not a config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{str(path)!r} is not UTF-8 text (byte {exc.start}); a config is a JSON file"
        ) from None
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"cannot read config file {str(path)!r}: {why}") from None
    return Document(parse_json(text, str(path)), str(path))


def parse_json(text: str, origin: str) -> Any:
    """Strict JSON: no NaN/Infinity, no key given twice in one object."""
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                duplicates.append(key)
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON value")

    where = "inline JSON" if origin == INLINE else origin
    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant,
                          parse_int=parse_integer)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"invalid JSON in {where} at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"invalid JSON in {where}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"invalid JSON in {where}: nested too deeply") from None
    if duplicates:
        raise ConfigError(
            [
                ConfigProblem(
                    ROOT,
                    f'key "{key}" appears twice in one object of {where}; JSON keeps only '
                    "the last value, so remove one",
                )
                for key in dict.fromkeys(duplicates)
            ]
        )
    return data


def _plain(value: Any) -> Any:
    """A private copy as plain dicts and lists, so validation never mutates the
    caller's mapping and read-only views (MappingProxyType, tuples) validate."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
