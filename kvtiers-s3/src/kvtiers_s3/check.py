"""The machine checks of `kvtiers validate` (the tier records' `check`): what a
schema cannot say about an s3 or obj section.

In order, stopping at the first that fails: the URL's scheme is one fsspec knows
and its filesystem is installed; every storage option is a parameter of that
filesystem (for s3fs, memory and file, whose parameters are known); then, against
the server, with a 2 s connect timeout and no retries so that validate never hangs:
the endpoint answers, the credentials are accepted, the bucket exists (or
`create_bucket` is set), and an object can be written, listed and deleted under
the prefix - the tier does all three. Each failure is one `ConfigProblem` at the
JSON path of the option to change, its message scrubbed of credentials.

Runs in the `kvtiers` CLI (any thread); blocks for a few network round trips.
"""

from __future__ import annotations

import difflib
import inspect
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.errors import ConfigError, ConfigNote, ConfigProblem

from kvtiers_s3.client.connect import boto3_client, open_filesystem
from kvtiers_s3.settings import S3Settings, settings_from_obj, settings_from_s3

__all__ = ["OBJ_PATHS", "S3_PATHS", "check_obj", "check_offline", "check_s3", "check_settings"]

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
GENERIC_TIMEOUT_S = 10.0
PROBE_NAME = ".kvtiers-check"

# Protocols whose filesystem accepts exactly its named parameters (plus fsspec's).
_STRICT = frozenset({"s3", "s3a", "file", "local", "memory"})
# Set by the tier itself.
_RESERVED = frozenset({"asynchronous", "loop", "skip_instance_cache"})
_COMMON_SCHEMES = ("s3", "gs", "az", "file", "memory")

Remark = ConfigProblem | ConfigNote


@dataclass(frozen=True)
class Paths:
    """Where in the section each kind of problem points."""

    url: str
    endpoint: str
    options: str


S3_PATHS = Paths("$.url", "$.storage_options.endpoint_url", "$.storage_options")
OBJ_PATHS = Paths("$.store_config.bucket", "$.store_config.endpoint_override", "$.store_config")


def check_s3(options: Mapping[str, Any]) -> list[Remark]:
    """The `s3` record's check: kvtiers' form."""
    try:
        settings = settings_from_s3(options)
    except ConfigError as exc:
        return list(exc.problems)
    return check_settings(settings, S3_PATHS)


def check_obj(options: Mapping[str, Any]) -> list[Remark]:
    """The `obj` record's check: vLLM's form."""
    try:
        settings = settings_from_obj(options)
    except ConfigError as exc:
        return list(exc.problems)
    top = "bucket" in options
    store = "$.store_config"
    paths = Paths(
        "$.bucket" if top else f"{store}.bucket",
        "$.endpoint_override" if "endpoint_override" in options else f"{store}.endpoint_override",
        store,
    )
    return check_settings(settings, paths, tier="obj")


def check_offline(settings: S3Settings, paths: Paths = S3_PATHS,
                  tier: str = "s3") -> list[ConfigProblem]:
    """The checks that need no network (scheme, options): what the tier's
    constructor refuses before it starts."""
    return [r for r in _scrubbed(_check_protocol(settings, paths), settings, tier)
            if isinstance(r, ConfigProblem)]


def check_settings(settings: S3Settings, paths: Paths, tier: str = "s3") -> list[Remark]:
    """Every check, against the server the settings name."""
    remarks = _check_protocol(settings, paths)
    if remarks:
        return _scrubbed(remarks, settings, tier)
    if settings.is_s3:
        remarks = _check_s3_server(settings, paths)
    else:
        remarks = _check_generic(settings, paths)
    return _scrubbed(remarks, settings, tier)


def _scrubbed(remarks: list[Remark], settings: S3Settings, tier: str) -> list[Remark]:
    return [type(r)(r.path, settings.scrub(f"{tier} tier: {r.message}")) for r in remarks]


# -- scheme and options ---------------------------------------------------------------


def _check_protocol(settings: S3Settings, paths: Paths) -> list[Remark]:
    import fsspec
    from fsspec.registry import known_implementations, registry

    protocol = settings.protocol
    known = sorted(set(known_implementations) | set(registry))
    if protocol not in known:
        close = difflib.get_close_matches(protocol, known, n=1)
        hint = f" (did you mean {close[0]}://?)" if close else ""
        return [ConfigProblem(paths.url, (
            f"unknown URL scheme {protocol}://{hint}; use s3://BUCKET/PREFIX, or another "
            f"scheme fsspec knows ({', '.join(_COMMON_SCHEMES)}, ...)"))]
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        return [ConfigProblem(paths.url, f"{protocol}:// cannot be used here: {exc}")]
    return _check_options(settings, cls, paths)


def _accepted(cls: type) -> set[str] | None:
    """The keyword parameters of `cls`'s constructor chain (None: not knowable)."""
    from fsspec.dircache import DirCache

    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                names.add(p.name)
    names.update(p for p in inspect.signature(DirCache.__init__).parameters if p != "self")
    return names


