"""The copy kernel in CUDA C, compiled once per process with NVRTC and launched
through the driver (`cuLaunchKernel` on the swapper's own stream).

Why not Triton for this: a Triton launch costs ~29 µs of host time on the H200 host
(argument binding, specialisation key, current-stream lookup) and runs on torch's
current stream, so every job also paid for a stream switch (~18 µs); a driver
launch with a prepared argument array costs a few µs. Triton stays the fallback
(`kvtiers.swap.triton_copy`) where NVRTC cannot be loaded.

The kernel takes the same int64 `[3, n]` table as the Triton one (source addresses,
destination addresses, lengths in 8-byte words: `plan.make_table`); programs take
pieces round-robin; a piece whose addresses and length are 16-byte aligned is
copied in 16-byte vectors, four per thread in flight.

Only the CUDA backend imports this module.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys

from kvtiers.swap.cuda_driver import CudaDriver

log = logging.getLogger(__name__)

__all__ = ["NvrtcCopyKernel", "load_nvrtc_kernel"]

_NAME = "kvtiers_copy_pieces"
_THREADS = 256
_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256)
kvtiers_copy_pieces(const long long* __restrict__ table, long long n) {
    for (long long i = blockIdx.x; i < n; i += gridDim.x) {
        const char* src = (const char*)table[i];
        char* dst = (char*)table[n + i];
        long long words = table[2 * n + i];
        unsigned long long align = (unsigned long long)src | (unsigned long long)dst
                                   | (unsigned long long)(words * 8);
        if ((align & 15) == 0) {
            const uint4* s = (const uint4*)src;
            uint4* d = (uint4*)dst;
            long long m = words / 2;
            long long k = threadIdx.x;
            for (; k + 3 * blockDim.x < m; k += 4 * blockDim.x) {
                uint4 a = s[k], b = s[k + blockDim.x], c = s[k + 2 * blockDim.x],
                      e = s[k + 3 * blockDim.x];
                d[k] = a; d[k + blockDim.x] = b; d[k + 2 * blockDim.x] = c;
                d[k + 3 * blockDim.x] = e;
            }
            for (; k < m; k += blockDim.x) d[k] = s[k];
        } else {
            const unsigned long long* s = (const unsigned long long*)src;
            unsigned long long* d = (unsigned long long*)dst;
            for (long long k = threadIdx.x; k < words; k += blockDim.x) d[k] = s[k];
        }
    }
}
"""


class NvrtcCopyKernel:
    """The compiled kernel in the driver's current context. `launch` is not
    thread-safe (one argument array, rewritten per launch): the swapper calls it
    from its one submitting thread."""

    def __init__(self, driver: CudaDriver, function: int):
        self._driver = driver
        self._fn = function
        self._table = ctypes.c_uint64(0)
        self._n = ctypes.c_longlong(0)
        self._params = (ctypes.c_void_p * 2)(
            ctypes.addressof(self._table), ctypes.addressof(self._n)
        )
        self._params_address = ctypes.addressof(self._params)

    def launch(self, table_address: int, n: int, grid: int, stream: int) -> None:
        """Queue the copy of the `n` pieces of the table at device address
        `table_address` (device memory or mapped pinned host memory) on `stream`."""
        self._table.value = table_address
        self._n.value = n
        self._driver.launch(self._fn, max(1, min(grid, n)), _THREADS, stream, self._params_address)


def load_nvrtc_kernel(driver: CudaDriver) -> NvrtcCopyKernel | None:
    """Compile and load the kernel; None (with the reason logged) where NVRTC is
    missing or cannot build for this device."""
    try:
        nvrtc = _load_nvrtc()
        major, minor = driver.compute_capability()
        cubin = _compile(nvrtc, f"sm_{major}{minor}")
        driver.ensure_context()
        return NvrtcCopyKernel(driver, driver.load_function(cubin, _NAME))
    except Exception as e:  # noqa: BLE001 - any failure: fall back to Triton
        log.info("NVRTC copy kernel unavailable (%r): falling back to Triton", e)
        return None


def _load_nvrtc() -> ctypes.CDLL:
    """libnvrtc: by soname (torch's CUDA wheels or the system), else from the
    `nvidia/*/lib` folders of the pip-installed CUDA libraries."""
    names: list[str] = []
    try:
        import torch

        if torch.version.cuda:
            names.append(f"libnvrtc.so.{torch.version.cuda.split('.')[0]}")
    except Exception:  # noqa: BLE001  # pragma: no cover - torch is there with CUDA
        pass
    names.append("libnvrtc.so")
    for p in sys.path:
        names += sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib", "libnvrtc.so*")))
        names += sorted(glob.glob(os.path.join(p, "nvidia", "*", "*", "lib", "libnvrtc.so*")))
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    names += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    for name in names:
        if "builtins" in name or name.endswith(".alt.so"):
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("no libnvrtc found")


def _compile(nvrtc: ctypes.CDLL, arch: str) -> bytes:
    prog = ctypes.c_void_p()
    vp = ctypes.c_void_p

    def check(call: str, code: int) -> None:
        if code != 0:
            raise RuntimeError(f"{call} failed with nvrtcResult {code}")

    check(
        "nvrtcCreateProgram",
        nvrtc.nvrtcCreateProgram(
            ctypes.byref(prog), _SOURCE.encode(), b"kvtiers_copy.cu", 0, vp(), vp()
        ),
    )
    try:
        opts = [f"--gpu-architecture={arch}".encode()]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
        if err != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            text = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(prog, text)
            raise RuntimeError(f"nvrtcCompileProgram ({arch}): {text.value.decode()}")
        size = ctypes.c_size_t()
        check("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
        image = ctypes.create_string_buffer(size.value)
        check("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(prog, image))
        return image.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
