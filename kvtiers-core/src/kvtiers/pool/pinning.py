"""Making pool memory ready for DMA: pre-faulting its pages and registering it with
CUDA (`cudaHostRegister`), chunk by chunk, with progress.

Why chunks: registering pins every page, ~1.5-2 GB/s on untouched memory but ~25 GB/s
on memory whose pages already exist, so each chunk is pre-faulted right before it is
registered; a 400 GiB pool then shows steady progress instead of a silent minute or
more; and single registrations of >= 512 GiB have been reported to fail. Chunk
boundaries fall on slot boundaries, so no block transfer spans two registrations.

Registration belongs to the process that made it: each GPU worker registers its own
mapping of a shared pool, and unregisters it before unmapping. Nothing here imports
torch until pinning is actually asked for.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import logging
import mmap
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from kvtiers.extras import missing_torch
from kvtiers.pool.memory import PAGE, PinError, PoolSizeError, human_bytes

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]
"""`progress(done_bytes, total_bytes)`, called after each chunk of the pool is ready
(reserved, pre-faulted and registered as asked); `done_bytes` grows to `total_bytes`."""

PinMode = Literal["auto"] | bool
CudaBackend = Literal["auto", "torch", "cuda-python"]

# cudaHostRegister flags (driver_types.h).
REGISTER_PORTABLE = 0x1  # pinned for every CUDA context, not just the current one
REGISTER_MAPPED = 0x2  # mapped into the device address space (copy kernels can read it)
DEFAULT_CUDA_FLAGS = REGISTER_PORTABLE | REGISTER_MAPPED
DEFAULT_CHUNK_BYTES = 1 << 30

# Linux >= 5.14. Python 3.11's mmap module does not name it.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


# ---------------------------------------------------------------------- pin choice


def cuda_status() -> tuple[bool, str]:
    """(whether torch sees a CUDA device, why not in words: without torch, the words
    name the extra that brings it)."""
    try:
        import torch
    except ImportError as exc:
        return False, str(missing_torch("registering the pool with CUDA", exc))
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, ""


def resolve_pin(pin: PinMode) -> bool:
    """Whether to register the pool with CUDA. `"auto"`: when a CUDA device is there;
    `True`: required (`PinError` without CUDA); `False`: never (torch is not imported)."""
    if pin not in ("auto", True, False):
        raise ValueError(f"pin must be 'auto', True or False, got {pin!r}")
    if pin is False:
        return False
    available, why = cuda_status()
    if pin is True and not available:
        raise PinError(
            f"pin=True needs CUDA to register the pool for DMA, but {why}; pass "
            f"pin='auto' to fall back to ordinary (pageable) memory, or pin=False"
        )
    return available


def chunk_step(chunk_bytes: int, slot_bytes: int) -> int:
    """`chunk_bytes` rounded down to whole slots (at least one slot)."""
    if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    return max(1, chunk_bytes // slot_bytes) * slot_bytes


def prepare_in_chunks(
    nbytes: int,
    step_bytes: int,
    steps: Sequence[Callable[[int, int], None]],
    progress: ProgressFn | None,
) -> None:
    """Run every step on [start, start + length) of the pool, chunk after chunk, and
    report progress after each chunk. With no steps, progress is reported once, done."""
    if not steps:
        if progress is not None:
            progress(nbytes, nbytes)
        return
    for start in range(0, nbytes, step_bytes):
        length = min(step_bytes, nbytes - start)
        for step in steps:
            step(start, length)
        if progress is not None:
            progress(start + length, nbytes)


# ---------------------------------------------------------------------- pre-fault


class Prefaulter:
    """Makes the pages of a mapping exist and be mapped writable, without changing
    their bytes. `fresh`: nobody else can see the memory yet, so the fallback for
    kernels without MADV_POPULATE_WRITE may write a zero byte per page; otherwise the
    fallback only reads (a shared pool's contents belong to others)."""

    def __init__(self, mm: mmap.mmap, *, fresh: bool):
        self._mm = mm
        self._fresh = fresh
        self._madvise = sys.platform.startswith("linux")

    def __call__(self, start: int, length: int) -> None:
        if self._madvise:
            try:
                self._mm.madvise(_MADV_POPULATE_WRITE, start, length)
                return
            except OSError as e:
                if e.errno in (errno.ENOMEM, errno.EFAULT):
                    raise PoolSizeError(
                        f"ran out of memory pre-faulting the pool at "
                        f"{human_bytes(start)} (the machine's free memory or /dev/shm "
                        f"shrank after the pool was sized): lower cpu_bytes_to_use"
                    ) from e
                self._madvise = False  # EINVAL: kernel older than 5.14
        with memoryview(self._mm) as mv, mv[start : start + length : PAGE] as pages:
            if self._fresh:
                pages[:] = bytes(len(pages))
            else:
                pages.tobytes()


# ------------------------------------------------------------------------ CUDA


class _CudaRuntime(Protocol):
    def register(self, ptr: int, size: int, flags: int) -> int: ...
    def unregister(self, ptr: int) -> int: ...
    def describe(self, code: int) -> str: ...
    def clear_error(self) -> None: ...


class _TorchRuntime:
    """`torch.cuda.cudart()`: cudaHostRegister(ptr: int, size: int, flags: int) and
    cudaHostUnregister(ptr: int), each returning a `cudaError` enum."""

    def __init__(self) -> None:
        import torch

        self._rt: Any = torch.cuda.cudart()  # type: ignore[no-untyped-call]  # torch's stubs
        if not hasattr(self._rt, "cudaHostRegister"):
            raise PinError("this torch build's cudart bindings lack cudaHostRegister")

    def register(self, ptr: int, size: int, flags: int) -> int:
        return int(self._rt.cudaHostRegister(ptr, size, flags))

    def unregister(self, ptr: int) -> int:
        return int(self._rt.cudaHostUnregister(ptr))

    def describe(self, code: int) -> str:
        try:
            return str(self._rt.cudaGetErrorString(self._rt.cudaError(code)))
        except Exception:  # noqa: BLE001 - only a message: the code is enough
            return f"cudaError {code}"

    def clear_error(self) -> None:
        # torch binds no cudaGetLastError. A failed registration leaves the runtime's
        # last error set, and torch's next kernel-launch check would report it as its
        # own; so reset it through the libcudart this process already loaded (the same
        # library instance, hence the same per-thread error state).
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "libcudart.so" in line}
            for path in paths:
                ctypes.CDLL(path).cudaGetLastError()
        except Exception:  # noqa: BLE001 - best effort: clearing a stale error
            pass


