"""Clients built from `S3Settings`: the fsspec filesystem the data path runs on, and
a boto3 client for what fsspec does not offer (bucket creation, lifecycle rules,
the machine check).

Defaults for S3 (the user's `config_kwargs` win): botocore's own CRC checksums are
sent and checked only where an operation requires them - servers other than AWS
reject or mis-answer them on ranged GETs, and every block carries its own xxh3
checksum, verified on load - and connections time out after a few seconds, so a
server that went away costs a failed request, never a hang. Request bodies are not
part of the signature (`payload_signing_enabled: False`, the UNSIGNED-PAYLOAD of
SigV4): over http botocore would otherwise SHA-256 every PUT's body, ~2 ms of CPU
per 2 MiB block, the largest cost of a store on the client; the block's own
checksum already covers its bytes end to end.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from kvtiers_s3.settings import S3Settings

__all__ = [
    "S3_CONFIG_DEFAULTS",
    "boto3_client",
    "botocore_config",
    "filesystem_kwargs",
    "open_filesystem",
]

S3_CONFIG_DEFAULTS: Mapping[str, Any] = {
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
    "connect_timeout": 5,
    "read_timeout": 30,
    # one quick retry of a throttled or dropped request; deadlines do the rest
    "retries": {"mode": "standard", "total_max_attempts": 2},
    "s3": {"payload_signing_enabled": False},
}


def botocore_config(user: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`S3_CONFIG_DEFAULTS` updated with the user's `config_kwargs`, then `overrides`;
    the `s3` sub-options are merged key by key (a user's `addressing_style` keeps
    the unsigned payload)."""
    config = {**S3_CONFIG_DEFAULTS, **dict(user or {}), **overrides}
    s3 = {**S3_CONFIG_DEFAULTS["s3"], **dict((user or {}).get("s3") or {}),
          **dict(overrides.get("s3") or {})}
    config["s3"] = s3
    return config


def filesystem_kwargs(settings: S3Settings, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of the settings' fsspec filesystem class: the storage
    options, plus (for S3) `S3_CONFIG_DEFAULTS` under `config_kwargs`, updated
    with `overrides` (botocore Config fields, for S3 only), and s3fs'
    `max_concurrency` 1 unless given."""
    kwargs = dict(settings.storage_options)
    # Other engines write the same prefix: a cached listing would hide their objects.
    kwargs.setdefault("use_listings_cache", False)
    if settings.protocol in ("file", "local"):
        kwargs.setdefault("auto_mkdir", True)  # object names imply their directories
    if settings.is_s3:
        kwargs["config_kwargs"] = botocore_config(kwargs.get("config_kwargs"), overrides)
        # s3fs reads a whole object with a HEAD first, to split it into concurrent
        # ranged GETs: two requests per block. Blocks already go out concurrently.
        kwargs.setdefault("max_concurrency", 1)
    return kwargs


def open_filesystem(
    settings: S3Settings, *, loop: asyncio.AbstractEventLoop | None = None, **overrides: Any
) -> Any:
    """A new (never cached) fsspec filesystem for the settings' protocol. With
    `loop`, an async one bound to that loop (call its `_` methods on the loop) where
    the filesystem is async; else a synchronous one (`objects.ObjectStore` wraps
    it). `overrides` as in `filesystem_kwargs`."""
    import fsspec

    cls = fsspec.get_filesystem_class(settings.protocol)
    kwargs = filesystem_kwargs(settings, **overrides)
    if loop is not None and getattr(cls, "async_impl", False):
        kwargs.update(asynchronous=True, loop=loop)
    return cls(skip_instance_cache=True, **kwargs)


def boto3_client(settings: S3Settings, **overrides: Any) -> Any:
    """A boto3 S3 client with the same endpoint, credentials and client options as
    the data path; `overrides` are botocore Config fields (timeouts, retries)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    options = settings.storage_options
    config = botocore_config(options.get("config_kwargs"), overrides)
    if options.get("anon"):
        config["signature_version"] = UNSIGNED
    client_kwargs = dict(options.get("client_kwargs") or {})
    if options.get("endpoint_url"):
        client_kwargs.setdefault("endpoint_url", options["endpoint_url"])
    for ours, theirs in (("key", "aws_access_key_id"), ("secret", "aws_secret_access_key"),
                         ("token", "aws_session_token")):
        if options.get(ours):
            client_kwargs.setdefault(theirs, options[ours])
    profile = options.get("profile")
    with _sessions_lock:  # boto3 sessions are not thread-safe; clients are
        session = _sessions.get(profile)
        if session is None:
            session = _sessions[profile] = boto3.session.Session(profile_name=profile)
        return session.client("s3", config=Config(**config), **client_kwargs)


# One boto3 session per profile and process: a session parses S3's service model
# (~0.3-1 s here) the first time it makes a client, and caches it.
_sessions: dict[Any, Any] = {}
_sessions_lock = threading.Lock()


def region_of(settings: S3Settings) -> str | None:
    """The region the options name, if any."""
    client_kwargs = settings.storage_options.get("client_kwargs") or {}
    region = client_kwargs.get("region_name") if isinstance(client_kwargs, Mapping) else None
    return region if isinstance(region, str) and region else None
