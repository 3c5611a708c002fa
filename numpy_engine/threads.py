"""The engine's own threads, for work over independent blocks: the optimizer's, attention's.

NumPy's BLAS spreads a product over the cores, but an elementwise pass (a ufunc) runs on
the thread that calls it. The optimizer's update is ~13 such passes over every parameter,
block by block (optim.py), and its blocks are independent, so several Python threads can
each take a contiguous run of them: NumPy lets go of the GIL inside a ufunc's loop. The
results are one thread's, bit for bit: the same operations on the same blocks, and what
each block returns (the norm's squares) added in block order.

Measured on the Intel Xeon (2 cores): AdamW with clipping over GPT-2's 124M float32
parameters, alone, 379 -> 291 ms on two threads (0.809 in `python -m
benchmarks.optimizer_threads`, which alternates it with torch's AdamW on two threads);
GPT-2's training step with NumPy's BLAS on two threads, the engine's one or two
alternating in one process, 1292 -> 1253 ms (0.978, 12 pairs). Smaller models gain
nothing (large 0.986 and 1.009, 48 blocks; char-lm's 3 blocks stay on one thread).

Between two products, OpenBLAS's threads spin for a while before they sleep, and a helper
thread there competes with them: GELU's row blocks on two threads made the step slower
(large 1.026, char-lm 1.032). So work between products runs on the engine's threads only
where it pays for stopping the BLAS's workers first (in_chunks_alone, blas_threads.py):
attention's batch groups and blocks of queries (attention.py), whose passes over the scores
outweigh their products. GELU's row blocks so gained nothing (large 0.996).

How many threads: set_threads(n), or by default the number NumPy's BLAS is told to start
(OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS) where that is set, else the cores this process
may run on. One thread makes every call on the caller's thread.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import numpy as np

from numpy_engine import blas_threads
from numpy_engine.checks import InputError

Result = TypeVar("Result")
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
HELPER_NAME = "numpy-engine"  # the helper threads' names start so
# Other libraries' threads known to make no product: tqdm's monitor, which a progress bar
# (transformers' loading of a checkpoint) starts, and which lives as long as the process
IDLE_THREAD_NAMES = ("tqdm_monitor",)


def default_threads(environ=os.environ) -> int:
    """The BLAS's thread count where a variable sets it (a positive integer), else the cores
    this process may run on."""
    for name in BLAS_THREAD_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):  # Linux: the process's own, which may be fewer
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_threads = default_threads()
_pool: ThreadPoolExecutor | None = None  # the helpers, made at the first need of them


def set_threads(n: int) -> None:
    """Run the engine's elementwise blocks on n threads (the caller's and n - 1 helpers)."""
    global _threads, _pool
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"threads must be a positive int, got {n!r}")
    if n != _threads and _pool is not None:
        _pool.shutdown()
        _pool = None
    _threads = n


def threads() -> int:
    """How many threads the engine's elementwise blocks run on."""
    return _threads


def in_chunks(work: Callable[[int, list], Result], items: list, least: int = 1) -> list[Result]:
    """[work(i, chunk_i)]: items cut into one contiguous chunk a thread, each of at least
    `least` items (so fewer threads, or one, for fewer items), chunk 0 worked on by the
    caller, the others by the helpers at the same time. Returns when every chunk is done,
    with their results in order; a chunk's exception is raised then, the first chunk's
    first. The helpers handle NumPy's floating-point errors as the caller does (np.errstate)."""
    n = chunk_count(len(items), least)
    if n == 1:
        return [work(0, items)]
    chunks = [items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)]
    errors = np.geterr()  # NumPy's error handling is the thread's own: the helpers take the
    # caller's, so that an overflow the caller raises on (a training loop's guard) raises

    def as_the_caller(i: int, chunk: list) -> Result:
        with np.errstate(**errors):
            return work(i, chunk)

    helpers = [_helpers().submit(as_the_caller, i, chunk) for i, chunk in enumerate(chunks) if i]
    try:
        first = work(0, chunks[0])
    finally:  # no helper may still be writing when the caller goes on, even after an error
        failures = [future.exception() for future in helpers]  # each waits for its chunk
    for failure in failures:
        if failure is not None:
            raise failure
    return [first, *(future.result() for future in helpers)]


def chunk_count(n_items: int, least: int) -> int:
    """How many threads in_chunks runs n_items on: one chunk a thread, each of at least
    `least` items, and never fewer than one."""
    return max(1, min(_threads, n_items // least))


def in_chunks_alone(work: Callable[[int, list], Result], items: list) -> list[Result]:
    """in_chunks(work, items) with NumPy's BLAS on one thread and its idle workers stopped
    meanwhile (blas_threads.py), so that the engine's threads have the cores, each calling
    the BLAS on its own thread. On the caller's thread alone (work(0, items)) where the BLAS
    cannot be so set, or where a thread not the engine's is running: it might be inside a
    product, and a worker stopped under it would never return."""
    if min(_threads, len(items)) <= 1 or not _only_the_engines_threads():
        return [work(0, items)]
    with blas_threads.alone() as alone:
        if not alone:
            return [work(0, items)]
        return in_chunks(work, items)


def _only_the_engines_threads() -> bool:
    """Whether every other thread of this process is one of the engine's helpers, or a
    thread known to make no product (IDLE_THREAD_NAMES)."""
    caller = threading.current_thread()
    return all(
        t is caller or t.name.startswith(HELPER_NAME) or t.name in IDLE_THREAD_NAMES
        for t in threading.enumerate()
    )


def _helpers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(_threads - 1, thread_name_prefix=HELPER_NAME)
    return _pool


def _forget_helpers() -> None:
    """In a forked child: the parent's helper threads do not exist there."""
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)
