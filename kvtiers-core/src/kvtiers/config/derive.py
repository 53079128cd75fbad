"""Options a vLLM config may leave out: derived from the machine, and said so.

vLLM's tier sections lack options that kvtiers requires (vLLM's `fs` tier has no
capacity: it never evicts). A tier's schema marks such a property with
`"x-kvtiers-derive": {"function": "module:function", "rule": "..."}`; in a vLLM
config only, a missing one is not an error: `function(options)` derives it from
the section's other (validated) options and returns `(value, sentence)`, the
sentence stating the figure and how to set it, which `kvtiers validate` prints as
a note. It raises `ConfigError` (paths relative to the section) when it cannot.
The function runs only with machine checks on; without them, the note says the
rule (`rule`) and that the value is derived where the config is loaded.

A kvtiers config must still set every required option: there, the same key
missing is the usual "missing" error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.config.paths import join
from kvtiers.config.schema import DERIVE_MARK, properties
from kvtiers.errors import ConfigError, ConfigProblem


@dataclass(frozen=True)
class Derivation:
    """One derivable property of a section's schema."""

    key: str
    function: str
    rule: str


@dataclass
class Derived:
    """What deriving one property gave: a value (or None), and what to say."""

    value: Any = None
    problems: list[ConfigProblem] | None = None
    note: str | None = None


def derivations(schema: Mapping[str, Any]) -> dict[str, Derivation]:
    """The required properties of `schema` that carry a well-formed derive mark."""
    if not isinstance(schema, Mapping):
        return {}
    required = schema.get("required")
    names = set(required) if isinstance(required, list) else set()
    out: dict[str, Derivation] = {}
    for key, sub in properties(schema).items():
        mark = sub.get(DERIVE_MARK) if isinstance(sub, Mapping) else None
        if key in names and isinstance(mark, Mapping):
            function, rule = mark.get("function"), mark.get("rule")
            if isinstance(function, str) and isinstance(rule, str):
                out[key] = Derivation(key, function, rule)
    return out


def relaxed(schema: Mapping[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    """`schema` with `keys` no longer required."""
    required = [k for k in schema.get("required", ()) if k not in keys]
    return {**schema, "required": required}


def derive(
    derivation: Derivation,
    options: Mapping[str, Any],
    section_path: str,
    *,
    check_machine: bool,
) -> Derived:
    """Run `derivation` on a section's validated options."""
    where = join(section_path, derivation.key)
    if not check_machine:
        return Derived(
            note=f"{where}: not set (vLLM's tier section has no such key); derived where "
            f"this config is loaded with machine checks: {derivation.rule}"
        )
    try:
        function = _resolve(derivation.function)
        value, sentence = function(options)
    except ConfigError as exc:
        return Derived(problems=[_rebase(p, section_path) for p in exc.problems])
    except Exception as exc:  # noqa: BLE001 - a plugin's function may raise anything
        return Derived(
            problems=[
                ConfigProblem(
                    where, f"not set, and deriving it failed: {type(exc).__name__}: {exc}"
                )
            ]
        )
    return Derived(value=value, note=f"{where}: {sentence}")


def _rebase(problem: ConfigProblem, section_path: str) -> ConfigProblem:
    rel = problem.path
    rel = rel[1:] if rel.startswith("$") else "." + rel
    return ConfigProblem(section_path + rel, problem.message)


def _resolve(target: str) -> Callable[[Mapping[str, Any]], tuple[Any, str]]:
    module_name, _, attr = target.partition(":")
    function: Callable[[Mapping[str, Any]], tuple[Any, str]] = getattr(
        importlib.import_module(module_name), attr
    )
    return function
