"""The shared conformance suite, with every capability hook, against each real
server and without one (memory://): the s3 tier is persistent (restart),
verifying (corrupt, truncate) and shared (sibling); `stored_bytes` lists its
prefix. Both layouts run: per-block objects on the servers, packed segments on
SeaweedFS and memory://."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import fsspec
import pytest
from kvtiers import SecondaryTier, TierContext
from kvtiers.testing import TierConformance
from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.tier import S3Tier

from tests.s3.servers import S3Server


class _S3Conformance(TierConformance):
    concurrent_jobs = True
    server_kind: ClassVar[str | None] = None
    packing: ClassVar[str] = "per_block"

    @pytest.fixture(autouse=True)
    def _s3_prefix(self, request: pytest.FixtureRequest) -> Iterator[None]:
        self.server: S3Server | None = None
        self.raw: Any = None  # a boto3 client of the test's own, made on first use
        if self.server_kind is None:
            self.url = f"memory://kvtiers-conformance/{uuid.uuid4().hex[:12]}"
            self.storage: dict[str, Any] = {}
        else:
            self.server = request.getfixturevalue(self.server_kind)
            name = f"conformance-{uuid.uuid4().hex[:12]}"
            self.url = f"s3://{self.server.bucket}/{name}"
            self.storage = self.server.storage_options()
        yield
        if self.server is not None and self.server.running:
            self.server.clear(self.url.split("/", 3)[3] + "/")

    def make_tier(self, ctx: TierContext, capacity_bytes: int,
                  eviction_policy: str = "lru") -> SecondaryTier:
        return S3Tier(ctx, {"url": self.url, "capacity_bytes": capacity_bytes,
                            "eviction_policy": eviction_policy, "concurrency": 8,
                            "storage_options": self.storage, "rescan_s": 0,
                            "layout": {"packing": self.packing}})

    def restart(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        tier.close()
        return S3Tier(ctx, tier.config)

    def sibling(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        return S3Tier(ctx, tier.config)

    def stored_bytes(self, tier: SecondaryTier) -> int:
        """The objects under the namespace's block and segment prefixes, by a raw
        listing: boto3 on a server, the memory filesystem itself for memory://.
        The tier counts each object's size against its capacity."""
        fp = tier.ctx.namespace.fingerprint
        if self.server is None:
            memory = fsspec.filesystem("memory", skip_instance_cache=True)
            root = "/" + self.url.removeprefix("memory://")
            return sum(info["size"] for kind in ("b", "s")
                       for info in memory.find(f"{root}/{fp}/{kind}", detail=True).values())
        bucket, _, name = self.url.removeprefix("s3://").partition("/")
        if self.raw is None:
            self.raw = self.server.client()
        pages = self.raw.get_paginator("list_objects_v2")
        return sum(obj["Size"] for kind in ("b", "s")
                   for page in pages.paginate(Bucket=bucket, Prefix=f"{name}/{fp}/{kind}/")
                   for obj in page.get("Contents", []))

    def _rewrite(self, tier: SecondaryTier, key: bytes, change: Any) -> None:
        """Rewrite the object holding `key` behind the tier's back."""
        assert isinstance(tier, S3Tier)
        obj = tier.held_object(key)
        assert obj is not None, "the tier does not hold the key"
        fs = open_filesystem(tier.settings)
        path = fs._strip_protocol(f"{tier.settings.protocol}://{obj.name}")
        data = bytearray(fs.cat_file(path))
        member = obj.members[key]
        fs.pipe_file(path, bytes(change(data, member.offset, member.length)))

    def corrupt(self, tier: SecondaryTier, key: bytes) -> None:
        def flip(data: bytearray, offset: int, length: int) -> bytearray:
            data[offset + length - self.block_bytes // 2] ^= 0xFF  # a byte of the block
            return data

        self._rewrite(tier, key, flip)

    def truncate(self, tier: SecondaryTier, key: bytes) -> None:
        if self.packing == "segments":
            # Cutting a segment loses every record after the cut as well, which the
            # suite's test (the cut key fails alone) cannot allow; test_corruption
            # covers cut segments.
            raise NotImplementedError

        def cut(data: bytearray, offset: int, length: int) -> bytearray:
            return data[:offset + length - self.block_bytes // 2]

        self._rewrite(tier, key, cut)


class TestMemoryUrl(_S3Conformance):
    pass


class TestMemoryUrlSegments(_S3Conformance):
    packing = "segments"


class TestMoto(_S3Conformance):
    server_kind = "moto"


class TestSeaweedFS(_S3Conformance):
    server_kind = "seaweedfs"


class TestSeaweedFSSegments(_S3Conformance):
    server_kind = "seaweedfs"
    packing = "segments"


class TestRclone(_S3Conformance):
    server_kind = "rclone"


def test_memory_urls_share_one_process_wide_store() -> None:
    """What the memory:// classes rely on for restart and sibling."""
    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    other = fsspec.filesystem("memory", skip_instance_cache=True)
    fs.pipe_file("/kvtiers-check/x", b"123")
    assert other.cat_file("/kvtiers-check/x") == b"123"
    fs.rm_file("/kvtiers-check/x")
