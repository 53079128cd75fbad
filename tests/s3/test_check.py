"""`kvtiers validate`'s machine checks of the s3 and obj tiers, against real servers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvtiers.errors import ConfigNote, ConfigProblem
from kvtiers_s3 import check
from kvtiers_s3.check import check_obj, check_s3

from tests.s3.servers import Identity, S3Server, SeaweedServer, free_port


def _section(server: S3Server, root: str, identity: Identity | None = None,
             **extra: Any) -> dict[str, Any]:
    return {"url": f"s3://{root}", "capacity_bytes": 1 << 30,
            "storage_options": server.storage_options(identity), **extra}


def _only(remarks: list[Any]) -> ConfigProblem:
    assert len(remarks) == 1, remarks
    assert isinstance(remarks[0], ConfigProblem), remarks
    return remarks[0]


def test_a_good_section_passes_and_leaves_nothing_behind(s3_server: S3Server,
                                                         s3_prefix: str) -> None:
    assert check_s3(_section(s3_server, s3_prefix)) == []
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                Prefix=s3_prefix.split("/", 1)[1])
    assert listed.get("KeyCount", 0) == 0


def test_vllms_form_is_checked_the_same_way(s3_server: S3Server, s3_prefix: str) -> None:
    store = {"bucket": s3_server.bucket, "endpoint_override": s3_server.endpoint_url,
             "access_key": s3_server.admin.key, "secret_key": s3_server.admin.secret}
    options = {"store_config": store, "prefix": s3_prefix.split("/", 1)[1], "capacity_bytes": 1}
    assert check_obj(options) == []
    store["endpoint_override"] = f"127.0.0.1:{free_port()}"  # scheme http by default
    problem = _only(check_obj(options))
    assert problem.path == "$.store_config.endpoint_override"
    assert problem.message.startswith("obj tier: cannot reach http://127.0.0.1:")


def test_an_unknown_scheme_is_named_with_a_suggestion() -> None:
    problem = _only(check_s3({"url": "s4://bucket/p", "capacity_bytes": 1}))
    assert problem.path == "$.url"
    assert "unknown URL scheme s4://" in problem.message and "s3://" in problem.message


def test_a_scheme_whose_filesystem_is_missing_says_what_to_install() -> None:
    problem = _only(check_s3({"url": "gs://bucket/p", "capacity_bytes": 1}))
    assert problem.path == "$.url" and "gcsfs" in problem.message


def test_an_unknown_storage_option_is_named(moto: S3Server) -> None:
    options = _section(moto, f"{moto.bucket}/p")
    options["storage_options"]["endpoint"] = options["storage_options"]["endpoint_url"]
    options["storage_options"]["loop"] = None
    remarks = check_s3(options)
    by_path = {r.path: r.message for r in remarks}
    assert set(by_path) == {"$.storage_options.endpoint", "$.storage_options.loop"}
    assert "unknown option 'endpoint' for s3://" in by_path["$.storage_options.endpoint"]
    assert '"endpoint_url"' in by_path["$.storage_options.endpoint"]
    assert "set by the tier" in by_path["$.storage_options.loop"]


def test_an_unreachable_endpoint_is_one_clear_problem() -> None:
    port = free_port()  # nothing listens there
    options = {"url": "s3://bucket/p", "capacity_bytes": 1,
               "storage_options": {"endpoint_url": f"http://127.0.0.1:{port}", "key": "AKIDX",
                                   "secret": "secret-never-shown"}}
    problem = _only(check_s3(options))
    assert problem.path == "$.storage_options.endpoint_url"
    assert f"cannot reach http://127.0.0.1:{port}" in problem.message
    assert "secret-never-shown" not in problem.message


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_server_that_never_answers_does_not_hang_validate(
        silent_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "READ_TIMEOUT_S", 0.5)
    options = {"url": "s3://bucket/p", "capacity_bytes": 1,
               "storage_options": {"endpoint_url": silent_endpoint, "key": "k", "secret": "s"}}
    problem = _only(check_s3(options))
    assert problem.path == "$.storage_options.endpoint_url"
    assert "timeout" in problem.message.lower() or "timed out" in problem.message.lower()


def test_a_missing_bucket_is_named_or_noted_when_the_tier_will_create_it(
        s3_server: S3Server) -> None:
    options = _section(s3_server, "no-such-bucket-kvtiers/p")
    problem = _only(check_s3(options))
    assert problem.path == "$.url"
    assert "bucket 'no-such-bucket-kvtiers' does not exist" in problem.message
    assert '"create_bucket": true' in problem.message
    (note,) = check_s3({**options, "create_bucket": True})
    assert isinstance(note, ConfigNote) and "will create it" in note.message


def test_read_only_credentials_are_no_write_permission(seaweedfs: S3Server) -> None:
    assert isinstance(seaweedfs, SeaweedServer)
    options = _section(seaweedfs, f"{seaweedfs.bucket}/p", seaweedfs.reader)
    problem = _only(check_s3(options))
    assert problem.path == "$.url"
    assert problem.message.startswith("s3 tier: no write permission under s3://")
    assert seaweedfs.reader.secret not in problem.message


@pytest.mark.parametrize("kind", ["seaweedfs", "rclone"])
def test_wrong_credentials_are_denied_without_showing_them(
        request: pytest.FixtureRequest, kind: str) -> None:
    server: S3Server = request.getfixturevalue(kind)
    wrong = Identity(server.admin.key, "wrong-secret-for-kvtiers-test")
    problem = _only(check_s3(_section(server, f"{server.bucket}/p", wrong)))
    assert problem.path in ("$.storage_options", "$.url")
    assert "denied" in problem.message or "permission" in problem.message
    for secret in (wrong.secret, server.admin.secret, server.admin.key):
        assert secret not in problem.message


def test_other_fsspec_filesystems_are_probed_by_writing(tmp_path: Path) -> None:
    assert check_s3({"url": "memory://kvtiers-check/p", "capacity_bytes": 1}) == []
    assert check_s3({"url": f"file://{tmp_path}/kv", "capacity_bytes": 1}) == []
    (tmp_path / "file").write_bytes(b"not a directory")
    problem = _only(check_s3({"url": f"file://{tmp_path}/file/kv", "capacity_bytes": 1}))
    assert problem.path == "$.url" and "cannot write" in problem.message
