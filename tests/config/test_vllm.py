"""vLLM's kv_transfer_config loads as-is: renamed keys mapped, unused keys warned
about by name, paths in messages pointing into the document as written."""

from __future__ import annotations

from kvtiers.config import load_config
from kvtiers.config.vllm import NATIVE, VLLM_EXTRA, VLLM_TRANSFER, detect

from .conftest import REPO, GiB

EXTRA = {
    "spec_name": "TieringOffloadingSpec",
    "cpu_bytes_to_use": GiB,
    "block_size": 64,
    "eviction_policy": "lru",
    "secondary_tiers": [
        {
            "type": "disk",
            "root_dir": "/mnt/nvme",
            "n_read_threads": 8,
            "n_write_threads": 3,
            "enable_kv_events": True,
        },
    ],
}
TRANSFER = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "engine_id": "e0",
    "kv_connector_extra_config": EXTRA,
}


def test_detection() -> None:
    assert detect(TRANSFER) == VLLM_TRANSFER
    assert detect({"kv_connector_extra_config": {}}) == VLLM_TRANSFER
    assert detect(EXTRA) == VLLM_EXTRA
    assert detect({"cpu_bytes_to_use": 1}) == NATIVE


def test_whole_kv_transfer_config(load) -> None:
    cfg = load(TRANSFER)
    assert cfg.source_format == VLLM_TRANSFER
    [tier] = cfg.secondary_tiers
    assert tier.path == "$.kv_connector_extra_config.secondary_tiers[0]"
    assert dict(tier.options["threads"]) == {"load": 8, "store": 3}
    assert "n_read_threads" not in tier.options
    assert cfg.warnings == (
        '$.kv_connector_extra_config.secondary_tiers[0].type: vLLM has no "disk" tier (its '
        'own: example, fs, kvcr, obj, p2p): under "TieringOffloadingSpec" vLLM refuses this '
        'entry ("Unknown secondary tier type"); write it as {"type": "kvtiers", "tier": '
        '{"type": "disk", ...}}',
        "$.kv_connector_extra_config.block_size: ignored, kvtiers has no use for it",
        "$.kv_connector_extra_config.secondary_tiers[0].enable_kv_events: ignored, kvtiers has "
        "no use for it",
    )


def test_extra_config_alone(load) -> None:
    cfg = load(EXTRA)
    assert cfg.source_format == VLLM_EXTRA
    assert cfg.secondary_tiers[0].path == "$.secondary_tiers[0]"
    assert cfg.warnings[1] == "$.block_size: ignored, kvtiers has no use for it"
    assert cfg.to_dict() == load(TRANSFER).to_dict()


def test_errors_point_at_the_vllm_names(problems) -> None:
    doc = {
        **TRANSFER,
        "kv_connector_extra_config": {
            **EXTRA,
            "cpu_bytes_to_use": "1GB",
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "n_read_threads": 0}],
        },
    }
    assert problems(doc) == [
        '$.kv_connector_extra_config.cpu_bytes_to_use: expected an integer >= 1, found "1GB" '
        "(string)",
        "$.kv_connector_extra_config.secondary_tiers[0].n_read_threads: expected an integer "
        ">= 1, found 0 (integer)",
    ]


def test_both_names_for_one_option_is_an_error(problems) -> None:
    doc = {
        **EXTRA,
        "secondary_tiers": [
            {"type": "disk", "root_dir": "/kv", "n_read_threads": 2, "threads": {"load": 3}}
        ],
    }
    assert problems(doc) == [
        '$.secondary_tiers[0].n_read_threads: both "n_read_threads" (vLLM\'s name) and '
        '"threads.load" are set; keep one'
    ]


def test_typos_in_a_vllm_config_are_warnings_with_did_you_mean(load) -> None:
    cfg = load(
        {
            **EXTRA,
            "evicton_policy": "lru",
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "capacity_byte": 5}],
        }
    )
    assert (
        '$.evicton_policy: ignored, kvtiers has no use for it (did you mean "eviction_policy"?)'
        in cfg.warnings
    )
    assert (
        "$.secondary_tiers[0].capacity_byte: ignored, kvtiers has no use for it "
        '(did you mean "capacity_bytes"?)'
    ) in cfg.warnings


