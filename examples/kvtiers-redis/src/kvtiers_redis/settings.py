"""`RedisSettings`: the `redis` tier's options, resolved and checked once.

`settings_from(config)` validates a section against `schema.SCHEMA`
(`kvtiers.config.options.resolve_options`: a hand-written dict gets the checks and defaults
a config document gets), then checks what a schema cannot: the URL's form, its
port and database number. Every problem is a `ConfigError` naming the field - and
never repeating a credential: the URL is reported by its parts, the password not
at all.

Credentials (`password`, the URL's password, the URL itself) live only in the
fields marked `repr=False`; `address` names the server without them, for logs and
errors, and `scrub(text)` takes them out of any text (an exception's message)
before it is logged or counted. Pure; any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kvtiers.errors import ConfigError, ConfigProblem
from kvtiers.sdk import resolve_options

from kvtiers_redis.schema import SCHEMA

__all__ = ["REDACTED", "RedisSettings", "settings_from"]

REDACTED = "***"
SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class RedisSettings:
    address: str  # the server without credentials: "redis://127.0.0.1:6379/0"
    capacity_bytes: int
    prefix: str
    eviction_policy: str
    ttl_s: float
    timeout_s: float
    concurrency: int
    username: str | None
    url: str = field(repr=False)
    password: str | None = field(repr=False)
    secrets: tuple[str, ...] = field(repr=False, default=())

    def scrub(self, text: str) -> str:
        """`text` with every credential replaced by `***` (longest first, so a
        password inside the URL goes with the URL)."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for `redis.asyncio.Redis.from_url(self.url, ...)`
        besides the timeouts and retries the tier sets."""
        options: dict[str, Any] = {}
        if self.username is not None:
            options["username"] = self.username
        if self.password is not None:
            options["password"] = self.password
        return options


def settings_from(config: Mapping[str, Any]) -> RedisSettings:
    options = resolve_options(SCHEMA, config, "redis")
    url = str(options["url"])
    address, url_password = _parse_url(url)
    password = options.get("password")
    # The URL is a secret only when it carries one (else it is the address itself).
    secrets = {s for s in (url if url_password else None, url_password, password) if s}
    secrets |= {unquote(s) for s in secrets}
    return RedisSettings(
        address=address,
        capacity_bytes=int(options["capacity_bytes"]),
        prefix=str(options["prefix"]),
        eviction_policy=str(options["eviction_policy"]),
        ttl_s=float(options["ttl_s"]),
        timeout_s=float(options["timeout_s"]),
        concurrency=int(options["concurrency"]),
        username=options.get("username"),
        url=url,
        password=password,
        secrets=tuple(sorted(secrets, key=len, reverse=True)),
    )


def _problem(why: str) -> ConfigError:
    # The URL may hold a password: say what is wrong with it, never what it is.
    return ConfigError(ConfigProblem("$.url", f"redis tier: url: {why}"))


def _parse_url(url: str) -> tuple[str, str | None]:
    """The server's address without credentials, and the URL's password."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _problem("not a URL with a valid port (redis://host:port/db)") from None
    if parts.scheme not in SCHEMES:
        shown = parts.scheme if parts.scheme.isalnum() else "?"
        raise _problem(f"scheme {shown!r} is not one of {', '.join(SCHEMES)} "
                       "(redis://host:port/db, rediss://..., unix:///path)")
    query = parse_qs(parts.query)
    if parts.scheme == "unix":
        if not parts.path:
            raise _problem("a unix:// URL needs the socket's path (unix:///run/redis.sock)")
        db = _db(query.get("db", ["0"])[0])
        return f"unix://{parts.path}?db={db}", parts.password
    if not parts.hostname:
        raise _problem("no host (redis://host:port/db)")
    path = parts.path.strip("/")
    db = _db(query["db"][0] if "db" in query else (path or "0"))
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port or 6379}/{db}", parts.password


def _db(text: str) -> int:
    if not text.isdigit() or int(text) > 1 << 16:
        raise _problem("the database is a number (redis://host:port/0)")
    return int(text)
