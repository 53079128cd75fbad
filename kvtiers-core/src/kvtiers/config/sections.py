"""Validating sections: the top-level document and every tier section in it, each
against its own schema, collecting every problem instead of stopping at the first.

A tier section is `{"type": NAME, **options}`. NAME is looked up in the plugin
registry (its error lists the installed tiers with a did-you-mean); the options
are checked against that record's schema; nested tier sections (`"x-kvtiers":
"tier"`) are checked the same way, recursively, and become `TierSection`s.

In a vLLM config (`vllm=True`) a tier's vLLM key names are first mapped through
its record's `aliases`, and unknown keys are set aside with a warning instead of
being errors: vLLM's tier sections carry options for vLLM's own classes. A
required option that vLLM's tier lacks may be derived instead (see
`kvtiers.config.derive`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import Draft202012Validator, validator_for

from kvtiers.config.derive import derivations, derive, relaxed
from kvtiers.config.messages import describe, did_you_mean, found, problems_from_error
from kvtiers.config.model import TierSection, freeze
from kvtiers.config.options import fill_defaults
from kvtiers.config.paths import PathParts, join
from kvtiers.config.plugin_hints import disabled_hint
from kvtiers.config.schema import (
    ADMISSION_KEY,
    is_policy_schema,
    is_tier_array_schema,
    is_tier_schema,
    properties,
    section_schema,
)
from kvtiers.errors import ConfigProblem, PluginError, UnknownNameError
from kvtiers.plugins.records import VllmTierRecord
from kvtiers.plugins.registry import Registered, Registry

# A wrapper of a wrapper of ... is legal; a thousand of them is a mistake (or an
# attack on the recursion limit).
MAX_TIER_DEPTH = 8


class Checker:
    """One validation pass over one document. Not thread-safe; cheap to create."""

    def __init__(self, registry: Registry, *, vllm: bool = False, check_machine: bool = True):
        self.registry = registry
        self.vllm = vllm
        self.check_machine = check_machine
        self.problems: list[ConfigProblem] = []
        self.warnings: list[str] = []
        self.notes: list[str] = []
        self._validators: dict[
            tuple[int, frozenset[str]], tuple[Mapping[str, Any], Validator]
        ] = {}

    def problem(self, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(path, message))

    # -- sections ---------------------------------------------------------------

    def section(
        self,
        schema: Mapping[str, Any],
        doc: dict[str, Any],
        path: str,
        *,
        owner: str,
        renames: Mapping[PathParts, PathParts] | None = None,
        aliases: Mapping[str, str] | None = None,
        depth: int = 0,
    ) -> dict[str, Any]:
        """Check `doc` (a dict) against `schema`, fill its defaults and turn its
        nested tier sections into `TierSection`s; returns `doc`, changed in place.
        Problems are collected, never raised."""
        derivable = derivations(schema) if self.vllm else {}
        missing = frozenset(k for k in derivable if k not in doc)
        validator = self._validator(schema, path, owner, relax=missing)
        if validator is None:
            return doc
        if self.vllm:
            self._set_aside_unknown(validator.schema, doc, path)
        before = len(self.problems)
        for error in validator.iter_errors(doc):
            self.problems.extend(
                problems_from_error(
                    error,
                    path,
                    owner=owner,
                    renames=renames or {},
                    aliases={} if self.vllm else (aliases or {}),
                )
            )
        fill_defaults(schema, doc)
        if missing and len(self.problems) == before:
            for key in sorted(missing):
                got = derive(derivable[key], doc, path, check_machine=self.check_machine)
                self.problems.extend(got.problems or ())
                if got.note:
                    self.notes.append(got.note)
                if got.value is not None:
                    doc[key] = got.value
        for key, sub in properties(schema).items():
            if key not in doc:
                continue
            if is_policy_schema(sub) and isinstance(doc[key], str) and doc[key]:
                self._check_policy(doc[key], join(path, key))
            elif is_tier_schema(sub):
                doc[key] = self.tier(doc[key], join(path, key), depth + 1)
            elif is_tier_array_schema(sub) and isinstance(doc[key], list):
                doc[key] = [
                    self.tier(item, join(path, key, i), depth + 1)
                    for i, item in enumerate(doc[key])
                ]
        return doc

    def tier(self, raw: Any, path: str, depth: int) -> TierSection | None:
        """A `TierSection` from a raw tier section, or None (with problems noted)."""
        if depth > MAX_TIER_DEPTH:
            self.problem(path, f"tier sections nest more than {MAX_TIER_DEPTH} levels deep")
            return None
        if not isinstance(raw, dict):
            self.problem(
                path,
                'expected a tier section (an object with "type" and that tier\'s '
                f"options), found {found(raw)}",
            )
            return None
        name = raw.get("type")
        if not isinstance(name, str):
            installed = ", ".join(sorted(self.registry.tiers)) or "(none)"
            if name is None and "type" not in raw:
                self.problem(
                    join(path, "type"),
                    f"missing; expected a tier name; installed tiers: {installed}",
                )
            else:
                self.problem(
                    join(path, "type"), f"expected a tier name (a string), found {found(name)}"
                )
            return None
        form = self.vllm_tier_form(raw) if self.vllm else None
        if form is not None:
            return self._vllm_wrapper(form, raw, path, depth)
        try:
            record = self.registry.get("tier", name).record
        except UnknownNameError as exc:
            self.problem(join(path, "type"), str(exc) + disabled_hint("tier", name))
            return None
        except PluginError as exc:
            self.problem(join(path, "type"), str(exc))
            return None
        options = {k: v for k, v in raw.items() if k != "type"}
        admission: tuple[str, dict[str, Any]] = ("all", {})
        if depth == 1 and ADMISSION_KEY not in properties(record.schema):
            admission = self._admission(options.pop(ADMISSION_KEY, "all"),
                                        join(path, ADMISSION_KEY))
        renames: dict[PathParts, PathParts] = {}
        aliases = record.aliases if isinstance(record.aliases, Mapping) else {}
        if self.vllm:
            self._apply_aliases(aliases, options, path, renames)
        options = self.section(
            record.schema,
            options,
            path,
            owner=f'tier "{name}"',
            renames=renames,
            aliases=aliases,
            depth=depth,
        )
        return TierSection(name, freeze(options), path, admission[0], freeze(admission[1]))

    def _admission(self, raw: Any, path: str) -> tuple[str, dict[str, Any]]:
        """A tier section's `admission`: (policy name, its options with defaults),
        checked against the registry and the policy's schema."""
        if isinstance(raw, str) and raw:
            name, options = raw, {}
        elif isinstance(raw, dict) and isinstance(raw.get("policy"), str) and raw["policy"]:
            name = raw["policy"]
            options = {k: copy.deepcopy(v) for k, v in raw.items() if k != "policy"}
        else:
            self.problem(path, "expected the name of an admission policy or an object "
                               f'{{"policy": NAME, ...options}}, found {found(raw)}')
            return "all", {}
        try:
            record = self.registry.get("admission", name).record
        except UnknownNameError as exc:
            self.problem(path if isinstance(raw, str) else join(path, "policy"),
                         str(exc) + disabled_hint("admission", name))
            return "all", {}
        except PluginError as exc:
            self.problem(path, str(exc))
            return "all", {}
        options = self.section(record.schema, options, path, owner=f'admission "{name}"')
        return name, options

    def vllm_tier_form(self, raw: Mapping[str, Any]) -> Registered[VllmTierRecord] | None:
        """The plugin's entry form `raw` is (`kvtiers_register_vllm_tiers`): by the
        short name it registers with vLLM, or by class and module."""
        name, module = raw.get("type"), raw.get("module_path")
        for reg in self.registry.vllm_tiers.values():
            rec = reg.record
            if (module is None and name == rec.name) or (
                name == rec.class_name and module == rec.module
            ):
                return reg
        return None

    def _vllm_wrapper(
        self, form: Registered[VllmTierRecord], raw: dict[str, Any], path: str, depth: int
    ) -> TierSection | None:
        """A plugin's tier entry of vLLM's config (kvtiers-vllm's `{"type":
        "kvtiers", "tier": {...}}`): vLLM runs the kvtiers tier in its inner section
        below its own CPU tier, so that section is what this config's stack holds
        there; the entry's own options are checked against the plugin's schemas."""
        rec, dist = form.record, form.distribution
        known = {"type", "module_path", rec.inner_key, *rec.options}
        for key in sorted(set(raw) - known):
            self.warnings.append(
                f"{join(path, key)}: not an option of {dist}'s tier entry "
                f"(known: {', '.join(sorted(known))}); {dist} ignores it"
            )
        for key, schema in rec.options.items():
            if key in raw and any(Draft202012Validator(schema).iter_errors(raw[key])):
                self.problem(join(path, key), f"expected {describe(schema)}, found "
                             f"{found(raw[key])}")  # fmt: skip
        if rec.inner_key not in raw:
            self.problem(
                join(path, rec.inner_key),
                f"missing; expected the kvtiers tier section that vLLM runs through "
                f'{dist} (for example {{"type": "fs", "root_dir": "/mnt/nvme/kv", '
                '"capacity_bytes": 1000000000000})',
            )
            return None
        return self.tier(raw[rec.inner_key], join(path, rec.inner_key), depth + 1)

    # -- helpers ----------------------------------------------------------------

    def _check_policy(self, name: str, path: str) -> None:
        try:
            self.registry.get("policy", name)
        except UnknownNameError as exc:
            self.problem(path, str(exc) + disabled_hint("policy", name))
        except PluginError as exc:
            self.problem(path, str(exc))

    def _validator(
        self, schema: Mapping[str, Any], path: str, owner: str, relax: frozenset[str]
    ) -> Validator | None:
        """A validator for `schema` as a section (see `section_schema`), with the
        `relax` keys no longer required, built once per schema and keys; a schema
        that is not valid JSON Schema is a plugin's bug, reported at the section
        rather than raised."""
        key = (id(schema), relax)
        cached = self._validators.get(key)
        if cached is not None and cached[0] is schema:
            return cached[1]
        try:
            shallow = section_schema(relaxed(schema, relax) if relax else schema)
            cls = validator_for(shallow, default=Draft202012Validator)
            cls.check_schema(shallow)
            validator: Validator = cls(shallow)
        except (SchemaError, TypeError, ValueError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            self.problem(
                path,
                f"the config schema of {owner} is not valid JSON Schema (a bug in its "
                f"plugin): {message}",
            )
            return None
        self._validators[key] = (schema, validator)
        return validator

    def _set_aside_unknown(self, schema: Any, doc: dict[str, Any], path: str) -> None:
        """vLLM configs: drop keys this section's schema does not know, with a
        warning naming each one."""
        if not isinstance(schema, Mapping) or schema.get("patternProperties"):
            return
        if schema.get("additionalProperties") is not False:
            return
        allowed = list(properties(schema))
        for key in [k for k in doc if k not in allowed]:
            del doc[key]
            self.warnings.append(
                f"{join(path, key)}: ignored, kvtiers has no use for it{did_you_mean(key, allowed)}"
            )

    def _apply_aliases(
        self,
        aliases: Mapping[str, str],
        options: dict[str, Any],
        path: str,
        renames: dict[PathParts, PathParts],
    ) -> None:
        """Move each vLLM-named key to the (dotted) option it means here."""
        for vllm_key, target in aliases.items():
            if vllm_key not in options:
                continue
            parts = tuple(target.split("."))
            node: Any = options
            for part in parts[:-1]:
                node = node.setdefault(part, {}) if isinstance(node, dict) else None
            if not isinstance(node, dict) or parts[-1] in node:
                self.problem(
                    join(path, vllm_key),
                    f'both "{vllm_key}" (vLLM\'s name) and "{target}" are set; keep one',
                )
                continue
            node[parts[-1]] = copy.deepcopy(options.pop(vllm_key))
            renames[parts] = (vllm_key,)
