"""Reading vLLM's `kv_transfer_config` as a kvtiers config.

vLLM configures its `OffloadingConnector` with a `kv_transfer_config`
(`{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
"kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", ...}}`). The
tiering spec's options sit in `kv_connector_extra_config` and mostly share kvtiers'
names (`cpu_bytes_to_use`, `eviction_policy`, `secondary_tiers`, each tier's
`type`). Tier keys that only differ in name are mapped through each `TierRecord`'s
`aliases` (by `sections.Checker`); keys kvtiers has no use for (`block_size`, a
tier's `n_write_threads` where the tier has no such option, ...) are accepted with
a warning naming them, so a working vLLM config always loads.

vLLM's own fields are checked as vLLM checks them (`kv_role` is one of three
names, `kv_port` an integer, ...), and a config that vLLM would never route to
kvtiers' reading is an error, not a warning: another connector, a connector or
spec imported from someone else's module, a spec other than vLLM's tiering spec or
one a plugin registered.

Plugins contribute vLLM forms through two hooks (`kvtiers.plugins.hookspecs`):
`kvtiers_register_vllm_specs` (a spec whose extra config is a kvtiers config, with
the keys it reads itself: kvtiers-vllm's `KvtiersOffloadingSpec`) and
`kvtiers_register_vllm_tiers` (a `secondary_tiers` entry wrapping a kvtiers tier
section: kvtiers-vllm's `{"type": "kvtiers", "tier": {...}}`, read by
`sections.Checker`). This module knows vLLM's names only.

Detection: an object with `kv_connector`, `kv_role` or `kv_connector_extra_config`
is a whole kv_transfer_config; one with `spec_name` is its extra config; anything
else is a kvtiers config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.config.messages import describe, did_you_mean, found, problems_from_error, show
from kvtiers.config.paths import ROOT, join
from kvtiers.config.sections import Checker
from kvtiers.plugins.records import VllmSpecRecord

NATIVE = "kvtiers"
VLLM_TRANSFER = "vllm_kv_transfer_config"
VLLM_EXTRA = "vllm_extra_config"

EXTRA_KEY = "kv_connector_extra_config"
TIERING_SPEC = "TieringOffloadingSpec"
CONNECTORS = frozenset({"OffloadingConnector"})
# vLLM's own keys of an offloading spec's extra config that a plugin's spec may also
# read (as vLLM's specs do): never warned about as "only that spec reads it".
VLLM_EXTRA_KEYS = frozenset({"canonical_layout", "store_threshold", "max_tracker_size"})

# The tier types vLLM's tiering spec builds itself (vLLM 0.33 and 0.34); a plugin
# registers more (kvtiers-vllm: "kvtiers").
VLLM_TIER_TYPES = frozenset({"example", "fs", "kvcr", "obj", "p2p"})

# vLLM's own specs that are not a typo of ours (no "did you mean" for them).
_OTHER_SPECS = frozenset({"CPUOffloadingSpec"})

_ROLES = ["kv_producer", "kv_consumer", "kv_both"]


def _nullable(kind: str, description: str) -> dict[str, Any]:
    return {"type": [kind, "null"], "description": description}


# vLLM's KVTransferConfig fields and their types (vLLM 0.33): they configure vLLM's
# side of the connector and pass without a warning, but a value vLLM would refuse
# is refused here too. Their meaning is vLLM's business; see its docs.
TRANSFER_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "kv_connector": _nullable("string", "the connector vLLM builds"),
        "engine_id": _nullable("string", "the engine id of KV transfers"),
        "kv_buffer_device": _nullable("string", "the connector's buffer device"),
        "kv_buffer_size": {"type": "number", "minimum": 0, "description": "buffer bytes"},
        "kv_role": {"enum": [*_ROLES, None], "description": "what this instance does with KV"},
        "kv_rank": _nullable("integer", "this instance's rank in KV transfers"),
        "kv_parallel_size": {"type": "integer", "minimum": 1, "description": "instances"},
        "kv_ip": {"type": "string", "description": "the connector's IP"},
        "kv_port": {
            "type": "integer", "minimum": 0, "maximum": 65535, "description": "its port",
        },
        EXTRA_KEY: {"type": "object", "description": "the connector's options"},
        "kv_connector_module_path": _nullable("string", "where vLLM imports the connector"),
        "enable_permute_local_kv": {"type": "boolean", "description": "HND to NHD transfer"},
        "kv_load_failure_policy": {
            "enum": ["recompute", "fail"], "description": "what a failed load costs",
        },
    },
}
TRANSFER_FIELDS = frozenset(TRANSFER_SCHEMA["properties"])
_MARKERS = frozenset({"kv_connector", "kv_role", EXTRA_KEY})
# Extra-config keys that choose vLLM's spec class rather than configure it.
_SPEC_KEYS = frozenset({"spec_name", "spec_module_path"})
_OWNER = "vLLM's kv_transfer_config"


@dataclass(frozen=True)
class Unwrapped:
    """The tiering options as a kvtiers document, the JSON path they sit at in the
    source (for messages), and which format the source was; for a vLLM config, the
    spec vLLM builds and which `secondary_tiers` entries vLLM runs with its own tiers
    (under its tiering spec: every entry no plugin's form wraps)."""

    doc: dict[str, Any]
    base: str
    source_format: str
    spec: str | None = None
    vllm_runs: tuple[int, ...] = ()


def detect(doc: Mapping[str, Any]) -> str:
    """NATIVE, VLLM_TRANSFER or VLLM_EXTRA."""
    if _MARKERS & doc.keys():
        return VLLM_TRANSFER
    if "spec_name" in doc:
        return VLLM_EXTRA
    return NATIVE


def unwrap(doc: dict[str, Any], checker: Checker) -> Unwrapped | None:
    """The kvtiers document inside `doc`; warnings and problems go to `checker`.
    None when there is nothing to validate (the extra config is not an object)."""
    fmt = detect(doc)
    if fmt == NATIVE:
        return Unwrapped(doc, ROOT, NATIVE)
    extra: Any = doc
    base = ROOT
    if fmt == VLLM_TRANSFER:
        _check_transfer(doc, checker)
        base = join(ROOT, EXTRA_KEY)
        extra = doc.get(EXTRA_KEY, {})
        if not isinstance(extra, dict):
            checker.problem(
                base, f"expected an object (the connector's options), found {found(extra)}"
            )
            return None
    specs = plugin_specs(checker)
    _check_spec(extra, base, checker, specs)
    own = _check_spec_options(extra, base, checker, specs)
    native = {k: v for k, v in extra.items() if k not in _SPEC_KEYS and k not in own}
    spec = extra.get("spec_name")
    runs: tuple[int, ...] = ()
    if spec == TIERING_SPEC:
        runs = _who_runs_what(native, base, checker)
    return Unwrapped(native, base, fmt, spec if isinstance(spec, str) else None, runs)


def _who_runs_what(doc: Mapping[str, Any], base: str, checker: Checker) -> tuple[int, ...]:
    """A note for a config under vLLM's own tiering spec: vLLM runs its CPU tier and
    its own tier for each plain entry, so what kvtiers reads from those options (a
    capacity, verification, warm restart) is not what vLLM will do; kvtiers runs
    only the entries a plugin's form wraps (kvtiers-vllm's `{"type": "kvtiers",
    "tier": {...}}`). Says how to get kvtiers' tiers under vLLM. Returns the
    indices of the entries vLLM runs itself."""
    tiers = doc.get("secondary_tiers")
    entries = tiers if isinstance(tiers, list) else []
    vllms: list[str] = []
    ours: list[str] = []
    runs: list[int] = []
    for i, raw in enumerate(entries):
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            continue
        form = checker.vllm_tier_form(raw)
        if form is None and raw["type"] not in VLLM_TIER_TYPES:
            checker.warnings.append(
                f"{join(base, 'secondary_tiers', i, 'type')}: vLLM has no {show(raw['type'])} "
                f"tier (its own: {', '.join(sorted(VLLM_TIER_TYPES))}): under "
                f'"{TIERING_SPEC}" vLLM refuses this entry ("Unknown secondary tier type")'
                + (f"; write it as {_entry(checker, raw['type'])}" if checker.registry.vllm_tiers
                   else "; install kvtiers-vllm to run kvtiers' tiers under vLLM"))
            continue
        if form is None:
            runs.append(i)
        (ours if form is not None else vllms).append(
            f"secondary_tiers[{i}] ({show(raw['type'])}"
            + (f", through {form.distribution})" if form is not None else ")"))
    wrappers = [reg.distribution for reg in checker.registry.vllm_tiers.values()]
    entry = _entry(checker, "fs") if wrappers else None
    where = join(base, "spec_name")
    text = f'under "{TIERING_SPEC}" vLLM runs this stack with its own code: its CPU tier'
    if vllms:
        text += (f", and its own tier for {', '.join(vllms)}. For "
                 f"{'that entry' if len(vllms) == 1 else 'those entries'} this summary is "
                 "kvtiers' reading of the same options, not what vLLM enforces: vLLM's "
                 "tiers keep vLLM's rules (kvtiers' capacity_bytes, verified hits and warm "
                 "restart do not apply to them)")
    if ours:
        text += f"; kvtiers runs {', '.join(ours)}"
    text += ". "
    ways = []
    if entry is not None and vllms:
        ways.append(f"write an entry as {entry} ({wrappers[0]}: vLLM's CPU tier on "
                    "top, kvtiers' tier below it)")
    for name, reg in sorted(checker.registry.vllm_specs.items())[:1]:
        ways.append(f'set "spec_name": "{name}" ({reg.distribution}: kvtiers runs the CPU '
                    "pool and every tier)")
    if ways and not vllms:
        text += "To let kvtiers run the CPU pool too, " + ways[0] + "."
    elif ways:
        text += "To run kvtiers' tiers under vLLM, " + ", or ".join(ways) + "."
    elif vllms:
        text += ("To run kvtiers' tiers under vLLM, install kvtiers-vllm (pip install "
                 "kvtiers-vllm) and use its entry form or its spec.")
    if vllms or ours:
        checker.notes.append(f"{where}: {text.strip()}")
    return tuple(runs)


def _entry(checker: Checker, tier: str) -> str:
    """A plugin's entry form wrapping kvtiers' tier `tier`, as JSON text."""
    rec = next(iter(checker.registry.vllm_tiers.values())).record
    return f'{{"type": {show(rec.name)}, "{rec.inner_key}": {{"type": {show(tier)}, ...}}}}'


def plugin_specs(checker: Checker) -> dict[str, VllmSpecRecord]:
    """The specs plugins registered (`kvtiers_register_vllm_specs`; kvtiers-vllm's
    `KvtiersOffloadingSpec`), by name."""
    return {name: reg.record for name, reg in sorted(checker.registry.vllm_specs.items())}


def _check_spec_options(
    extra: Mapping[str, Any], base: str, checker: Checker, specs: Mapping[str, VllmSpecRecord]
) -> set[str]:
    """The keys a plugin's spec reads itself: checked against that spec's schemas
    when it is the spec named, warned about under another spec (vLLM's own keys
    excepted: vLLM's specs read them). Returns the keys left out of the kvtiers
    document."""
    from jsonschema.validators import Draft202012Validator

    spec = extra.get("spec_name")
    chosen = specs.get(spec) if isinstance(spec, str) else None
    own: set[str] = set()
    for key in extra:
        if chosen is not None and key in chosen.options:
            own.add(key)
            schema = chosen.options[key]
            if any(Draft202012Validator(schema).iter_errors(extra[key])):
                checker.problem(
                    join(base, key), f"expected {describe(schema)}, found {found(extra[key])}"
                )
            continue
        readers = [name for name, rec in specs.items() if key in rec.options]
        if readers and key not in VLLM_EXTRA_KEYS:
            own.add(key)
            checker.warnings.append(
                f"{join(base, key)}: only {' and '.join(readers)} reads this option; "
                f"{show(spec) if isinstance(spec, str) else 'this spec'} ignores it"
            )
    return own


def _check_transfer(doc: dict[str, Any], checker: Checker) -> None:
    """vLLM's own fields: their types, and that vLLM would build its
    OffloadingConnector from them (the only connector whose options kvtiers reads)."""
    from jsonschema.validators import Draft202012Validator

    for key in doc:
        if key not in TRANSFER_FIELDS:
            checker.warnings.append(
                f"{join(ROOT, key)}: ignored, not a field of vLLM's kv_transfer_config"
                f"{did_you_mean(key, TRANSFER_FIELDS)}"
            )
    for error in Draft202012Validator(TRANSFER_SCHEMA).iter_errors(doc):
        if list(error.absolute_path) == [EXTRA_KEY]:
            continue  # said by `unwrap`, with the connector's words
        checker.problems.extend(
            problems_from_error(error, ROOT, owner=_OWNER, renames={}, aliases={})
        )
    connector = doc.get("kv_connector")
    want = " or ".join(f'"{c}"' for c in sorted(CONNECTORS))
    if connector is None:
        checker.problem(
            join(ROOT, "kv_connector"),
            f"{'null' if 'kv_connector' in doc else 'missing'}; without a connector vLLM "
            f"offloads nothing: set \"kv_connector\": {want}",
        )
    elif isinstance(connector, str) and connector not in CONNECTORS:
        checker.problem(
            join(ROOT, "kv_connector"),
            f"is {show(connector)}{did_you_mean(connector, CONNECTORS)}; vLLM hands "
            f"{EXTRA_KEY} to that connector, and kvtiers reads it only as the options of "
            f"vLLM's {' or '.join(sorted(CONNECTORS))}: set \"kv_connector\": {want}",
        )
    module = doc.get("kv_connector_module_path")
    if isinstance(module, str) and not _within(module, "vllm"):
        checker.problem(
            join(ROOT, "kv_connector_module_path"),
            f"is {show(module)}: vLLM would import {show(connector)} from that module "
            "instead of building its own OffloadingConnector; remove "
            "kv_connector_module_path",
        )
    if connector is not None and doc.get("kv_role") is None:
        checker.problem(
            join(ROOT, "kv_role"),
            f"{'null' if 'kv_role' in doc else 'missing'}; "
            "vLLM refuses a kv_connector without a role: one of "
            f"{', '.join(show(r) for r in _ROLES)} (offloading: \"kv_both\")",
        )


def _check_spec(
    extra: Mapping[str, Any], base: str, checker: Checker, specs: Mapping[str, VllmSpecRecord]
) -> None:
    """`spec_name` and `spec_module_path`: the spec vLLM builds must be one whose
    options kvtiers reads (vLLM's tiering spec, or one a plugin registered)."""
    spec = extra.get("spec_name")
    # Where each spec may be imported from (`spec_module_path`): vLLM's own modules
    # for its tiering spec, its plugin's package for a plugin's. Anything else is
    # someone else's class that happens to share the name.
    modules = {TIERING_SPEC: "vllm", **{name: rec.package for name, rec in specs.items()}}
    names = " or ".join(f'"{s}"' for s in modules)
    where = join(base, "spec_name")
    if spec is None:
        checker.problem(
            where,
            f"{'null' if 'spec_name' in extra else 'missing'}; vLLM then builds "
            "CPUOffloadingSpec, which has no secondary tiers and never reads these "
            f"options as kvtiers does: set \"spec_name\": {names}",
        )
        return
    if not isinstance(spec, str):
        checker.problem(where, f"expected a spec name (a string), found {found(spec)}")
        return
    if spec not in modules:
        checker.problem(
            where,
            f"is {show(spec)}{'' if spec in _OTHER_SPECS else did_you_mean(spec, modules)}: "
            "vLLM builds that spec, which "
            f"does not read these options as kvtiers does: set \"spec_name\": {names}",
        )
        return
    module = extra.get("spec_module_path")
    where = join(base, "spec_module_path")
    if module is None:
        return
    if not isinstance(module, str):
        checker.problem(where, f"expected a module path (a string), found {found(module)}")
    elif not _within(module, modules[spec]):
        checker.problem(
            where,
            f"is {show(module)}: vLLM would import {spec} from that module, a class "
            f"kvtiers knows nothing of; remove spec_module_path (vLLM finds {spec} by "
            f"name), or name a module of {modules[spec]}",
        )


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
