"""DeviceSwapper end to end: every layout, random data, poisoned destinations, random
permutations, concurrency, TP, several KV groups, failures. Each test runs on the
CPU backend and, where CUDA is present, on the CUDA backend with every method."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from kvtiers.contract.jobs import FailureReason, JobResult
from kvtiers.contract.pool_view import round_up
from kvtiers.pool import CpuPool
from kvtiers.swap import DeviceSwapper, KVLayout, SwapResult

from tests.swap.conftest import CUDA, collect, cuda_only
from tests.swap.kv import KINDS, Engine, make_engine, random_pool

Backend = tuple[str, str | None]  # (device, CUDA copy method)

BACKENDS = [
    pytest.param(("cpu", None), id="cpu"),
    *[
        pytest.param(("cuda", m), id=f"cuda-{m}", marks=cuda_only)
        for m in ("dma", "kernel", "staged", "auto")
    ],
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    param: Backend = request.param
    return param


def names(values: Iterable[object]) -> list[object]:
    """A result's block names as plain objects: without keys at submit, the swapper
    names blocks by their index in the job (ints), where `JobResult` says keys."""
    return list(values)


def failures(result: JobResult) -> dict[object, FailureReason]:
    """`result.failed` by block name (see `names`)."""
    return {name: reason for name, reason in result.failed.items()}


def swapper_for(
    backend: Backend,
    layouts: KVLayout | Sequence[KVLayout],
    pools: Any,
    rank: int = 0,
    **kw: Any,
) -> DeviceSwapper:
    device, method = backend
    if device == "cuda":
        kw.setdefault("method", method)
        kw.setdefault("staging_bytes", 1 << 20)
    return DeviceSwapper(layouts, pools, rank, **kw)


def pool_for(
    layout: KVLayout, num_slots: int, gen: torch.Generator, device: str, extra: int = 0
) -> torch.Tensor:
    return random_pool(num_slots, round_up(layout.block_bytes + extra), gen, pin=device == "cuda")


def store_load_check(
    eng: Engine,
    swap: DeviceSwapper,
    pool: torch.Tensor,
    gen: torch.Generator,
    blocks: int,
    job_base: int = 0,
) -> torch.Tensor:
    """Store `blocks` random blocks into random slots, check the slots byte for byte
    (and that nothing else changed), poison the engine, load them into other random
    pages and check those pages (and that nothing else changed)."""
    n = eng.layout.pages_per_block
    rank_bytes = eng.layout.rank_bytes
    rank_off = swap.rank * rank_bytes
    perm = torch.randperm(eng.num_pages, generator=gen)
    pages = perm[: blocks * n].view(blocks, n)
    slots = torch.randperm(pool.shape[0], generator=gen)[:blocks]
    before = pool.clone()
    swap.submit_store(job_base + 1, pages.numpy(), slots.numpy())
    (res,) = collect(swap, [job_base + 1]).values()
    assert res.success, res.error
    assert res.direction == "store" and res.bytes_moved == blocks * rank_bytes
    expected = before.clone()
    for b in range(blocks):
        want = eng.block_bytes_of(pages[b].tolist()).cpu()
        expected[slots[b], rank_off : rank_off + rank_bytes] = want
    assert torch.equal(pool, expected), "store wrote wrong bytes or bytes outside its blocks"

    # Load into other pages of a poisoned engine.
    eng.poison(0)
    targets = torch.randperm(eng.num_pages, generator=gen)[: blocks * n].view(blocks, n)
    order = torch.randperm(blocks, generator=gen)
    swap.submit_load(job_base + 2, slots[order].numpy(), targets.numpy())
    (res,) = collect(swap, [job_base + 2]).values()
    assert res.success, res.error
    for b in range(blocks):
        got = eng.block_bytes_of(targets[b].tolist()).cpu()
        assert torch.equal(got, expected[slots[order[b]], rank_off : rank_off + rank_bytes])
    untouched = set(range(eng.num_pages)) - set(targets.reshape(-1).tolist())
    for p in untouched:
        assert not eng.page_bytes_of(p).any(), f"load wrote page {p}"
    return slots


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pages_per_block", [1, 2])
def test_round_trip_every_layout(
    backend: Backend, kind: str, pages_per_block: int, gen: torch.Generator
) -> None:
    device = backend[0]
    eng = make_engine(kind, device=device, pages_per_block=pages_per_block)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 9, gen, device, extra=100)
    with swapper_for(backend, eng.layout, pool) as swap:
        store_load_check(eng, swap, pool, gen, blocks=5)
        assert swap.pending() == 0


def test_fp32_and_odd_sizes(backend: Backend, gen: torch.Generator) -> None:
    # head_size 3 of float32: 12-byte rows, fragments not multiples of 8 bytes.
    device = backend[0]
    if device == "cuda" and backend[1] in ("kernel", "staged"):
        pytest.skip("the kernels need 8-byte words; auto/dma cover odd sizes on CUDA")
    eng = make_engine(
        "kv_first", device=device, dtype=torch.float32, head_size=3, tokens=3, heads=1
    )
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 6, gen, device)
    with swapper_for(backend, eng.layout, pool) as swap:
        store_load_check(eng, swap, pool, gen, blocks=4)


def test_every_page_and_slot_in_random_order(backend: Backend, gen: torch.Generator) -> None:
    device = backend[0]
    eng = make_engine("page_first", device=device, pages=16, layers=2)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 16, gen, device)
    with swapper_for(backend, eng.layout, pool) as swap:
        store_load_check(eng, swap, pool, gen, blocks=16)


def test_consecutive_pages_into_consecutive_slots(
    backend: Backend, gen: torch.Generator
) -> None:
    """Coalescing across blocks must still put every byte in its place."""
    device = backend[0]
    eng = make_engine("cross", device=device, pages=10)
    eng.fill_random(gen)
    # slot_bytes == block_bytes (no padding): block b+1 follows block b in the pool.
    nbytes = eng.layout.block_bytes
    pool = torch.randint(0, 256, (10, nbytes), dtype=torch.uint8, generator=gen)
    if device == "cuda":
        pool = pool.pin_memory()
    with swapper_for(backend, eng.layout, pool) as swap:
        swap.submit_store(1, np.arange(2, 8), np.arange(1, 7))
        assert collect(swap, [1])[1].success
        for b in range(6):
            assert torch.equal(pool[1 + b], eng.page_bytes_of(2 + b).cpu())


@pytest.mark.parametrize("chunk", [1, 1024])
def test_jobs_larger_than_the_copy_buffers(
    backend: Backend, chunk: int, gen: torch.Generator
) -> None:
    """Many chunks per job: the CPU copy buffer (one row, or 8 rows shared by two
    threads) and the CUDA staging buffer hold only a couple of blocks."""
    device = backend[0]
    eng = make_engine("page_first", device=device, pages=24, pages_per_block=2)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 12, gen, device)
    kw = {"staging_bytes": 2 * eng.layout.rank_bytes, "cpu_chunk_bytes": chunk}
    with swapper_for(backend, eng.layout, pool, **kw) as swap:
        store_load_check(eng, swap, pool, gen, blocks=11)


def test_tp_ranks_write_disjoint_parts_of_one_slot(
    backend: Backend, gen: torch.Generator
) -> None:
    device = backend[0]
    tp = 2
    engines = [make_engine("kv_first", device=device, tp_size=tp) for _ in range(tp)]
    for e in engines:
        e.fill_random(gen)
    layout = engines[0].layout
    pool = pool_for(layout, 8, gen, device)
    rank_bytes = layout.rank_bytes
    assert layout.block_bytes == tp * rank_bytes
    pages = np.array([3, 7, 1])
    slots = np.array([6, 0, 4])
    original = pool.clone()
    swaps = [swapper_for(backend, e.layout, pool, rank=r) for r, e in enumerate(engines)]
    try:
        swaps[0].submit_store(1, pages, slots)
        assert collect(swaps[0], [1])[1].success
        # Only rank 0's part changed so far.
        assert torch.equal(pool[:, rank_bytes:], original[:, rank_bytes:])
        swaps[1].submit_store(1, pages, slots)
        assert collect(swaps[1], [1])[1].success
        for b, (p, s) in enumerate(zip(pages, slots, strict=True)):
            for r, e in enumerate(engines):
                part = pool[s, r * rank_bytes : (r + 1) * rank_bytes]
                assert torch.equal(part, e.page_bytes_of(int(p)).cpu()), (b, r)
        # And back: each rank loads only its part.
        for r, e in enumerate(engines):
            e.poison(0)
            swaps[r].submit_load(2, slots, pages)
            assert collect(swaps[r], [2])[2].success
            for p, s in zip(pages, slots, strict=True):
                assert torch.equal(
                    e.page_bytes_of(int(p)).cpu(), pool[s, r * rank_bytes : (r + 1) * rank_bytes]
                )
    finally:
        for s in swaps:
            s.close()


def test_groups_with_different_page_sizes(backend: Backend, gen: torch.Generator) -> None:
    device = backend[0]
    full = make_engine("kv_first", device=device, layers=2, tokens=8, pages=10)
    window = make_engine("page_first", device=device, layers=3, tokens=4, heads=1, pages=6)
    for e in (full, window):
        e.fill_random(gen)
    assert full.layout.block_bytes != window.layout.block_bytes
    pools = [pool_for(full.layout, 5, gen, device), pool_for(window.layout, 4, gen, device)]
    with swapper_for(backend, [full.layout, window.layout], pools) as swap:
        swap.submit_store(1, [9, 0], [4, 1], group=0)
        swap.submit_store(2, [5, 2, 3], [3, 0, 2], group=1)
        res = collect(swap, [1, 2])
        assert res[1].success and res[2].success and res[2].group == 1
        assert torch.equal(pools[0][4, : full.layout.block_bytes], full.page_bytes_of(9).cpu())
        assert torch.equal(pools[1][0, : window.layout.block_bytes], window.page_bytes_of(2).cpu())


def test_concurrent_store_and_load_jobs(backend: Backend, gen: torch.Generator) -> None:
    device = backend[0]
    eng = make_engine("cross", device=device, pages=64, layers=4)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 64, gen, device)
    # Slots 32..63 hold known blocks to load; stores go to slots 0..31.
    known = pool[32:, : eng.layout.block_bytes].clone()
    with swapper_for(backend, eng.layout, pool) as swap:
        pages = torch.randperm(32, generator=gen).numpy()  # store from pages 0..31
        slots = torch.randperm(32, generator=gen).numpy()
        load_src = (32 + torch.randperm(32, generator=gen)).numpy()
        load_dst = (32 + torch.randperm(32, generator=gen)).numpy()  # into pages 32..63
        ids = []
        for j in range(8):  # interleaved, all in flight together
            sl = slice(4 * j, 4 * j + 4)
            swap.submit_store(100 + j, pages[sl], slots[sl])
            swap.submit_load(200 + j, load_src[sl], load_dst[sl])
            ids += [100 + j, 200 + j]
        res = collect(swap, ids)
        assert all(r.success for r in res.values())
        for p, s in zip(pages, slots, strict=True):
            assert torch.equal(pool[s, : eng.layout.block_bytes], eng.page_bytes_of(int(p)).cpu())
        for s, p in zip(load_src, load_dst, strict=True):
            assert torch.equal(eng.page_bytes_of(int(p)).cpu(), known[s - 32])
        stats = swap.stats()
        assert stats.jobs == {"store": 8, "load": 8} and stats.failed_jobs == 0


def test_failures_are_results_and_valid_blocks_still_move(
    backend: Backend, gen: torch.Generator
) -> None:
    device = backend[0]
    eng = make_engine("kv_first", device=device, pages=8)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 4, gen, device)
    keys = [b"a", b"b", b"c", b"d"]
    with swapper_for(backend, eng.layout, pool) as swap:
        # page 8 out of range, slot -1 out of range; then slot 3 twice (both rejected).
        swap.submit_store(1, [1, 8, 2, 4], [0, 1, -1, 2], keys=keys)
        swap.submit_store(2, [1, 2, 3], [3, 3, 1])
        swap.submit_load(3, [0, 1], [5, 5])  # one page written twice
        swap.submit_load(4, [3, 99], [6, 7])  # slot 3: no store of this test writes it
        swap.submit_store(5, [1, 2], [0])  # lengths differ
        swap.submit_store(6, ["x"], [0])  # not integers
        swap.submit_store(7, [], [])  # empty job
        res = collect(swap, range(1, 8))
        r = res[1]
        assert isinstance(r, JobResult) and isinstance(r, SwapResult)
        assert r.ok == [b"a", b"d"] and set(r.failed) == {b"b", b"c"}
        assert r.failed[b"b"] == FailureReason.REJECTED and r.failed[b"c"] == FailureReason.REJECTED
        assert "page outside" in r.error and "slot outside" in r.error
        assert r.bytes_moved == 2 * eng.layout.rank_bytes
        assert torch.equal(pool[2, : eng.layout.block_bytes], eng.page_bytes_of(4).cpu())
        assert names(res[2].ok) == [2] and set(names(res[2].failed)) == {0, 1}
        assert torch.equal(pool[1, : eng.layout.block_bytes], eng.page_bytes_of(3).cpu())
        assert res[3].ok == [] and set(names(res[3].failed)) == {0, 1}
        assert names(res[4].ok) == [0]
        assert failures(res[4]) == {1: FailureReason.REJECTED}
        assert torch.equal(eng.page_bytes_of(6).cpu(), pool[3, : eng.layout.block_bytes])
        assert res[5].ok == [] and set(names(res[5].failed)) == {0}
        assert "bad job" in res[5].error
        assert failures(res[6]) == {0: FailureReason.REJECTED}
        assert res[7].success and res[7].ok == [] and res[7].bytes_moved == 0
        with pytest.raises(ValueError, match="group"):
            swap.submit_store(8, [1], [1], group=3)
    swap.submit_store(9, [1], [1])
    (r,) = swap.get_finished()
    assert failures(r) == {0: FailureReason.CLOSED}


def test_copy_error_is_an_io_failure(
    backend: Backend, gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = backend[0]
    eng = make_engine("cross", device=device)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 4, gen, device)
    with swapper_for(backend, eng.layout, pool) as swap:
        import kvtiers.swap.cpu_backend
        import kvtiers.swap.cuda_backend

        if device == "cpu":
            targets = [(kvtiers.swap.cpu_backend.__name__, "copy_runs")]
        else:  # planning fails, whichever method the job takes
            mod = kvtiers.swap.cuda_backend.__name__
            targets = [(mod, "plan_runs"), (mod, "plan_pieces")]

        def boom(*a: object, **k: object) -> None:
            raise RuntimeError("injected")

        for mod, target in targets:
            monkeypatch.setattr(f"{mod}.{target}", boom)
        swap.submit_store(1, [0, 1], [2, 3], keys=[b"x", b"y"])
        r = collect(swap, [1])[1]
        assert r.failed == {b"x": FailureReason.IO, b"y": FailureReason.IO}
        assert "injected" in r.error and r.bytes_moved == 0
        monkeypatch.undo()
        swap.submit_store(2, [0], [2])  # the swapper still works
        assert collect(swap, [2])[2].success


def test_wait_then_results(backend: Backend, gen: torch.Generator) -> None:
    device = backend[0]
    eng = make_engine("kv_first", device=device, pages=32)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 32, gen, device)
    with swapper_for(backend, eng.layout, pool) as swap:
        swap.submit_store(1, np.arange(32), np.arange(32)[::-1].copy())
        swap.submit_load(2, [0], [3])
        assert swap.wait([1, 2], timeout=30)
        assert swap.wait([12345])  # unknown ids count as ended
        res = collect(swap, [1, 2])
        assert res[1].success and res[1].seconds >= 0 and res[1].method
        assert swap.get_finished() == []
        with pytest.raises(ValueError, match="in flight"):
            swap.submit_store(3, [1], [1])
            swap.submit_store(3, [1], [1])


def test_cpu_pool_object_is_accepted(gen: torch.Generator) -> None:
    eng = make_engine("pairs")
    eng.fill_random(gen)
    with CpuPool(eng.layout.block_bytes, 8 * round_up(eng.layout.block_bytes), pin=False) as pool:
        with DeviceSwapper(eng.layout, pool) as swap:
            swap.submit_store(1, [4, 5], [7, 0])
            assert collect(swap, [1])[1].success
        assert bytes(pool.view.block(7)) == eng.page_bytes_of(4).numpy().tobytes()


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["dma", "kernel", "staged"])
def test_cuda_registered_cpu_pool_and_store_after_compute(
    method: str, gen: torch.Generator
) -> None:
    """A real pinned pool (cudaHostRegister, Portable|Mapped); the store is queued
    right behind the kernel that writes the KV, and must see its result."""
    eng = make_engine("kv_first", device="cuda", pages=16)
    layout = eng.layout
    nbytes = 16 * round_up(layout.block_bytes)
    with (
        CpuPool(layout.block_bytes, nbytes, pin=True) as pool,
        DeviceSwapper(layout, pool, method=method, staging_bytes=1 << 20) as swap,
    ):
        assert method in swap.methods
        for t in eng.backing:
            t.fill_(3.0)  # queued on the current stream, not yet synchronised
        swap.submit_store(1, np.arange(16), np.arange(16)[::-1].copy())
        assert collect(swap, [1])[1].success
        assert torch.equal(pool.tensor()[15, : layout.block_bytes], eng.page_bytes_of(0).cpu())


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("kind,method", [("cross", "dma"), ("kv_first", "staged")])
def test_cuda_copies_never_span_two_pool_registrations(
    kind: str, method: str, gen: torch.Generator
) -> None:
    """The pool is registered in chunks of 3 slots: consecutive slots coalesce into
    runs that would cross a registration edge, which one DMA may not do."""
    # 32 KiB blocks: slots have no padding, so consecutive slots are contiguous.
    eng = make_engine(kind, device="cuda", pages=12, layers=4, tokens=16, heads=4, head_size=32)
    eng.fill_random(gen)
    layout = eng.layout
    slot = round_up(layout.block_bytes)
    assert slot == layout.block_bytes
    with (
        CpuPool(layout.block_bytes, 12 * slot, pin=True, chunk_bytes=3 * slot) as pool,
        DeviceSwapper(layout, pool, method=method, staging_bytes=1 << 22) as swap,
    ):
        swap.submit_store(1, np.arange(12), np.arange(12))
        assert collect(swap, [1])[1].success
        t = pool.tensor()
        for b in range(12):
            assert torch.equal(t[b, : layout.block_bytes], eng.page_bytes_of(b).cpu())
        eng.poison()
        swap.submit_load(2, np.arange(12), np.arange(12))
        assert collect(swap, [2])[2].success
        for b in range(12):
            assert torch.equal(eng.page_bytes_of(b).cpu(), t[b, : layout.block_bytes])


@pytest.mark.parametrize("kind", ["kv_first", "cross"])
def test_many_small_jobs_reuse_the_backend_buffers(
    backend: Backend, kind: str, gen: torch.Generator
) -> None:
    """Rounds of small jobs, more than any buffer pool holds at once, each round's
    stores and loads in flight together: events, kernel tables and DMA descriptor
    arrays are reused between jobs, and no job may see another's."""
    device = backend[0]
    eng = make_engine(kind, device=device, pages=48, layers=4)
    layout = eng.layout
    pool = pool_for(layout, 48, gen, device)
    with swapper_for(backend, layout, pool) as swap:
        job = 0
        for _ in range(6):
            eng.fill_random(gen)
            known = pool[24:, : layout.block_bytes].clone()
            ids = []
            pages = torch.randperm(24, generator=gen).numpy()
            slots = torch.randperm(24, generator=gen).numpy()
            load_src = (24 + torch.randperm(24, generator=gen)).numpy()
            load_dst = (24 + torch.randperm(24, generator=gen)).numpy()
            for j in range(0, 24, 3):  # 8 stores and 8 loads of 3 blocks
                swap.submit_store(job, pages[j : j + 3], slots[j : j + 3])
                swap.submit_load(job + 1, load_src[j : j + 3], load_dst[j : j + 3])
                ids += [job, job + 1]
                job += 2
            res = collect(swap, ids)
            assert all(r.success for r in res.values()), [r.error for r in res.values()]
            for p, s in zip(pages, slots, strict=True):
                want = eng.page_bytes_of(int(p)).cpu()
                assert torch.equal(pool[s, : layout.block_bytes], want)
            for s, p in zip(load_src, load_dst, strict=True):
                assert torch.equal(eng.page_bytes_of(int(p)).cpu(), known[s - 24])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_kernels_run_as_nvrtc_kernel_where_nvrtc_loads() -> None:
    from kvtiers.swap.copy_kernel import NvrtcCopyKernel, load_nvrtc_kernel
    from kvtiers.swap.cuda_driver import CudaDriver

    eng = make_engine("kv_first", device="cuda", pages=8)
    pool = random_pool(8, round_up(eng.layout.block_bytes), torch.Generator(), pin=True)
    if load_nvrtc_kernel(CudaDriver(0)) is None:
        pytest.skip("NVRTC does not load here: the Triton fallback runs")
    with DeviceSwapper(eng.layout, pool, method="staged", staging_bytes=1 << 20) as swap:
        assert isinstance(swap._backend._kernel, NvrtcCopyKernel)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["kernel", "staged"])
@pytest.mark.parametrize("kind", ["kv_first", "pairs", "cross"])
def test_cuda_triton_fallback_moves_the_same_bytes(
    method: str, kind: str, gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without NVRTC the kernels run through Triton (the real one), same results."""
    pytest.importorskip("triton")
    import kvtiers.swap.copy_kernel
    from kvtiers.swap.cuda_resources import TritonKernel

    monkeypatch.setattr(kvtiers.swap.copy_kernel, "load_nvrtc_kernel", lambda driver: None)
    eng = make_engine(kind, device="cuda", pages=16, pages_per_block=2)
    eng.fill_random(gen)
    pool = pool_for(eng.layout, 12, gen, "cuda")
    with swapper_for(("cuda", method), eng.layout, pool) as swap:
        assert isinstance(swap._backend._kernel, TritonKernel)
        store_load_check(eng, swap, pool, gen, blocks=5)
