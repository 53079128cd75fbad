"""The CPU pool: the gateway tier's memory, one slot per block, shared with the GPU
workers.

Who does what:

- the scheduler process creates the pool (`CpuPool(block_bytes, cpu_bytes_to_use,
  shared=True, pin=False)`: it does no DMA, so pinning there would only double the
  start-up time), gives `pool.view` to the manager and the tiers, and `pool.name` to
  the workers;
- each GPU worker attaches (`CpuPool.attach(name, block_bytes)`), which registers its
  own mapping with CUDA, and copies through `pool.tensor()`;
- when everything runs in one process, `shared=False` uses anonymous memory, which is
  registered with CUDA in that process when CUDA is there;
- a model whose KV groups have different block sizes gets `CpuPools`: one pool per
  size (`kvtiers.pool.groups` says how the budget is split).

Threading: create, attach and close from one thread, and close only after every job
that touches the pool has ended (DMA into unregistered or unmapped memory is
undefined). Disjoint slots may be read and written from any thread.

Importing this module does not import torch, and the pool works without it (the
scheduler side and the tiers use `pool.view`); `tensor()` and pinning import it, and
raise an error naming the extra (`kvtiers-core[torch]`) when it is missing.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import sys
import weakref
from typing import TYPE_CHECKING

from kvtiers.contract.pool_view import ALIGN, PoolView, round_up
from kvtiers.extras import missing_torch
from kvtiers.pool.memory import (
    HEADER_BYTES,
    SHM_DIR,
    Backing,
    PinError,
    PoolAttachError,
    PoolError,
    PoolHeader,
    PoolSizeError,
    check_pool_fits,
    create_anonymous,
    create_shm,
    human_bytes,
    open_shm,
    reserve,
    shm_path,
    write_header,
)
from kvtiers.pool.pinning import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CUDA_FLAGS,
    CudaBackend,
    HostRegistration,
    PinMode,
    Prefaulter,
    ProgressFn,
    chunk_step,
    forget_registered,
    note_registered,
    prepare_in_chunks,
    resolve_pin,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "CpuPool",
    "PinError",
    "PoolAttachError",
    "PoolError",
    "PoolSizeError",
    "ProgressFn",
    "pool_shape",
]

log = logging.getLogger(__name__)


def pool_shape(block_bytes: int, cpu_bytes_to_use: int) -> tuple[int, int]:
    """(slot_bytes, num_slots) of a pool: slots are blocks rounded up to 4 KiB, as
    many as fit in the budget. `PoolSizeError` when not even one fits."""
    for field, value in (("block_bytes", block_bytes), ("cpu_bytes_to_use", cpu_bytes_to_use)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{field} must be a non-negative integer, got {value!r}")
    if block_bytes == 0:
        raise ValueError("block_bytes must be positive")
    slot_bytes = round_up(block_bytes, ALIGN)
    num_slots = cpu_bytes_to_use // slot_bytes
    if num_slots == 0:
        raise PoolSizeError(
            f"cpu_bytes_to_use ({human_bytes(cpu_bytes_to_use)}) is smaller than one slot "
            f"({human_bytes(slot_bytes)} for a block of {block_bytes} bytes): raise "
            f"cpu_bytes_to_use to at least {slot_bytes}"
        )
    return slot_bytes, num_slots


class _Resources:
    """What must be undone when a pool goes away, even if `close()` is never called.
    Kept apart from the pool so that a weakref finalizer can hold it."""

    __slots__ = ("registration", "registered_base", "unlink_path", "pid")

    def __init__(self, unlink_path: str | None):
        self.registration: HostRegistration | None = None
        self.registered_base: int | None = None
        self.unlink_path = unlink_path
        self.pid = os.getpid()

    def release(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child's copy: registration and file belong to the parent
        if self.registered_base is not None:
            forget_registered(self.registered_base)
            self.registered_base = None
        if self.registration is not None:
            registration, self.registration = self.registration, None
            registration.close()
        if self.unlink_path is not None:
            path, self.unlink_path = self.unlink_path, None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


class CpuPool:
    """`num_slots` slots of `slot_bytes` (a block rounded up to 4 KiB) in one
    page-aligned buffer.

    `pin`: register the memory with CUDA for DMA — `"auto"` when CUDA is there,
    `True` required, `False` never. `prefault`: make every page exist before use
    (default: when pinning, where it makes registration ~10x faster). `progress`:
    `progress(done_bytes, total_bytes)` after each `chunk_bytes` chunk is ready.
    A shared pool's file is also reserved (fallocate) chunk by chunk, so that a full
    /dev/shm is an error now instead of a SIGBUS later.
    """

    view: PoolView
    block_bytes: int
    slot_bytes: int
    num_slots: int

    def __init__(
        self,
        block_bytes: int,
        cpu_bytes_to_use: int,
        *,
        shared: bool = False,
        name: str | None = None,
        pin: PinMode = "auto",
        prefault: bool | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        progress: ProgressFn | None = None,
        shm_dir: str = SHM_DIR,
        cuda_flags: int = DEFAULT_CUDA_FLAGS,
        cuda_backend: CudaBackend = "auto",
    ):
        slot_bytes, num_slots = pool_shape(block_bytes, cpu_bytes_to_use)
        if name is not None and not shared:
            raise ValueError("only a shared pool has a name: pass shared=True")
        step = chunk_step(chunk_bytes, slot_bytes)
        pinned = resolve_pin(pin)
        nbytes = slot_bytes * num_slots
        if not shared:
            check_pool_fits(nbytes, shm_dir=None)
            backing = create_anonymous(nbytes)
        else:
            name = name if name is not None else f"{os.getpid()}-{secrets.token_hex(6)}"
            path = shm_path(name, shm_dir)
            check_pool_fits(nbytes + HEADER_BYTES, shm_dir=shm_dir)
            try:
                backing = create_shm(path, nbytes)
            except FileExistsError:
                raise FileExistsError(
                    errno.EEXIST,
                    "a shared CPU pool with this name exists already: choose another "
                    "name, or remove the file if its creator is gone",
                    path,
                ) from None
        header = PoolHeader(block_bytes, slot_bytes, num_slots)
        self._open(
            backing, header, name, pinned=pinned,
            populate=pinned if prefault is None else prefault, fresh=True, step=step,
            progress=progress, cuda_flags=cuda_flags, cuda_backend=cuda_backend,
        )  # fmt: skip
        if shared:
            write_header(backing, header)  # now attachers may map it

    @classmethod
    def attach(
        cls,
        name: str,
        block_bytes: int | None = None,
        *,
        num_slots: int | None = None,
        pin: PinMode = "auto",
        prefault: bool | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        progress: ProgressFn | None = None,
        shm_dir: str = SHM_DIR,
        cuda_flags: int = DEFAULT_CUDA_FLAGS,
        cuda_backend: CudaBackend = "auto",
    ) -> CpuPool:
        """Map the shared pool another process created as `name`; the same bytes.

        `block_bytes` and `num_slots`, when given, must match the creator's
        (`PoolAttachError` otherwise); a missing pool is `FileNotFoundError`.
        Closing an attached pool unmaps it here and leaves the file to its creator.
        """
        path = shm_path(name, shm_dir)
        chunk_step(chunk_bytes, ALIGN)  # validate before mapping anything
        pinned = resolve_pin(pin)
        backing, header = open_shm(path)
        problem = None
        if block_bytes is not None and block_bytes != header.block_bytes:
            problem = (
                f"holds blocks of {header.block_bytes} bytes, not {block_bytes}: its "
                f"creator and this process disagree on the block geometry"
            )
        elif num_slots is not None and num_slots != header.num_slots:
            problem = f"has {header.num_slots} slots, not {num_slots}"
        if problem:
            backing.mm.close()
            raise PoolAttachError(f"shared CPU pool {name!r} ({path}) {problem}")
        pool = cls.__new__(cls)
        pool._open(
            backing, header, name, pinned=pinned,
            populate=pinned if prefault is None else prefault, fresh=False,
            step=chunk_step(chunk_bytes, header.slot_bytes), progress=progress,
            cuda_flags=cuda_flags, cuda_backend=cuda_backend,
        )  # fmt: skip
        return pool

    def _open(
        self,
        backing: Backing,
        header: PoolHeader,
        name: str | None,
        *,
        pinned: bool,
        populate: bool,
        fresh: bool,
        step: int,
        progress: ProgressFn | None,
        cuda_flags: int,
        cuda_backend: CudaBackend,
    ) -> None:
        """Set up the pool over `backing`, then make its memory ready chunk by chunk;
        on any failure (a progress callback that raises included) undo everything."""
        self._backing = backing
        self._name = name if backing.path is not None else None
        self.block_bytes = header.block_bytes
        self.slot_bytes = header.slot_bytes
        self.num_slots = header.num_slots
        self._closed = False
        self._slots = memoryview(backing.mm)[: header.nbytes]
        self.view = PoolView(self._slots, header.block_bytes, header.slot_bytes)
        self._resources = _Resources(backing.path if backing.owner else None)
        self._finalizer = weakref.finalize(self, self._resources.release)
        try:
            steps: list[Callable[[int, int], None]] = []
            if fresh and backing.fd is not None:
                steps.append(_Reserver(backing))
                reserve(backing, header.nbytes, HEADER_BYTES)
            if populate:
                steps.append(Prefaulter(backing.mm, fresh=fresh))
            if pinned:
                registration = HostRegistration(cuda_flags, cuda_backend)
                self._resources.registration = registration
                base = self.view.address
                steps.append(lambda start, length: registration.register(base + start, length))
            prepare_in_chunks(header.nbytes, step, steps, progress)
            if pinned:
                note_registered(self.view.address, header.nbytes, step)
                self._resources.registered_base = self.view.address
        except BaseException:
            self.close()
            raise
        finally:
            backing.close_fd()

    # ------------------------------------------------------------------ access

    def tensor(self) -> torch.Tensor:
        """A `uint8` tensor `[num_slots, slot_bytes]` over the pool's memory (no copy).
        Needs torch (`MissingExtraError` naming `kvtiers-core[torch]` without it)."""
        self._check_open()
        try:
            import torch
        except ImportError as exc:
            raise missing_torch("CpuPool.tensor()", exc) from exc

        # A fresh memoryview per tensor: it keeps a buffer export on the mapping for as
        # long as the tensor lives, so close() can never unmap memory a tensor still uses.
        buffer = memoryview(self._backing.mm)[: self.nbytes]
        return torch.frombuffer(buffer, dtype=torch.uint8).view(self.num_slots, self.slot_bytes)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.slot_bytes

    @property
    def name(self) -> str | None:
        """What `attach` takes; None for an anonymous pool."""
        return self._name

    @property
    def path(self) -> str | None:
        """The /dev/shm file of a shared pool."""
        return self._backing.path

    @property
    def shared(self) -> bool:
        return self._backing.path is not None

    @property
    def pinned(self) -> bool:
        """Registered with CUDA by this process (until close)."""
        return self._resources.registration is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the CPU pool is closed")

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Unregister from CUDA, unlink the shm file this pool created, unmap.
        Idempotent. Memory that tensors from `tensor()` (or memoryviews of single
        blocks) still use stays mapped until the last of them is gone."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        # Release the memoryviews the pool and its view hold, so that later use of the
        # view fails cleanly; but never one that another object holds: torch.frombuffer
        # keeps a reference to its buffer object but no buffer export, so a memoryview
        # released (and the memory unmapped) under a tensor would leave it dangling.
        view_buffer = self.view.buffer
        if sys.getrefcount(view_buffer) <= 3:  # the view's, ours, the call's
            _release(view_buffer)
        del view_buffer
        if sys.getrefcount(self._slots) <= 3:  # ours, the view's, the call's
            _release(self._slots)
        try:
            self._backing.mm.close()
        except BufferError:
            log.debug("%r: memory still in use, unmapped when the last user is gone", self)

    def __enter__(self) -> CpuPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = f"shared {self._name!r}" if self.shared else "anonymous"
        state = ", closed" if self._closed else ""
        return (
            f"<CpuPool {kind}: {self.num_slots} slots x {self.slot_bytes} B "
            f"(block {self.block_bytes} B), {human_bytes(self.nbytes)}, "
            f"pinned={self.pinned}{state}>"
        )


class _Reserver:
    """The reserve step: stops quietly when the filesystem cannot reserve."""

    def __init__(self, backing: Backing):
        self._backing = backing
        self._on = True

    def __call__(self, start: int, length: int) -> None:
        if self._on:
            self._on = reserve(self._backing, start, length)


def _release(mv: memoryview) -> None:
    # BufferError: something holds a buffer export on it, which keeps the mapping alive.
    with contextlib.suppress(BufferError):
        mv.release()
