"""`kvtiers snapshot save/load` on `s3://`: against the real servers the s3 tier's
tests use (moto in server mode, SeaweedFS), the credentials and endpoint given the
usual ways - the AWS environment, fsspec's `FSSPEC_S3_*` environment, and
`--storage-option` - and never printed. Every block byte-equal and served as a hit
in a fresh tier; the store's objects really are in the bucket."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import random_keys

from tests.clirun import run_kvtiers
from tests.fs.helpers import FILE, context, load_and_check, open_tier, store_keys
from tests.s3.servers import BIN, S3Server, start_server

from .conftest import REPO, fs_config

pytest.importorskip("zarr")
pytest.importorskip("s3fs")

CAP = 200 * FILE
_BINARIES = {"moto": "moto_server", "seaweedfs": "weed"}


@pytest.fixture(scope="module", params=sorted(_BINARIES))
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if shutil.which(_BINARIES[request.param], path=str(BIN)) is None:
        pytest.skip(f"{request.param}: not installed next to {sys.executable}")
    with start_server(request.param, tmp_path_factory.mktemp(request.param)) as s:
        yield s


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "FSSPEC_"))}  # nothing of the caller's
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / d / "src") for d in ("kvtiers-core", "kvtiers-fs")]
        + [env.get("PYTHONPATH", "")])
    # botocore >= 1.36 checksums: not every server takes them (tests/s3/servers.py)
    env.update(AWS_REQUEST_CHECKSUM_CALCULATION="when_required",
               AWS_RESPONSE_CHECKSUM_VALIDATION="when_required", **more)
    return env


def _aws_env(server: S3Server) -> dict[str, str]:
    return _env(AWS_ACCESS_KEY_ID=server.admin.key,
                AWS_SECRET_ACCESS_KEY=server.admin.secret,
                AWS_ENDPOINT_URL=server.endpoint_url)


def _kvtiers(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """In a process of its own (tests/clirun.py; a real `python -m kvtiers` where the
    environment asks for one: fsspec reads its FSSPEC_* at import)."""
    return run_kvtiers(args, cwd=REPO, env=env, timeout=300)


def _objects(server: S3Server, prefix: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=server.bucket, Prefix=prefix)
    return [o["Key"] for o in listed.get("Contents", [])]


def test_save_to_s3_then_load_into_a_fresh_tier(server: S3Server, tmp_path: Path) -> None:
    keys = random_keys(70)  # more than one job of 64, more than one zarr chunk of rows
    (tmp_path / "a").mkdir()
    a = open_tier(context(model="model-a", slots=128), tmp_path / "a", 200)
    try:
        assert store_keys(a, keys).success
    finally:
        a.close()
    prefix = f"snap-{uuid.uuid4().hex[:8]}"
    url = f"s3://{server.bucket}/{prefix}/system-prompt.zarr"
    secret = server.admin.secret
    # save: credentials and endpoint from the AWS environment
    done = _kvtiers(_aws_env(server), "snapshot", "save",
                    fs_config(tmp_path / "a.json", str(tmp_path / "a"), CAP), url, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blocks"] == 70
    assert secret not in done.stdout + done.stderr
    stored = _objects(server, prefix + "/")
    assert f"{prefix}/system-prompt.zarr/zarr.json" in stored
    assert any("/blocks/c/" in k for k in stored), stored
    try:
        # load: the endpoint as a storage option, the key pair from fsspec's environment
        (tmp_path / "b").mkdir()
        env = _env(FSSPEC_S3_KEY=server.admin.key, FSSPEC_S3_SECRET=secret)
        done = _kvtiers(env, "snapshot", "load",
                        fs_config(tmp_path / "b.json", str(tmp_path / "b"), CAP), url,
                        "--storage-option", f"endpoint_url={server.endpoint_url}", "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["blocks"] == 70 and doc["bad"] == [] and doc["failed"] == {}
        assert secret not in done.stdout + done.stderr
        b = open_tier(context(model="model-a"), tmp_path / "b", 200)
        try:
            assert [b.lookup(k) for k in keys] == [LookupResult.HIT] * 70
            assert load_and_check(b, keys[:64]).success  # byte for byte
            assert load_and_check(b, keys[64:]).success
        finally:
            b.close()
    finally:
        server.clear(prefix + "/")


def test_wrong_credentials_are_a_clear_error_that_never_shows_them(
        server: S3Server, tmp_path: Path) -> None:
    if server.kind == "moto":
        pytest.skip("moto accepts any signature; SeaweedFS checks them")
    (tmp_path / "a").mkdir()
    a = open_tier(context(model="model-a", slots=64), tmp_path / "a", 200)
    try:
        assert store_keys(a, random_keys(3)).success
    finally:
        a.close()
    wrong = "wrong-secret-" + uuid.uuid4().hex
    env = _env()
    prefix = f"denied-{uuid.uuid4().hex[:8]}"
    done = _kvtiers(env, "snapshot", "save",
                    fs_config(tmp_path / "a.json", str(tmp_path / "a"), CAP),
                    f"s3://{server.bucket}/{prefix}/s.zarr",
                    "--storage-option", f"endpoint_url={server.endpoint_url}",
                    "--storage-option", f"key={server.admin.key}",
                    "--storage-option", f"secret={wrong}")
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out and f"s3://{server.bucket}/{prefix}/s.zarr" in out
    assert wrong not in out and server.admin.secret not in out
    assert _objects(server, prefix + "/") == []
    # a missing snapshot: named, exit 2
    done = _kvtiers(_aws_env(server), "snapshot", "load",
                    fs_config(tmp_path / "b.json", str(tmp_path / "a"), CAP),
                    f"s3://{server.bucket}/{prefix}/none.zarr")
    assert done.returncode == 2 and "not a readable kvtiers snapshot" in done.stderr, done.stderr


@pytest.mark.parametrize("server", ["seaweedfs"], indirect=True)
def test_a_cpu_pool_snapshot_through_s3(server: S3Server) -> None:
    """`save_pool` / `load_pool` with explicit storage options: a fresh pool holds
    every block byte for byte, and each is a hit. On one server: the objects are the
    ones `snapshot save/load` moves, tested on each server above."""
    from kvtiers.config import load_config
    from kvtiers.contract.pool_view import PoolView
    from kvtiers.manager import TieringOffloadingManager
    from kvtiers.manager.build import build_manager
    from kvtiers.ops.pool_snapshot import load_pool, save_pool
    from kvtiers.ops.snapshot_store import SnapshotReader, rows_per_chunk
    from kvtiers.testing import make_namespace

    bb = 1 << 16
    ns = make_namespace("model-a", bb)
    options = server.storage_options()
    url = f"s3://{server.bucket}/pool-{uuid.uuid4().hex[:8]}/pool.zarr"
    keys = random_keys(300)
    assert len(keys) > 2 * rows_per_chunk(bb)  # three chunks of rows
    content = {k: os.urandom(bb) for k in keys}

    def stack() -> tuple[TieringOffloadingManager, PoolView]:
        pool = PoolView.anonymous(512, bb)
        return build_manager(load_config({"cpu_bytes_to_use": pool.nbytes}), pool, ns), pool

    mgr, pool = stack()
    try:
        for i in range(0, len(keys), 100):
            part = keys[i : i + 100]
            out = mgr.prepare_store(part)
            assert out is not None
            for k, slot in zip(part, out.slots, strict=True):
                pool.block(slot)[:] = content[k]
            mgr.complete_store(part)
        assert save_pool(mgr, pool, ns, url, storage_options=options).blocks == 300
    finally:
        mgr.close()
    fresh, fpool = stack()
    try:
        reader = SnapshotReader(url, storage_options=options)
        assert reader.count == 300 and reader.attrs["source"] == "cpu"
        result = load_pool(fresh, fpool, ns, reader)
        assert result.blocks == 300 and result.bad == []
        assert [fresh.lookup(k) for k in keys] == [LookupResult.HIT] * 300
        slots = fresh.prepare_load(keys)
        for k, slot in zip(keys, slots, strict=True):
            assert bytes(fpool.block(slot)) == content[k]
        fresh.complete_load(keys)
    finally:
        fresh.close()
        server.clear(url.split("/", 3)[3].rsplit("/", 1)[0] + "/")


def test_a_prefix_of_other_objects_is_refused_and_a_snapshot_replaced_only_when_asked(
        server: S3Server) -> None:
    """The local rule on s3: a prefix holding other objects is left alone, a kvtiers
    snapshot is replaced only with `overwrite` (completely: nothing of the old one
    left, nothing staged left beside it), and a failed save leaves the old one."""
    from kvtiers.ops.snapshot_store import SnapshotError, SnapshotReader

    from .save_child import blocks, save

    options = server.storage_options()
    prefix = f"target-{uuid.uuid4().hex[:8]}"
    url = f"s3://{server.bucket}/{prefix}/snap.zarr"
    client = server.client()
    client.put_object(Bucket=server.bucket, Key=f"{prefix}/mine/notes.txt", Body=b"mine")

    def content() -> list[tuple[bytes, bytes]]:
        reader = SnapshotReader(url, storage_options=options)
        return [(k, bytes(d)) for chunk in reader.chunks() for k, _, d in chunk]

    def fail() -> None:
        raise RuntimeError("injected")

    try:
        with pytest.raises(SnapshotError, match="not a kvtiers snapshot"):
            save(f"s3://{server.bucket}/{prefix}/mine", 1, 2, overwrite=True,
                 storage_options=options)
        assert _objects(server, prefix + "/") == [f"{prefix}/mine/notes.txt"]
        save(url, 1, 40, storage_options=options)  # two chunks of rows
        first = sorted(_objects(server, f"{prefix}/snap.zarr/"))
        with pytest.raises(SnapshotError, match="already"):
            save(url, 2, 3, storage_options=options)
        with pytest.raises(RuntimeError):
            save(url, 2, 3, overwrite=True, stop=fail, storage_options=options)
        assert content() == blocks(1, 40)
        save(url, 2, 3, overwrite=True, storage_options=options)
        assert content() == blocks(2, 3)
        now = _objects(server, prefix + "/")
        assert set(first) - set(now)  # the old second chunk is gone
        assert {k.split("/")[1] for k in now} == {"mine", "snap.zarr"}  # nothing staged
        assert client.get_object(Bucket=server.bucket,
                                 Key=f"{prefix}/mine/notes.txt")["Body"].read() == b"mine"
    finally:
        server.clear(prefix + "/")
