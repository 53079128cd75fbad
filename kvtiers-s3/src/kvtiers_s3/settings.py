"""What a tier section means, whichever form it came in: `S3Settings`.

`settings_from_s3(options)` reads kvtiers' form (`url`, `storage_options`, ...);
`settings_from_obj(options)` reads vLLM's obj form (`store_config`, `prefix`, ...,
or `bucket` / `endpoint_override` at the tier's top level) and maps it onto the
same settings. Both take a section the schema accepted, defaults filled
(`kvtiers.sdk.resolve_options`), and raise `ConfigError` for what a schema
cannot say (a bad bucket name, a bucket given twice).

Credentials: `S3Settings.secrets` holds every credential value found in the
options (by name: key, secret, token, password, ... at any depth), and
`scrub(text)` replaces each one with `***`. Every message the tier writes - log
lines, job failure details, errors, validate output - goes through it; the
settings' repr shows no storage options at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtiers.errors import ConfigError, ConfigProblem
from kvtiers.sdk import credential_values, scrub

from kvtiers_s3.schema import OBJ_SCHEMA, S3_SCHEMA

__all__ = ["LayoutSettings", "S3Settings", "scrub", "settings_from_obj", "settings_from_s3"]

#: fsspec protocols that s3fs serves (buckets follow S3's naming rules)
S3_PROTOCOLS = frozenset({"s3", "s3a"})
# S3's bucket naming rules (the strict, virtual-host-compatible ones).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class LayoutSettings:
    packing: str  # "auto" | "per_block" | "segments"
    segment_bytes: int
    pack_below_bytes: int

    def packs(self, block_bytes: int) -> bool:
        """Whether blocks of `block_bytes` go into packed segments."""
        if self.packing == "auto":
            return block_bytes < self.pack_below_bytes
        return self.packing == "segments"


@dataclass(frozen=True)
class S3Settings:
    """A resolved tier section. `root` is the fsspec path of the prefix, without
    protocol or trailing slash ("bucket/prefix"); namespaces live below it."""

    protocol: str
    root: str
    capacity_bytes: int
    eviction_policy: str
    concurrency: int
    layout: LayoutSettings
    ttl_s: int | None
    create_bucket: bool
    shared: bool
    timeout_s: float
    rescan_s: float
    client: str
    storage_options: Mapping[str, Any] = field(repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def url(self) -> str:
        """The prefix as a URL (no credentials in it)."""
        return f"{self.protocol}://{self.root}"

    @property
    def is_s3(self) -> bool:
        return self.protocol in S3_PROTOCOLS

    @property
    def bucket(self) -> str:
        """The first path element: the bucket of an object store."""
        return self.root.split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The root without its bucket ("" at the bucket's top)."""
        return self.root.split("/", 1)[1] if "/" in self.root else ""

    @property
    def uses_boto3(self) -> bool:
        """S3 requests go through boto3 on threads (`client`)."""
        return self.is_s3 and self.client in ("auto", "boto3")

    @property
    def endpoint_url(self) -> str | None:
        value = self.storage_options.get("endpoint_url")
        return value if isinstance(value, str) else None

    def scrub(self, text: str) -> str:
        return scrub(text, self.secrets)




def split_url(url: str) -> tuple[str, str]:
    """(protocol, path without trailing slashes) of a URL with a `scheme://`."""
    protocol, _, rest = url.partition("://")
    return protocol.lower(), rest.rstrip("/")


def check_s3_root(root: str, path: str) -> list[ConfigProblem]:
    """Problems with an s3:// root ("bucket/prefix") at JSON path `path`."""
    bucket = root.split("/", 1)[0]
    if not bucket:
        return [ConfigProblem(path, "s3 tier: the URL names no bucket; write s3://BUCKET/PREFIX")]
    if not _BUCKET.match(bucket) or ".." in bucket:
        return [ConfigProblem(path, (
            f"s3 tier: {bucket!r} is not a valid bucket name (3-63 characters: lowercase "
            "letters, digits, dots and hyphens, starting and ending with a letter or digit)"))]
    if "//" in root:
        return [ConfigProblem(path, "s3 tier: the prefix has an empty element ('//')")]
    return []


