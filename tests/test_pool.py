"""The CPU pool on real memory: anonymous mappings, real /dev/shm files, a real second
process. Pools stay a few MiB; oversize requests must be refused before allocating.
Payloads are random bytes (never zeros, which fresh memory holds anyway)."""

from __future__ import annotations

import ctypes
import glob
import importlib
import itertools
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kvtiers
import pytest
import torch
from kvtiers.contract.namespace import BlockGeometry
from kvtiers.pool import (
    CpuPool,
    CpuPools,
    PinError,
    PoolAttachError,
    PoolSizeError,
    plan_pools,
)
from kvtiers.pool import cpu_pool as pool_module
from kvtiers.pool import memory as pool_memory
from kvtiers.pool import pinning as pool_pinning
from kvtiers.pool.memory import HEADER_BYTES, SHM_DIR, MemoryLimits, shm_path
from kvtiers.pool.pinning import CudaBackend, Prefaulter

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PID = os.getpid()
_counter = itertools.count()
CUDA = torch.cuda.is_available()


def unique_name() -> str:
    return f"test-{PID}-{next(_counter)}"


def our_shm_files() -> set[str]:
    """Files this test process may have created (explicit test names, random names)."""
    return set(glob.glob(os.path.join(SHM_DIR, f"kvtiers-test-{PID}-*"))) | set(
        glob.glob(os.path.join(SHM_DIR, f"kvtiers-{PID}-*"))
    )


@pytest.fixture(autouse=True)
def no_leftover_shm_files() -> Iterator[None]:
    before = our_shm_files()
    yield
    leftover = our_shm_files() - before
    for path in leftover:  # clean up so one failure does not cascade
        os.unlink(path)
    assert not leftover, f"left in {SHM_DIR}: {sorted(leftover)}"


def path_of(pool: CpuPool) -> str:
    """The /dev/shm file of a shared pool."""
    assert pool.path is not None and pool.name is not None, f"{pool} is not shared"
    return pool.path


def name_of(pool: CpuPool) -> str:
    """The name a shared pool is attached by."""
    assert pool.name is not None, f"{pool} is not shared"
    return pool.name


