"""The s3 and obj tiers' config: kvtiers' form, vLLM's obj tier verbatim, and what
each resolves to (`S3Settings`)."""

from __future__ import annotations

from typing import Any

import pytest
from kvtiers.config import KvtiersConfig, load_config
from kvtiers.errors import ConfigError
from kvtiers.plugins import Registry
from kvtiers_s3.settings import S3Settings, settings_from_obj, settings_from_s3

MiB = 1 << 20


def _native(tier: dict[str, Any], registry: Registry) -> KvtiersConfig:
    return load_config({"cpu_bytes_to_use": 64 * MiB, "secondary_tiers": [tier]}, registry,
                       check_machine=False)


def _vllm(tier: dict[str, Any], registry: Registry) -> KvtiersConfig:
    doc = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 64 * MiB,
            "secondary_tiers": [tier],
        },
    }
    return load_config(doc, registry, check_machine=False)


def _problems(exc: pytest.ExceptionInfo[ConfigError]) -> dict[str, str]:
    return {p.path: p.message for p in exc.value.problems}


def test_the_kvtiers_form_loads_with_every_default(s3_registry: Registry) -> None:
    config = _native({"type": "s3", "url": "s3://kv-cache/prod/", "capacity_bytes": 10**12},
                     s3_registry)
    s = settings_from_s3(config.secondary_tiers[0].options)
    assert (s.protocol, s.root, s.bucket, s.prefix, s.url) == (
        "s3", "kv-cache/prod", "kv-cache", "prod", "s3://kv-cache/prod")
    assert (s.capacity_bytes, s.eviction_policy, s.concurrency, s.shared) == (10**12, "lru", 32,
                                                                              True)
    assert (s.ttl_s, s.create_bucket, s.storage_options, s.secrets) == (None, False, {}, ())
    assert s.layout.packing == "auto" and s.layout.segment_bytes == 16 * MiB


def test_vllms_obj_tier_loads_verbatim_and_maps_onto_the_same_settings(
        s3_registry: Registry) -> None:
    """vLLM's ObjStoreConfig fields and the tier's own keys, exactly as vLLM takes
    them; the keys kvtiers has no use for are warned about, each by name."""
    tier = {
        "type": "obj",
        "store_config": {
            "bucket": "kv-cache", "endpoint_override": "minio.local:9000",
            "access_key": "AKIAEXAMPLEKEY00001", "secret_key": "s3cr3t-value-000001",
            "session_token": "token-value-000001", "region": "eu-west-1", "scheme": "https",
            "ca_bundle": "/etc/ssl/ca.pem",
        },
        "prefix": "prod/",
        "io_threads": 12,
        "enable_kv_events": True,
        "locality": "REMOTE",
        "capacity_bytes": 10**12,
    }
    config = _vllm(tier, s3_registry)
    warned = "\n".join(config.warnings)
    for key in ("enable_kv_events", "locality"):
        assert f"secondary_tiers[0].{key}: ignored" in warned
    assert "io_threads" not in warned
    s = settings_from_obj(config.secondary_tiers[0].options)
    assert (s.protocol, s.root, s.concurrency) == ("s3", "kv-cache/prod", 12)
    assert s.storage_options == {
        "endpoint_url": "https://minio.local:9000",
        "key": "AKIAEXAMPLEKEY00001", "secret": "s3cr3t-value-000001",
        "token": "token-value-000001",
        "client_kwargs": {"region_name": "eu-west-1", "verify": "/etc/ssl/ca.pem"},
    }
    assert set(s.secrets) == {"AKIAEXAMPLEKEY00001", "s3cr3t-value-000001", "token-value-000001"}
    assert "s3cr3t" not in repr(s) and "AKIA" not in repr(s)


@pytest.mark.parametrize("endpoint, expected", [
    ("127.0.0.1:8333", "http://127.0.0.1:8333"),
    ("https://s3.example.com", "https://s3.example.com"),
])
def test_the_top_level_form_of_vllms_blog_works_too(
        s3_registry: Registry, endpoint: str, expected: str) -> None:
    config = _vllm({"type": "obj", "bucket": "kv-cache", "endpoint_override": endpoint,
                    "capacity_bytes": 5 * 10**9}, s3_registry)
    s = settings_from_obj(config.secondary_tiers[0].options)
    assert (s.root, s.endpoint_url) == ("kv-cache", expected)
    assert s.secrets == () and "key" not in s.storage_options  # the default chain