class _CudaPythonRuntime:
    """cuda-python (`cuda.bindings.runtime`, or `cuda.cudart` before 12.6): every call
    returns a tuple whose first item is the error."""

    def __init__(self) -> None:
        for module in ("cuda.bindings.runtime", "cuda.cudart"):
            try:
                self._rt: Any = importlib.import_module(module)
                return
            except ImportError:
                continue
        raise PinError("cuda-python is not installed")

    def register(self, ptr: int, size: int, flags: int) -> int:
        return int(self._rt.cudaHostRegister(ptr, size, flags)[0])

    def unregister(self, ptr: int) -> int:
        return int(self._rt.cudaHostUnregister(ptr)[0])

    def describe(self, code: int) -> str:
        try:
            text = self._rt.cudaGetErrorString(self._rt.cudaError_t(code))[1]
            return text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # noqa: BLE001 - only a message: the code is enough
            return f"cudaError {code}"

    def clear_error(self) -> None:
        self._rt.cudaGetLastError()


def cuda_runtime(backend: CudaBackend = "auto") -> _CudaRuntime:
    """torch's cudart bindings, or cuda-python's when torch's are unusable."""
    if backend == "torch":
        return _TorchRuntime()
    if backend == "cuda-python":
        return _CudaPythonRuntime()
    if backend != "auto":
        raise ValueError(f"cuda_backend must be 'auto', 'torch' or 'cuda-python', got {backend!r}")
    try:
        return _TorchRuntime()
    except Exception as torch_problem:  # noqa: BLE001 - e.g. no CUDA in a forked child
        try:
            return _CudaPythonRuntime()
        except PinError:
            raise PinError(f"cannot register host memory with CUDA: {torch_problem}") from None


class HostRegistration:
    """Ranges of this process's memory registered with CUDA (page-locked, DMA-able).
    Used from one thread; `close()` unregisters them all and never raises."""

    def __init__(self, flags: int = DEFAULT_CUDA_FLAGS, backend: CudaBackend = "auto"):
        self.flags = flags
        self._rt = cuda_runtime(backend)
        self._ranges: list[tuple[int, int]] = []

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self._ranges)

    def register(self, ptr: int, size: int) -> None:
        err = self._rt.register(ptr, size, self.flags)
        if err:
            self._rt.clear_error()
            raise PinError(
                f"cudaHostRegister of {human_bytes(size)} at {ptr:#x} (after "
                f"{human_bytes(self.nbytes)} registered) failed: {self._rt.describe(err)} "
                f"({err}); try a smaller chunk_bytes, check the locked-memory limits of "
                f"the container, or pass pin=False"
            )
        self._ranges.append((ptr, size))

    def close(self) -> None:
        while self._ranges:
            ptr, size = self._ranges.pop()
            try:
                err = self._rt.unregister(ptr)
            except Exception as e:  # noqa: BLE001 - CUDA torn down at interpreter exit
                log.warning("cudaHostUnregister(%#x) raised %r", ptr, e)
                continue
            if err:
                self._rt.clear_error()
                log.warning(
                    "cudaHostUnregister(%#x, %s) failed: %s (%d)",
                    ptr,
                    human_bytes(size),
                    self._rt.describe(err),
                    err,
                )


# Registered pools of this process: base address -> (bytes, registration step). CUDA
# treats each cudaHostRegister call as its own allocation: a DMA that spans two of
# them fails ("invalid argument"), so copy planners cut runs at these boundaries.
_REGISTERED: dict[int, tuple[int, int]] = {}


def note_registered(base: int, nbytes: int, step: int) -> None:
    _REGISTERED[base] = (nbytes, step)


def forget_registered(base: int) -> None:
    _REGISTERED.pop(base, None)


def registration_chunks(address: int) -> tuple[int, int] | None:
    """`(base, step)` of the pinned pool containing `address` (its registrations
    start at base + k * step), or None when no kvtiers pool registered it."""
    for base, (nbytes, step) in _REGISTERED.items():
        if base <= address < base + nbytes:
            return base, step
    return None
