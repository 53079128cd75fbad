"""The on-store form of a kvtiers snapshot: a zarr v3 group on any fsspec URL (a
local directory, `memory://`, `s3://`), written and read in chunks so neither
side holds more than one chunk of blocks.

    attributes  kvtiers_snapshot (format version), namespace (fingerprint), model,
                revision, format_version, groups (geometry per KV group),
                block_bytes, checksum ("xxh3_64"), order ("hottest first"), blocks
    keys        uint8 [n, max key length], zero padded
    key_lengths uint16 [n]
    checksums   uint64 [n]   kvtiers.integrity.checksum of each block's bytes
    blocks      uint8 [n, block_bytes], chunks of whole blocks (~8 MiB), uncompressed

Needs zarr (the extra `kvtiers-core[snapshot]`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from kvtiers.errors import KvtiersError, MissingExtraError
from kvtiers.keys import BlockKey
from kvtiers.namespace import BlockGeometry, Namespace

SNAPSHOT_EXTRA = "snapshot"
SNAPSHOT_VERSION = 1
CHUNK_BYTES = 8 << 20
MAX_KEY = 256


class SnapshotError(KvtiersError):
    """A snapshot that cannot be read or does not fit where it is loaded."""


def _zarr() -> Any:
    try:
        import zarr
    except ImportError as exc:
        raise MissingExtraError(
            f"kvtiers snapshots need zarr, which cannot be imported here ({exc}): "
            f"pip install 'kvtiers-core[{SNAPSHOT_EXTRA}]'",
            extra=SNAPSHOT_EXTRA, package="zarr") from exc
    return zarr


def rows_per_chunk(block_bytes: int) -> int:
    return max(1, CHUNK_BYTES // block_bytes)


class SnapshotWriter:
    """Append blocks (`add`), then `close()`; the arrays grow a chunk at a time."""

    def __init__(self, url: str, namespace: Namespace, block_bytes: int, *,
                 storage_options: Mapping[str, Any] | None = None):
        zarr = _zarr()
        self.block_bytes = block_bytes
        self.rows = rows_per_chunk(block_bytes)
        self._group = zarr.open_group(url, mode="w", storage_options=storage_options)
        self._group.attrs.update({
            "kvtiers_snapshot": SNAPSHOT_VERSION, "namespace": namespace.fingerprint,
            "model": namespace.model, "revision": namespace.revision,
            "format_version": namespace.format_version,
            "groups": [asdict(g) for g in namespace.groups], "block_bytes": block_bytes,
            "checksum": "xxh3_64", "order": "hottest first", "blocks": 0})
        g = self._group
        self._keys = g.create_array("keys", shape=(0, MAX_KEY), chunks=(self.rows, MAX_KEY),
                                    dtype="uint8", compressors=None)
        self._lens = g.create_array("key_lengths", shape=(0,), chunks=(self.rows,),
                                    dtype="uint16", compressors=None)
        self._sums = g.create_array("checksums", shape=(0,), chunks=(self.rows,),
                                    dtype="uint64", compressors=None)
        self._blocks = g.create_array("blocks", shape=(0, block_bytes),
                                      chunks=(self.rows, block_bytes), dtype="uint8",
                                      compressors=None)
        self._pending: list[tuple[BlockKey, int, bytes]] = []
        self.count = 0

    def add(self, key: BlockKey, digest: int, data: bytes) -> None:
        if len(key) > MAX_KEY:
            raise SnapshotError(f"a key of {len(key)} bytes: snapshots hold keys up to "
                                f"{MAX_KEY} bytes")
        if len(data) != self.block_bytes:
            raise ValueError(f"a block of {len(data)} bytes, expected {self.block_bytes}")
        self._pending.append((key, digest, data))
        if len(self._pending) >= self.rows:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        n, start = len(self._pending), self.count
        end = start + n
        keys = np.zeros((n, MAX_KEY), dtype=np.uint8)
        for i, (k, _, _) in enumerate(self._pending):
            keys[i, : len(k)] = np.frombuffer(k, dtype=np.uint8)
        for arr, width in ((self._keys, MAX_KEY), (self._blocks, self.block_bytes)):
            arr.resize((end, width))
        self._lens.resize((end,))
        self._sums.resize((end,))
        self._keys[start:end] = keys
        self._lens[start:end] = np.array([len(k) for k, _, _ in self._pending], np.uint16)
        self._sums[start:end] = np.array([d for _, d, _ in self._pending], np.uint64)
        self._blocks[start:end] = np.frombuffer(
            b"".join(d for _, _, d in self._pending), np.uint8).reshape(n, self.block_bytes)
        self.count = end
        self._pending = []

    def close(self) -> None:
        self._flush()
        self._group.attrs["blocks"] = self.count


class SnapshotReader:
    """A snapshot's namespace (`namespace`) and its blocks, a chunk at a time."""

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None):
        zarr = _zarr()
        try:
            self._group = zarr.open_group(url, mode="r", storage_options=storage_options)
            attrs = self._group.attrs.asdict()
        except (FileNotFoundError, KeyError, ValueError, OSError) as exc:
            raise SnapshotError(f"{url}: not a readable kvtiers snapshot ({exc})") from exc
        if attrs.get("kvtiers_snapshot") != SNAPSHOT_VERSION:
            raise SnapshotError(f"{url}: not a kvtiers snapshot of version {SNAPSHOT_VERSION}")
        try:
            groups = tuple(BlockGeometry(**g) for g in attrs["groups"])
            self.namespace = Namespace(attrs["model"], groups, attrs.get("revision") or "",
                                       attrs["format_version"])
            self.block_bytes = int(attrs["block_bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{url}: the snapshot's attributes are damaged ({exc})") from exc
        if self.namespace.fingerprint != attrs.get("namespace"):
            raise SnapshotError(f"{url}: the snapshot's namespace {attrs.get('namespace')} "
                                "does not match its own description")
        self.url = url
        self.attrs = attrs
        self._blocks = self._group["blocks"]
        self.count = int(self._blocks.shape[0])

    def chunks(self) -> Iterator[list[tuple[BlockKey, int, memoryview]]]:
        """(key, stored checksum, block bytes) of every block, hottest first, one
        chunk of rows at a time."""
        g, rows = self._group, rows_per_chunk(self.block_bytes)
        for start in range(0, self.count, rows):
            end = min(self.count, start + rows)
            keys = np.asarray(g["keys"][start:end])
            lens = np.asarray(g["key_lengths"][start:end])
            sums = np.asarray(g["checksums"][start:end])
            data = np.ascontiguousarray(self._blocks[start:end], dtype=np.uint8).reshape(-1).data
            bb = self.block_bytes
            yield [(bytes(keys[i, : int(lens[i])]), int(sums[i]), data[i * bb : (i + 1) * bb])
                   for i in range(end - start)]


__all__ = ["SNAPSHOT_EXTRA", "SnapshotError", "SnapshotReader", "SnapshotWriter"]
