"""The `p2p` tier is found through its entry point, and its config accepts vLLM's
p2p keys verbatim plus ours, naming unknown keys."""

from __future__ import annotations

import importlib.metadata as md
from typing import Any

import pytest
from kvtiers.config.loader import load_config
from kvtiers.config.options import resolve_options
from kvtiers.errors import ConfigError
from kvtiers.plugins.registry import Registry, load_registry
from kvtiers_p2p.schema import P2P_SCHEMA
from kvtiers_p2p.tier import P2PTier

from tests.p2p.conftest import MakeEngine

GiB = 1 << 30


@pytest.fixture
def registry() -> Registry:
    ep = md.EntryPoint(name="p2p", value="kvtiers_p2p.plugin", group="kvtiers")
    return load_registry(entry_points=[ep], environ={})


def config(**tier: Any) -> dict[str, Any]:
    return {"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "p2p", **tier}]}


def test_the_entry_point_registers_the_tier(registry: Registry) -> None:
    record = registry.get_tier("p2p").record
    assert record.load() is P2PTier
    assert P2PTier.serves_peers and P2PTier.verifies


def test_vllm_keys_are_accepted_verbatim(registry: Registry) -> None:
    tier = {"type": "p2p", "host": "0.0.0.0", "port": 5710, "backends": ["UCX"],
            "num_threads": 8, "unbound_store_timeout_s": 60}
    doc = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
                                         "cpu_bytes_to_use": GiB, "secondary_tiers": [tier]}}
    loaded = load_config(doc, registry)
    [section] = loaded.secondary_tiers
    assert section.options["port"] == 5710 and section.options["num_threads"] == 8
    assert list(section.options["peers"]) == [] and section.options["data_plane"] == "auto"


def test_our_keys_are_accepted(registry: Registry, tmp_path: Any) -> None:
    load_config(config(peers=["tcp://10.0.0.7:5710"], role="remote_kv_source",
                       hash_seed="42", keepalive={"interval_s": 2},
                       limits={"max_pinned_share": 0.5}), registry)


@pytest.mark.parametrize("tier, words", [
    ({"bogus": 1}, ["bogus"]),
    ({"peers": ["10.0.0.7:5710"]}, ["peers"]),
    ({"port": 70000}, ["port"]),
    ({"role": "remote_prefill"}, ["role"]),
    ({"limits": {"max_pinned_share": 2}}, ["max_pinned_share"]),
])
def test_bad_keys_are_named(registry: Registry, tier: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config(**tier), registry)
    for word in words:
        assert word in str(info.value)


def test_defaults_fill_a_hand_written_section() -> None:
    options = resolve_options(P2P_SCHEMA, {"port": 0}, "p2p")
    assert options["keepalive"] == {"interval_s": 1.0, "timeout_s": 5.0}
    assert options["limits"]["max_pinned_share"] == 0.25


def test_the_port_is_offset_by_the_data_parallel_rank(engines: MakeEngine) -> None:
    import socket

    with socket.socket() as s:  # a free port, and the next one, on loopback
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    engine = engines({"port": base, "data_parallel_rank": 1})
    assert engine.endpoint == f"tcp://127.0.0.1:{base + 1}"
