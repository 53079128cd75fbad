"""`KvtiersHiCacheStorage`: a kvtiers tier stack as SGLang HiCache's L3 storage.

SGLang builds it through its `dynamic` storage backend::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtiers",
        "module_path": "kvtiers_sglang.backend", "class_name": "KvtiersHiCacheStorage",
        "interface_v1": 1, "secondary_tiers": [{"type": "fs", "root_dir": "/nvme/kv"}]}'

as `KvtiersHiCacheStorage(storage_config, kwargs)`; the options are read and
validated then (`kvtiers_sglang.options`), the tiers are built when SGLang registers
its host pool (`register_mem_pool_host`): the pool's geometry is the namespace's
(`kvtiers_sglang.identity`) and its buffer the pool the tiers read and write in
place (`kvtiers_sglang.pages`).

What maps to what: SGLang's page hash -> kvtiers keys (`kvtiers_sglang.keys`: one
per half page); `batch_get_v1` / `batch_set_v1` (`interface_v1`) -> load / store
jobs on the host pages themselves; `get` / `set` / `batch_*` (SGLang's generic path,
flat page tensors) -> the same jobs on blocks lent for the call, copied once;
`exists` / `batch_exists` -> the tiers' lookups (the leading run of pages found, a
probing tier waited for at most `exists_wait_s`); `get_stats` -> SGLang's storage
metrics; `close` -> the tiers drained and closed. Every call returns what SGLang
expects - a v1 call a list of one bool per key - whatever fails inside: a failure is
a miss (`False`, `None`, 0), never an exception in SGLang's threads, whose death
would turn L3 off for the life of the process.

Threads: SGLang's (its prefetch and backup threads, several at once); each call
blocks until its jobs end, at most `job_timeout_s` plus a grace (`TierStack`).
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvtiers_sglang.versions import require_sglang

require_sglang()

import torch  # noqa: E402
from kvtiers import BlockKey  # noqa: E402
from kvtiers.metrics import MetricsRecorder  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvtiers_sglang.build import build_stack  # noqa: E402
from kvtiers_sglang.identity import namespace_for  # noqa: E402
from kvtiers_sglang.keys import block_keys  # noqa: E402
from kvtiers_sglang.options import BackendOptions, read_options  # noqa: E402
from kvtiers_sglang.pages import (  # noqa: E402
    LayoutError,
    PageShape,
    PagesView,
    host_view,
    page_shape,
    page_slots,
)
from kvtiers_sglang.stack import TierStack  # noqa: E402

log = logging.getLogger(__name__)
_T = TypeVar("_T")
#: staging buffers the generic path keeps for reuse (two: SGLang's prefetch and
#: backup threads)
SPARE_BUFFERS = 2


class KvtiersHiCacheStorage(HiCacheStorage):
    """See the module docstring. `kvtiers_stats()` gives each tier's counters and
    the bridge's own; `metrics` is the `MetricsRecorder` the tiers report to."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None):
        self.storage_config = storage_config
        self.options: BackendOptions = read_options(storage_config.extra_config)
        self.is_mla = bool(storage_config.is_mla_model)
        self.is_writer = bool(getattr(storage_config, "is_storage_writer", True))
        self.metrics = MetricsRecorder()
        self.stack: TierStack | None = None
        self.shape: PageShape | None = None
        self.view: PagesView | None = None
        self.in_place = False  # the host pages are the pool (zero copy)
        self._num_pages = 0
        self._metrics_server: Any = None
        self._said: set[str] = set()
        self._io_lock = threading.Lock()
        self._io_records: dict[str, list[float]] = {"prefetch_pgs": [], "backup_pgs": [],
                                                   "prefetch_bandwidth": [],
                                                   "backup_bandwidth": []}
        self._spare: list[mmap.mmap] = []  # staging buffers of the generic path
        self._closed = False

    # -- the host pool: the tiers are built here ------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang's controller, once, before any I/O: build the tiers over the host
        pool. Raises `LayoutError` for a pool kvtiers cannot serve (interface_v1 on
        a layout without whole pages in place), failing SGLang's start."""
        super().register_mem_pool_host(mem_pool_host)
        shape = page_shape(mem_pool_host, self.is_mla)
        if self.options.interface_v1:
            view = host_view(mem_pool_host, shape)
            self.in_place = True
        else:
            try:
                view = host_view(mem_pool_host, shape)
                self.in_place = True
            except LayoutError:  # the generic path serves it, through lent blocks
                view = PagesView.unbacked(shape.block_bytes)
        namespace = namespace_for(self.storage_config, shape, self.options.config.model)
        self.stack = build_stack(self.options, view, namespace, self.metrics)
        self.shape, self.view = shape, view
        self._num_pages = view.num_slots // shape.parts if self.in_place else 0
        port = self.options.metrics_port
        if port is not None and self.storage_config.tp_rank == 0:
            self._serve_metrics(port)
        log.info(
            "kvtiers L3 storage: %s over SGLang's host pool (%s, %d pages of %d bytes%s), "
            "namespace %s", ", ".join(self.stack.names) or "no tiers", shape.layout,
            self._num_pages, shape.page_bytes, ", in place" if self._num_pages else "",
            namespace,
        )

    def _serve_metrics(self, port: int) -> None:
        from kvtiers.metrics import MetricsExporter

        self._metrics_server = MetricsExporter(self.metrics).serve(port)
        log.info("kvtiers L3 storage: metrics at %s", self._metrics_server.url)

    # -- the zero-copy path (interface_v1) -------------------------------------------

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._listed("batch_get_v1", keys, lambda: self._v1(keys, host_indices, True))

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        if not self.is_writer:  # MLA: another rank stores the one copy of each page
            return [True] * len(keys)
        return self._listed("batch_set_v1", keys, lambda: self._v1(keys, host_indices, False))

    def _v1(self, keys: list[str], host_indices: torch.Tensor, load: bool) -> list[bool]:
        stack, shape = self.stack, self.shape
        if stack is None or shape is None or not keys:
            return [False] * len(keys)
        slots = page_slots(host_indices, len(keys), shape, self._num_pages)
        if slots is None:
            self._say_once("indices", "kvtiers L3 storage: host indices that are not whole "
                           "pages of the host pool; those calls are misses")
            return [False] * len(keys)
        return self._pages(keys, slots, load)

    def _pages(self, keys: Sequence[str], slots: Sequence[Sequence[int]], load: bool) -> list[bool]:
        """Load or store pages `keys[i]` at slots `slots[i]`: True where every block
        of the page was moved. A key given twice is moved once (its later copies
        are False on a load, the first one's outcome on a store)."""
        assert self.stack is not None and self.shape is not None
        t0 = time.perf_counter()
        parts = self.shape.parts
        flat_keys: list[BlockKey] = []
        flat_slots: list[int] = []
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in first:
                continue
            first[key] = i
            flat_keys.extend(block_keys(key, parts))
            flat_slots.extend(slots[i])
        op = self.stack.load if load else self.stack.store
        moved = op(flat_keys, flat_slots)
        page_ok = [all(moved[j * parts:(j + 1) * parts]) for j in range(len(first))]
        position = {key: j for j, key in enumerate(first)}
        out = [
            page_ok[position[key]] if first[key] == i or not load else False
            for i, key in enumerate(keys)
        ]
        self._record(load, sum(out), time.perf_counter() - t0)
        return out

    # -- the generic path (flat page tensors) ----------------------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[Any]:
        targets = list(target_locations or [None] * len(keys))
        return self._guarded("batch_get", [None] * len(keys),
                             lambda: self._generic_get(keys, targets))

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        if not self.is_writer:
            return True
        items = list(values or [])
        return self._guarded("batch_set", False, lambda: self._generic_set(keys, items))

    def _page_bytes(self, tensor: Any) -> memoryview | None:
        """The bytes of a flat page tensor as a writable view of its memory, or None
        when it is not one whole CPU page."""
        assert self.shape is not None
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return None
        size = tensor.numel() * tensor.element_size()
        if not tensor.is_contiguous() or size != self.shape.page_bytes:
            return None
        return tensor.view(torch.uint8).reshape(-1).numpy().data.cast("B")

    def _lend_staging(self, count: int) -> tuple[mmap.mmap, list[list[int]]]:
        """A page-aligned buffer of `count` pages lent to the view: each page's
        slots. A spare one is reused (no page faults); `_return_staging` keeps it
        for the next call unless a job of this call was abandoned (a tier may still
        write into it: then it is dropped, never read again)."""
        assert self.view is not None and self.shape is not None
        size = self.shape.block_bytes
        parts = self.shape.parts
        need = max(count * parts * size, 1)
        with self._io_lock:
            fits = [b for b in self._spare if len(b) >= need]
            buf = fits[0] if fits else mmap.mmap(-1, need)
            if fits:
                self._spare.remove(buf)
        mv = memoryview(buf)
        blocks = [mv[b * size:(b + 1) * size] for b in range(count * parts)]
        lent = self.view.lend(blocks)
        return buf, [lent[i * parts:(i + 1) * parts] for i in range(count)]

    def _return_staging(self, buf: mmap.mmap, slots: list[list[int]], abandoned: int) -> None:
        assert self.view is not None and self.stack is not None
        self.view.give_back([s for page in slots for s in page])
        if self.stack.counters.abandoned_jobs == abandoned:
            with self._io_lock:
                self._spare = [buf, *self._spare][:SPARE_BUFFERS]

    def _generic_get(self, keys: list[str], targets: list[Any]) -> list[Any]:
        if self.stack is None or self.view is None or self.shape is None:
            return [None] * len(keys)
        views = [self._page_bytes(t) for t in targets]
        usable = [i for i, v in enumerate(views) if v is not None]
        out: list[Any] = [None] * len(keys)
        if not usable:
            return out
        abandoned = self.stack.counters.abandoned_jobs
        buf, slots = self._lend_staging(len(usable))
        try:
            ok = self._pages([keys[i] for i in usable], slots, True)
            stage = memoryview(buf)
            size = self.shape.page_bytes
            for n, i in enumerate(usable):
                if ok[n]:
                    dst = views[i]
                    assert dst is not None
                    dst[:] = stage[n * size:(n + 1) * size]
                    out[i] = targets[i]
        finally:
            self._return_staging(buf, slots, abandoned)
        return out

    def _generic_set(self, keys: list[str], values: list[Any]) -> bool:
        if self.stack is None or self.view is None or self.shape is None:
            return False
        if len(values) != len(keys):
            return False
        sources = []
        for value in values:
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                value = value.contiguous()
            src = self._page_bytes(value)
            if src is None:
                return False
            sources.append(src)
        abandoned = self.stack.counters.abandoned_jobs
        buf, slots = self._lend_staging(len(keys))
        try:
            stage = memoryview(buf)
            size = self.shape.page_bytes
            for n, src in enumerate(sources):
                stage[n * size:(n + 1) * size] = src
            return all(self._pages(keys, slots, False))
        finally:
            self._return_staging(buf, slots, abandoned)

    # -- existence --------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """The number of pages, from the first, the tiers hold; waits at most
        `exists_wait_s` for tiers still probing."""
        return self._guarded("batch_exists", 0, lambda: self._leading(keys))

    def _leading(self, keys: list[str]) -> int:
        if self.stack is None or self.shape is None:
            return 0
        parts = self.shape.parts
        return self.stack.leading_pages([block_keys(k, parts) for k in keys])

    # -- stats, clear, close ------------------------------------------------------------

    def _record(self, load: bool, pages: int, seconds: float) -> None:
        if not self.storage_config.enable_storage_metrics or self.shape is None or pages == 0:
            return
        gb = pages * self.shape.page_bytes / 1e9
        with self._io_lock:
            which = "prefetch" if load else "backup"
            self._io_records[f"{which}_pgs"].append(pages)
            self._io_records[f"{which}_bandwidth"].append(gb / max(seconds, 1e-9))

    def get_stats(self) -> Any:
        """SGLang's `StorageMetrics` of the calls since the last one (pages per call,
        GB/s), or None where SGLang's metrics module cannot be imported."""
        with self._io_lock:
            records = {k: list(v) for k, v in self._io_records.items()}
            for v in self._io_records.values():
                v.clear()
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:  # noqa: BLE001 - SGLang then makes an empty one
            return None
        metrics = StorageMetrics()
        metrics.prefetch_pgs.extend(int(x) for x in records["prefetch_pgs"])
        metrics.backup_pgs.extend(int(x) for x in records["backup_pgs"])
        metrics.prefetch_bandwidth.extend(records["prefetch_bandwidth"])
        metrics.backup_bandwidth.extend(records["backup_bandwidth"])
        return metrics

    def kvtiers_stats(self) -> dict[str, Any]:
        """Each tier's counters (`TierStats` as dicts) and the bridge's own."""
        if self.stack is None:
            return {"tiers": {}, "bridge": {}}
        tiers = {name: s.as_dict() for name, s in self.stack.stats().items()}
        return {"tiers": tiers, "bridge": self.stack.counters_snapshot(),
                "breaker_open": self.stack.breaker_open()}

    def clear(self) -> None:
        """SGLang's "flush the L3 cache": kvtiers tiers keep their blocks (they are
        bounded and evict by themselves; an fs root is emptied with kvtiers' own
        tools); said once in the log."""
        self._say_once("clear", "kvtiers L3 storage: clear() leaves the tiers' blocks "
                       "in place (they are bounded and evict by themselves)")

    def close(self) -> None:
        """Drain the tiers' writes (at most job_timeout_s), close them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.stack is not None:
            self.stack.close()
        if self._metrics_server is not None:
            self._metrics_server.close()

    # -- every call returns what SGLang expects ------------------------------------------

    def _listed(self, call: str, keys: Sequence[str], fn: Callable[[], list[bool]]) -> list[bool]:
        """`fn()`, else one False per key: a v1 call's answer is always a list of
        `len(keys)` bools (SGLang's controller thread dies on anything else)."""
        n = len(keys)
        out = self._guarded(call, None, fn)
        if not isinstance(out, list) or len(out) != n:
            return [False] * n
        return [bool(x) for x in out]

    def _guarded(self, call: str, fallback: _T, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a failure is a miss, never SGLang's crash
            self._say_once(f"{call}:{type(exc).__name__}",
                           f"kvtiers L3 storage: {call} failed ({type(exc).__name__}: "
                           f"{exc}); answered as a miss (said once per kind)")
            return fallback

    def _say_once(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            log.warning(message)
