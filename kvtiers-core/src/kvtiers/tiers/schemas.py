"""Config schemas of the built-in tiers (JSON Schema draft 2020-12, section without
its "type" key).

They live apart from the tier classes so that registering the built-ins (done for
every `kvtiers` command, including `kvtiers plugins`) imports no tier code. The
tiers read their defaults from these same schemas, so a section built by hand in
Python and one loaded from a config document mean the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.plugins.schema_fragments import CAPACITY_BYTES, DRAFT, EVICTION_POLICY, THREADS


def _rate(description: str) -> dict[str, Any]:
    return {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0,
        "description": description,
    }


MEMORY_SCHEMA: Mapping[str, Any] = {
    "$schema": DRAFT,
    "title": "memory tier",
    "type": "object",
    "additionalProperties": False,
    "required": ["capacity_bytes"],
    "properties": {
        "capacity_bytes": {
            **CAPACITY_BYTES,
            # Summed with the CPU pool against the machine's memory.
            "x-kvtiers": "ram_bytes",
            "description": (
                "RAM the tier may hold, in bytes (block bytes only). Required: RAM is "
                "the resource the engine competes for, so its budget is never guessed. "
                "Together with the CPU pool and every other memory tier it must fit the "
                "machine's memory."
            ),
        },
        "eviction_policy": {**EVICTION_POLICY},
        "threads": {**THREADS, "description": "worker threads that copy blocks between the "
                    "pool and RAM"},
    },
}

FAULT_OPS = ("load", "store", "lookup")

FAULTY_SCHEMA: Mapping[str, Any] = {
    "$schema": DRAFT,
    "title": "faulty tier",
    "type": "object",
    "additionalProperties": False,
    "required": ["inner"],
    "properties": {
        "inner": {
            "type": "object",
            "x-kvtiers": "tier",
            "description": "the tier section to wrap (any tier, e.g. {\"type\": \"memory\", ...})",
        },
        "seed": {
            "type": "integer",
            "default": 0,
            "description": "seed of the fault draws: one seed, one sequence of faults",
        },
        "error_rate": _rate("probability that a key of a job fails with `io` instead of "
                            "being forwarded to the inner tier"),
        "miss_rate": _rate("probability that a lookup answers MISS without asking the "
                           "inner tier (a flaky index)"),
        "latency_s": {
            "type": "number",
            "minimum": 0,
            "default": 0,
            "description": (
                "seconds (on the tier's clock) a job is held before it is forwarded; "
                "a job whose deadline passes while held fails with `timeout`"
            ),
        },
        "hang_rate": _rate("probability that a job hangs: held without any I/O for "
                           "`hang_s`, failed with `timeout` if its deadline passes first"),
        "hang_s": {
            "type": ["number", "null"],
            "minimum": 0,
            "default": None,
            "description": "how long a hung job is held, on the tier's clock; null: forever",
        },
        "corrupt_rate": _rate("probability that a key a load reported ok gets one byte "
                              "of its pool slot flipped"),
        "corrupt_detected": {
            "type": "boolean",
            "default": True,
            "description": (
                "true: injected corruption is reported as `corrupt` (a verifying tier "
                "caught it); false: reported as success with the wrong bytes (a broken "
                "tier, for tests that prove end-to-end detection)"
            ),
        },
        "ops": {
            "type": "array",
            "items": {"type": "string", "enum": list(FAULT_OPS)},
            "uniqueItems": True,
            "default": list(FAULT_OPS),
            "description": "operations faults apply to; the others pass straight through",
        },
    },
}
