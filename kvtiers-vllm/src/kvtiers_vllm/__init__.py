"""kvtiers-vllm: kvtiers inside an unmodified vLLM (supported: 0.33.x and 0.34.x).

- `kvtiers_vllm.plugin.register`: what vLLM's `vllm.general_plugins` entry point runs;
  registers the secondary tier type "kvtiers" and the spec "KvtiersOffloadingSpec".
- `kvtiers_vllm.tier.KvtiersTier`: any kvtiers tier as a vLLM secondary tier.
- `kvtiers_vllm.compat`: the supported vLLM versions, the error for another one, and
  what differs between them (one module per concern).

Importing this package never imports vLLM; the modules that subclass vLLM's classes
(`tier`, `spec`) check its version first.
"""

from __future__ import annotations

from kvtiers_vllm.compat import SUPPORTED, UnsupportedVllmError, require_vllm

__all__ = ["SUPPORTED", "UnsupportedVllmError", "require_vllm"]
