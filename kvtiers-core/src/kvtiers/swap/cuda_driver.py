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
        dsts: np.ndarray,
        srcs: np.ndarray,
        sizes: np.ndarray,
        stream: int,
        *,
        to_host: bool,
        flags: int = FLAG_PREFER_OVERLAP_WITH_COMPUTE,
    ) -> None:
        """One `cuMemcpyBatchAsync` for every copy; the arrays are uint64 and must
        stay alive until the call returns (kept until the job ends anyway)."""
        if self._batch is None:
            raise DriverError("cuMemcpyBatchAsync", -1, "not available in this driver")
        n = len(sizes)
        if n == 0:
            return
        attrs = _MemcpyAttributes()
        attrs.srcAccessOrder = _SRC_ACCESS_ORDER_STREAM
        dev, host = _MemLocation(_LOC_DEVICE, self.device_index), _MemLocation(_LOC_HOST, 0)
        attrs.srcLocHint, attrs.dstLocHint = (dev, host) if to_host else (host, dev)
        attrs.flags = flags
        idx = ctypes.c_size_t(0)
        fail = ctypes.c_size_t(0)
        err = self._batch(
            dsts.ctypes.data, srcs.ctypes.data, sizes.ctypes.data, n,
            ctypes.byref(attrs), ctypes.byref(idx), 1, ctypes.byref(fail), stream,
        )  # fmt: skip
        if err != CUDA_SUCCESS:
            raise DriverError(
                f"cuMemcpyBatchAsync (copy {fail.value} of {n})", err, self.error_text(err)
            )