def address(buffer: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def fill_random(pool: CpuPool, slots: range) -> list[bytes]:
    data = [os.urandom(pool.block_bytes) for _ in slots]
    for slot, payload in zip(slots, data, strict=True):
        pool.view.block(slot)[:] = payload
    return data


def run_python(code: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """A real second interpreter, importing kvtiers from this source tree."""
    env = dict(os.environ)
    src = str(Path(kvtiers.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", code, *args], input=stdin, capture_output=True, env=env,
        timeout=120,
    )  # fmt: skip


def physical_ram() -> int:
    return pool_memory.memory_limits().physical


@pytest.fixture
def no_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to map or create pool memory."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("memory was allocated before the size check refused")

    monkeypatch.setattr(mmap, "mmap", refuse)
    monkeypatch.setattr(pool_module, "create_anonymous", refuse)
    monkeypatch.setattr(pool_module, "create_shm", refuse)


# ------------------------------------------------------------------ shape, memory


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("block_bytes", [1, 4096, 5000, 70_000])
def test_sizes_and_alignment(shared: bool, block_bytes: int) -> None:
    budget = 2 * MiB + 123
    with CpuPool(block_bytes, budget, shared=shared, pin=False) as pool:
        slot = -(-block_bytes // 4096) * 4096
        assert pool.slot_bytes == slot
        assert pool.block_bytes == block_bytes
        assert pool.num_slots == budget // slot
        assert pool.nbytes == pool.num_slots * slot <= budget
        assert (pool.view.num_slots, pool.view.slot_bytes) == (pool.num_slots, slot)
        assert pool.view.block_bytes == block_bytes
        assert pool.view.address % 4096 == 0
        for s in range(pool.num_slots):
            block = pool.view.block(s)
            assert len(block) == block_bytes
            assert address(block) % 4096 == 0
            assert address(block) == pool.view.address + s * slot
        t = pool.tensor()
        assert t.dtype == torch.uint8 and tuple(t.shape) == (pool.num_slots, slot)
        assert t.data_ptr() == pool.view.address
        assert all(t[s].data_ptr() % 4096 == 0 for s in range(pool.num_slots))
        assert not pool.pinned


@pytest.mark.parametrize("shared", [False, True])
def test_tensor_and_view_share_memory(shared: bool) -> None:
    with CpuPool(5000, 1 * MiB, shared=shared, pin=False) as pool:
        t = pool.tensor()
        # tensor -> view
        payload = torch.frombuffer(bytearray(os.urandom(pool.nbytes)), dtype=torch.uint8)
        t.copy_(payload.view(pool.num_slots, pool.slot_bytes))
        for s in (0, 7, pool.num_slots - 1):
            assert bytes(pool.view.block(s)) == bytes(payload[s * pool.slot_bytes :][:5000])
        # view -> tensor, and a block write stays inside its slot
        before = t.clone()
        data = fill_random(pool, range(3, 4))[0]
        assert bytes(t[3, :5000].numpy()) == data
        assert torch.equal(t[3, 5000:], before[3, 5000:])
        assert torch.equal(t[2], before[2]) and torch.equal(t[4], before[4])


def test_importing_and_using_the_pool_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import kvtiers, kvtiers.pool, kvtiers.pool.groups\n"
        "assert 'torch' not in sys.modules, 'import'\n"
        "with kvtiers.pool.CpuPool(4096, 1 << 20, pin=False, prefault=True) as p:\n"
        "    p.view.block(0)[:4] = b'abcd'\n"
        "assert 'torch' not in sys.modules, 'use'\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr.decode()


# ---------------------------------------------------------------- shared memory

CHILD_ATTACH = """
import os, sys
from kvtiers.pool import CpuPool
name, block_bytes, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
expected = sys.stdin.buffer.read()
with CpuPool.attach(name, block_bytes, pin=False, prefault=True) as pool:
    seen = b"".join(bytes(pool.view.block(s)) for s in range(n))
    if seen != expected:
        sys.exit(3)
    written = os.urandom(n * block_bytes)
    for i in range(n):
        pool.view.block(n + i)[:] = written[i * block_bytes : (i + 1) * block_bytes]
assert "torch" not in sys.modules
sys.stdout.buffer.write(written)
"""


def test_shared_pool_across_processes() -> None:
    name, n, block = unique_name(), 6, 6000
    with CpuPool(block, 1 * MiB, shared=True, name=name, pin=False) as pool:
        assert pool.name == name and pool.path == shm_path(name)
        assert os.stat(pool.path).st_mode & 0o777 == 0o600
        ours = fill_random(pool, range(n))
        result = run_python(CHILD_ATTACH, name, str(block), str(n), stdin=b"".join(ours))
        assert result.returncode == 0, (result.returncode, result.stderr.decode())
        theirs = result.stdout
        assert len(theirs) == n * block
        assert b"".join(bytes(pool.view.block(n + i)) for i in range(n)) == theirs
        assert os.path.exists(pool.path), "an attacher must not unlink the creator's file"
        path = pool.path
    assert not os.path.exists(path)


def test_attach_in_process_sees_same_bytes_and_leaves_the_file() -> None:
    name = unique_name()
    with CpuPool(4096, 256 * KiB, shared=True, name=name, pin=False) as creator:
        data = fill_random(creator, range(5))
        other = CpuPool.attach(name, 4096, num_slots=creator.num_slots, pin=False, prefault=True)
        assert other.view.address != creator.view.address  # a second mapping
        assert [bytes(other.view.block(s)) for s in range(5)] == data  # prefault kept them
        other.view.block(9)[:] = payload = os.urandom(4096)
        assert bytes(creator.view.block(9)) == payload
        other.close()
        other.close()
        assert os.path.exists(path_of(creator))
        assert CpuPool.attach(name, pin=False).block_bytes == 4096  # geometry from header


def test_attach_errors() -> None:
    with pytest.raises(FileNotFoundError, match="no shared CPU pool"):
        CpuPool.attach(unique_name(), 4096, pin=False)
    name = unique_name()
    with CpuPool(5000, 64 * KiB, shared=True, name=name, pin=False) as pool:
        with pytest.raises(PoolAttachError, match="blocks of 5000 bytes, not 6000"):
            CpuPool.attach(name, 6000, pin=False)  # same slot size, other block size
        with pytest.raises(PoolAttachError, match="8 slots, not 9"):
            CpuPool.attach(name, 5000, num_slots=9, pin=False)
        with pytest.raises(FileExistsError, match="exists already"):
            CpuPool(5000, 64 * KiB, shared=True, name=name, pin=False)
        assert os.path.exists(path_of(pool))
    for bad in ("", "../etc", "a/b", ".hidden", "x" * 201):
        with pytest.raises(ValueError, match="pool name"):
            CpuPool.attach(bad, pin=False)
    with pytest.raises(ValueError, match="shared=True"):
        CpuPool(4096, 64 * KiB, name="x", pin=False)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\0" * (64 * KiB + HEADER_BYTES), "not ready"),  # creator still preparing
        (os.urandom(64 * KiB + HEADER_BYTES), "not a kvtiers CPU pool"),
        (os.urandom(100), "not a kvtiers CPU pool"),
    ],
)
def test_attach_refuses_files_that_are_not_ready_pools(content: bytes, message: str) -> None:
    name = unique_name()
    path = shm_path(name)
    Path(path).write_bytes(content)
    try:
        with pytest.raises(PoolAttachError, match=message):
            CpuPool.attach(name, pin=False)
    finally:
        os.unlink(path)


def test_attach_does_not_follow_symlinks(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(os.urandom(8 * KiB))
    name = unique_name()
    os.symlink(target, shm_path(name))
    try:
        with pytest.raises(OSError):
            CpuPool.attach(name, pin=False)
    finally:
        os.unlink(shm_path(name))


# ------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("shared", [False, True])
def test_refuses_more_than_physical_ram_before_allocating(
    shared: bool, no_allocation: None
) -> None:
    ask = 10 * physical_ram()
    started = time.monotonic()
    with pytest.raises(PoolSizeError, match="physical memory") as info:
        CpuPool(2 * MiB, ask, shared=shared, name=unique_name() if shared else None, pin=False)
    assert time.monotonic() - started < 1.0
    assert "GiB" in str(info.value) and "cpu_bytes_to_use" in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, kvtiers.KvtiersError)


def test_refuses_more_than_available_memory(
    monkeypatch: pytest.MonkeyPatch, no_allocation: None
) -> None:
    monkeypatch.setattr(pool_memory, "memory_limits", lambda: MemoryLimits(64 * GiB, 1 * MiB, None))
    with pytest.raises(PoolSizeError, match="MemAvailable") as info:
        CpuPool(4096, 2 * MiB, pin=False)
    assert "1 MiB" in str(info.value) and "64 GiB" in str(info.value)


def test_refuses_more_than_cgroup_limit(
    monkeypatch: pytest.MonkeyPatch, no_allocation: None
) -> None:
    monkeypatch.setattr(
        pool_memory, "memory_limits", lambda: MemoryLimits(64 * GiB, 60 * GiB, 4 * GiB)
    )
    with pytest.raises(PoolSizeError, match="cgroup memory limit"):
        CpuPool(4096, 5 * GiB, pin=False)


def test_refuses_shared_pool_larger_than_shm_free_space(monkeypatch: pytest.MonkeyPatch) -> None:
    real_statvfs = os.statvfs

    def small_shm(path: Any) -> os.statvfs_result:
        if os.path.realpath(path) != os.path.realpath(SHM_DIR):
            return real_statvfs(path)
        # 8 MiB in all, 1 MiB free, in 4 KiB blocks
        return os.statvfs_result((4096, 4096, 2048, 256, 256, 100, 50, 50, 0, 255))

    monkeypatch.setattr(os, "statvfs", small_shm)
    name = unique_name()
    with pytest.raises(PoolSizeError, match="1 MiB free of 8 MiB") as info:
        CpuPool(4096, 2 * MiB, shared=True, name=name, pin=False)
    assert "--shm-size" in str(info.value)
    assert not os.path.exists(shm_path(name))
    with CpuPool(4096, 2 * MiB, pin=False) as private:  # /dev/shm is not its concern
        assert private.num_slots == 512


def test_zero_slots_is_an_error() -> None:
    with pytest.raises(PoolSizeError, match="raise cpu_bytes_to_use to at least 8192"):
        CpuPool(5000, 8191, pin=False)
    with pytest.raises(PoolSizeError):
        CpuPool(5000, 0, pin=False)
    with pytest.raises(ValueError):
        CpuPool(0, MiB, pin=False)
    with pytest.raises(ValueError):
        CpuPool(4096, -1, pin=False)


def test_check_of_real_limits_accepts_a_small_pool() -> None:
    pool_memory.check_pool_fits(MiB, shm_dir=SHM_DIR)
    limits = pool_memory.memory_limits()
    assert 0 < limits.available <= limits.physical


# ---------------------------------------------------------------------- lifetime


def test_close_is_idempotent_and_unlinks_the_file() -> None:
    pool = CpuPool(4096, 64 * KiB, shared=True, pin=False)
    path = pool.path
    assert path is not None and os.path.exists(path)
    assert pool.name is not None and pool.name.startswith(f"{PID}-")
    pool.close()
    assert pool.closed and not os.path.exists(path)
    pool.close()
    with pytest.raises(ValueError):
        pool.view.block(0)  # released, not dangling
    with pytest.raises(ValueError, match="closed"):
        pool.tensor()


def test_context_manager_closes() -> None:
    with CpuPool(4096, 64 * KiB, shared=True, pin=False) as pool:
        path = path_of(pool)
    assert pool.closed and not os.path.exists(path)


def test_live_tensor_keeps_its_memory_after_close() -> None:
    pool = CpuPool(4096, 64 * KiB, shared=True, pin=False)
    t = pool.tensor()
    data = fill_random(pool, range(2))
    pool.close()
    assert not os.path.exists(shm_path(name_of(pool)))
    assert bytes(t[1].numpy()) == data[1]  # still mapped: no crash, same bytes
    del t


def test_unclosed_pool_is_cleaned_up_when_collected() -> None:
    pool = CpuPool(4096, 64 * KiB, shared=True, pin=False)
    path = path_of(pool)
    del pool
    import gc

    gc.collect()
    assert not os.path.exists(path)


def test_close_unmaps_unless_something_still_uses_the_memory() -> None:
    pool = CpuPool(4096, 64 * KiB, pin=False)
    del_me = pool.tensor()
    del del_me
    pool.close()
    assert pool._backing.mm.closed  # nothing else used it: unmapped now
    # torch.frombuffer keeps a reference to the memoryview it was given but no buffer
    # export: close must neither release that memoryview nor unmap under it.
    pool = CpuPool(4096, 64 * KiB, pin=False)
    t = torch.frombuffer(pool.view.buffer, dtype=torch.uint8)
    block = pool.view.block(3)
    data = fill_random(pool, range(3, 4))[0]
    pool.close()
    assert not pool._backing.mm.closed
    assert bytes(t[3 * 4096 : 4 * 4096].numpy()) == data == bytes(block)
    del t, block


# ---------------------------------------------------------------------- progress


@pytest.mark.parametrize("shared", [False, True])
def test_progress_grows_to_the_total(shared: bool) -> None:
    calls: list[tuple[int, int]] = []
    with CpuPool(
        12 * KiB, 1 * MiB, shared=shared, pin=False, prefault=True, chunk_bytes=64 * KiB,
        progress=lambda done, total: calls.append((done, total)),
    ) as pool:  # fmt: skip
        step = 60 * KiB  # 64 KiB rounded down to whole 12 KiB slots
        assert len(calls) == -(-pool.nbytes // step)
        dones = [done for done, _ in calls]
        assert dones == sorted(set(dones)) and dones[0] == step
        assert calls[-1] == (pool.nbytes, pool.nbytes)
        assert {total for _, total in calls} == {pool.nbytes}


def test_progress_once_when_nothing_to_prepare() -> None:
    calls: list[tuple[int, int]] = []
    with CpuPool(4096, 64 * KiB, pin=False, progress=lambda *a: calls.append(a)) as pool:
        assert calls == [(pool.nbytes, pool.nbytes)]


def test_failing_progress_aborts_and_cleans_up() -> None:
    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    name = unique_name()
    with pytest.raises(KeyboardInterrupt):
        CpuPool(4096, 256 * KiB, shared=True, name=name, pin=False, progress=stop)
    assert not os.path.exists(shm_path(name))


def test_prefault_fallback_keeps_contents() -> None:
    """Kernels before 5.14 lack MADV_POPULATE_WRITE: the fallback touches pages."""
    with CpuPool(4096, 256 * KiB, shared=True, pin=False) as pool:
        data = fill_random(pool, range(pool.num_slots))
        attached = CpuPool.attach(name_of(pool), pin=False)
        prefault = Prefaulter(attached._backing.mm, fresh=False)
        prefault._madvise = False
        prefault(0, attached.nbytes)
        assert [bytes(attached.view.block(s)) for s in range(pool.num_slots)] == data
        attached.close()
    fresh = mmap.mmap(-1, 64 * KiB, flags=mmap.MAP_PRIVATE)
    touch = Prefaulter(fresh, fresh=True)
    touch._madvise = False
    touch(0, 64 * KiB)
    assert fresh[:] == bytes(64 * KiB)
    fresh.close()


# ------------------------------------------------------------------------ pinning


def test_pin_options_without_cuda() -> None:
    if CUDA:
        pytest.skip("this machine has CUDA")
    with CpuPool(4096, 64 * KiB, pin="auto") as pool:
        assert not pool.pinned
    name = unique_name()
    with pytest.raises(PinError, match="pin=True needs CUDA"):
        CpuPool(4096, 64 * KiB, shared=True, name=name, pin=True)
    assert not os.path.exists(shm_path(name))
    with pytest.raises(ValueError, match="pin must be"):
        CpuPool(4096, 64 * KiB, pin="yes")  # type: ignore[arg-type]


class FakeCudaRuntime:
    """Stands in for cudart on machines without a GPU: records what would be pinned."""

    def __init__(self, fail_at: int | None = None):
        self.registered: dict[int, int] = {}
        self.log: list[tuple[str, int, int]] = []
        self.fail_at = fail_at
        self.cleared = 0

    def register(self, ptr: int, size: int, flags: int) -> int:
        if len(self.registered) == self.fail_at:
            return 2  # cudaErrorMemoryAllocation
        self.registered[ptr] = size
        self.log.append(("register", ptr, size))
        assert flags == pool_pinning.DEFAULT_CUDA_FLAGS
        return 0

    def unregister(self, ptr: int) -> int:
        self.log.append(("unregister", ptr, self.registered.pop(ptr)))
        return 0

    def describe(self, code: int) -> str:
        return "out of memory"

    def clear_error(self) -> None:
        self.cleared += 1


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCudaRuntime:
    fake = FakeCudaRuntime()
    monkeypatch.setattr(pool_module, "resolve_pin", lambda pin: True)
    monkeypatch.setattr(pool_pinning, "cuda_runtime", lambda backend: fake)
    return fake


def test_registration_in_slot_aligned_chunks_undone_on_close(fake_cuda: FakeCudaRuntime) -> None:
    calls: list[tuple[int, int]] = []
    pool = CpuPool(12 * KiB, 1 * MiB, chunk_bytes=64 * KiB, progress=lambda *a: calls.append(a))
    assert pool.pinned
    ranges = sorted(fake_cuda.registered.items())
    assert ranges[0][0] == pool.view.address
    assert sum(size for _, size in ranges) == pool.nbytes
    for (ptr, size), (next_ptr, _) in zip(ranges, ranges[1:], strict=False):
        assert next_ptr == ptr + size and size == 60 * KiB  # contiguous, whole slots
    assert len(calls) == len(ranges)
    pool.close()
    assert not pool.pinned and fake_cuda.registered == {}
    unregistered = [ptr for op, ptr, _ in fake_cuda.log if op == "unregister"]
    assert unregistered == [ptr for ptr, _ in reversed(ranges)]


def test_failed_registration_undoes_everything(fake_cuda: FakeCudaRuntime) -> None:
    fake_cuda.fail_at = 2
    name = unique_name()
    with pytest.raises(PinError, match=r"failed: out of memory \(2\).*chunk_bytes"):
        CpuPool(4096, 1 * MiB, shared=True, name=name, chunk_bytes=64 * KiB)
    assert fake_cuda.registered == {} and fake_cuda.cleared == 1
    assert not os.path.exists(shm_path(name))


def cuda_backends() -> list[CudaBackend]:
    backends: list[CudaBackend] = ["torch"]
    try:
        importlib.import_module("cuda.bindings.runtime")
        backends.append("cuda-python")
    except ImportError:
        pass
    return backends


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("backend", cuda_backends())
def test_cuda_pinned_pool_round_trip(backend: CudaBackend) -> None:
    calls: list[tuple[int, int]] = []
    with CpuPool(
        40 * KiB, 4 * MiB, pin=True, chunk_bytes=256 * KiB, cuda_backend=backend,
        progress=lambda *a: calls.append(a),
    ) as pool:  # fmt: skip
        assert pool.pinned
        assert len(calls) > 1 and calls[-1] == (pool.nbytes, pool.nbytes)
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)
        t = pool.tensor()
        assert t.is_pinned()
        assert t[pool.num_slots - 1].is_pinned()  # the last chunk too
        gpu = torch.randint(0, 256, t.shape, dtype=torch.uint8, device="cuda")
        # Slot by slot: each registration is its own CUDA allocation, and one DMA may
        # not span two of them (the swapper cuts its runs at the edges).
        for i in range(pool.num_slots):
            t[i].copy_(gpu[i], non_blocking=True)
        torch.cuda.synchronize()
        assert bytes(pool.view.block(3)) == bytes(gpu[3, : pool.block_bytes].cpu().numpy())
        fill_random(pool, range(2))
        back = torch.empty_like(gpu)
        for i in range(pool.num_slots):
            back[i].copy_(t[i], non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(back.cpu(), t)
    assert not t.is_pinned()  # unregistered on close; the tensor's memory stays valid


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_worker_attaches_and_pins_a_shared_pool() -> None:
    child = """
import sys, torch
from kvtiers.pool import CpuPool
with CpuPool.attach(sys.argv[1], int(sys.argv[2]), pin=True) as pool:
    assert pool.pinned
    t = pool.tensor()
    assert t.is_pinned()
    gpu = torch.randint(0, 256, t.shape, dtype=torch.uint8, device="cuda")
    t.copy_(gpu, non_blocking=True)
    torch.cuda.synchronize()
    sys.stdout.buffer.write(gpu.cpu().numpy().tobytes())
"""
    name = unique_name()
    with CpuPool(8192, 2 * MiB, shared=True, name=name, pin=False) as pool:
        result = run_python(child, name, "8192")
        assert result.returncode == 0, result.stderr.decode()
        assert bytes(pool.tensor().numpy()) == result.stdout


# ------------------------------------------------------------------------ hybrid

FULL = BlockGeometry(layers=1, kv_heads=1, head_size=64, dtype="float16", tokens_per_block=64)
OTHER = BlockGeometry(layers=5, kv_heads=2, head_size=64, dtype="float16", tokens_per_block=16)


def test_hybrid_split_gives_every_group_the_same_number_of_blocks() -> None:
    assert (FULL.block_bytes, OTHER.block_bytes) == (16 * KiB, 40 * KiB)
    groups = [FULL, OTHER, FULL]
    budget = 1 * MiB
    plans = plan_pools(groups, budget)
    assert [(p.block_bytes, p.groups) for p in plans] == [(16 * KiB, (0, 2)), (40 * KiB, (1,))]
    per_round = 2 * 16 * KiB + 40 * KiB
    n = budget // per_round
    assert [p.num_slots for p in plans] == [2 * n, n]
    with CpuPools(groups, budget, pin=False) as pools:
        assert len(pools) == 2 and pools.blocks_per_group == n
        assert pools.pool_for_group(0) is pools.pool_for_group(2)
        assert pools.pool_for_group(1) is not pools.pool_for_group(0)
        for g, geometry in enumerate(groups):
            assert pools.pool_for_group(g).block_bytes == geometry.block_bytes
        assert budget - per_round < pools.nbytes <= budget
        with pytest.raises(IndexError, match="KV group 3"):
            pools.pool_for_group(3)
        with pytest.raises(IndexError):
            pools.pool_for_group(-1)


def test_hybrid_one_size_is_one_pool() -> None:
    with CpuPools([FULL, FULL], 1 * MiB, pin=False) as pools:
        assert len(pools) == 1 and pools.pools[0].num_slots == 64
        assert pools.blocks_per_group == 32


def test_hybrid_refusals(no_allocation: None) -> None:
    with pytest.raises(PoolSizeError, match="one block of each of the 3 KV groups"):
        CpuPools([FULL, OTHER, FULL], 70 * KiB, pin=False)
    with pytest.raises(PoolSizeError, match="physical memory"):
        CpuPools([FULL, OTHER], 10 * physical_ram(), shared=True, name=unique_name(), pin=False)


def test_hybrid_shared_attach_and_progress() -> None:
    name = unique_name()
    calls: list[tuple[int, int]] = []
    with CpuPools(
        [FULL, OTHER], 1 * MiB, shared=True, name=name, pin=False, prefault=True,
        chunk_bytes=128 * KiB, progress=lambda *a: calls.append(a),
    ) as pools:  # fmt: skip
        dones = [d for d, _ in calls]
        assert dones == sorted(set(dones)) and calls[-1] == (pools.nbytes, pools.nbytes)
        data = fill_random(pools.pool_for_group(1), range(3))
        with CpuPools.attach(name, [FULL, OTHER], pin=False) as attached:
            assert [p.num_slots for p in attached] == [p.num_slots for p in pools]
            assert [bytes(attached.pool_for_group(1).view.block(s)) for s in range(3)] == data
        paths = [path_of(p) for p in pools]
        assert all(os.path.exists(p) for p in paths)
    assert not any(os.path.exists(p) for p in paths)
    with pytest.raises(FileNotFoundError):
        CpuPools.attach(name, [FULL, OTHER], pin=False)


def _thp_eligible(address: int) -> bool | None:
    """THPeligible of the mapping that holds `address` (None: not reported)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("THPeligible:"):
                return line.split()[1] == "1"
    return None


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
    or "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(),
    reason="transparent huge pages are off on this machine",
)
def test_an_anonymous_pool_asks_for_huge_pages() -> None:
    pool = CpuPool(2 << 20, 64 << 20, pin=False)
    try:
        assert _thp_eligible(pool.view.address) is True
        pool.view.block(3)[:] = os.urandom(2 << 20)
        assert bytes(pool.view.block(3)[:16]) != bytes(16)
    finally:
        pool.close()
