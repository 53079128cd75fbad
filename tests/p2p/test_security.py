"""CURVE: only clients whose public key is on the server's allow-list get a
session; an unauthenticated or unlisted client gets nothing. Key files: made by
keygen, secret ones private, their contents never logged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers_p2p.wire.security import KeyFileError, keygen, load_secret

from tests.p2p.conftest import MakeEngine
from tests.p2p.engine import Engine, keys_for


def keys(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "keys"
    out: dict[str, Path] = {}
    for name in ("server", "listed", "stranger"):
        out[f"{name}.pub"], out[name] = keygen(d / name, name)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "listed.key").write_bytes(out["listed.pub"].read_bytes())
    out["allowed"] = allowed
    return out


def serve(engines: MakeEngine, k: dict[str, Path]) -> Engine:
    server = engines({"port": 0, "curve": {"secret_key_file": str(k["server"]),
                                           "allowed_keys_dir": str(k["allowed"])}})
    server.store(keys_for("s", 4))
    return server


def client(engines: MakeEngine, server: Engine, k: dict[str, Path], who: str | None) -> Engine:
    curve = None if who is None else {"secret_key_file": str(k[who]),
                                      "server_public_key_file": str(k["server.pub"])}
    return engines({"peers": [server.endpoint], "curve": curve})


def test_a_listed_client_pulls(tmp_path: Path, engines: MakeEngine,
                               caplog: pytest.LogCaptureFixture) -> None:
    k = keys(tmp_path)
    server = serve(engines, k)
    puller = client(engines, server, k, "listed")
    assert puller.wait_ready()
    blocks = keys_for("s", 4)
    assert puller.settle(blocks) == [LookupResult.HIT] * 4
    puller.check_loaded(blocks)
    for name in ("server", "listed"):
        public, secret = load_secret(k[name])
        assert secret.decode() not in caplog.text and public.decode() not in caplog.text


@pytest.mark.parametrize("who", ["stranger", None], ids=["unlisted", "unauthenticated"])
def test_an_unlisted_or_unauthenticated_client_gets_nothing(
        tmp_path: Path, engines: MakeEngine, who: str | None) -> None:
    k = keys(tmp_path)
    server = serve(engines, k)
    puller = client(engines, server, k, who)
    assert not puller.wait_ready(timeout=3.0)
    assert puller.settle(keys_for("s", 4)) == [LookupResult.MISS] * 4
    srv = server.tier.server
    assert srv is not None
    assert srv.counters["sessions"] == 0 and srv.counters["lookups"] == 0
    assert srv.counters["bad_messages"] == 0  # not one protocol message got through


def test_keygen_makes_private_secret_files_and_refuses_to_overwrite(tmp_path: Path) -> None:
    public, secret = keygen(tmp_path / "k", "node")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    assert load_secret(secret)[0] == public.read_bytes().split(b'"')[1]
    with pytest.raises(FileExistsError):
        keygen(tmp_path / "k", "node")


def test_a_secret_key_file_others_can_read_is_refused(tmp_path: Path,
                                                       engines: MakeEngine) -> None:
    _, secret = keygen(tmp_path / "k", "node")
    os.chmod(secret, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600") as err:
        load_secret(secret)
    assert secret.read_text() not in str(err.value)
    with pytest.raises(KeyFileError):
        engines({"port": 0, "curve": {"secret_key_file": str(secret)}})


def test_a_public_key_file_is_not_a_secret_one(tmp_path: Path) -> None:
    public, _ = keygen(tmp_path / "k", "node")
    os.chmod(public, 0o600)
    with pytest.raises(KeyFileError, match="no secret key"):
        load_secret(public)