def test_without_capacity_bytes_the_obj_tier_says_what_to_add(s3_registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _vllm({"type": "obj", "store_config": {"bucket": "kv-cache", "endpoint_override": "h:1"}},
              s3_registry)
    problems = _problems(info)
    path = "$.kv_connector_extra_config.secondary_tiers[0].capacity_bytes"
    assert path in problems, problems
    assert 'add "capacity_bytes" to this section' in problems[path]
    assert "no such bound" in problems[path]


def test_without_capacity_bytes_the_s3_tier_refuses_too(s3_registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _native({"type": "s3", "url": "s3://kv-cache"}, s3_registry)
    message = _problems(info)["$.secondary_tiers[0].capacity_bytes"]
    assert "no free space to derive a bound" in message


def test_an_obj_tier_without_a_bucket_is_refused_at_store_config(s3_registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _vllm({"type": "obj", "capacity_bytes": 1}, s3_registry)
    problems = _problems(info)
    path = "$.kv_connector_extra_config.secondary_tiers[0].store_config"
    assert path in problems and "top level" in problems[path]


def test_a_bucket_given_twice_differently_is_refused(s3_registry: Registry) -> None:
    config = _native({"type": "obj", "bucket": "one-bucket", "capacity_bytes": 1,
                      "store_config": {"bucket": "other-bucket"}}, s3_registry)
    with pytest.raises(ConfigError) as info:
        settings_from_obj(config.secondary_tiers[0].options)
    assert "$.bucket" in _problems(info)


@pytest.mark.parametrize("url", ["s3://", "s3://Bad_Bucket/x", "s3://ab", "s3://b..ad/x",
                                 "s3://bucket//x"])
def test_bad_s3_urls_are_refused_with_the_path(s3_registry: Registry, url: str) -> None:
    config = _native({"type": "s3", "url": url, "capacity_bytes": 1}, s3_registry)
    with pytest.raises(ConfigError) as info:
        settings_from_s3(config.secondary_tiers[0].options)
    assert list(_problems(info)) == ["$.url"]


def test_a_url_without_a_scheme_is_refused_by_the_schema(s3_registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _native({"type": "s3", "url": "/tmp/kv", "capacity_bytes": 1}, s3_registry)
    assert "$.secondary_tiers[0].url" in _problems(info)


def test_a_mistyped_credential_is_not_repeated_in_the_error(s3_registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _native({"type": "s3", "url": "s3://kv-cache", "capacity_bytes": 1,
                 "storage_options": {"secret": 918273645546372819}}, s3_registry)
    assert "918273645546372819" not in str(info.value)
    assert "$.secondary_tiers[0].storage_options.secret" in _problems(info)


def test_vllms_names_in_a_kvtiers_config_get_a_hint(s3_registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _native({"type": "s3", "url": "s3://kv-cache", "capacity_bytes": 1, "io_threads": 4},
                s3_registry)
    assert '"concurrency"' in _problems(info)["$.secondary_tiers[0].io_threads"]


@pytest.mark.parametrize("url, protocol, root", [
    ("memory://kv/prefix", "memory", "kv/prefix"),
    ("file:///var/tmp/kv/", "file", "/var/tmp/kv"),
    ("gs://bucket/p", "gs", "bucket/p"),
])
def test_any_fsspec_url_resolves(s3_registry: Registry, url: str, protocol: str,
                                 root: str) -> None:
    config = _native({"type": "s3", "url": url, "capacity_bytes": 1}, s3_registry)
    s = settings_from_s3(config.secondary_tiers[0].options)
    assert (s.protocol, s.root, s.is_s3) == (protocol, root, False)


def test_the_layout_packs_blocks_below_4_mib_by_default(s3_registry: Registry) -> None:
    def layout(**kw: Any) -> S3Settings:
        tier = {"type": "s3", "url": "s3://kv-cache", "capacity_bytes": 1, "layout": kw}
        return settings_from_s3(_native(tier, s3_registry).secondary_tiers[0].options)

    auto = layout()
    assert auto.layout.packs(64 * 1024) and auto.layout.packs(2 * MiB)
    assert not auto.layout.packs(4 * MiB)
    assert not layout(packing="per_block").layout.packs(1)
    assert layout(packing="segments").layout.packs(1 << 30)
    assert not layout(pack_below_bytes=1 * MiB).layout.packs(2 * MiB)
