"""The on-store form of a kvtiers snapshot: a zarr v3 group on any fsspec URL (a
local directory, `memory://`, `s3://`), written and read in chunks so neither
side holds more than one chunk of blocks.

    attributes  kvtiers_snapshot (format version), namespace (fingerprint), model,
                revision, format_version, groups (geometry per KV group),
                block_bytes, checksum ("xxh3_64"), order ("hottest first"),
                hottest_by (what "hottest" meant where it was saved: "recency",
                the policy's order of use; or "stored_at", newest first), source
                (the tier's name, or "cpu" for the CPU pool), blocks
    keys        uint8 [n, max key length], zero padded
    key_lengths uint16 [n]
    checksums   uint64 [n]   kvtiers.sdk.integrity.checksum of each block's bytes
    blocks      uint8 [n, block_bytes], chunks of whole blocks (~8 MiB), uncompressed

Needs zarr (the extra `kvtiers-core[snapshot]`). `storage_options` are fsspec's
(for `s3://`: `key`, `secret`, `endpoint_url`, ...); without them fsspec and the
S3 client read their usual environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`,
`FSSPEC_S3_*`). Errors opening a store never repeat the options (credentials).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.errors import MissingExtraError
from kvtiers.ops.snapshot_errors import SnapshotError, describe_error

SNAPSHOT_EXTRA = "snapshot"
SNAPSHOT_VERSION = 1
CHUNK_BYTES = 8 << 20
MAX_KEY = 256


def _zarr() -> Any:
    try:
        import zarr
    except ImportError as exc:
        raise MissingExtraError(
            f"kvtiers snapshots need zarr, which cannot be imported here ({exc}): "
            f"pip install 'kvtiers-core[{SNAPSHOT_EXTRA}]'",
            extra=SNAPSHOT_EXTRA, package="zarr") from exc
    return zarr


def require_zarr() -> None:
    """`MissingExtraError` naming the extra when zarr cannot be imported."""
    _zarr()


def rows_per_chunk(block_bytes: int) -> int:
    return max(1, CHUNK_BYTES // block_bytes)


class SnapshotWriter:
    """Append blocks (`add`), then `close()`; the arrays grow a chunk at a time.

    The snapshot is written to a sibling of `url` and put in place by `close()`
    only once complete (`kvtiers.ops.snapshot_target`): a failure before that -
    `abort()`, or leaving a `with` block by an exception - leaves whatever was at
    `url` as it was. `url` must be absent, an empty directory, or (with
    `overwrite`) a kvtiers snapshot; anything else is refused
    (`SnapshotTargetError`, a `SnapshotError`) before anything is written."""

    def __init__(self, url: str, namespace: Namespace, block_bytes: int, *,
                 storage_options: Mapping[str, Any] | None = None,
                 hottest_by: str = "recency", source: str = "", overwrite: bool = False):
        from kvtiers.ops.snapshot_target import Staging

        zarr = _zarr()
        self.block_bytes = block_bytes
        self.rows = rows_per_chunk(block_bytes)
        self.url = url
        try:
            self._staging = Staging(url, storage_options, overwrite=overwrite)
        except SnapshotError:
            raise
        except Exception as exc:
            raise SnapshotError(f"{url}: cannot create a snapshot there "
                                f"({describe_error(exc, storage_options)})") from exc
        try:
            self._create(zarr, namespace, hottest_by, source)
        except Exception as exc:
            self._staging.abort()
            raise SnapshotError(f"{url}: cannot create a snapshot there "
                                f"({describe_error(exc, storage_options)})") from exc
        self._pending: list[tuple[BlockKey, int, bytes]] = []
        self.count = 0

    def _create(self, zarr: Any, namespace: Namespace, hottest_by: str, source: str) -> None:
        self._group = zarr.open_group(self._staging.zarr_store(), mode="w-")
        self._group.attrs.update({
            "kvtiers_snapshot": SNAPSHOT_VERSION, "namespace": namespace.fingerprint,
            "model": namespace.model, "revision": namespace.revision,
            "format_version": namespace.format_version,
            "groups": [asdict(g) for g in namespace.groups], "block_bytes": self.block_bytes,
            "checksum": "xxh3_64", "order": "hottest first", "hottest_by": hottest_by,
            "source": source, "blocks": 0})
        g, rows, block_bytes = self._group, self.rows, self.block_bytes
        self._keys = g.create_array("keys", shape=(0, MAX_KEY), chunks=(rows, MAX_KEY),
                                    dtype="uint8", compressors=None)
        self._lens = g.create_array("key_lengths", shape=(0,), chunks=(rows,),
                                    dtype="uint16", compressors=None)
        self._sums = g.create_array("checksums", shape=(0,), chunks=(rows,),
                                    dtype="uint64", compressors=None)
        self._blocks = g.create_array("blocks", shape=(0, block_bytes),
                                      chunks=(rows, block_bytes), dtype="uint8",
                                      compressors=None)

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
        """Write what is pending and put the complete snapshot in place of `url`."""
        try:
            self._flush()
            self._group.attrs["blocks"] = self.count
        except BaseException:
            self.abort()
            raise
        self._staging.commit()

    def abort(self) -> None:
        """Drop what was written; `url` stays as it was."""
        self._staging.abort()

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            self.abort()


class SnapshotReader:
    """A snapshot's namespace (`namespace`) and its blocks, a chunk at a time."""

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None):
        from kvtiers.ops.snapshot_target import local_path

        zarr = _zarr()
        path = local_path(url)  # a plain path or file://: zarr's local store
        try:
            self._group = (zarr.open_group(url, mode="r",
                                           storage_options=_options(storage_options))
                           if path is None else zarr.open_group(path, mode="r"))
            attrs = self._group.attrs.asdict()
        except Exception as exc:
            raise SnapshotError(f"{url}: not a readable kvtiers snapshot "
                                f"({describe_error(exc, storage_options)})") from exc
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

    def chunks(self, *, first: int | None = None, coldest_first: bool = False
               ) -> Iterator[list[tuple[BlockKey, int, memoryview]]]:
        """(key, stored checksum, block bytes) of every block (only the `first`
        hottest), hottest first, one chunk of rows at a time; `coldest_first`: the
        same rows the other way round (chunks read from the end)."""
        g, rows = self._group, rows_per_chunk(self.block_bytes)
        count = self.count if first is None else max(0, min(first, self.count))
        starts = range(0, count, rows)
        for start in (reversed(starts) if coldest_first else starts):
            end = min(count, start + rows)
            keys = np.asarray(g["keys"][start:end])
            lens = np.asarray(g["key_lengths"][start:end])
            sums = np.asarray(g["checksums"][start:end])
            data = np.ascontiguousarray(self._blocks[start:end], dtype=np.uint8).reshape(-1).data
            bb = self.block_bytes
            out = [(bytes(keys[i, : int(lens[i])]), int(sums[i]), data[i * bb : (i + 1) * bb])
                   for i in range(end - start)]
            yield out[::-1] if coldest_first else out


def _options(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if options is None else dict(options)


__all__ = ["SNAPSHOT_EXTRA", "SnapshotError", "SnapshotReader", "SnapshotWriter", "describe_error",
           "require_zarr"]
