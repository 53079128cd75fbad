"""`ObjectStore`: the handful of object operations the tier makes, as coroutines on
one event loop, over any fsspec filesystem.

For S3 the calls go to s3fs' aiobotocore client itself, not through s3fs' file
methods: those add a HEAD before whole-object reads, listings of directory markers
around deletes and a retry loop of their own with sleeps (the tier has deadlines
and a breaker), and cost ~10-20% of throughput on small blocks (docs/tiers/s3.md).
With `boto3_threads` (the tier's `client: "boto3"`), the same calls go to boto3 on
a thread pool instead, awaited from the loop. Errors are translated the way s3fs
does (`FileNotFoundError` for a missing key).

put (one request per object), get (whole, or one byte range: never a HEAD first),
size (HEAD), delete (bulk where the store has it: S3's DeleteObjects, 1000 names a
request), and a listing of every object under a prefix with its size and time
(S3: ListObjectsV2 itself; past one page, the shards concurrently). A synchronous
filesystem (memory://, file://) is wrapped by fsspec's `AsyncFileSystemWrapper`
(its calls run on threads).

Errors are classified once, here: `classify(exc)` maps an exception to the
`FailureReason` a job reports (`missing`, `timeout`, else `io`), and `describe`
gives a one-line message, scrubbed of credentials, for logs.

Runs on the loop thread that owns the filesystem; nothing here blocks it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvtiers.sdk import FailureReason

from kvtiers_s3.client.body import Buffer, PartsBody
from kvtiers_s3.settings import S3Settings

__all__ = ["ObjectInfo", "ObjectStore", "classify", "describe", "refused"]

T = TypeVar("T")
LIST_CONCURRENCY = 32
#: a listing expected to take at most this many pages is read page after page
SEQUENTIAL_PAGES = 8


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    name: str  # as the tier names it (`ObjectStore.path`)
    size: int
    mtime: float | None  # seconds since the epoch, when the store says
    etag: str | None = None  # the store's ETag, when it gives one (changes with the bytes)


def classify(exc: BaseException) -> FailureReason:
    """The job failure an exception of the data path stands for."""
    if isinstance(exc, FileNotFoundError):
        return FailureReason.MISSING
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return FailureReason.TIMEOUT
    name = type(exc).__name__
    if "Timeout" in name:  # botocore's ConnectTimeoutError / ReadTimeoutError
        return FailureReason.TIMEOUT
    return FailureReason.IO


def refused(exc: BaseException) -> bool:
    """Whether the server answered the request with a client error (4xx): it was
    refused whole, nothing of it can take effect later. A timeout, a dropped
    connection or a server error (5xx) leaves the outcome unknown (False)."""
    cause = exc if exc.__cause__ is None else exc.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return isinstance(status, int) and 400 <= status < 500


def describe(exc: BaseException, settings: S3Settings) -> str:
    """`Type: message`, one line, shortened, credentials scrubbed."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return settings.scrub(text[:500])


def _mtime(info: dict[str, Any]) -> float | None:
    for field in ("LastModified", "mtime", "created", "last_modified"):
        value = info.get(field)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _etag(info: dict[str, Any]) -> str | None:
    for field in ("ETag", "etag", "e_tag"):
        value = info.get(field)
        if isinstance(value, str) and value:
            return value.strip('"')
    return None


