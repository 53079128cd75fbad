"""What kvtiers-vllm needs to know about the vLLM it runs inside, one concern a module.

- `versions`: the supported minor releases and the error for another one (pure: this
  package's import never imports vLLM, so `kvtiers_vllm.plugin` can check first);
- `worker_io`: the device side of a worker job (0.33's `GPULoadStoreSpec`, 0.34's
  `DevicePointers`) as one description for kvtiers' worker;
- `results`: a secondary tier's job results (0.34's `JobResult.deferred_release`).

The modules other than `versions` import vLLM; only code that already requires it
imports them. Nothing outside this package asks which vLLM is installed.
"""

from __future__ import annotations

from kvtiers_vllm.compat.versions import (
    SUPPORTED,
    SUPPORTED_TEXT,
    UnsupportedVllmError,
    installed_vllm,
    is_supported,
    minor_of,
    require_vllm,
)

__all__ = [
    "SUPPORTED",
    "SUPPORTED_TEXT",
    "UnsupportedVllmError",
    "installed_vllm",
    "is_supported",
    "minor_of",
    "require_vllm",
]
