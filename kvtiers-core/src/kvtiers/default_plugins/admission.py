"""The built-in admission policies: `all` and `second_touch`. The schemas are
spelled here, not imported: loading the registry imports no policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import AdmissionRecord
from kvtiers.plugins.version import CONTRACT_VERSION

# kvtiers.admission.second_touch states the bounds (MIN/DEFAULT/MAX_WINDOW).
SECOND_TOUCH_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "window_blocks": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": 16777216,
            "default": None,
            "description": (
                "First offers remembered (at least; at most twice as many): a block "
                "offered again within them is admitted. `null`: the tier's capacity "
                "in blocks, within 4096..16777216 (1048576 when "
                "the tier states none)."
            ),
        },
        "bits_per_key": {
            "type": "integer",
            "minimum": 4,
            "maximum": 32,
            "default": 10,
            "description": "Bloom-filter bits per remembered key (10: about 1% false admits).",
        },
    },
}


@hookimpl
def kvtiers_register_admissions() -> list[AdmissionRecord]:
    return [
        AdmissionRecord(
            "all",
            "kvtiers.admission.base:AdmitAll",
            "every block cascades to the tier",
            CONTRACT_VERSION,
            {"type": "object", "additionalProperties": False, "properties": {}},
        ),
        AdmissionRecord(
            "second_touch",
            "kvtiers.admission.second_touch:SecondTouch",
            "a block cascades only when offered a second time (proven reuse); a bounded"
            " two-generation Bloom doorkeeper remembers first offers",
            CONTRACT_VERSION,
            SECOND_TOUCH_SCHEMA,
        ),
    ]
