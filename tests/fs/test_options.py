"""Config: schema, vLLM names, validation of the root directory; O_DIRECT probing
with buffered fallback; durable mode."""

from __future__ import annotations

import json
import os
from pathlib import Path

import kvtiers_fs.disk.blockio as blockio
import pytest
from kvtiers.config import load_config
from kvtiers.errors import ConfigError
from kvtiers.testing import random_keys

from tests.fs.helpers import context, load_and_check, mounted, open_tier, store_keys


def _doc(**fs: object) -> dict:
    return {"cpu_bytes_to_use": 1 << 20,
            "secondary_tiers": [{"type": "fs", "capacity_bytes": 1 << 30, **fs}]}


def test_defaults_and_vllm_thread_names(tmp_path: Path) -> None:
    config = load_config(_doc(root_dir=str(tmp_path)))
    opts = config.secondary_tiers[0].options
    assert (opts["eviction_policy"], opts["o_direct"], opts["durable"]) == ("lru", "auto", False)
    vllm = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 20,
                "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path),
                                     "capacity_bytes": 1 << 30,
                                     "n_read_threads": 3, "n_write_threads": 5}]}}
    opts = load_config(vllm).secondary_tiers[0].options
    assert dict(opts["threads"]) == {"load": 3, "store": 5}


@pytest.mark.parametrize(("root", "message"), [
    ("relative/dir", "root_dir"),
    ("/does/not/exist", "does not exist"),
])
def test_bad_roots_are_reported_at_validation(root: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config(_doc(root_dir=root))
    assert all(p.path.startswith("$.secondary_tiers[0].root_dir") for p in err.value.problems)


def test_each_bad_root_of_a_list_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_doc(root_dir=[str(tmp_path), "/nope/a", "/nope/b"]))
    assert [p.path for p in err.value.problems] == [
        "$.secondary_tiers[0].root_dir[1]", "$.secondary_tiers[0].root_dir[2]"]


def test_unwritable_root_is_reported_at_validation(tmp_path: Path) -> None:
    from tests.fs.helpers import read_only

    with (mounted("tmpfs", tmp_path / "ro", "1m") as root, read_only(root),
          pytest.raises(ConfigError, match="not writable")):
        load_config(_doc(root_dir=str(root)))
    # ... unless validating for another machine.
    load_config(_doc(root_dir="/does/not/exist"), check_machine=False)


def test_bad_values_name_their_field(tmp_path: Path) -> None:
    for bad, path in [({"o_direct": "yes"}, "o_direct"), ({"threads": {"load": 0}}, "threads"),
                      ({"durable": 1}, "durable"), ({"eviction_policy": "lruu"}, "eviction")]:
        with pytest.raises(ConfigError) as err:
            load_config(_doc(root_dir=str(tmp_path), **bad))
        assert path in str(err.value), (bad, str(err.value))


def test_o_direct_falls_back_to_buffered_on_a_filesystem_without_it(tmp_path: Path) -> None:
    """ramfs has no O_DIRECT (tmpfs has it since Linux 6.6)."""
    with mounted("ramfs", tmp_path / "ram") as root:
        ctx = context()
        tier = open_tier(ctx, root)
        keys = random_keys(4)
        try:
            assert tier.o_direct == [False]
            assert store_keys(tier, keys).success
            assert load_and_check(tier, keys, 8).success
        finally:
            tier.close()
        with pytest.raises(ConfigError, match="O_DIRECT"):
            open_tier(context(), root, o_direct=True)


def test_o_direct_is_used_where_supported(tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "tmp", "8m") as root:
        tier = open_tier(context(), root)
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                assert tier.o_direct == [blockio.probe_o_direct(fd)]
            finally:
                os.close(fd)
        finally:
            tier.close()
    tier = open_tier(context(), tmp_path, o_direct=False)
    try:
        assert tier.o_direct == [False]
    finally:
        tier.close()


def test_durable_mode_syncs_files_directories_and_journal(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    calls = {"fsync": 0, "fdatasync": 0}
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        calls["fsync"] += 1
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls["fdatasync"] += 1
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    keys = random_keys(4)
    for durable in (False, True):
        root = tmp_path / f"root{durable}"
        root.mkdir()
        before = dict(calls)
        tier = open_tier(context(), root, durable=durable)
        try:
            assert store_keys(tier, keys).success
            assert load_and_check(tier, keys, 8).success
        finally:
            tier.close()
        synced = calls["fsync"] - before["fsync"]
        datasynced = calls["fdatasync"] - before["fdatasync"]
        if durable:
            assert synced >= 2 * len(keys)  # each file and its directory
            assert datasynced >= 2  # the reservation and the commit frames
        else:
            assert synced == datasynced == 0
    assert json.dumps({"ok": True})
