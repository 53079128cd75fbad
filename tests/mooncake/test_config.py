"""The `mooncake` tier's options and `kvtiers validate`'s machine checks: a master
that does not answer and a missing libibverbs are one clear problem each, vLLM's
MooncakeStoreConnector keys are understood, a good section passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kvtiers.config import load_config
from kvtiers.errors import ConfigError, ConfigNote
from kvtiers_mooncake.check import check_mooncake
from kvtiers_mooncake.settings import MIN_SEGMENT_BYTES, settings_from

from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace

REPO = Path(__file__).resolve().parents[2]
VERBS = "/lib/x86_64-linux-gnu/libibverbs.so.1"


def section(master: str = "127.0.0.1:50051", **extra: object) -> dict[str, object]:
    return {"master_address": master, "capacity_bytes": 1 << 30, **extra}


def test_defaults_and_derived_values() -> None:
    s = settings_from(section())
    assert (s.metadata_server, s.protocol, s.tenant, s.prefix, s.replicas) == (
        "P2PHANDSHAKE", "tcp", "default", "kvtiers", 1)
    assert s.segment_bytes == (1 << 30) * 5 // 4 + (4 << 20)  # quota, headers, watermark
    assert settings_from(section(capacity_bytes=1 << 20)).segment_bytes == MIN_SEGMENT_BYTES
    assert settings_from(section(segment_bytes=0)).segment_bytes == 0


@pytest.mark.parametrize(("extra", "path", "words"), [
    ({"master_address": "nohost"}, "$.master_address", "host:port"),
    ({"admin_address": "h:x"}, "$.admin_address", "host:port"),
    ({"master_address": "h:99999"}, "$.master_address", "1..65535"),
    ({"segment_bytes": 1 << 20}, "$.segment_bytes", "at least"),
    ({"protocol": "rdma"}, "$.rdma_devices", "rdma_devices"),
    ({"protocol": "udp"}, "$.protocol", "tcp"),
    ({"replicas": 0}, "$.replicas", "minimum"),
])
def test_bad_options_name_the_field(extra: dict[str, object], path: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from({**section(), **extra})
    problem = caught.value.problems[0]
    assert problem.path == path and words in problem.message, problem


def test_vllms_mooncake_keys_map_to_the_tiers_options(master: Master) -> None:
    vllm = {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 64 << 20,
            "secondary_tiers": [{
                "type": "mooncake", "master_server_address": master.address,
                "global_segment_size": 32 << 20, "local_buffer_size": 8 << 20,
                "device_name": "", "protocol": "tcp", "metadata_server": "P2PHANDSHAKE",
                "local_hostname": "127.0.0.1", "capacity_bytes": 16 << 20}]}}
    config = load_config(vllm, check_machine=False)
    tier = config.secondary_tiers[0]
    options = dict(tier.options)
    assert options["master_address"] == master.address
    assert options["segment_bytes"] == 32 << 20 and options["buffer_bytes"] == 8 << 20


def test_a_master_that_does_not_answer_is_one_problem(ns: NetNamespace) -> None:
    port = ns.free_port()  # nothing listens there
    remarks = ns.run(check_mooncake, section(f"127.0.0.1:{port}"))
    assert len(remarks) == 1 and remarks[0].path == "$.master_address", remarks
    assert "does not answer" in remarks[0].message and "mooncake_master" in remarks[0].message


def test_a_good_section_passes_with_notes(ns: NetNamespace, master: Master) -> None:
    remarks = ns.run(check_mooncake, section(master.address,
                                             admin_address=master.admin_address))
    assert remarks and all(isinstance(r, ConfigNote) for r in remarks), remarks
    assert any("objects" in r.message for r in remarks)


def _validate(config: dict[str, object], tmp_path: Path, *prefix: str) -> tuple[int, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([*prefix, sys.executable, "-m", "kvtiers", "validate", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, done.stdout + done.stderr


def test_validate_names_an_unreachable_master(ns: NetNamespace, tmp_path: Path) -> None:
    config = {"cpu_bytes_to_use": 64 << 20,
              "secondary_tiers": [{"type": "mooncake", **section(f"127.0.0.1:{ns.free_port()}")}]}
    rc, out = _validate(config, tmp_path, *ns.command())
    assert rc != 0 and "$.secondary_tiers[0].master_address" in out and "does not answer" \
        in out, out


@pytest.mark.skipif(not os.path.exists(VERBS) or shutil.which("unshare") is None,
                    reason=f"needs {VERBS} and unshare(1)")
def test_validate_names_the_debian_package_when_libibverbs_is_missing(
        ns: NetNamespace, tmp_path: Path) -> None:
    """libibverbs.so.1 hidden (a private mount namespace binds /dev/null over it)."""
    config = {"cpu_bytes_to_use": 64 << 20,
              "secondary_tiers": [{"type": "mooncake", **section()}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    script = (f"mount --bind /dev/null {VERBS} && exec {sys.executable} -m kvtiers "
              f"validate {path}")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "$.secondary_tiers[0].type" in out and "libibverbs1" in out, out
    assert out.count("error:") == 1, out
