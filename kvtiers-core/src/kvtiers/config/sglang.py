"""Reading SGLang's `--hicache-storage-backend-extra-config` as a kvtiers config.

SGLang loads a third-party L3 storage with `--hicache-storage-backend dynamic` and an
extra config naming it: `{"backend_name": ..., "module_path": ..., "class_name": ...,
"interface_v1": 1, ...}`. kvtiers-sglang's backend (`module_path` in `kvtiers_sglang`)
reads the rest of that object as a kvtiers config (`secondary_tiers`, `job_timeout_s`,
`breaker`, `model`, ...) plus the few keys of its own in `BACKEND_OPTIONS`.

SGLang's host pool is the CPU pool there (sized by `--hicache-size` /
`--hicache-ratio`), so `cpu_bytes_to_use` is not needed: a nominal one is filled in
(a given one is ignored, with a warning). Detection: an object with `module_path` and
`class_name` is such an extra config. This module knows SGLang's names only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.config.messages import describe, found, show
from kvtiers.config.paths import ROOT, join
from kvtiers.config.sections import Checker

SGLANG_EXTRA = "sglang_extra_config"
#: the package whose `HiCacheStorage` reads the rest of the object as kvtiers'
BACKEND_PACKAGE = "kvtiers_sglang"
#: what `cpu_bytes_to_use` is set to: SGLang's host pool is the CPU pool
NOMINAL_POOL_BYTES = 4096

#: SGLang's own keys of a `dynamic` backend's extra config.
SGLANG_KEYS: dict[str, dict[str, Any]] = {
    "backend_name": {"type": "string", "title": "a name"},
    "module_path": {"type": "string", "title": "a module path"},
    "class_name": {"type": "string", "title": "a class name"},
    "interface_v1": {"enum": [0, 1], "title": "0 or 1"},
}
#: kvtiers-sglang's backend options (read by `kvtiers_sglang.options`).
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    "exists_wait_s": {
        "type": "number", "minimum": 0, "maximum": 60, "title": "a number of seconds in 0..60",
        "description": "how long one existence query may wait for tiers still probing",
    },
    "metrics_port": {
        "type": "integer", "minimum": 0, "maximum": 65535, "title": "a port (0: any free one)",
        "description": "serve Prometheus metrics on 127.0.0.1:PORT (TP rank 0 only)",
    },
}  # fmt: skip


def detect(doc: Mapping[str, Any]) -> bool:
    """Whether `doc` is an SGLang `dynamic` backend's extra config."""
    return "module_path" in doc and "class_name" in doc


def unwrap(doc: Mapping[str, Any], checker: Checker) -> dict[str, Any]:
    """The kvtiers document inside SGLang's extra config; problems and warnings go
    to `checker`."""
    from jsonschema.validators import Draft202012Validator

    for key, schema in {**SGLANG_KEYS, **BACKEND_OPTIONS}.items():
        if key in doc and any(Draft202012Validator(schema).iter_errors(doc[key])):
            checker.problem(
                join(ROOT, key), f"expected {describe(schema)}, found {found(doc[key])}"
            )
    module = doc.get("module_path")
    if isinstance(module, str) and not (
        module == BACKEND_PACKAGE or module.startswith(BACKEND_PACKAGE + ".")
    ):
        checker.problem(
            join(ROOT, "module_path"),
            f"is {show(module)}: SGLang would load that module's backend, which does not "
            f'read these options as kvtiers does: set "module_path": "{BACKEND_PACKAGE}.backend"',
        )
    if "cpu_bytes_to_use" in doc:
        checker.warnings.append(
            f"{join(ROOT, 'cpu_bytes_to_use')}: ignored under SGLang: its host pool "
            "(--hicache-size / --hicache-ratio) is the CPU pool"
        )
    native = {k: v for k, v in doc.items() if k not in SGLANG_KEYS and k not in BACKEND_OPTIONS}
    native["cpu_bytes_to_use"] = NOMINAL_POOL_BYTES
    return native
