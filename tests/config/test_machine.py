"""Everything a config keeps in RAM, against the machine: the CPU pool plus every
tier that marks a RAM budget (`"x-kvtiers": "ram_bytes"`, the `memory` tier's
capacity), and tiers listed twice."""

from __future__ import annotations

from kvtiers.config.machine import check_ram, physical_memory_bytes

from .conftest import GiB

POOL = "$.cpu_bytes_to_use"


def test_the_pool_plus_memory_tiers_beyond_ram_is_an_error() -> None:
    tiers = [("$.secondary_tiers[0].capacity_bytes", 6 * GiB), ("$.x.inner.capacity_bytes", GiB)]
    problems, warnings = check_ram(2 * GiB, POOL, tiers, memory=8 * GiB, shm=64 * GiB)
    assert [str(p) for p in problems] == [
        "$.cpu_bytes_to_use: the CPU pool (2 GiB) plus the tiers that keep blocks in RAM "
        "($.secondary_tiers[0].capacity_bytes 6 GiB, $.x.inner.capacity_bytes 1 GiB), 9 GiB "
        "(9663676416 bytes) in all, is more than this machine's physical memory, 8 GiB "
        "(8589934592 bytes); lower them well below that (or validate on the machine that "
        "will run it, or pass --skip-machine-checks)"
    ]
    assert warnings == []


def test_a_pool_that_leaves_too_little_or_exceeds_what_is_free_is_a_warning() -> None:
    # 23.3 GiB of a 23.5 GiB machine: fits, but leaves nothing for anyone else.
    memory = 23 * GiB + GiB // 2
    problems, warnings = check_ram(23 * GiB + GiB // 4, POOL, [], memory=memory, shm=memory)
    assert problems == []
    assert warnings == [
        "$.cpu_bytes_to_use: 23.3 GiB leaves 256 MiB of this machine's 23.5 GiB (less than "
        "10%) for the engine, the model and the OS; lower cpu_bytes_to_use unless this "
        "machine does nothing else"
    ]
    problems, warnings = check_ram(
        4 * GiB, POOL, [], memory=16 * GiB, available=3 * GiB, shm=16 * GiB
    )
    assert problems == []
    assert warnings[0].startswith(
        "$.cpu_bytes_to_use: 4 GiB is more than is available now (3 GiB of 16 GiB, "
        "MemAvailable): the pool allocator refuses"
    )
    assert check_ram(4 * GiB, POOL, [("$.t", GiB)], memory=16 * GiB, shm=16 * GiB) == ([], [])


def test_load_config_sums_the_memory_tiers_with_the_pool(problems, load) -> None:
    memory = physical_memory_bytes()
    assert memory is not None
    half = memory // 2 + 1
    doc = {
        "cpu_bytes_to_use": half,
        "secondary_tiers": [
            {"type": "memory", "capacity_bytes": GiB},
            {"type": "faulty", "inner": {"type": "memory", "capacity_bytes": half}},
        ],
    }
    [line] = problems(doc)
    assert line.startswith(
        "$.cpu_bytes_to_use: the CPU pool (" + line.split("(", 1)[1].split(")")[0] + ") plus "
        "the tiers that keep blocks in RAM ($.secondary_tiers[0].capacity_bytes 1 GiB, "
        "$.secondary_tiers[1].inner.capacity_bytes "
    )
    assert load(doc, check_machine=False).cpu_bytes_to_use == half


def test_a_tier_listed_twice_is_an_error(problems, load) -> None:
    memory = {"type": "memory", "capacity_bytes": GiB}
    assert problems(
        {"cpu_bytes_to_use": GiB, "secondary_tiers": [memory, {"type": "checked"}, memory]},
        check_machine=False,
    ) == [
        "$.secondary_tiers[2]: the same tier as $.secondary_tiers[0]: every block would be "
        "stored and looked up twice; remove one"
    ]
    # Spelled differently, defaults written out: still the same tier.
    explicit = {**memory, "threads": 1, "eviction_policy": "lru"}
    assert len(problems({"cpu_bytes_to_use": GiB, "secondary_tiers": [explicit, memory]})) == 1
    # Inside a tier's own list of tier sections too.
    [line] = problems(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [
                {"type": "wrap", "inner": memory, "mirrors": [{"type": "checked"}] * 2}
            ],
        }
    )
    assert line.startswith("$.secondary_tiers[0].mirrors[1]: the same tier as ")
    # A faulty wrapper around a copy of another tier is a test, not a duplicate.
    wrapped = {"type": "faulty", "inner": memory}
    load({"cpu_bytes_to_use": GiB, "secondary_tiers": [memory, wrapped]})
