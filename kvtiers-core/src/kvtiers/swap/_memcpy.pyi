# The optional native helper built from _memcpy.c (see its header comment).
import numpy as np

def copy_batch(
    dst_addrs: np.ndarray, src_addrs: np.ndarray, lengths: np.ndarray, threads: int = 1, /
) -> None:
    """Copy lengths[i] bytes from src_addrs[i] to dst_addrs[i] (8-byte integers, C
    contiguous, equal lengths), split over `threads` threads, without the GIL."""
