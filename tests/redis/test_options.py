"""Options: resolved through the core's `resolve_options` (defaults, checks), every
bad one a `ConfigError` naming its field; the plugin is found through its entry
point and `kvtiers validate` checks a section against its schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvtiers.cli import main
from kvtiers.errors import ConfigError
from kvtiers.plugins import get_registry
from kvtiers_redis.settings import settings_from
from kvtiers_redis.tier import RedisTier

from tests.redis.helpers import BLOCK, context
from tests.redis.server import RedisServer


def test_defaults_are_filled_in() -> None:
    s = settings_from({"capacity_bytes": 1 << 20})
    assert (s.address, s.prefix, s.eviction_policy, s.ttl_s, s.timeout_s, s.concurrency) == (
        "redis://127.0.0.1:6379/0", "kvtiers", "lru", 0.0, 5.0, 8)
    assert settings_from({"capacity_bytes": 1, "url": "unix:///run/r.sock?db=3"}).address == (
        "unix:///run/r.sock?db=3")
    assert settings_from({"capacity_bytes": 1, "url": "rediss://h.example:7000/2"}).address == (
        "rediss://h.example:7000/2")


@pytest.mark.parametrize(("options", "field", "says"), [
    ({}, "$.capacity_bytes", "'capacity_bytes' is a required property"),
    ({"capacity_bytes": "1 MiB"}, "$.capacity_bytes", "is not of type 'integer'"),
    ({"capacity_bytes": 1, "ttl_s": -1}, "$.ttl_s", "less than the minimum"),
    ({"capacity_bytes": 1, "timeout_s": 0}, "$.timeout_s", "less than or equal"),
    ({"capacity_bytes": 1, "concurrency": 1}, "$.concurrency", "less than the minimum"),
    ({"capacity_bytes": 1, "prefix": "has space"}, "$.prefix", "does not match"),
    ({"capacity_bytes": 1, "bogus": 1}, "$", "'bogus' was unexpected"),
    ({"capacity_bytes": 1, "url": "http://h:1/0"}, "$.url", "scheme 'http' is not one of"),
    ({"capacity_bytes": 1, "url": "redis://h:99999/0"}, "$.url", "valid port"),
    ({"capacity_bytes": 1, "url": "redis://h:1/x"}, "$.url", "the database is a number"),
    ({"capacity_bytes": 1, "url": "redis:///0"}, "$.url", "no host"),
    ({"capacity_bytes": 1, "url": "unix://"}, "$.url", "socket's path"),
])
def test_bad_options_are_config_errors_naming_the_field(options: dict[str, Any], field: str,
                                                        says: str) -> None:
    with pytest.raises(ConfigError) as err:
        RedisTier(context(), options)
    text = str(err.value)
    assert field in text and says in text and "redis tier" in text, text


def test_an_unknown_policy_names_the_installed_ones(shared_server: RedisServer) -> None:
    with pytest.raises(ConfigError) as err:
        RedisTier(context(), {"capacity_bytes": BLOCK, "url": shared_server.url,
                              "eviction_policy": "no-such-policy"})
    assert "$.eviction_policy" in str(err.value) and "lru" in str(err.value)


def test_the_plugin_is_found_through_its_entry_point() -> None:
    found = get_registry().get_tier("redis")
    assert found.distribution == "kvtiers-redis" and found.plugin == "redis"
    assert found.record.load() is RedisTier


def test_kvtiers_validate_checks_the_schema(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def validate(section: dict[str, Any]) -> tuple[int, str]:
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 26,
                                    "secondary_tiers": [{"type": "redis", **section}]}))
        code = main(["validate", str(path)])
        out = capsys.readouterr()
        return code, out.out + out.err

    code, text = validate({"capacity_bytes": 1 << 20, "ttl_s": 60})
    assert code == 0 and "kvtiers-redis" in text, text
    code, text = validate({"capacity_bytes": "big"})
    assert code != 0 and "secondary_tiers[0].capacity_bytes" in text, text
