"""Keep freed memory for reuse: a training step allocates and frees the same arrays every step.

glibc's malloc hands arrays above a threshold back to the operating system when they are
freed (and trims the heap when its free top grows), so the next step's arrays of the same
sizes arrive as fresh pages, each zeroed by the kernel on first touch. On this project's
machines that was ~4,700 page faults and 9 ms of system time per char-lm step (a fifth of
the step), where PyTorch's allocator had ~240. Raising the trim threshold, and mapping no
array on its own, keeps the memory in the process: a step then reuses the last step's
pages. The peak stays the same; the process just does not shrink between steps.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from numpy_engine.checks import InputError

_M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
_M_MMAP_MAX = -4
_TRIM_THRESHOLD = 2**30


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse. Process-wide, so it helps every
    library in the process (PyTorch too). Returns False, changing nothing, where there is no
    glibc (macOS, musl): there the allocator is left as it is.

    No array is mapped on its own (M_MMAP_MAX 0): raising the mmap threshold instead stops
    at glibc's ceiling of 32 MiB, and larger arrays (attention's weights over 1000 positions)
    were still mapped fresh each step: the benchmarks' long, 1073 page faults and 8-9 ms of
    system time a step of 120 ms. Where the heap cannot grow, glibc still maps."""
    mallopt = glibc_mallopt()
    if mallopt is None:
        return False
    trimmed = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    unmapped = mallopt(_M_MMAP_MAX, 0)
    return bool(trimmed and unmapped)


def glibc_mallopt():
    """glibc's mallopt(option, value), 1 where it took the setting; None without glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


CACHE_LINE = 64  # bytes


def aligned_empty(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """np.empty(shape, dtype) whose data starts on a cache line (64 bytes).

    NumPy's arrays start on 16 bytes, so three in four start inside a line, and so does every
    wide store into them. Measured on the Intel machine (docs/performance-log.md), one thread:
    a + b into a (16K,) float32 array in L2 took 0.14 ns an entry when the output starts
    on a line and 0.27-0.29 when it does not; an in-place c += b 0.11 against 0.18. For the
    long-lived vectors the optimizer walks block by block (parameters, moments, scratch)."""
    return _on_a_cache_line(np.empty, shape, dtype)


def aligned_zeros(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """np.zeros(shape, dtype) starting on a cache line (see aligned_empty). Like np.zeros, it
    takes zeroed pages from the system that hold no memory until first written (or, where
    malloc keeps freed memory, memory the process holds already): a resumed run's optimizer
    fills its moments from the checkpoint's arrays as it lets each go, so the two are never
    both whole (GPT-2: 1 GB)."""
    return _on_a_cache_line(np.zeros, shape, dtype)


def _on_a_cache_line(allocate, shape: int | tuple[int, ...], dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape if isinstance(shape, tuple) else (shape,)) * dtype.itemsize
    raw = allocate(nbytes + CACHE_LINE, np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def available_bytes() -> int | None:
    """Memory the system can give this process now (Linux's MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts in KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(what: str, needed: int, available: int | None) -> None:
    """ValueError, saying how much is needed, when `needed` bytes exceed `available` (as
    available_bytes reads it; None: unknown, and nothing is refused)."""
    if available is not None and needed > available:
        gib = 2**30
        raise InputError(
            f"{what} would need about {needed / gib:.1f} GiB for one training step; "
            f"{available / gib:.1f} GiB are available"
        )
