"""The `fs` tier as `kvtiers validate` sees it: roots and capacities against real
filesystems (tmpfs mounts of a known size), the capacity a vLLM config leaves out,
and the seed's PR #46216 config taken verbatim."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
from kvtiers.config import load_config
from kvtiers.config.loader import ConfigRejected

from tests.fs.helpers import mounted

MiB = 1 << 20

# vLLM PR #46216's stress run, exactly as its author passed it to `vllm serve`.
PR46216: dict[str, Any] = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 429496729600,
        "eviction_policy": "lru",
        "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/nvme_storage"}],
    },
}
TIER = "$.kv_connector_extra_config.secondary_tiers[0]"


def _pr(root: str, pool: int = 64 * MiB) -> dict[str, Any]:
    doc = copy.deepcopy(PR46216)
    extra = doc["kv_connector_extra_config"]
    extra["cpu_bytes_to_use"] = pool
    extra["secondary_tiers"][0]["root_dir"] = root
    return doc


def _fs(root: Any, **options: Any) -> dict[str, Any]:
    return {
        "cpu_bytes_to_use": 64 * MiB,
        "secondary_tiers": [{"type": "fs", "root_dir": root, **options}],
    }


def _rejected(source: Any, **kw: Any) -> ConfigRejected:
    with pytest.raises(ConfigRejected) as info:
        load_config(source, **kw)
    return info.value


def test_the_pr46216_config_is_accepted_verbatim_for_its_machine() -> None:
    cfg = load_config(PR46216, check_machine=False)
    [tier] = cfg.secondary_tiers
    assert tier.type == "fs" and tier.options["root_dir"] == "/mnt/nvme_storage"
    assert cfg.cpu_bytes_to_use == 400 << 30 and cfg.eviction_policy == "lru"
    assert cfg.vllm_runs == (0,) and cfg.vllm_spec == "TieringOffloadingSpec"
    assert cfg.notes[0].startswith(
        '$.kv_connector_extra_config.spec_name: under "TieringOffloadingSpec" vLLM runs this '
        'stack with its own code: its CPU tier, and its own tier for secondary_tiers[0] ("fs")')
    assert cfg.notes[1:] == (
        f"{TIER}.capacity_bytes: not set (vLLM's tier section has no such key); derived where "
        "this config is loaded with machine checks: 90% of the space free on each root's "
        "filesystem (plus what kvtiers blocks already hold there), never more than its size",
    )
    assert cfg.warnings == ()


def test_a_vllm_fs_tier_gets_90_percent_of_the_free_space(tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "nvme", "16m") as root:
        (root / "other-file").write_bytes(os.urandom(6 * MiB))
        st = os.statvfs(root)
        free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        cfg = load_config(_pr(str(root)))
        capacity = cfg.secondary_tiers[0].options["capacity_bytes"]
        assert capacity == int(0.9 * free) // MiB * MiB and 0 < capacity <= size
        [note] = [n for n in cfg.notes if ".capacity_bytes" in n]
        assert note.startswith(
            f"{TIER}.capacity_bytes: not set (vLLM's fs tier has no such key): "
            f"{capacity // MiB} MiB ({capacity} bytes) per root, 90% of the "
        )
        assert f"free on the filesystem of {root} (size 16 MiB)" in note
        assert note.endswith("; set capacity_bytes to choose the bound yourself")
        # The resolved kvtiers document states the figure, and loads as it is.
        resolved = cfg.to_dict()
        assert resolved["secondary_tiers"][0]["capacity_bytes"] == capacity
        assert load_config(resolved).to_dict() == resolved


def test_two_roots_on_one_filesystem_share_the_derived_capacity(tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "m", "32m") as mount:
        (mount / "a").mkdir()
        (mount / "b").mkdir()
        cfg = load_config(_pr([str(mount / "a"), str(mount / "b")]))  # type: ignore[arg-type]
        capacity = cfg.secondary_tiers[0].options["capacity_bytes"]
        assert capacity == int(0.9 * 32 * MiB) // 2 // MiB * MiB
        assert any("shared by 2 roots" in n for n in cfg.notes)


def test_a_kvtiers_config_still_requires_the_capacity(tmp_path: Path) -> None:
    err = _rejected(_fs(str(tmp_path)))
    assert [p.path for p in err.problems] == ["$.secondary_tiers[0].capacity_bytes"]
    assert err.problems[0].message.startswith("missing; expected an integer >= 1 (Bytes ")


def test_a_capacity_beyond_the_filesystem_is_an_error_beyond_its_free_space_a_warning(
    tmp_path: Path,
) -> None:
    with mounted("tmpfs", tmp_path / "t", "8m") as root:
        err = _rejected(_fs(str(root), capacity_bytes=16 * MiB))
        assert [str(p) for p in err.problems] == [
            "$.secondary_tiers[0].capacity_bytes: fs tier: 16 MiB plus up to 1.3 MiB of the "
            "tier's own index (journals, snapshots) is more than the filesystem "
            f"of {root} holds (8 MiB, 8 MiB free now); set capacity_bytes to at most 7.1 MiB "
            "(7405568 bytes), less what other files need"
        ]
        (root / "filler").write_bytes(os.urandom(5 * MiB))
        cfg = load_config(_fs(str(root), capacity_bytes=6 * MiB))
        [warning] = [w for w in cfg.warnings if w.startswith("$.secondary_tiers[0].capacity")]
        assert warning.startswith(
            "$.secondary_tiers[0].capacity_bytes: fs tier: 6 MiB plus up to 896.3 KiB of the "
            "tier's own index"
            f" (journals, snapshots) is more than the filesystem of {root} has free "
            "now (3 MiB, of 8 MiB): stores will fail"
        )
        # Both roots count against the one filesystem they share.
        (root / "a").mkdir()
        (root / "b").mkdir()
        err = _rejected(_fs([str(root / "a"), str(root / "b")], capacity_bytes=5 * MiB))
        assert err.problems[0].message.startswith(
            "fs tier: 5 MiB per root for 2 roots on one filesystem plus up to 856.3 KiB each of "
            "the tier's own index (journals, snapshots) is more than the filesystem"
        )


def test_every_problem_of_an_fs_section_at_once(tmp_path: Path) -> None:
    # The root check runs although capacity_bytes is missing (and the pool is wrong).
    err = _rejected({**_fs("/does/not/exist"), "cpu_bytes_to_use": "1G"})
    assert [p.path for p in err.problems] == [
        "$.cpu_bytes_to_use",
        "$.secondary_tiers[0].capacity_bytes",
        "$.secondary_tiers[0].root_dir",
    ]
    # In vLLM's form the capacity cannot be derived from a root that is not there.
    err = _rejected(_pr("/does/not/exist"))
    assert [str(p) for p in err.problems] == [
        f"{TIER}.capacity_bytes: not set (vLLM's fs tier has no such key), and kvtiers derives "
        "it from the root's filesystem, which cannot be used (see root_dir); set capacity_bytes",
        f"{TIER}.root_dir: fs tier: '/does/not/exist' does not exist; create it (the tier does "
        "not create its root)",
    ]


def test_root_messages_say_what_is_wrong_in_words(tmp_path: Path) -> None:
    err = _rejected(_fs([str(tmp_path), "rel/dir", "/a\x00b"], capacity_bytes=MiB))
    assert [str(p) for p in err.problems] == [
        '$.secondary_tiers[0].root_dir[1]: expected an absolute path, found "rel/dir" (string)',
        '$.secondary_tiers[0].root_dir[2]: expected an absolute path, found "/a\\u0000b" '
        "(string)",
    ]
    assert [str(p) for p in _rejected(_fs([], capacity_bytes=MiB)).problems] == [
        "$.secondary_tiers[0].root_dir: expected a non-empty array, found 0 items: []"
    ]
    [line] = _rejected(_fs(7, capacity_bytes=MiB)).problems
    assert line.message == (
        "expected an absolute path or a non-empty array of absolute paths, found 7 (integer)"
    )
    [line] = _rejected(_fs("/proc", capacity_bytes=MiB)).problems
    assert line.message == (
        "fs tier: '/proc' is on a virtual filesystem (such as /proc or /sys), which holds no "
        "files; give a directory on a disk"
    )


def test_one_directory_for_two_tiers_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    a = str(tmp_path / "a")
    doc = {
        "cpu_bytes_to_use": 64 * MiB,
        "secondary_tiers": [
            {"type": "fs", "root_dir": a, "capacity_bytes": MiB},
            {"type": "faulty", "inner": {"type": "fs", "root_dir": a + "/", "capacity_bytes": MiB}},
            {"type": "fs", "root_dir": [str(tmp_path), a + "/./"], "capacity_bytes": MiB},
        ],
    }
    lines = [str(p) for p in _rejected(doc, check_machine=False).problems]
    assert lines == [
        f"$.secondary_tiers[1].inner.root_dir: '{a}/' is already the directory of "
        f"$.secondary_tiers[0].root_dir (as '{a}'): two tiers on one directory evict and "
        "overwrite each other's blocks; give each its own",
        f"$.secondary_tiers[2].root_dir[1]: '{a}/./' is already the directory of "
        f"$.secondary_tiers[0].root_dir (as '{a}'): two tiers on one directory evict and "
        "overwrite each other's blocks; give each its own",
    ]
    # With machine checks, a symlink above a root resolves to the directory it names.
    linked = {
        "cpu_bytes_to_use": 64 * MiB,
        "secondary_tiers": [
            {"type": "fs", "root_dir": a, "capacity_bytes": MiB},
            {"type": "fs", "root_dir": str(tmp_path / "link" / "."), "capacity_bytes": MiB},
        ],
    }
    paths = [p.path for p in _rejected(linked).problems]
    assert "$.secondary_tiers[1].root_dir" in paths
    load_config(linked, check_machine=False)  # another machine may lay it out otherwise
