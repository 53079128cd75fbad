"""`kvtiers bench --engine hf`: a real transformers decoder (Llama architecture, built
from a config with random weights: no download) serving requests from a paged KV
cache whose full pages go through kvtiers (manager + DeviceSwapper + the configured
tiers), timed per request against recompute and against the machine's copy limit.

Modules: `presets` (model shapes), `paged` (the paged KV cache and the attention that
reads it), `decoder` (the model and its forward pass), `offload` (kvtiers the way an
engine embeds it), `limits` (pinned-copy and disk-read ceilings), `ttft` (time to
first token per prompt size), `multiturn` (the shared-prefix chat workload), `run`
(the command line and its report).
"""
