"""Credentials never appear in what kvtiers prints: `kvtiers validate` (summary,
`--show`, `--json`, errors, warnings, notes), `kvtiers plugins`, the machine
check's problems, and the tier's logs, errors, stats and repr."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kvtiers.cli import main
from kvtiers.errors import ConfigError
from kvtiers.plugins import Registry
from kvtiers.plugins import registry as registry_module
from kvtiers.testing import JobTracker, fill_slots, make_context, random_keys

from tests.clirun import run_kvtiers
from tests.s3.conftest import cli_env
from tests.s3.helpers import s3_tier
from tests.s3.servers import Identity, S3Server, free_port

TOKEN = "session-token-kvtiers-000"


def _kvtiers(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_kvtiers(args, cwd=os.getcwd(), env=cli_env(tmp_path), timeout=120)


def _in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


def _configs(server: S3Server, who: Identity, endpoint: str) -> dict[str, dict[str, Any]]:
    s3 = {"type": "s3", "url": f"s3://{server.bucket}/secrets", "capacity_bytes": 1 << 30,
          "storage_options": {"endpoint_url": endpoint, "key": who.key, "secret": who.secret,
                              "token": TOKEN}}
    obj = {"type": "obj", "capacity_bytes": 1 << 30, "prefix": "secrets",
           "store_config": {"bucket": server.bucket, "endpoint_override": endpoint,
                            "access_key": who.key, "secret_key": who.secret,
                            "session_token": TOKEN}}
    vllm = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
                                          "cpu_bytes_to_use": 1 << 26,
                                          "secondary_tiers": [
                                              {**obj, "io_threads": 4,
                                               "enable_kv_events": False}]}}
    return {
        "s3": {"cpu_bytes_to_use": 1 << 26, "secondary_tiers": [s3]},
        "obj": {"cpu_bytes_to_use": 1 << 26, "secondary_tiers": [obj]},
        "vllm": vllm,
    }


def _assert_clean(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a credential leaked into:\n{text}"


@pytest.fixture
def cli_registry(s3_registry: Registry, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The in-process `kvtiers` command sees the s3 tier."""
    monkeypatch.setattr(registry_module, "_cached", s3_registry)
    return s3_registry


@pytest.mark.parametrize("outcome", ["valid", "refused"])
def test_validate_never_prints_credentials(
        tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str],
        cli_registry: Registry, outcome: str) -> None:
    # moto takes any credentials, session token included; SeaweedFS checks them
    server: S3Server = request.getfixturevalue("moto" if outcome == "valid" else "seaweedfs")
    who, endpoint = server.admin, server.endpoint_url
    if outcome == "refused":  # a wrong secret; then an unreachable endpoint
        who = Identity(server.admin.key, "wrong-secret-kvtiers-0001")
    outputs: list[str] = []
    for name, doc in _configs(server, who, endpoint).items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        for extra in ([], ["--json"], ["--show"]):
            code, text = _in_process(capsys, "validate", str(path), *extra)
            assert code == (0 if outcome == "valid" else 2), text
            outputs.append(text)
    if outcome == "refused":
        doc = _configs(server, who, f"http://127.0.0.1:{free_port()}")["s3"]
        code, text = _in_process(capsys, "validate", json.dumps(doc))
        assert code == 2 and "cannot reach" in text
        outputs.append(text)
    text = "\n".join(outputs)
    _assert_clean(text, who.key, who.secret, TOKEN)
    if outcome == "valid":
        assert text.count('"***"') >= 6 and "s3://kvtiers-test/secrets" in text
        assert "warning: $.kv_connector_extra_config.secondary_tiers[0].enable_kv_events" in text
    else:
        assert "denied" in text


def test_the_real_cli_finds_the_tier_and_prints_no_credentials(
        tmp_path: Path, moto: S3Server) -> None:
    doc = _configs(moto, moto.admin, moto.endpoint_url)["vllm"]
    done = _kvtiers(tmp_path, "validate", json.dumps(doc))
    assert done.returncode == 0, done.stderr
    listing = _kvtiers(tmp_path, "plugins", "--json")
    assert listing.returncode == 0
    rows = {(r["name"], r["status"]) for r in json.loads(listing.stdout)}
    assert {("s3", "ok"), ("obj", "ok")} <= rows
    _assert_clean(done.stdout + done.stderr + listing.stdout + listing.stderr,
                  moto.admin.key, moto.admin.secret, TOKEN)
    assert "obj (kvtiers-s3" in done.stdout


def test_the_tier_never_logs_raises_or_counts_credentials(
        seaweedfs: S3Server, caplog: pytest.LogCaptureFixture) -> None:
    """Refused credentials, then a server that is not there: every message the tier
    writes (at any level), every error it raises, its stats and its repr."""
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.DEBUG, logger="kvtiers")
    wrong = Identity(seaweedfs.admin.key, "wrong-secret-kvtiers-0002")
    ctx = make_context(16384)
    with pytest.raises(ConfigError) as refused:
        s3_tier(ctx, seaweedfs, f"{seaweedfs.bucket}/secrets",
                storage_options=seaweedfs.storage_options(wrong))
    texts = [str(refused.value)]
    gone = {**seaweedfs.storage_options(),
            "endpoint_url": f"http://127.0.0.1:{free_port()}", "token": TOKEN}
    tier = s3_tier(ctx, seaweedfs, f"{seaweedfs.bucket}/secrets", storage_options=gone,
                   timeout_s=1)
    try:
        jobs = JobTracker(tier, 30)
        keys = random_keys(2)
        fill_slots(ctx.pool, range(2))
        stored = jobs.run_store(keys, range(2))
        assert stored.failed, "a store to a closed port succeeded"
        texts += [json.dumps(tier.stats().as_dict()), repr(tier.settings), repr(stored)]
    finally:
        tier.close()
    texts.append(caplog.text)
    assert "store failed" in caplog.text  # the failures were logged ...
    for secret in (wrong.secret, seaweedfs.admin.secret, seaweedfs.admin.key, TOKEN):
        _assert_clean("\n".join(texts), secret)  # ... without a credential