def test_configs_vllm_would_not_route_to_kvtiers_are_errors(problems, load) -> None:
    extra = {k: v for k, v in EXTRA.items() if k != "spec_name"}
    got = problems(
        {
            "kv_connector": "LMCacheConnectorV1",
            "kv_role": "kv_both",
            "kv_port": 1,
            "kv_connector_extra_config": extra,
            "kv_colour": "blue",
        }
    )
    assert got == [
        '$.kv_connector: is "LMCacheConnectorV1"; vLLM hands kv_connector_extra_config to '
        "that connector, and kvtiers reads it only as the options of vLLM's "
        'OffloadingConnector: set "kv_connector": "OffloadingConnector"',
        "$.kv_connector_extra_config.spec_name: missing; vLLM then builds CPUOffloadingSpec, "
        "which has no secondary tiers and never reads these options as kvtiers does: set "
        '"spec_name": "TieringOffloadingSpec" or "KvtiersOffloadingSpec"',
    ]
    # Another spec, or the tiering spec imported from someone else's module.
    assert problems({**EXTRA, "spec_name": "CPUOffloadingSpec"}) == [
        '$.spec_name: is "CPUOffloadingSpec": vLLM builds that spec, which does not read '
        'these options as kvtiers does: set "spec_name": "TieringOffloadingSpec" or '
        '"KvtiersOffloadingSpec"'
    ]
    assert problems({**EXTRA, "spec_module_path": "my_plugins.spec"}) == [
        '$.spec_module_path: is "my_plugins.spec": vLLM would import TieringOffloadingSpec '
        "from that module, a class kvtiers knows nothing of; remove spec_module_path (vLLM "
        "finds TieringOffloadingSpec by name), or name a module of vllm"
    ]
    [line] = problems({**TRANSFER, "kv_connector_module_path": "lmcache.connector"})
    assert line.startswith('$.kv_connector_module_path: is "lmcache.connector": vLLM would ')
    [line] = problems({k: v for k, v in TRANSFER.items() if k != "kv_role"})
    assert line.startswith("$.kv_role: missing; vLLM refuses a kv_connector without a role")
    [line] = problems({k: v for k, v in TRANSFER.items() if k != "kv_connector"})
    assert line.startswith("$.kv_connector: missing; without a connector vLLM offloads nothing")
    # What vLLM does route to these options loads, kvtiers-vllm's spec too.
    for ok in (
        {**EXTRA, "spec_module_path": "vllm.v1.kv_offload.tiering.spec"},
        {**EXTRA, "spec_name": "KvtiersOffloadingSpec"},
        {**EXTRA, "spec_name": "KvtiersOffloadingSpec", "spec_module_path": "kvtiers_vllm.spec"},
        {**TRANSFER, "kv_connector_module_path": None},
    ):
        assert load(ok).cpu_bytes_to_use == GiB
    # A typo in a vLLM field name stays a warning: vLLM ignores it too.
    cfg = load({**TRANSFER, "kv_colour": "blue"})
    assert cfg.warnings[0] == (
        "$.kv_colour: ignored, not a field of vLLM's kv_transfer_config (did you mean "
        '"kv_connector"?)'
    )


def test_vllm_fields_are_type_checked(problems) -> None:
    got = problems(
        {
            **TRANSFER,
            "kv_role": 7,
            "kv_port": "14579",
            "kv_rank": 1.5,
            "engine_id": ["e"],
            "enable_permute_local_kv": "yes",
            "kv_load_failure_policy": "retry",
        }
    )
    assert got == [
        '$.enable_permute_local_kv: expected true or false, found "yes" (string)',
        '$.engine_id: expected a string or null, found ["e"] (array)',
        '$.kv_load_failure_policy: expected one of "recompute", "fail", found "retry" '
        "(string)",
        '$.kv_port: expected an integer >= 0 and <= 65535, found "14579" (string)',
        "$.kv_rank: expected an integer or null, found 1.5 (number)",
        '$.kv_role: expected one of "kv_producer", "kv_consumer", "kv_both", null, found 7 '
        "(integer)",
    ]
    # Unhashable values where vLLM expects a name are type errors, not crashes.
    for bad in ([1], {"a": 1}):
        assert problems({**TRANSFER, "kv_connector": bad})[0].startswith(
            "$.kv_connector: expected a string or null, found "
        )
        [line] = problems({**EXTRA, "spec_name": bad})
        assert line.startswith("$.spec_name: expected a spec name (a string), found ")
        [line] = problems({**EXTRA, "spec_module_path": bad})
        assert line.startswith("$.spec_module_path: expected a module path (a string), found ")


def test_extra_config_must_be_an_object(problems) -> None:
    doc = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    assert problems({**doc, "kv_connector_extra_config": []}) == [
        "$.kv_connector_extra_config: expected an object (the connector's options), "
        "found [] (array)"
    ]
    assert problems(
        {**doc, "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec"}}
    ) == [
        "$.kv_connector_extra_config.cpu_bytes_to_use: missing; expected an integer >= 1 (Size "
        "of the CPU pool in bytes: the shared-memory gateway between the GPU and the secondary "
        "tiers)"
    ]


def test_vllm_names_in_a_kvtiers_config_get_a_hint(problems) -> None:
    [line] = problems(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "n_read_threads": 2}],
        }
    )
    assert line == (
        '$.secondary_tiers[0].n_read_threads: unknown key: "n_read_threads" is vLLM\'s name for '
        '"threads.load"; write "threads.load" here (vLLM names are mapped only in a vLLM '
        "kv_transfer_config)"
    )


def test_the_vllm_example_loads_with_named_warnings() -> None:
    cfg = load_config(REPO / "examples" / "vllm_kv_transfer_config.json")
    assert cfg.cpu_bytes_to_use == 2 * GiB
    assert [w.split(":")[0] for w in cfg.warnings] == [
        "$.kv_connector_extra_config.block_size",
        "$.kv_connector_extra_config.secondary_tiers[0].tier.n_read_threads",
        "$.kv_connector_extra_config.secondary_tiers[0].tier.n_write_threads",
    ]