def _check_options(settings: S3Settings, cls: type, paths: Paths) -> list[Remark]:
    problems: list[Remark] = []
    given = list(settings.storage_options)
    for key in given:
        if key in _RESERVED:
            problems.append(ConfigProblem(f"{paths.options}.{key}",
                                          f"{key!r} is set by the tier itself; remove it"))
    accepted = _accepted(cls) if settings.protocol in _STRICT else None
    if accepted is not None:
        name = f"{cls.__module__}.{cls.__qualname__}"
        for key in given:
            if key not in accepted and key not in _RESERVED:
                close = difflib.get_close_matches(key, sorted(accepted), n=1)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                problems.append(ConfigProblem(f"{paths.options}.{key}", (
                    f"unknown option {key!r} for {settings.protocol}:// ({name}){hint}")))
    return problems


# -- S3 -----------------------------------------------------------------------------


def _check_s3_server(settings: S3Settings, paths: Paths) -> list[Remark]:
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        ProfileNotFound,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )

    where = settings.endpoint_url or "AWS S3"
    try:
        client = boto3_client(settings, connect_timeout=CONNECT_TIMEOUT_S,
                              read_timeout=READ_TIMEOUT_S,
                              retries={"total_max_attempts": 1})
    except ProfileNotFound as exc:
        return [ConfigProblem(f"{paths.options}.profile", f"{exc}")]
    except (BotoCoreError, ValueError) as exc:
        return [ConfigProblem(paths.options, f"cannot build an S3 client: {exc}")]
    bucket, prefix = settings.bucket, settings.prefix
    probe = "/".join(p for p in (prefix, f"{PROBE_NAME}-{uuid.uuid4().hex}") if p)
    step = "reach the bucket"
    try:
        try:
            client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if _status(exc) != 404:
                raise
            if settings.create_bucket:
                return [ConfigNote(paths.url, (
                    f"bucket {bucket!r} does not exist at {where}; the tier will create it "
                    "(create_bucket is true)"))]
            return [ConfigProblem(paths.url, (
                f"bucket {bucket!r} does not exist at {where}; create it, or set "
                '"create_bucket": true'))]
        step = "write"
        client.put_object(Bucket=bucket, Key=probe, Body=os.urandom(16))
        step = "list"
        client.list_objects_v2(Bucket=bucket, Prefix=probe, MaxKeys=1)
        step = "delete"
        client.delete_object(Bucket=bucket, Key=probe)
    except NoCredentialsError:
        return [ConfigProblem(paths.options, (
            "no credentials found: give key and secret, a profile, or set anon for a "
            "public bucket"))]
    except BotoConnectionError as exc:
        return [ConfigProblem(paths.endpoint, f"cannot reach {where}: {_reason(exc)}")]
    except ClientError as exc:
        status, code = _status(exc), _code(exc)
        if step == "reach the bucket":
            if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId",
                                         "SignatureDoesNotMatch", "Forbidden"):
                return [ConfigProblem(paths.options, (
                    f"access to bucket {bucket!r} at {where} denied ({code or status}); "
                    "check the credentials"))]
            return [ConfigProblem(paths.url, (
                f"bucket {bucket!r} at {where} answered {code or status}"))]
        why = {"write": "no write permission", "list": "no permission to list",
               "delete": "no permission to delete (the tier deletes to evict)"}[step]
        return [ConfigProblem(paths.url, (
            f"{why} under {settings.url} at {where} with these credentials "
            f"({code or status})"))]
    except BotoCoreError as exc:
        return [ConfigProblem(paths.endpoint, f"cannot {step} at {where}: {_reason(exc)}")]
    return []


def _status(exc: Any) -> int | None:
    meta = getattr(exc, "response", {}).get("ResponseMetadata", {})
    status = meta.get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", "") or "")


def _reason(exc: BaseException) -> str:
    """The innermost cause's words ("Connection refused"), not botocore's wrapper."""
    inner: BaseException = exc
    while inner.__cause__ is not None or inner.__context__ is not None:
        nxt = inner.__cause__ or inner.__context__
        assert nxt is not None
        inner = nxt
    text = str(getattr(inner, "strerror", None) or inner)
    return text if inner is exc else f"{exc}; {text}"


# -- any other fsspec filesystem -------------------------------------------------------


def _check_generic(settings: S3Settings, paths: Paths) -> list[Remark]:
    """Write, list and delete a probe object through the fsspec filesystem, on a
    thread with a time limit (these filesystems' timeouts are their own)."""

    def probe() -> None:
        fs = open_filesystem(settings)
        created = not fs.exists(settings.root)
        if created:  # as the tier will (a no-op on object stores)
            fs.makedirs(settings.root, exist_ok=True)
        name = f"{settings.root}/{PROBE_NAME}-{uuid.uuid4().hex}"
        fs.pipe_file(name, os.urandom(16))
        fs.ls(settings.root)
        fs.rm_file(name)
        if created:
            fs.rmdir(settings.root)

    error = _run_with_timeout(probe, GENERIC_TIMEOUT_S)
    if error is None:
        return []
    if isinstance(error, TimeoutError):
        return [ConfigProblem(paths.url, f"{settings.url} did not answer within "
                                         f"{GENERIC_TIMEOUT_S:g} s")]
    return [ConfigProblem(paths.url, (
        f"cannot write, list and delete under {settings.url}: "
        f"{type(error).__name__}: {error}"))]


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> BaseException | None:
    result: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            result.append(None)
        except Exception as exc:  # noqa: BLE001 - reported as a config problem
            result.append(exc)

    thread = threading.Thread(target=run, name="kvtiers-s3-check", daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0] if result else TimeoutError()
