"""The few CUDA driver calls the swapper makes itself, through ctypes on libcuda.

Why not a binding package: `cuMemcpyBatchAsync` takes three pointer arrays; calling
it through ctypes with numpy arrays costs the same for 10 or 100,000 copies, while a
Python binding converts every element. The entry point is looked up with
`cuGetProcAddress` for the CUDA 12.8 ABI (with `failIdx`), which newer drivers keep
serving, so the same code runs under a CUDA 12.8+ or 13 runtime.

All calls must come from a thread with the device's context current (torch makes
the primary context current on threads that used it; `ensure_context` does so).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["CudaDriver", "DriverError"]

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
EVENT_DEFAULT = 0x0  # with timing
EVENT_DISABLE_TIMING = 0x2
# CUmemcpySrcAccessOrder: the source is read in stream order (after earlier work on
# the stream), which is what a job queued behind the engine's kernels needs.
_SRC_ACCESS_ORDER_STREAM = 0x1
# CUmemcpyFlags: ask the driver to keep the copy off the SMs (copy engines only).
FLAG_PREFER_OVERLAP_WITH_COMPUTE = 0x1
_LOC_DEVICE = 1
_LOC_HOST = 2
_BATCH_ABI_VERSION = 12080
_ATTR_DEVICE_POINTER = 2  # CU_POINTER_ATTRIBUTE_DEVICE_POINTER


class DriverError(RuntimeError):
    """A CUDA driver call failed; `code` is the CUresult."""

    def __init__(self, call: str, code: int, text: str):
        super().__init__(f"{call} failed: {text} ({code})")
        self.code = code


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


_BATCH_FN = ctypes.CFUNCTYPE(
    ctypes.c_int,  # CUresult
    ctypes.c_void_p,  # CUdeviceptr* dsts
    ctypes.c_void_p,  # CUdeviceptr* srcs
    ctypes.c_void_p,  # size_t* sizes
    ctypes.c_size_t,  # count
    ctypes.POINTER(_MemcpyAttributes),
    ctypes.POINTER(ctypes.c_size_t),  # attrsIdxs
    ctypes.c_size_t,  # numAttrs
    ctypes.POINTER(ctypes.c_size_t),  # failIdx
    ctypes.c_void_p,  # CUstream
)


class CudaDriver:
    """libcuda entry points. `batch_available` tells whether `cuMemcpyBatchAsync`
    exists (driver for CUDA >= 12.8)."""

    def __init__(self, device_index: int):
        self.device_index = device_index
        self._lib = ctypes.CDLL("libcuda.so.1")
        self._lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._lib.cuMemHostGetDevicePointer_v2.argtypes = [
            ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint,
        ]  # fmt: skip
        self._lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
        self._bind_hot_calls()
        version = ctypes.c_int()
        self._lib.cuDriverGetVersion(ctypes.byref(version))
        self.driver_version = version.value
        self._batch = self._lookup_batch()
        self.batch_available = self._batch is not None

    def _lookup_batch(self) -> Callable[..., int] | None:
        pfn = ctypes.c_void_p()
        status = ctypes.c_int()
        try:
            get = self._lib.cuGetProcAddress_v2
            get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                            ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]  # fmt: skip
            err = get(
                b"cuMemcpyBatchAsync",
                ctypes.byref(pfn),
                _BATCH_ABI_VERSION,
                0,
                ctypes.byref(status),
            )
        except AttributeError:
            get = self._lib.cuGetProcAddress
            get.argtypes = [
                ctypes.c_char_p,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_int,
                ctypes.c_uint64,
            ]
            err = get(b"cuMemcpyBatchAsync", ctypes.byref(pfn), _BATCH_ABI_VERSION, 0)
        if err != CUDA_SUCCESS or not pfn.value:
            log.info(
                "cuMemcpyBatchAsync unavailable (driver %s, code %s)", self.driver_version, err
            )
            return None
        return _BATCH_FN(pfn.value)

    def _bind_hot_calls(self) -> None:
        """Argument types of the calls made per job (events, stream waits, kernel
        launches, small copies): set once, so each call converts plain ints."""
        lib, vp, ui = self._lib, ctypes.c_void_p, ctypes.c_uint
        lib.cuEventCreate.argtypes = [ctypes.POINTER(vp), ui]
        lib.cuEventRecord.argtypes = [vp, vp]
        lib.cuEventQuery.argtypes = [vp]
        lib.cuEventSynchronize.argtypes = [vp]
        lib.cuEventDestroy_v2.argtypes = [vp]
        lib.cuStreamWaitEvent.argtypes = [vp, vp, ui]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.cuLaunchKernel.argtypes = [vp, ui, ui, ui, ui, ui, ui, ui, vp, vp, vp]
        lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, vp, ctypes.c_size_t, vp]
        int_p = ctypes.POINTER(ctypes.c_int)
        lib.cuDeviceGetAttribute.argtypes = [int_p, ctypes.c_int, ctypes.c_int]
        elapsed = getattr(lib, "cuEventElapsedTime_v2", None) or lib.cuEventElapsedTime
        elapsed.argtypes = [ctypes.POINTER(ctypes.c_float), vp, vp]
        self._elapsed = elapsed
        self._batch_attrs: dict[tuple[bool, int], _MemcpyAttributes] = {}
        self._batch_idx = ctypes.c_size_t(0)
        self._batch_fail = ctypes.c_size_t(0)

    # ---------------------------------------------------------------- events

    def event_create(self, timing: bool = True) -> int:
        ev = ctypes.c_void_p()
        flags = EVENT_DEFAULT if timing else EVENT_DISABLE_TIMING
        self._check("cuEventCreate", self._lib.cuEventCreate(ctypes.byref(ev), flags))
        return int(ev.value or 0)

    def event_record(self, event: int, stream: int) -> None:
        err = self._lib.cuEventRecord(event, stream)
        if err != CUDA_SUCCESS:
            self._check("cuEventRecord", err)

    def event_done(self, event: int) -> bool:
        """True once the work before the event's record ran; raises `DriverError`
        for a device fault (sticky errors show up here)."""
        err = self._lib.cuEventQuery(event)
        if err == CUDA_SUCCESS:
            return True
        if err == CUDA_ERROR_NOT_READY:
            return False
        self._check("cuEventQuery", err)
        return True

    def event_synchronize(self, event: int) -> None:
        """Block (GIL released) until the event's work ran."""
        self._check("cuEventSynchronize", self._lib.cuEventSynchronize(event))

    def event_seconds(self, start: int, end: int) -> float:
        ms = ctypes.c_float()
        self._check("cuEventElapsedTime", self._elapsed(ctypes.byref(ms), start, end))
        return ms.value / 1e3

    def event_destroy(self, event: int) -> None:
        self._lib.cuEventDestroy_v2(event)

    def stream_wait_event(self, stream: int, event: int) -> None:
        err = self._lib.cuStreamWaitEvent(stream, event, 0)
        if err != CUDA_SUCCESS:
            self._check("cuStreamWaitEvent", err)

    # ---------------------------------------------------------------- kernels

    def compute_capability(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
        self._check("cuDeviceGetAttribute",
                    self._lib.cuDeviceGetAttribute(ctypes.byref(major), 75, self.device_index))
        self._check("cuDeviceGetAttribute",
                    self._lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, self.device_index))
        return major.value, minor.value  # fmt: skip

    def load_function(self, image: bytes, name: str) -> int:
        """Load a compiled module (cubin) into the current context and return the
        handle of its kernel `name` (the module stays loaded for the process)."""
        module = ctypes.c_void_p()
        self._check("cuModuleLoadData", self._lib.cuModuleLoadData(ctypes.byref(module), image))
        fn = ctypes.c_void_p()
        self._check(
            "cuModuleGetFunction",
            self._lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
        )
        return int(fn.value or 0)

    def launch(self, fn: int, grid: int, block: int, stream: int, params: int) -> None:
        """`cuLaunchKernel` of a 1-D grid; `params`: the address of the kernel's
        `void*` argument array."""
        err = self._lib.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, None)
        if err != CUDA_SUCCESS:
            self._check("cuLaunchKernel", err)

    def copy_to_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """An async H2D copy of `nbytes` from pinned host memory at `src`."""
        err = self._lib.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream)
        if err != CUDA_SUCCESS:
            self._check("cuMemcpyHtoDAsync", err)

    def error_text(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self._lib.cuGetErrorString(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
            return text.value.decode()
        return f"CUresult {code}"

    def _check(self, call: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            raise DriverError(call, code, self.error_text(code))

    def ensure_context(self) -> None:
        """Make the device's primary context current on this thread (the runtime
        does it lazily, the driver API needs it now)."""
        ctx = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", self._lib.cuCtxGetCurrent(ctypes.byref(ctx)))
        if not ctx.value:
            import torch

            torch.cuda.set_device(self.device_index)
            torch.cuda.current_stream(self.device_index).query()

    def host_device_pointer(self, host_ptr: int) -> int | None:
        """The device address of registered, mapped host memory; None when the
        memory is not mapped into the device's address space."""
        dptr = ctypes.c_uint64()
        err = self._lib.cuMemHostGetDevicePointer_v2(
            ctypes.byref(dptr), ctypes.c_void_p(host_ptr), 0
        )
        if err != CUDA_SUCCESS:
            return None
        return int(dptr.value)

    def memcpy_batch(
        self,
        dsts: np.ndarray | int,
        srcs: np.ndarray | int,
        sizes: np.ndarray | int,
        stream: int,
        *,
        to_host: bool,
        flags: int = FLAG_PREFER_OVERLAP_WITH_COMPUTE,
        count: int | None = None,
    ) -> None:
        """One `cuMemcpyBatchAsync` for every copy. The three arrays are uint64 (or
        the addresses of such arrays, with `count`) and must stay alive until the
        call returns: the driver reads them during the call."""
        if self._batch is None:
            raise DriverError("cuMemcpyBatchAsync", -1, "not available in this driver")
        if count is None:
            assert isinstance(sizes, np.ndarray)
            n = len(sizes)
        else:
            n = count
        if n == 0:
            return
        attrs = self._batch_attrs.get((to_host, flags))
        if attrs is None:
            attrs = _MemcpyAttributes()
            attrs.srcAccessOrder = _SRC_ACCESS_ORDER_STREAM
            dev, host = _MemLocation(_LOC_DEVICE, self.device_index), _MemLocation(_LOC_HOST, 0)
            attrs.srcLocHint, attrs.dstLocHint = (dev, host) if to_host else (host, dev)
            attrs.flags = flags
            self._batch_attrs[(to_host, flags)] = attrs
        d, s, z = (a.ctypes.data if isinstance(a, np.ndarray) else a for a in (dsts, srcs, sizes))
        fail = self._batch_fail
        err = self._batch(d, s, z, n, attrs, self._batch_idx, 1, fail, stream)
        if err != CUDA_SUCCESS:
            raise DriverError(
                f"cuMemcpyBatchAsync (copy {fail.value} of {n})", err, self.error_text(err)
            )
