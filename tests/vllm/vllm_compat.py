"""What the test harness does differently on the vLLM minors kvtiers-vllm supports.

- `model_runner_output`: vLLM 0.33's `ModelRunnerOutput` takes `req_id_to_index`,
  0.34's does not;
- `device_side`: what the connector hands a worker for the GPU side of a job: the
  `GPULoadStoreSpec` itself (0.33) or vLLM's `DevicePointers` resolved from it
  against the worker's KV caches (0.34, `resolve_device_pointers`).

Feature checks on vLLM's own classes, in this one module.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.base import CanonicalKVCaches, GPULoadStoreSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

_RUNNER_FIELDS = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
try:  # vLLM 0.34 and later
    _pointer_utils: Any = importlib.import_module("vllm.v1.kv_offload.pointer_utils")
except ModuleNotFoundError:  # vLLM 0.33
    _pointer_utils = None

#: Whether workers get device pointers (0.34) rather than the GPU spec (0.33).
DEVICE_POINTERS = _pointer_utils is not None


def model_runner_output(
    req_ids: Sequence[str],
    sampled_token_ids: list[list[int]],
    kv_connector_output: KVConnectorOutput,
) -> ModelRunnerOutput:
    extra: dict[str, Any] = {}
    if "req_id_to_index" in _RUNNER_FIELDS:  # vLLM 0.33
        extra["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(
        req_ids=list(req_ids),
        sampled_token_ids=sampled_token_ids,
        kv_connector_output=kv_connector_output,
        **extra,
    )


def device_side(spec: GPULoadStoreSpec, kv_caches: CanonicalKVCaches) -> Any:
    """What the installed vLLM's connector passes a worker for `spec`."""
    if _pointer_utils is None:
        return spec
    return _pointer_utils.resolve_device_pointers(spec, kv_caches)
