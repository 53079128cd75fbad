"""The config schemas of the `s3` tier (kvtiers' form) and of `obj` (vLLM's object
store tier, accepted verbatim), and the vLLM names of their options.

Imported by the plugin module, so it imports nothing but the standard library and
the schema fragments of `kvtiers.plugins` (`DRAFT`, `EVICTION_POLICY`,
`CAPACITY_BYTES` with s3's own description): `kvtiers plugins` and `kvtiers
validate` stay fast. Credentials are marked `"writeOnly": true` (JSON Schema's word
for "never shown back"): `kvtiers validate` prints them as `***`. What the options
mean once resolved is `settings.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.plugins import CAPACITY_BYTES, DRAFT, EVICTION_POLICY

MiB = 1 << 20

DEFAULT_CONCURRENCY = 32
DEFAULT_SEGMENT_BYTES = 16 * MiB
DEFAULT_PACK_BELOW_BYTES = 4 * MiB
PACKINGS = ("auto", "per_block", "segments")
CLIENTS = ("auto", "boto3", "aiobotocore")


def _secret(description: str) -> dict[str, Any]:
    return {"type": "string", "writeOnly": True, "description": description}


def _capacity(why: str) -> dict[str, Any]:
    # The first sentence is what a "missing" error quotes: it says what to add.
    return {
        **CAPACITY_BYTES,
        "description": (
            "Bytes this model's objects may take under the prefix, headers included; "
            f"{why}. Every writer sharing a prefix should use the same value."
        ),
    }


_COMMON: dict[str, Any] = {
    "eviction_policy": {**EVICTION_POLICY},
    "concurrency": {
        "type": "integer",
        "minimum": 1,
        "maximum": 1024,
        "default": DEFAULT_CONCURRENCY,
        "description": (
            "requests in flight at once (one event-loop thread runs them all); a job's "
            "blocks go out as concurrent requests (vLLM: io_threads)"
        ),
    },
    "layout": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "packing": {
                "enum": list(PACKINGS),
                "default": "auto",
                "description": (
                    '"per_block": one object per block; "segments": the blocks of a job '
                    "packed into objects of up to segment_bytes, loaded with ranged GETs; "
                    '"auto": segments for blocks smaller than pack_below_bytes (see '
                    "docs/tiers/s3.md for the measurements behind it)"
                ),
            },
            "segment_bytes": {
                "type": "integer",
                "minimum": MiB,
                "maximum": 1 << 30,
                "default": DEFAULT_SEGMENT_BYTES,
                "description": "largest packed object, in bytes",
            },
            "pack_below_bytes": {
                "type": "integer",
                "minimum": 0,
                "default": DEFAULT_PACK_BELOW_BYTES,
                "description": 'with packing "auto": blocks smaller than this are packed',
            },
        },
        "default": {},
        "description": "how blocks map to objects",
    },
    "client": {
        "enum": list(CLIENTS),
        "default": "auto",
        "description": (
            'S3 only, which client makes the requests: "aiobotocore" (s3fs\' own, on the '
            'event loop) or "boto3" (on a thread pool, awaited from the loop); "auto": '
            "boto3, measured faster for large blocks (docs/tiers/s3.md)"
        ),
    },
    "timeout_s": {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 3600,
        "default": 10,
        "description": (
            "longest one request may take (a job's deadline shortens it): a server that "
            "stops answering costs a failed request, never a stuck job"
        ),
    },
    "rescan_s": {
        "type": "number",
        "minimum": 0,
        "default": 30,
        "description": (
            "with shared: true, list the namespace this often to count what other "
            "engines stored (and evict down to capacity_bytes); 0: never"
        ),
    },
    "ttl_s": {
        "type": ["integer", "null"],
        "minimum": 1,
        "default": None,
        "description": (
            "blocks older than this many seconds are misses; where the server supports "
            "lifecycle rules, one on the namespace prefix expires them (in whole days)"
        ),
    },
    "create_bucket": {
        "type": "boolean",
        "default": False,
        "description": "create the bucket at start if it does not exist",
    },
    "shared": {
        "type": "boolean",
        "default": True,
        "description": (
            "other engines write to the same prefix: a lookup of a key this process "
            "has not seen probes the store (RETRY, then HIT or MISS). false: this "
            "process is the only writer and such a lookup is a MISS at once"
        ),
    },
}

STORAGE_OPTIONS: Mapping[str, Any] = {
    "type": "object",
    "default": {},
    "additionalProperties": True,
    "properties": {
        "endpoint_url": {
            "type": "string",
            "minLength": 1,
            "description": "the S3 endpoint (for servers other than AWS)",
        },
        "key": _secret("access key id"),
        "secret": _secret("secret access key"),
        "token": _secret("session token"),
        "profile": {"type": "string", "minLength": 1,
                    "description": "a profile of the AWS config and credentials files"},
        "anon": {"type": "boolean", "description": "no credentials (public buckets)"},
        "client_kwargs": {"type": "object",
                          "description": "passed to the S3 client (region_name, verify, ...)"},
        "config_kwargs": {"type": "object",
                          "description": "passed to botocore's Config (timeouts, retries)"},
    },
    "description": (
        "options of the fsspec filesystem the URL names (s3fs for s3://); other keys are "
        "passed through, and `kvtiers validate` checks them against the filesystem's "
        "parameters. Without key/secret or profile, the usual credential chain applies "
        "(environment, files, instance role)"
    ),
}

S3_SCHEMA: Mapping[str, Any] = {
    "$schema": DRAFT,
    "title": "s3 tier",
    "type": "object",
    "additionalProperties": False,
    "required": ["url", "capacity_bytes"],
    "properties": {
        "url": {
            "type": "string",
            "pattern": "^[A-Za-z][A-Za-z0-9+.-]*://",
            "description": (
                "Where the objects go: s3://bucket/prefix, or any fsspec URL (gs://, "
                "az://, file://, memory://). Each model gets its own sub-prefix (its "
                "namespace fingerprint)."
            ),
        },
        "storage_options": STORAGE_OPTIONS,
        "capacity_bytes": _capacity(
            "required, since an object store has no free space to derive a bound from"),
        **_COMMON,
    },
}

STORE_CONFIG: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["bucket"],
    "properties": {
        "bucket": {"type": "string", "minLength": 1, "description": "the bucket"},
        "endpoint_override": {
            "type": "string",
            "description": 'the endpoint, "host:port" or a URL (default: AWS)',
        },
        "access_key": _secret("access key id"),
        "secret_key": _secret("secret access key"),
        "session_token": _secret("session token"),
        "region": {"type": "string", "description": "the region"},
        "scheme": {"enum": ["http", "https"], "default": "http",
                   "description": "of endpoint_override when it has none"},
        "ca_bundle": {"type": "string",
                      "description": "CA certificates file to verify the endpoint with"},
    },
    "description": (
        "vLLM's object-store connection: bucket, endpoint_override and credentials; "
        "bucket and endpoint_override may instead sit at the tier's top level"
    ),
}

OBJ_SCHEMA: Mapping[str, Any] = {
    "$schema": DRAFT,
    "title": "obj tier (vLLM's object store tier, on kvtiers-s3)",
    "type": "object",
    "additionalProperties": False,
    "required": ["capacity_bytes"],
    # the bucket is in store_config, or at the tier's top level
    "if": {"required": ["bucket"]},
    "else": {"required": ["store_config"], "properties": {"store_config": STORE_CONFIG}},
    "properties": {
        "store_config": STORE_CONFIG,
        "bucket": {"type": "string", "minLength": 1,
                   "description": "the bucket (instead of store_config.bucket)"},
        "endpoint_override": {
            "type": "string",
            "description": "the endpoint (instead of store_config.endpoint_override)",
        },
        "prefix": {"type": "string", "default": "",
                   "description": "prepended to every object name"},
        "capacity_bytes": _capacity(
            "vLLM's obj tier has no such bound and an object store no free space to derive "
            'one from, so add "capacity_bytes" to this section'),
        **_COMMON,
    },
}

#: vLLM's option names -> ours, applied to vLLM kv_transfer_configs only
VLLM_ALIASES: Mapping[str, str] = {"io_threads": "concurrency"}
