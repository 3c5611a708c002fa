"""NumPy's BLAS on one thread with its workers stopped (numpy_engine/blas_threads.py), and the
engine's threads working meanwhile (threads.in_chunks_alone): what runs where, how many
threads the process has, and what is put back. Attention's blocks so: test_query_blocks.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from numpy_engine import blas_threads, threads


def threads_in_process() -> int:
    return len(os.listdir("/proc/self/task"))


def test_alone_stops_the_blas_workers_and_starts_them_again_after(blas_on_two_threads):
    """Two BLAS threads are the caller and one worker: within `alone` the worker is gone and
    a product makes none; after it, the BLAS is on two threads again, its worker back."""
    blas = blas_on_two_threads
    a = np.ones((256, 256))
    a @ a  # 256^3 multiply-adds: past OpenBLAS's threshold for its threads
    running = threads_in_process()
    with blas_threads.alone() as alone:
        assert alone and blas.get_threads() == 1
        assert threads_in_process() == running - 1
        np.testing.assert_array_equal(a @ a, np.full((256, 256), 256.0))
        assert threads_in_process() == running - 1
    assert blas.get_threads() == 2 and threads_in_process() == running
    np.testing.assert_array_equal(a @ a, np.full((256, 256), 256.0))


def test_alone_with_the_blas_on_one_thread_leaves_its_workers(blas_on_two_threads):
    """A BLAS set to one thread (its worker, started before, asleep): nothing to stop."""
    blas = blas_on_two_threads
    a = np.ones((256, 256))
    a @ a  # its worker runs
    blas.set_threads(1)
    running = threads_in_process()
    with blas_threads.alone() as alone:
        assert alone and blas.get_threads() == 1 and threads_in_process() == running
    assert blas.get_threads() == 1 and threads_in_process() == running


def test_library_paths_reads_each_mapped_library_once_spaces_and_all():
    lines = [
        "7f00-7f10 r--p 00000000 08:01 123       /usr/lib/libc.so.6\n",
        "7f10-7f20 r-xp 00001000 08:01 123       /usr/lib/libc.so.6\n",
        "7f20-7f30 rw-p 00000000 00:00 0 \n",  # anonymous: no path
        "7f30-7f40 r--p 00000000 08:01 456       /opt/my libs/libscipy_openblas64_-x.so\n",
        "7f40-7f50 r--p 00000000 08:01 789       /usr/lib/python3.11/os.py\n",
        "7ffc-7ffd rw-p 00000000 00:00 0         [stack]\n",
    ]
    expected = ["/usr/lib/libc.so.6", "/opt/my libs/libscipy_openblas64_-x.so"]
    assert blas_threads.library_paths(lines) == expected


def test_alone_where_no_openblas_is_found_changes_nothing(monkeypatch, blas_on_two_threads):
    monkeypatch.setattr(blas_threads, "openblas", lambda: None)
    with blas_threads.alone() as alone:
        assert not alone and blas_on_two_threads.get_threads() == 2


def ran_where(blas) -> list:
    """threads.in_chunks_alone over two items: each chunk's (thread, BLAS threads, chunk's
    index, items)."""

    def work(i, chunk):
        return threading.get_ident(), blas.get_threads(), i, chunk

    return threads.in_chunks_alone(work, [1, 2])


@pytest.mark.usefixtures("only_the_engines_threads")
def test_in_chunks_alone_runs_each_chunk_on_a_thread_the_blas_on_one(
    on_threads, blas_on_two_threads
):
    on_threads(2)
    (caller, *on_caller), (helper, *on_helper) = ran_where(blas_on_two_threads)
    assert caller == threading.get_ident() != helper
    assert (on_caller, on_helper) == ([1, 0, [1]], [1, 1, [2]])  # the BLAS, the chunk
    assert blas_on_two_threads.get_threads() == 2


@pytest.mark.usefixtures("only_the_engines_threads")
def test_after_a_chunks_exception_the_blas_has_its_threads_again(on_threads, blas_on_two_threads):
    on_threads(2)

    def work(i, chunk):
        if i == 1:
            raise ValueError("chunk 1")

    with pytest.raises(ValueError, match="chunk 1"):
        threads.in_chunks_alone(work, [1, 2])
    assert blas_on_two_threads.get_threads() == 2


def test_in_chunks_alone_keeps_to_the_caller_while_another_thread_runs(
    on_threads, blas_on_two_threads
):
    """A thread not the engine's might be inside a product: its worker is not stopped."""
    on_threads(2)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="not the engine's")
    other.start()
    try:
        ran = ran_where(blas_on_two_threads)
    finally:
        stop.set()
        other.join()
    assert ran == [(threading.get_ident(), 2, 0, [1, 2])]


def test_the_engines_threads_are_told_from_any_other_in_a_fresh_process():
    """The check itself, in a process no other test has left a thread in: true with the
    engine's helper and tqdm's monitor running, false with any other thread."""
    code = """if True:
        import threading
        from numpy_engine import threads
        threads.set_threads(2)
        threads.in_chunks(lambda i, chunk: chunk, [1, 2])  # starts the helper
        seen = [threads._only_the_engines_threads()]
        for name in ("tqdm_monitor", "a user's"):
            stop = threading.Event()
            other = threading.Thread(target=stop.wait, name=name)
            other.start()
            seen.append(threads._only_the_engines_threads())
            stop.set()
            other.join()
        print(len(threading.enumerate()), *seen)
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["2", "True", "True", "False"]  # the caller and one helper


@pytest.mark.usefixtures("only_the_engines_threads")
def test_in_chunks_alone_keeps_to_the_caller_where_the_blas_is_not_found(
    monkeypatch, on_threads, blas_on_two_threads
):
    on_threads(2)
    monkeypatch.setattr(blas_threads, "openblas", lambda: None)
    assert ran_where(blas_on_two_threads) == [(threading.get_ident(), 2, 0, [1, 2])]


def test_in_chunks_alone_on_one_engine_thread_leaves_the_blas_as_it_is(
    on_threads, blas_on_two_threads
):
    on_threads(1)
    assert ran_where(blas_on_two_threads) == [(threading.get_ident(), 2, 0, [1, 2])]
