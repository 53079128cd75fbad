"""kvtiers-s3: the `s3` tier - KV-cache blocks as objects in S3 or any fsspec
filesystem, shared by many engines. Registered through the `kvtiers` entry point
(`kvtiers_s3.plugin`), with `obj` (vLLM's object store tier) as a second name.

- `S3Settings`, `settings_from_s3`, `settings_from_obj`: a tier section, resolved.
- `codec`, `segment`: the object formats (one block per object; packed segments).
- `names`: where objects live under the prefix.
"""

from __future__ import annotations

from kvtiers_s3.settings import S3Settings, settings_from_obj, settings_from_s3

__all__ = ["S3Settings", "settings_from_obj", "settings_from_s3"]