class ObjectStore:
    """The tier's objects under `settings.root`, through `fs` (an async fsspec
    filesystem bound to the running loop: `connect.open_filesystem(settings,
    loop=...)`; a synchronous one is wrapped)."""

    def __init__(self, fs: Any, settings: S3Settings, *, boto3_threads: int = 0):
        if not getattr(fs, "async_impl", False):
            from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

            fs = AsyncFileSystemWrapper(fs, asynchronous=True)
        self.fs = fs
        self.settings = settings
        #: objects per listing page (S3 allows 1000; tests make it small)
        self.page_size = 1000
        self.sequential_pages = SEQUENTIAL_PAGES
        self._s3: Any = None  # s3fs' aiobotocore client, once opened
        # boto3 on threads instead, for S3 (`client: boto3`)
        self._boto3 = _Boto3(settings, boto3_threads) if settings.is_s3 and boto3_threads else None
        # Names are kept without the protocol's leading slash (file:// lists "/x").
        self._lead = "/" if settings.root.startswith("/") else ""

    def path(self, name: str) -> str:
        return self._lead + name.lstrip("/")

    async def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = await self.fs.set_session()
        return self._s3

    async def _call(self, method: str, *, read: bool = False, **kwargs: Any) -> Any:
        """One S3 request; `read`: return the body's bytes instead of the response."""
        from botocore.exceptions import ClientError
        from s3fs.errors import translate_boto_error

        try:
            if self._boto3 is not None:
                return await self._boto3.call(method, read, kwargs)
            resp = await getattr(await self._client(), method)(**kwargs)
            if not read:
                return resp
            async with resp["Body"] as body:
                return await body.read()
        except ClientError as exc:
            raise translate_boto_error(exc) from exc

    @staticmethod
    def _split(name: str) -> tuple[str, str]:
        bucket, _, key = name.lstrip("/").partition("/")
        return bucket, key

    async def put(self, name: str, data: bytes | bytearray | memoryview) -> None:
        body = bytes(data) if isinstance(data, memoryview) else data
        if self.settings.is_s3:
            bucket, key = self._split(name)
            await self._call("put_object", Bucket=bucket, Key=key, Body=body)
        else:
            await self.fs._pipe_file(self.path(name), body)

    async def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object, or bytes [start, end) of it (fewer where the object is shorter)."""
        if not self.settings.is_s3:
            if start is None and end is None:
                whole: bytes = await self.fs._cat_file(self.path(name))
                return whole
            part: bytes = await self.fs._cat_file(self.path(name), start=start or 0, end=end)
            return part
        bucket, key = self._split(name)
        extra = {}
        if start is not None or end is not None:
            extra["Range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        data: bytes = await self._call("get_object", read=True, Bucket=bucket, Key=key, **extra)
        return data

    async def info(self, name: str) -> ObjectInfo | None:
        """Size and time of the object, or None when there is no such object."""
        if self.settings.is_s3:
            bucket, key = self._split(name)
            try:
                head = await self._call("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            modified = head.get("LastModified")
            return ObjectInfo(name, int(head.get("ContentLength", 0)),
                              modified.timestamp() if modified is not None else None,
                              _etag(head))
        try:
            found = await self.fs._info(self.path(name))
        except FileNotFoundError:
            return None
        if found.get("type") == "directory":
            return None
        return ObjectInfo(name, int(found.get("size") or 0), _mtime(found), _etag(found))

    @property
    def streams(self) -> bool:
        """`stream` and `put_made` are available (S3 through boto3)."""
        return self._boto3 is not None

    async def stream(self, name: str, start: int, end: int,
                     consume: Callable[[Any], T]) -> T:
        """GET bytes [start, end) of the object and hand the body (a file-like with
        `read(n)` and `readinto(buffer)`) to `consume`, on the request's thread:
        the bytes go where `consume` puts them (a pool slot), not through a copy.
        If the call is cancelled, the thread still runs to its end before the
        cancellation goes on: what `consume` writes to is never written later."""
        from botocore.exceptions import ClientError
        from s3fs.errors import translate_boto_error

        if self._boto3 is None:
            raise NotImplementedError("stream needs the boto3 client")
        bucket, key = self._split(name)
        client = self._boto3.client

        def run() -> T:
            try:
                resp = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            except ClientError as exc:
                raise translate_boto_error(exc) from exc
            body = resp["Body"]
            try:
                return consume(body)
            finally:
                body.close()

        return await _to_the_end(self._boto3.pool, run)

    async def put_made(self, name: str, make: Callable[[], Sequence[Buffer] | None]) -> bool:
        """PUT the body made of the parts `make()` returns, both on one request
        thread (S3 through boto3): the parts are sent where they lie (a
        `PartsBody`: the slots themselves, no copy into one buffer), with no
        hand-off between threads. Nothing is put when `make` returns None
        (False). Cancelled, the thread still runs to its end before the
        cancellation goes on: what `make` and the body read is never read later."""
        from botocore.exceptions import ClientError
        from s3fs.errors import translate_boto_error

        if self._boto3 is None:
            raise NotImplementedError("put_made needs the boto3 client")
        bucket, key = self._split(name)
        client = self._boto3.client

        def run() -> bool:
            parts = make()
            if parts is None:
                return False
            body = PartsBody(parts)
            try:
                client.put_object(Bucket=bucket, Key=key, Body=body)
            except ClientError as exc:
                raise translate_boto_error(exc) from exc
            finally:
                body.close()
            return True

        return await _to_the_end(self._boto3.pool, run)

    async def size(self, name: str) -> int | None:
        """The object's size, or None when there is no such object."""
        if self.settings.is_s3:
            bucket, key = self._split(name)
            try:
                head = await self._call("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            return int(head.get("ContentLength", 0))
        try:
            info = await self.fs._info(self.path(name))
        except FileNotFoundError:
            return None
        if info.get("type") == "directory":
            return None
        return int(info.get("size") or 0)

    async def delete(self, names: Sequence[str]) -> None:
        """Delete the objects (missing ones are no error): S3's DeleteObjects, up to
        1000 names a request, concurrently."""
        if not names:
            return
        if not self.settings.is_s3:
            async def rm(path: str) -> None:
                with contextlib.suppress(FileNotFoundError):
                    await self.fs._rm_file(path)
            await asyncio.gather(*(rm(self.path(n)) for n in names))
            return
        by_bucket: dict[str, list[str]] = {}
        for name in names:
            bucket, key = self._split(name)
            by_bucket.setdefault(bucket, []).append(key)
        await asyncio.gather(*(
            self._call("delete_objects", Bucket=bucket,
                       Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})
            for bucket, keys in by_bucket.items() for i in range(0, len(keys), 1000)))

    async def list_objects(self, prefix: str, shards: Sequence[str] = ()) -> list[ObjectInfo]:
        """Every object under `prefix` (a "directory" ending in "/"). With `shards`
        (sub-prefixes that together hold everything under it, names spread evenly), a
        listing expected to take more than `SEQUENTIAL_PAGES` pages continues as
        concurrent listings of the shards: 100 000 objects cost 100 pages, read 32 at
        a time instead of one after another."""
        if not self.settings.is_s3:
            try:
                found = await self.fs._find(self.path(prefix.rstrip("/")), detail=True)
            except FileNotFoundError:
                return []
            return [ObjectInfo(self.path(name), int(info.get("size") or 0), _mtime(info),
                               _etag(info))
                    for name, info in found.items() if info.get("type") != "directory"]
        first, more = await self._list_s3(prefix, pages=1 if shards else None)
        if not more:
            return first
        # Names are spread evenly over the shards and listed in order, so the shard
        # the first page ended in says how many pages the whole listing has.
        ordered = sorted(shards)
        reached = bisect.bisect_right(ordered, first[-1].name) if first else 0
        if -(-len(ordered) // max(1, reached)) <= self.sequential_pages:
            rest, _ = await self._list_s3(prefix, start_after=first[-1].name)
            return first + rest
        sem = asyncio.Semaphore(LIST_CONCURRENCY)

        async def one(shard: str) -> list[ObjectInfo]:
            async with sem:
                return (await self._list_s3(shard))[0]

        parts = await asyncio.gather(*(one(p) for p in shards))
        return [info for part in parts for info in part]

    async def _list_s3(self, prefix: str, pages: int | None = None,
                       start_after: str | None = None) -> tuple[list[ObjectInfo], bool]:
        """ListObjectsV2 pages, straight (s3fs' `_find` costs several requests more
        per prefix: it also looks for directory markers); at most `pages` of them.
        Also says whether more pages were left."""
        bucket, _, key_prefix = prefix.partition("/")
        out: list[ObjectInfo] = []
        token: str | None = None
        read = 0
        while True:
            extra: dict[str, Any] = {"ContinuationToken": token} if token else {}
            if start_after is not None and not token:
                extra["StartAfter"] = self._split(start_after)[1]
            page = await self._call("list_objects_v2", Bucket=bucket, Prefix=key_prefix,
                                    MaxKeys=self.page_size, **extra)
            read += 1
            for obj in page.get("Contents", ()):
                modified = obj.get("LastModified")
                out.append(ObjectInfo(f"{bucket}/{obj['Key']}", int(obj.get("Size", 0)),
                                      modified.timestamp() if modified is not None else None,
                                      _etag(obj)))
            token = page.get("NextContinuationToken")
            more = bool(page.get("IsTruncated") and token)
            if not more or (pages is not None and read >= pages):
                return out, more

    async def close(self) -> None:
        """Close the S3 client's connections (on the loop, at the tier's close)."""
        if self._boto3 is not None:
            self._boto3.close()
        if self._s3 is not None:
            client, self._s3 = self._s3, None
            await client.close()


async def _to_the_end(pool: Any, run: Callable[[], T]) -> T:
    """`run()` on a thread of `pool`, awaited. Cancelled, it waits for the thread to
    end before the cancellation goes on (what `run` touches is never touched later),
    and reads how it ended - its result or error is nobody's any more, and asyncio
    would log an error never read (a request timed out on a frozen server)."""
    fut = asyncio.get_running_loop().run_in_executor(pool, run)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        if not fut.cancelled():
            fut.exception()
        raise


class _Boto3:
    """boto3 calls on a thread pool of their own, awaited from the loop: measured
    faster than aiobotocore for large GETs (docs/tiers/s3.md). A request cancelled by
    its deadline finishes on its thread (botocore's timeouts bound it) and is
    discarded; it never touches a pool slot (the tier copies afterwards)."""

    def __init__(self, settings: S3Settings, threads: int):
        from concurrent.futures import ThreadPoolExecutor

        from kvtiers_s3.client.connect import boto3_client

        # A socket read never waits longer than a request may take.
        self.client = boto3_client(settings, max_pool_connections=threads,
                                   read_timeout=min(30.0, settings.timeout_s))
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="kvtiers-s3-boto3")

    async def call(self, method: str, read: bool, kwargs: dict[str, Any]) -> Any:
        def run() -> Any:
            resp = getattr(self.client, method)(**kwargs)
            return resp["Body"].read() if read else resp

        return await asyncio.get_running_loop().run_in_executor(self.pool, run)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()
