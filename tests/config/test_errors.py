"""Bad configs: one `ConfigError` with every problem, each naming its JSON path, what
was found and what is allowed; never a traceback, whatever the input."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvtiers.config import load_config
from kvtiers.config.machine import check_pool, physical_memory_bytes
from kvtiers.config.sections import MAX_TIER_DEPTH
from kvtiers.contract import CONTRACT_VERSION
from kvtiers.errors import ConfigError, ConfigProblem
from kvtiers.plugins import Registered, Registry, TierRecord, load_registry

from .conftest import GiB, PlainTier

# The tiers of the test registry: the core's built-ins plus conftest's fakes.
INSTALLED = ", ".join(
    sorted(
        load_registry(entry_points=[], environ={}).tiers.keys()
        | {"badschema", "checked", "disk", "ghost", "wrap"}
    )
)


def test_wrong_type_says_path_found_and_allowed(problems) -> None:
    assert problems(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "capacity_bytes": "10G"}],
        }
    ) == ['$.secondary_tiers[0].capacity_bytes: expected an integer >= 1, found "10G" (string)']
    assert problems({"cpu_bytes_to_use": True}) == [
        "$.cpu_bytes_to_use: expected an integer >= 1, found true (boolean)"
    ]
    assert problems({"cpu_bytes_to_use": GiB, "job_timeout_s": 0, "model": 7}) == [
        "$.job_timeout_s: expected a number > 0, found 0 (integer)",
        "$.model: expected a non-empty string or null, found 7 (integer)",
    ]


def test_enum_says_the_choices_and_the_closest(problems) -> None:
    assert problems({"cpu_bytes_to_use": GiB, "write_policy": "writeback"}) == [
        '$.write_policy: expected one of "write_through", "write_back", found "writeback" '
        '(string) (did you mean "write_back"?)'
    ]
    assert problems({"cpu_bytes_to_use": GiB, "write_policy": "WRITE_BACK"}) == [
        '$.write_policy: expected one of "write_through", "write_back", found "WRITE_BACK" '
        '(string) (did you mean "write_back"?)'
    ]


def test_unknown_keys_get_did_you_mean(problems) -> None:
    got = problems(
        {
            "cpu_bytes_to_use": GiB,
            "evicton_policy": "lru",
            "breaker": {"failure": 3},
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "capasity_bytes": 1}],
        }
    )
    assert got[0].startswith(
        '$.breaker.failure: unknown key (did you mean "failures"?); allowed keys: '
    )
    assert got[1].startswith('$.evicton_policy: unknown key (did you mean "eviction_policy"?); ')
    assert got[2].startswith(
        '$.secondary_tiers[0].capasity_bytes: unknown key for tier "disk" '
        '(did you mean "capacity_bytes"?); allowed keys: capacity_bytes, eviction_policy, '
        "root_dir, threads"
    )
    assert len(got) == 3


def test_missing_required_keys_say_what_belongs_there(problems) -> None:
    assert problems({"secondary_tiers": [{"type": "disk"}]}) == [
        "$.cpu_bytes_to_use: missing; expected an integer >= 1 (Size of the CPU pool in bytes: "
        "the shared-memory gateway between the GPU and the secondary tiers)",
        "$.secondary_tiers[0].root_dir: missing; expected a non-empty string (where blocks go)",
    ]


def test_unknown_tier_lists_the_installed_ones(problems, registry: Registry) -> None:
    [line] = problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "fss"}]})
    assert line.startswith("$.secondary_tiers[0].type: unknown tier 'fss'; installed tiers: ")
    for name in registry.tiers:
        assert name in line
    [hint] = problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "fs"}]})
    assert hint.endswith(
        "; install kvtiers-fs to use type 'fs' (not published yet: `pip install ./kvtiers-fs` "
        "in a checkout of the kvtiers repository, after kvtiers-core)"
    )
    [close] = problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "memroy"}]})
    assert "(did you mean 'memory'?)" in close


def test_tier_section_shape_errors(problems) -> None:
    assert problems(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": ["fs", {}, {"type": None}, {"type": ["memory"]}],
        }
    ) == [
        '$.secondary_tiers[0]: expected a tier section (an object with "type" and that '
        'tier\'s options), found "fs" (string)',
        f"$.secondary_tiers[1].type: missing; expected a tier name; installed tiers: {INSTALLED}",
        "$.secondary_tiers[2].type: expected a tier name (a string), found null",
        '$.secondary_tiers[3].type: expected a tier name (a string), found ["memory"] (array)',
    ]
    assert problems({"cpu_bytes_to_use": GiB, "secondary_tiers": {"type": "memory"}}) == [
        '$.secondary_tiers: expected an array of tier sections, found {"type": "memory"} (object)'
    ]


def test_unknown_policy_uses_the_registry_message(problems, registry: Registry) -> None:
    assert problems({"cpu_bytes_to_use": GiB, "eviction_policy": "lur"}) == [
        "$.eviction_policy: unknown policy 'lur' (did you mean 'lru'?); installed policies: "
        + ", ".join(sorted(registry.policies))
    ]
    [line] = problems(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "eviction_policy": "fifo"}],
        }
    )
    assert line.startswith("$.secondary_tiers[0].eviction_policy: unknown policy 'fifo'")


def test_errors_inside_nested_sections_carry_the_full_path(problems) -> None:
    got = problems(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [
                {"type": "checked"},
                {
                    "type": "wrap",
                    "rate": 2,
                    "inner": {
                        "type": "wrap",
                        "inner": {"type": "disk", "root_dir": "", "threads": {"load": 0}},
                    },
                    "mirrors": [{"type": "nope"}],
                },
                {"type": "faulty", "inner": {"type": "memory", "capacity_bytes": -1}},
            ],
        }
    )
    assert got == [
        '$.secondary_tiers[1].inner.inner.root_dir: expected a non-empty string, found "" (string)',
        "$.secondary_tiers[1].inner.inner.threads.load: expected an integer >= 1, "
        "found 0 (integer)",
        f"$.secondary_tiers[1].mirrors[0].type: unknown tier 'nope'; installed tiers: {INSTALLED}",
        "$.secondary_tiers[1].rate: expected a number >= 0 and <= 1, found 2 (integer)",
        "$.secondary_tiers[2].inner.capacity_bytes: expected an integer >= 1, found -1 (integer)",
    ]


def test_missing_nested_section(problems) -> None:
    [line] = problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "wrap"}]})
    assert line == (
        '$.secondary_tiers[0].inner: missing; expected a tier section (an object with "type" '
        "and that tier's options) (the wrapped tier)"
    )


def test_every_problem_is_reported_at_once(problems) -> None:
    got = problems(
        {
            "cpu_bytes_to_use": -1,
            "write_policy": 1,
            "hash_seed": -1,
            "x": 1,
            "breaker": {"cooldown_s": 0},
            "secondary_tiers": [{"type": "fss"}, {"type": "disk"}],
        }
    )
    assert len(got) == 7
    assert [line.split(":")[0] for line in got] == [
        "$.breaker.cooldown_s",
        "$.cpu_bytes_to_use",
        "$.hash_seed",
        "$.secondary_tiers[0].type",
        "$.secondary_tiers[1].root_dir",
        "$.write_policy",
        "$.x",
    ]


def test_invalid_json_says_line_and_column(problems) -> None:
    assert problems('{\n  "cpu_bytes_to_use": 1,\n  "model": "m",\n}') == [
        "$: invalid JSON in inline JSON at line 4, column 1: Expecting property name enclosed "
        "in double quotes"
    ]


def test_invalid_json_file_names_the_file(problems, tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    path.write_text('{"cpu_bytes_to_use": 1 "x": 2}')
    assert problems(path) == [
        f"$: invalid JSON in {path} at line 1, column 24: Expecting ',' delimiter"
    ]


def test_json_oddities_are_refused(problems) -> None:
    assert problems('{"cpu_bytes_to_use": 1, "cpu_bytes_to_use": 2}') == [
        '$: key "cpu_bytes_to_use" appears twice in one object of inline JSON; JSON keeps '
        "only the last value, so remove one"
    ]
    assert problems('{"cpu_bytes_to_use": 1, "job_timeout_s": Infinity}') == [
        "$: invalid JSON in inline JSON: Infinity is not a JSON value"
    ]
    assert problems("[1, 2]") == [
        "$: expected a JSON object (a kvtiers config, or vLLM's kv_transfer_config), "
        "found [1, 2] (array)"
    ]
    assert problems("[" * 100_000) == ["$: invalid JSON in inline JSON: nested too deeply"]
    # Python's own limit (4300 digits) and its interpreter hint never reach the user
    for digits in (100, 4300, 4301, 5001):
        doc = '{"cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "memory", ' \
            '"capacity_bytes": -' + "7" * digits + "}]}"
        assert problems(doc) == [
            f"$.secondary_tiers[0].capacity_bytes: an integer of {digits} digits is too "
            "large: options take integers up to 2**64 - 1 (18446744073709551615)"]


def test_missing_file_and_directory(problems, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    assert problems(missing) == [
        f"$: config file not found: {str(missing)!r} (pass the path of a JSON file, or the "
        "JSON document itself)"
    ]
    assert problems(tmp_path) == [f"$: {str(tmp_path)!r} is a directory, not a config file"]
    assert problems(b"{}") == ["$: a config is a file path, a JSON string or a mapping, not bytes"]


def test_pool_larger_than_the_machine_is_an_error_not_clamped(problems, load) -> None:
    memory = physical_memory_bytes()
    assert memory is not None
    huge = 1 << 60
    [line] = problems({"cpu_bytes_to_use": huge})
    assert line.startswith(
        f"$.cpu_bytes_to_use: 1 EiB ({huge} bytes) is more than this machine's physical memory, "
    )
    assert f"({memory} bytes); lower cpu_bytes_to_use" in line
    assert load({"cpu_bytes_to_use": huge}, check_machine=False).cpu_bytes_to_use == huge


def test_check_pool_against_given_memory_and_shm() -> None:
    problems, warnings = check_pool(16 * GiB, "$.cpu_bytes_to_use", memory=8 * GiB, shm=4 * GiB)
    assert [p.message.split(";")[0] for p in problems] == [
        "16 GiB (17179869184 bytes) is more than this machine's physical memory, "
        "8 GiB (8589934592 bytes)"
    ]
    assert warnings == []
    problems, warnings = check_pool(6 * GiB, "$.cpu_bytes_to_use", memory=8 * GiB, shm=4 * GiB)
    assert problems == []
    assert warnings[0].startswith("$.cpu_bytes_to_use: 6 GiB is more than /dev/shm (4 GiB)")


def test_require_verified_tiers_refuses_unverified_ones(problems) -> None:
    got = problems(
        {
            "cpu_bytes_to_use": GiB,
            "require_verified_tiers": True,
            "secondary_tiers": [
                {"type": "checked"},
                {"type": "wrap", "inner": {"type": "disk", "root_dir": "/kv"}},
                {"type": "ghost"},
            ],
        }
    )
    assert got[0].startswith(
        "$.secondary_tiers[1].inner.type: tier 'disk' "
        "(tests.config.conftest.PlainTier) does not verify block checksums"
    )
    assert got[1].startswith(
        "$.secondary_tiers[2].type: tier 'ghost' cannot be loaded to check "
        "that it verifies: cannot import 'kvtiers_no_such_module'"
    )
    assert len(got) == 2


def test_a_plugin_schema_that_is_not_json_schema_is_reported(problems) -> None:
    [line] = problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "badschema"}]})
    assert line.startswith(
        '$.secondary_tiers[0]: the config schema of tier "badschema" is not '
        "valid JSON Schema (a bug in its plugin): "
    )


def test_a_name_two_plugins_register_names_both(registry: Registry) -> None:
    reg = Registry(tiers=dict(registry.tiers), policies=dict(registry.policies))
    rec = TierRecord("twice", PlainTier, {"type": "object"}, "x", CONTRACT_VERSION)
    reg.conflicts[("tier", "twice")] = [
        Registered(rec, "a", "kvtiers-a", "1"),
        Registered(rec, "b", "kvtiers-b", "1"),
    ]
    with pytest.raises(ConfigError) as info:
        load_config({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "twice"}]}, reg)
    [p] = info.value.problems
    assert p.path == "$.secondary_tiers[0].type"
    assert "registered by both kvtiers-a (plugin 'a') and kvtiers-b (plugin 'b')" in p.message


def test_tier_nesting_is_bounded(problems) -> None:
    section: dict = {"type": "checked"}
    for _ in range(MAX_TIER_DEPTH + 2):
        section = {"type": "wrap", "inner": section}
    got = problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [section]})
    assert got == [
        "$.secondary_tiers[0]"
        + ".inner" * MAX_TIER_DEPTH
        + f": tier sections nest more than {MAX_TIER_DEPTH} levels deep"
    ]


def test_problems_are_config_problems(registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"cpu_bytes_to_use": "1"}, registry)
    assert info.value.problems == [
        ConfigProblem("$.cpu_bytes_to_use", 'expected an integer >= 1, found "1" (string)')
    ]


def test_inputs_that_used_to_crash_are_config_errors(problems) -> None:
    big = 10**400
    assert problems("\x00") == [
        "$: '\\x00' is not a file path (it contains a NUL character); pass the path of a JSON "
        "file, or the JSON document itself"
    ]
    assert problems("") == problems("  ") == [
        "$: the config is an empty string: pass the path of a JSON file, or the JSON document "
        "itself"
    ]
    too_large = (
        "an integer of 401 digits is too large: options take integers up to 2**64 - 1 "
        "(18446744073709551615)"
    )
    for machine in (True, False):
        got = problems(
            {"cpu_bytes_to_use": big, "job_timeout_s": big, "breaker": {"cooldown_s": big}},
            check_machine=machine,
        )
        assert got == [
            f"$.breaker.cooldown_s: {too_large}",
            f"$.cpu_bytes_to_use: {too_large}",
            f"$.job_timeout_s: {too_large}",
        ]
    assert problems('{"cpu_bytes_to_use": 1, "job_timeout_s": 1e400}') == [
        "$.job_timeout_s: expected a finite number, found one too large to represent (such as "
        "1e400, which reads as infinity)"
    ]
    assert problems({"cpu_bytes_to_use": GiB, "job_timeout_s": float("nan")}) == [
        "$.job_timeout_s: expected a number, found NaN (not a JSON value)"
    ]
    # Deep inside a tier section, and in a vLLM config, the same.
    [line] = problems(
        {"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "memory", "capacity_bytes": big}]}
    )
    assert line == f"$.secondary_tiers[0].capacity_bytes: {too_large}"


def test_a_missing_nested_section_is_described_whole(problems) -> None:
    [line] = problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "faulty"}]})
    assert line == (
        '$.secondary_tiers[0].inner: missing; expected a tier section (an object with "type" '
        'and that tier\'s options) (the tier section to wrap (any tier, e.g. {"type": '
        '"memory", ...}))'
    )


def test_the_memory_tier_checks_its_eviction_policy(problems) -> None:
    [line] = problems(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [
                {"type": "memory", "capacity_bytes": GiB, "eviction_policy": "lfu"}
            ],
        }
    )
    assert line.startswith(
        "$.secondary_tiers[0].eviction_policy: unknown policy 'lfu' (did you mean 'lru'?); "
        "installed policies: arc, lru, sieve"
    )


def test_a_tier_whose_plugin_is_disabled_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    if not any(ep.name == "fs" for ep in md.entry_points(group="kvtiers")):
        pytest.skip("kvtiers-fs is not installed here")
    monkeypatch.setenv("KVTIERS_PLUGINS_DISABLE", "kvtiers-fs")
    registry = load_registry()
    with pytest.raises(ConfigError) as info:
        load_config({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "fs"}]}, registry)
    [p] = info.value.problems
    assert p.message.startswith("unknown tier 'fs'; installed tiers: faulty, memory")
    assert p.message.endswith(
        "; the plugin 'fs' of kvtiers-fs, which provides tier 'fs', is installed but skipped: "
        "KVTIERS_PLUGINS_DISABLE lists it"
    )
    monkeypatch.delenv("KVTIERS_PLUGINS_DISABLE")
    monkeypatch.setenv("KVTIERS_PLUGINS_ALLOW", "nothing-else")
    with pytest.raises(ConfigError) as info:
        load_config(
            {"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "fs"}]}, load_registry()
        )
    assert info.value.problems[0].message.endswith("KVTIERS_PLUGINS_ALLOW does not list it")
