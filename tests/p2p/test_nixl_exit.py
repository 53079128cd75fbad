"""A process that made NIXL agents exits cleanly, also where the host has Debian's
RDMA libraries (`libibverbs1`, `ibverbs-providers`) and no RDMA device: there the
NIXL wheel's UCX loaded its EFA module, which brought the host's libibverbs and
libnl beside the wheel's own copies, and every such process died with SIGSEGV
after its last line of Python - a `kvtiers serve` node after saving its
snapshot. kvtiers keeps UCX's EFA module out where no EFA device exists
(`kvtiers_p2p.wire.ucx_modules`).

The children run with the host's RDMA libraries where it has them, else with the
packages unpacked privately (`tests.p2p.rdma_libs`, on LD_LIBRARY_PATH), and
without a `UCX_MODULES` of their own: each decides for itself, as a user's
process does."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers_p2p.wire.nixl_plane import nixl_available
from kvtiers_p2p.wire.ucx_modules import (
    UCX_MODULES,
    WITHOUT_EFA,
    efa_devices,
    keep_efa_module_out,
)

from tests.p2p.conftest import ROOT, MakeEngine, child_env
from tests.p2p.engine import BB, FAST, SLOTS, keys_for
from tests.p2p.nodes import Node
from tests.p2p.rdma_libs import rdma_environment

needs_nixl = pytest.mark.skipif(not nixl_available(), reason="NIXL does not import here "
                                "(pip install 'kvtiers-p2p[nixl]')")


def _own_env() -> dict[str, str]:
    """A child's environment without the `UCX_MODULES` this process may have set."""
    env = child_env()
    env.pop(UCX_MODULES, None)
    return env


@pytest.fixture(scope="module")
def rdma_env() -> Iterator[dict[str, str]]:
    """A child's environment in which the host's RDMA libraries load."""
    if efa_devices():
        pytest.skip("this host has an EFA device: UCX's EFA module is needed here")
    env, where = rdma_environment(_own_env())
    if env is None:
        pytest.skip(where)
    yield env


def _fake_device(sysfs: Path, name: str, driver: str) -> None:
    """`sysfs/name/device/driver` -> .../drivers/`driver`, as /sys/class/infiniband
    has it."""
    (sysfs / "bus" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
    (sysfs / name / "device").mkdir(parents=True)
    (sysfs / name / "device" / "driver").symlink_to(sysfs / "bus" / "drivers" / driver)


def test_the_efa_module_is_kept_out_without_an_efa_device(tmp_path: Path) -> None:
    for case, devices in (("none", []), ("mlx5", [("mlx5_0", "mlx5_core")])):
        sysfs = tmp_path / case
        sysfs.mkdir()
        for name, driver in devices:
            _fake_device(sysfs, name, driver)
        env: dict[str, str] = {}
        assert keep_efa_module_out(env, sysfs) is True
        assert env == {UCX_MODULES: WITHOUT_EFA}
    env = {}
    assert keep_efa_module_out(env, tmp_path / "missing") is True  # no /sys/class/infiniband
    assert env == {UCX_MODULES: WITHOUT_EFA}


def test_an_efa_device_or_the_user_s_own_choice_is_left_alone(tmp_path: Path) -> None:
    _fake_device(tmp_path, "mlx5_0", "mlx5_core")
    _fake_device(tmp_path, "rdmap16s27", "efa")
    assert efa_devices(tmp_path) == ["rdmap16s27"]
    env: dict[str, str] = {}
    assert keep_efa_module_out(env, tmp_path) is False and env == {}
    env = {UCX_MODULES: "all"}
    assert keep_efa_module_out(env, tmp_path / "missing") is False
    assert env == {UCX_MODULES: "all"}


def _pair(env: dict[str, str], n: int = 24) -> dict[str, object]:
    """`tests.p2p.nixl_pair` in a child: a READ of `n` blocks between two planes,
    then an ordinary exit; its report, once its exit status was 0."""
    out = subprocess.run([sys.executable, "-m", "tests.p2p.nixl_pair", str(n)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    report: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["verified"] == n and report["wrong"] == 0, report
    return report


@needs_nixl
def test_a_process_with_nixl_agents_exits_0() -> None:
    _pair(_own_env())


@needs_nixl
def test_a_process_with_nixl_agents_exits_0_with_the_host_s_rdma_libraries(
        rdma_env: dict[str, str]) -> None:
    report = _pair(rdma_env)
    assert report["ucx_modules"] == WITHOUT_EFA
    assert report["host_rdma"] == []  # no second rdma-core beside the wheel's


@needs_nixl
def test_a_node_saves_its_snapshot_on_sigterm_and_exits_0_with_the_rdma_libraries(
        tmp_path: Path, engines: MakeEngine, rdma_env: dict[str, str]) -> None:
    """Both nodes make NIXL agents ("auto": the puller below reads over NIXL); each
    is stopped with SIGTERM and must finish its snapshot and exit 0."""
    pytest.importorskip("zarr")
    url = str(tmp_path / "pool.zarr")
    config = {"cpu_bytes_to_use": SLOTS * BB,
              "secondary_tiers": [{"type": "p2p", "port": 0, "data_plane": "auto", **FAST}]}
    nodes = []
    try:
        first = Node(config, tmp_path, "--snapshot-save", url, env=rdma_env)
        nodes.append(first)
        a = engines({"peers": [first.endpoint], "push": True})
        assert a.wait_ready()
        keys = keys_for("exit", 12)
        a.store(keys)  # pushed into the node's pool
        rc, out, err = first.terminate()
        assert rc == 0, (rc, err[-3000:])
        assert f"saved the pool's 12 blocks to {url}" in out
        second = Node(config, tmp_path, "--snapshot-load", url, env=rdma_env)
        nodes.append(second)
        b = engines({"peers": [second.endpoint], "data_plane": "nixl"})
        assert b.wait_ready()
        assert next(iter(b.tier.links.values())).plane == "nixl"
        assert b.settle(keys) == [LookupResult.HIT] * 12
        b.check_loaded(keys)  # byte for byte, saved by the first node, over NIXL
        rc, _, err = second.terminate()
        assert rc == 0, (rc, err[-3000:])
    finally:
        for node in nodes:
            node.kill()

