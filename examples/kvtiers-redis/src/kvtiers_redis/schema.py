"""The config schema of the `redis` tier.

Imported by the plugin module, so it imports nothing but the standard library:
`kvtiers plugins` and `kvtiers validate` stay fast and work without redis-py.
Credentials - `password`, and `url`, which may carry one - are marked
`"writeOnly": true` (JSON Schema's word for "never shown back"): `kvtiers validate`
prints them as `***` and its errors never repeat them. What the options mean once
resolved is `settings.py`.
"""

from __future__ import annotations

from typing import Any

DEFAULT_URL = "redis://127.0.0.1:6379/0"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "url": {
            "type": "string",
            "minLength": 1,
            "writeOnly": True,
            "default": DEFAULT_URL,
            "description": (
                "the server: redis://[[user]:password@]host[:port][/db], rediss:// (TLS) "
                "or unix:///path/to/socket[?db=N]. Never shown back (it may carry a "
                "password); logs and errors name the server without its credentials"
            ),
        },
        "username": {
            "type": "string",
            "minLength": 1,
            "description": "ACL user name (default: the URL's, else Redis's `default` user)",
        },
        "password": {
            "type": "string",
            "writeOnly": True,
            "description": "password (overrides one in the URL); never shown back",
        },
        "capacity_bytes": {
            "type": "integer",
            "minimum": 1,
            "description": (
                "Block bytes this model's blocks may take under the prefix (each value "
                "adds a ~110-byte header); the least recently used go first."
            ),
        },
        "prefix": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "pattern": "^[^\\s]+$",
            "default": "kvtiers",
            "description": (
                "start of every Redis key the tier writes: <prefix>:<namespace>:b:<key hex> "
                "for blocks, <prefix>:<namespace>:m:* for its manifests"
            ),
        },
        "eviction_policy": {
            "type": "string",
            "minLength": 1,
            "x-kvtiers": "policy",
            "default": "lru",
            "description": "name of a registered eviction policy (see `kvtiers plugins`)",
        },
        "ttl_s": {
            "type": "number",
            "minimum": 0,
            "default": 0,
            "description": (
                "seconds a block lives after it is stored, by Redis expiry (0: no expiry). "
                "Expired blocks are misses; Redis deletes them itself"
            ),
        },
        "timeout_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 3600,
            "default": 5.0,
            "description": (
                "time limit of one request (connect included); a job's deadline, when "
                "nearer, cuts it shorter"
            ),
        },
        "concurrency": {
            "type": "integer",
            "minimum": 2,
            "maximum": 1024,
            "default": 8,
            "description": "requests in flight at once, half for loads and half for stores",
        },
    },
    "required": ["capacity_bytes"],
    "additionalProperties": False,
}
