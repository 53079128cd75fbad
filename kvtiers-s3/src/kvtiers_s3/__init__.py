"""kvtiers-s3: the `s3` tier - KV-cache blocks as objects in S3 or any fsspec
filesystem, shared by many engines. Registered through the `kvtiers` entry point
(`kvtiers_s3.plugin`), with `obj` (vLLM's object store tier) as a second name.

- `S3Settings`, `settings_from_s3`, `settings_from_obj`: a tier section, resolved.

At the top, the modules every tier package has: `plugin` (the entry point's
records, thin), `schema` (the config schemas), `settings`, `check` (the machine
checks of `kvtiers validate`) and `tier` (`S3Tier`, `ObjTier`). Below them:

- `client/`: talking to the object store (clients, object operations, bodies, bucket).
- `layout/`: the object formats (one block per object; packed segments) and names.
- `holdings/`: what the tier holds (the bounded index) and what the prefix holds.
- `jobs/`: the store and load jobs, their requests and their latency.
"""

from __future__ import annotations

from kvtiers_s3.settings import S3Settings, settings_from_obj, settings_from_s3

__all__ = ["S3Settings", "settings_from_obj", "settings_from_s3"]
