"""NumPy's BLAS on one thread, its idle workers stopped, while the engine's own threads share
the cores (threads.in_chunks_alone).

After each product, OpenBLAS's worker threads spin for about 2^28 clock ticks (a tenth of a
second) before they sleep (THREAD_TIMEOUT in its blas_server.c), so a step's next product
finds them awake. An engine thread started between two products then shares a core with a
spinning worker: attention's blocks on two threads made a step slower (Zen 4, char-lm's
model over 1024 positions: 1.065), and setting the BLAS to one thread alone does not stop
the spin. OpenBLAS's own blas_thread_shutdown_, which it runs before a fork, joins the
workers, and setting the BLAS's threads back starts them again. Stopping and starting
them took 95-166 us here (three readings, Zen 4).

Found through /proc/self/maps (Linux) and ctypes: the loaded library whose name holds
"openblas", and its set/get functions under the names NumPy's wheels (scipy-openblas) and
other builds give them. Where those are not found, nothing is changed and `alone` says so.
"""

from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager
from functools import cache
from typing import Iterator, NamedTuple

# Each function's names, scipy-openblas's first (NumPy's wheels: ILP64, then LP64), then
# OpenBLAS's own
SET_NAMES = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
GET_NAMES = tuple(name.replace("set_num", "get_num") for name in SET_NAMES)
STOP_NAME = "blas_thread_shutdown_"


class OpenBLAS(NamedTuple):
    set_threads: ctypes._CFuncPtr
    get_threads: ctypes._CFuncPtr
    stop_workers: ctypes._CFuncPtr


@cache
def openblas() -> OpenBLAS | None:
    """NumPy's OpenBLAS, as loaded in this process, or None where it is not found."""
    for path in _loaded_libraries():
        if "openblas" not in os.path.basename(path).lower():
            continue
        library = ctypes.CDLL(path)  # already loaded: the same handle, nothing run again
        functions = [_first(library, names) for names in (SET_NAMES, GET_NAMES, (STOP_NAME,))]
        if None not in functions:
            functions[0].argtypes = (ctypes.c_int,)
            return OpenBLAS(*functions)
    return None


def _loaded_libraries() -> list[str]:
    """The paths of the shared libraries this process has loaded (Linux), after NumPy's."""
    import numpy  # noqa: F401  (its BLAS is loaded with it)

    try:
        with open("/proc/self/maps") as maps:
            return library_paths(maps)
    except OSError:
        return []


def library_paths(maps_lines) -> list[str]:
    """Each shared library's path in /proc/self/maps' lines, once, in order: a line is
    "address perms offset device inode path", the path last (it may hold spaces) or none."""
    paths = (line.split(maxsplit=5)[-1].strip() for line in maps_lines)
    return list(dict.fromkeys(p for p in paths if ".so" in os.path.basename(p)))


def _first(library: ctypes.CDLL, names: tuple) -> ctypes._CFuncPtr | None:
    """The library's function by the first of names it has; None where it has none."""
    for name in names:
        if hasattr(library, name):
            return getattr(library, name)
    return None


@contextmanager
def alone() -> Iterator[bool]:
    """Within: NumPy's BLAS on one thread, its workers stopped (True), or nothing changed
    (False: no OpenBLAS found). After: the BLAS's threads as before, its workers started
    again (OpenBLAS's goto_set_num_threads starts them where a shutdown left none)."""
    blas = openblas()
    if blas is None:
        yield False
        return
    before = blas.get_threads()
    if before > 1:
        blas.set_threads(1)  # first: a product now runs on its caller's thread, no worker's
        blas.stop_workers()
    try:
        yield True
    finally:
        if before > 1:
            blas.set_threads(before)
