"""The JSON Schema (draft 2020-12) of the kvtiers config document, and the helpers
that recognise nested tier sections in any schema.

The schema is the single source of truth: validation, the defaults filled into a
loaded config, the defaults of the `KvtiersConfig` dataclass and
docs/configuration.md are all derived from it. Each property carries `type`,
`default` (unless required) and `description`.

A subschema marked `"x-kvtiers": "tier"` is a tier section: an object with "type"
(a registered tier name) plus that tier's options, validated against the schema
its `TierRecord` registered. The same marker works in tier schemas (the `faulty`
tier's `inner`), on a property or on the `items` of an array property.
`"x-kvtiers": "policy"` on a string property makes it the name of a registered
eviction policy, looked up in the plugin registry like a tier's type.

Two more values describe what a tier takes from the machine, for the checks that
span the whole config: `"ram_bytes"` on an integer property says the tier holds
that many bytes in RAM (summed with the CPU pool and every other such tier against
the machine's memory); `"own_directory"` on a path property (a string, or an array
of them) says the tier owns that directory, so no two tier sections may name one.

`"x-kvtiers-derive": {"function": "module:function", "rule": "..."}` on a required
property lets a vLLM config leave it out (vLLM's own tier has no such key): the
function derives it from the section's other options when the config is loaded
with machine checks, and `rule` says how, in words (see `kvtiers.config.derive`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIER_MARK = "x-kvtiers"
TIER_MARK_VALUE = "tier"
# On a string property: the name of a registered eviction policy, checked against
# the plugin registry (a schema cannot list what plugins will register).
POLICY_MARK_VALUE = "policy"
RAM_MARK_VALUE = "ram_bytes"
OWN_DIRECTORY_MARK_VALUE = "own_directory"
MARK_VALUES = (TIER_MARK_VALUE, POLICY_MARK_VALUE, RAM_MARK_VALUE, OWN_DIRECTORY_MARK_VALUE)
DERIVE_MARK = "x-kvtiers-derive"

WRITE_POLICIES = ("write_through", "write_back")
DEFAULT_HASH_SEED = 0

CORE_SCHEMA: Mapping[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "kvtiers configuration",
    "type": "object",
    "additionalProperties": False,
    "required": ["cpu_bytes_to_use"],
    "properties": {
        "cpu_bytes_to_use": {
            "type": "integer",
            "minimum": 1,
            "description": (
                "Size of the CPU pool in bytes: the shared-memory gateway between the "
                "GPU and the secondary tiers. Must fit in the machine's physical memory "
                "(a larger value is an error, never clamped)."
            ),
        },
        "eviction_policy": {
            "type": "string",
            "minLength": 1,
            TIER_MARK: POLICY_MARK_VALUE,
            "default": "lru",
            "description": (
                "Name of the eviction policy of the CPU pool, as registered by the core "
                "or a plugin (see `kvtiers plugins`)."
            ),
        },
        "write_policy": {
            "enum": list(WRITE_POLICIES),
            "default": "write_through",
            "description": (
                "When blocks cascade from the CPU pool to the secondary tiers: "
                "`write_through` copies every newly stored block to each tier; "
                "`write_back` copies a block down when the pool evicts it."
            ),
        },
        "secondary_tiers": {
            "type": "array",
            "items": {TIER_MARK: TIER_MARK_VALUE},
            "default": [],
            "description": (
                "The tiers below the CPU pool, searched in this order. Each is an "
                'object with "type" (a registered tier name) and that tier\'s options.'
            ),
        },
        "require_verified_tiers": {
            "type": "boolean",
            "default": False,
            "description": (
                "Refuse every configured tier (nested ones included) whose class does "
                "not verify block checksums on load (`verifies = False`)."
            ),
        },
        "cascade_queue_blocks": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": (
                "Per tier, the most blocks queued or running for cascade (each pinned); "
                "when a tier falls behind, further write-through copies wait unpinned "
                "(deferred) and are queued as it catches up if their block is still in "
                "the pool, else dropped and counted (backpressure). `null`: sized from "
                "the pool by the manager, so that cascades cannot pin the whole pool."
            ),
        },
        "job_timeout_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 30,
            "description": (
                "Seconds a secondary-tier job may take before it counts as failed "
                "(`timeout`); its slots stay quarantined until the tier reports it."
            ),
        },
        "breaker": {
            "type": "object",
            "additionalProperties": False,
            "default": {},
            "description": "Circuit breaker that skips a failing tier for a while.",
            "properties": {
                "failures": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 5,
                    "description": (
                        "Consecutive failed or timed-out jobs that open a tier's breaker."
                    ),
                },
                "cooldown_s": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "default": 10,
                    "description": (
                        "Seconds an open breaker skips its tier before probing it again."
                    ),
                },
            },
        },
        "metrics": {
            "type": "object",
            "additionalProperties": False,
            "default": {},
            "description": (
                "Prometheus metrics, when a sink records them (`kvtiers bench "
                "--metrics-port`, `kvtiers serve --metrics-port`; docs/metrics.md)."
            ),
            "properties": {
                "scheduler_call_timing": {
                    "type": "boolean",
                    "default": True,
                    "description": (
                        "Time each of the scheduler's calls into the manager "
                        "(`kvtiers_manager_call_seconds`, two clock reads and a "
                        "histogram update per call: ~0.9 us, more under load). Off: "
                        "those histograms "
                        "stay empty and the calls cost nothing extra; every counter "
                        "and gauge still counts."
                    ),
                },
            },
        },
        "hash_seed": {
            "type": "integer",
            "minimum": 0,
            "maximum": 2**64 - 1,
            "default": DEFAULT_HASH_SEED,
            "description": (
                "Seed of the chained block hash. Processes and machines that share "
                "blocks must use the same seed."
            ),
        },
        "model": {
            "type": ["string", "null"],
            "minLength": 1,
            "default": None,
            "description": (
                "Model id for the namespace that persistent tiers store under; "
                "`null`: the engine supplies it."
            ),
        },
        "enable_kv_events": {
            "type": "boolean",
            "default": False,
            "description": (
                "Keep stored/removed events of every tier (the CPU pool and each "
                "secondary tier) for the engine to read, as a cache-aware router needs. "
                "Off: nothing is kept."
            ),
        },
    },
}


#: The key every entry of `secondary_tiers` takes besides its tier's own options:
#: which blocks the manager cascades to that tier (`kvtiers.admission`). Taken out
#: of the section before the tier's schema sees it (a tier whose schema has its own
#: `admission` keeps it); not allowed on nested sections, which the manager never
#: cascades to directly.
ADMISSION_KEY = "admission"
ADMISSION_SCHEMA: Mapping[str, Any] = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "object",
            "required": ["policy"],
            "properties": {"policy": {"type": "string", "minLength": 1}},
        },
    ],
    "default": "all",
    "description": (
        "Which blocks the manager cascades to this tier: the name of a registered "
        "admission policy (`all`: every block; `second_touch`: a block only when it "
        "is offered a second time, having proven reuse), or an object "
        '`{"policy": NAME, ...options}` with that policy\'s options.'
    ),
}


def is_tier_schema(schema: Any) -> bool:
    """True for a subschema marked as a tier section."""
    return isinstance(schema, Mapping) and schema.get(TIER_MARK) == TIER_MARK_VALUE


def is_policy_schema(schema: Any) -> bool:
    """True for a string subschema naming a registered eviction policy."""
    return isinstance(schema, Mapping) and schema.get(TIER_MARK) == POLICY_MARK_VALUE


def is_ram_schema(schema: Any) -> bool:
    """True for an integer subschema counting bytes the tier holds in RAM."""
    return isinstance(schema, Mapping) and schema.get(TIER_MARK) == RAM_MARK_VALUE


def is_own_directory_schema(schema: Any) -> bool:
    """True for a path subschema naming a directory the tier owns."""
    return isinstance(schema, Mapping) and schema.get(TIER_MARK) == OWN_DIRECTORY_MARK_VALUE


def is_tier_array_schema(schema: Any) -> bool:
    """True for an array subschema whose items are tier sections."""
    return isinstance(schema, Mapping) and is_tier_schema(schema.get("items"))


def properties(schema: Any) -> Mapping[str, Any]:
    """The `properties` of an object schema ({} when it has none)."""
    if not isinstance(schema, Mapping):
        return {}
    props = schema.get("properties")
    return props if isinstance(props, Mapping) else {}


def section_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema a section's own keys are checked against.

    Nested tier sections are checked on their own (against their tier's schema), so
    here they keep only their marker and description (for messages) and accept
    anything. A section that says nothing about extra keys is closed: an unknown key
    in a config is a typo far more often than a wish.
    """
    out = dict(schema)
    if not {"additionalProperties", "patternProperties", "unevaluatedProperties"} & set(out):
        out["additionalProperties"] = False
    props = properties(schema)
    if props:
        shallow: dict[str, Any] = {}
        for key, sub in props.items():
            if is_tier_schema(sub):
                shallow[key] = _annotations(sub)
            elif is_tier_array_schema(sub):
                shallow[key] = {**sub, "items": _annotations(sub["items"])}
            else:
                shallow[key] = sub
        out["properties"] = shallow
    return out


def _annotations(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of a subschema that describe without constraining."""
    return {k: schema[k] for k in (TIER_MARK, "title", "description") if k in schema}


def default_of(key: str) -> Any:
    """The schema default of a top-level key (for the dataclass defaults)."""
    return CORE_SCHEMA["properties"][key]["default"]


def breaker_default_of(key: str) -> Any:
    return CORE_SCHEMA["properties"]["breaker"]["properties"][key]["default"]


def metrics_default_of(key: str) -> Any:
    return CORE_SCHEMA["properties"]["metrics"]["properties"][key]["default"]