def _common(options: Mapping[str, Any]) -> dict[str, Any]:
    layout = options.get("layout") or {}
    defaults = S3_SCHEMA["properties"]["layout"]["properties"]
    return {
        "capacity_bytes": int(options["capacity_bytes"]),
        "eviction_policy": str(options.get("eviction_policy", "lru")),
        "concurrency": int(options.get("concurrency",
                                       S3_SCHEMA["properties"]["concurrency"]["default"])),
        "layout": LayoutSettings(
            packing=str(layout.get("packing", defaults["packing"]["default"])),
            segment_bytes=int(layout.get("segment_bytes", defaults["segment_bytes"]["default"])),
            pack_below_bytes=int(layout.get("pack_below_bytes",
                                            defaults["pack_below_bytes"]["default"])),
        ),
        "ttl_s": None if options.get("ttl_s") is None else int(options["ttl_s"]),
        "create_bucket": bool(options.get("create_bucket", False)),
        "shared": bool(options.get("shared", True)),
        "timeout_s": float(options.get("timeout_s",
                                       S3_SCHEMA["properties"]["timeout_s"]["default"])),
        "rescan_s": float(options.get("rescan_s",
                                      S3_SCHEMA["properties"]["rescan_s"]["default"])),
        "client": str(options.get("client", "auto")),
    }


def _plain(value: Any) -> Any:
    """Plain dicts and lists from a loaded (frozen) section."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def settings_from_s3(options: Mapping[str, Any]) -> S3Settings:
    """Settings from kvtiers' form (the `s3` tier's section)."""
    protocol, root = split_url(str(options["url"]))
    storage = _plain(options.get("storage_options") or {})
    if protocol in S3_PROTOCOLS:
        problems = check_s3_root(root, "$.url")
        if problems:
            raise ConfigError(problems)
    elif not root and protocol != "memory":
        raise ConfigError(ConfigProblem("$.url", f"s3 tier: {options['url']!r} names no path"))
    return S3Settings(protocol=protocol, root=root, storage_options=storage,
                      secrets=tuple(credential_values(storage)), **_common(options))


def settings_from_obj(options: Mapping[str, Any]) -> S3Settings:
    """Settings from vLLM's obj form (the `obj` tier's section): store_config's
    connection parameters become s3fs storage options; empty credentials mean the
    default credential chain, as in vLLM."""
    store = _plain(options.get("store_config") or {})
    problems: list[ConfigProblem] = []
    for name in ("bucket", "endpoint_override"):
        top, inner = options.get(name), store.get(name)
        if top is not None and inner is not None and top != inner:
            problems.append(ConfigProblem(f"$.{name}", (
                f"obj tier: {name} is set both here and in store_config, to different "
                "values; keep one")))
    bucket = str(options.get("bucket") or store.get("bucket") or "")
    prefix = str(options.get("prefix") or "").strip("/")
    root = f"{bucket}/{prefix}" if prefix else bucket
    where = "$.bucket" if options.get("bucket") else "$.store_config.bucket"
    problems += [ConfigProblem(where, p.message.replace("s3 tier", "obj tier"))
                 for p in check_s3_root(bucket, where)]
    if prefix and "//" in prefix:
        problems.append(ConfigProblem("$.prefix", "obj tier: the prefix has an empty element"))
    if problems:
        raise ConfigError(problems)

    storage: dict[str, Any] = {}
    endpoint = str(options.get("endpoint_override") or store.get("endpoint_override") or "")
    if endpoint:
        scheme = str(store.get("scheme") or OBJ_SCHEMA["properties"]["store_config"]
                     ["properties"]["scheme"]["default"])
        storage["endpoint_url"] = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
    for ours, theirs in (("key", "access_key"), ("secret", "secret_key"),
                         ("token", "session_token")):
        if store.get(theirs):
            storage[ours] = store[theirs]
    client: dict[str, Any] = {}
    if store.get("region"):
        client["region_name"] = store["region"]
    if store.get("ca_bundle"):
        client["verify"] = store["ca_bundle"]
    if client:
        storage["client_kwargs"] = client
    return S3Settings(protocol="s3", root=root, storage_options=storage,
                      secrets=tuple(credential_values(storage)), **_common(options))
