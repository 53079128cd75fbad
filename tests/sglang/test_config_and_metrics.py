"""SGLang's extra config as `kvtiers validate` reads it, and the backend's
Prometheus metrics."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from kvtiers import load_config
from kvtiers.config import sglang as sglang_form

from .harness import extra_config, fs_tier, make_backend, page_keys

KVTIERS = [sys.executable, "-m", "kvtiers"]


def validate(doc: dict[str, object], *flags: str) -> subprocess.CompletedProcess[str]:
    import json

    return subprocess.run([*KVTIERS, "validate", json.dumps(doc), *flags],
                          capture_output=True, text=True, timeout=60)


def test_validate_reads_sglang_extra_config(tmp_path: Path) -> None:
    """The object given to --hicache-storage-backend-extra-config validates as is:
    SGLang's keys and the backend's own are set aside, the rest is kvtiers' config;
    SGLang's host pool stands for cpu_bytes_to_use."""
    doc = extra_config([fs_tier(tmp_path / "fs")], exists_wait_s=0.5, job_timeout_s=2)
    proc = validate(doc)
    assert proc.returncode == 0, proc.stderr
    assert "(SGLang HiCache storage extra config)" in proc.stdout
    assert "SGLang's host pool" in proc.stdout and "0. fs (kvtiers-fs" in proc.stdout
    config = load_config(doc)
    assert config.source_format == sglang_form.SGLANG_EXTRA and config.job_timeout_s == 2


def test_validate_names_each_problem(tmp_path: Path) -> None:
    doc = {**extra_config([{"type": "fs", "root_dir": str(tmp_path), "capacity": 1}]),
           "module_path": "someone.else", "interface_v1": 2, "metrics_port": 70000,
           "cpu_bytes_to_use": 1 << 30}
    proc = validate(doc, "--skip-machine-checks")
    assert proc.returncode == 2
    errors = re.findall(r"^error: (\$[^:]*):", proc.stderr, re.M)
    assert errors == ["$.interface_v1", "$.metrics_port", "$.module_path",
                      "$.secondary_tiers[0].capacity",
                      "$.secondary_tiers[0].capacity_bytes"], proc.stderr
    assert "warning: $.cpu_bytes_to_use: ignored under SGLang" in proc.stderr


def test_prometheus_metrics(tmp_path: Path) -> None:
    """With metrics_port, TP rank 0 serves kvtiers' tier metrics, labelled by tier."""
    pytest.importorskip("prometheus_client")
    backend, pool = make_backend(extra_config([fs_tier(tmp_path / "fs")], metrics_port=0))
    gen = torch.Generator().manual_seed(31)
    pool.fill_random(gen)
    keys = page_keys(gen, 3)
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2])) == [True] * 3
    assert backend.batch_get_v1(keys, pool.indices([4, 5, 6])) == [True] * 3
    url = backend._metrics_server.url
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    written = re.search(r'^kvtiers_tier_written_blocks_total\{tier="fs"\} (\S+)$', text, re.M)
    read = re.search(r'^kvtiers_tier_read_blocks_total\{tier="fs"\} (\S+)$', text, re.M)
    assert written and float(written.group(1)) == 6
    assert read and float(read.group(1)) == 6
    backend.close()
