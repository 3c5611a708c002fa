"""The engine's own threads (numpy_engine/threads.py): how work is cut and run, and what a
helper thread takes from its caller. The optimizer on several threads: test_optimizer_threads.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from numpy_engine import threads
from numpy_engine.checks import InputError


def chunks_and_threads(n_items: int, least: int = 1, n_chunks: int = 1) -> tuple[list, list]:
    """What in_chunks hands each chunk, and the thread each ran on; each of the n_chunks
    chunks expected waits for all of them to have started (they run at the same time)."""
    started = threading.Barrier(n_chunks)

    def work(i, chunk):
        started.wait(timeout=10)  # BrokenBarrierError unless n_chunks run at once
        return i, chunk, threading.get_ident()

    ran = threads.in_chunks(work, list(range(n_items)), least)
    assert [i for i, _, _ in ran] == list(range(len(ran)))  # results in the chunks' order
    return [chunk for _, chunk, _ in ran], [ident for _, _, ident in ran]


def test_items_are_cut_into_one_contiguous_chunk_a_thread(on_threads):
    on_threads(3)
    chunks, idents = chunks_and_threads(10, n_chunks=3)
    assert chunks == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert idents[0] == threading.get_ident()  # the caller takes the first chunk
    assert len(set(idents)) == 3  # and a helper each of the others, at the same time


@pytest.mark.parametrize(
    ("n_items", "least", "expected"),
    [
        (10, 4, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]),  # two chunks of at least 4
        (7, 4, [[0, 1, 2, 3, 4, 5, 6]]),  # one: the caller's
        (2, 1, [[0], [1]]),  # at most one thread an item
        (0, 1, [[]]),
    ],
)
def test_fewer_items_than_threads_times_least_run_on_fewer_threads(
    on_threads, n_items, least, expected
):
    on_threads(3)
    chunks, idents = chunks_and_threads(n_items, least, len(expected))
    assert chunks == expected
    assert len(set(idents)) == len(expected)


def test_a_new_thread_count_gets_as_many_threads_at_once(on_threads):
    """The helpers made for two threads give way to as many as a new count needs; the old
    ones are shut down, not left waiting."""
    on_threads(2)
    assert chunks_and_threads(4, n_chunks=2)[0] == [[0, 1], [2, 3]]
    helpers = threads._pool
    on_threads(3)
    assert helpers._shutdown and threads._pool is None  # made again at the next need
    chunks, idents = chunks_and_threads(6, n_chunks=3)  # three chunks running at once
    assert chunks == [[0, 1], [2, 3], [4, 5]] and len(set(idents)) == 3


def test_one_thread_runs_everything_on_the_caller(on_threads):
    on_threads(1)
    chunks, idents = chunks_and_threads(10)
    assert chunks == [list(range(10))] and idents == [threading.get_ident()]


def test_a_helpers_exception_is_raised_once_every_chunk_is_done(on_threads):
    on_threads(2)
    done = []

    def work(i, chunk):
        if i == 1:
            raise ValueError("chunk 1")
        threading.Event().wait(0.05)  # the caller's chunk ends after the helper's raised
        done.append(i)

    with pytest.raises(ValueError, match="chunk 1"):
        threads.in_chunks(work, [0, 1])
    assert done == [0]

    def both_fail(i, chunk):
        raise ValueError(f"chunk {i}")

    with pytest.raises(ValueError, match="chunk 0"):  # the caller's own first
        threads.in_chunks(both_fail, [0, 1])


def test_helpers_handle_floating_point_errors_as_their_caller(on_threads):
    """A training loop's guard raises on overflow (np.errstate); in a helper thread, whose
    own state would only warn, an overflow raises all the same."""
    on_threads(2)
    values = np.array([1.0, 3e38], np.float32)  # only the helper's chunk overflows

    def double(i, chunk):
        return [values[j] * np.float32(2) for j in chunk]

    with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow"):
        threads.in_chunks(double, [0, 1])
    with np.errstate(over="ignore"):
        assert threads.in_chunks(double, [0, 1]) == [[2.0], [np.inf]]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_set_threads_refuses_what_is_not_a_positive_int(bad):
    with pytest.raises(InputError, match=f"threads must be a positive int, got {bad!r}"):
        threads.set_threads(bad)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"OPENBLAS_NUM_THREADS": "3", "OMP_NUM_THREADS": "5"}, 3),
        ({"OPENBLAS_NUM_THREADS": "1"}, 1),  # the suite's setting (conftest.py)
        ({"OMP_NUM_THREADS": " 5 "}, 5),
        ({"OPENBLAS_NUM_THREADS": "0", "OMP_NUM_THREADS": "4"}, 4),
        ({"OPENBLAS_NUM_THREADS": "two"}, None),  # not a count: the cores
        ({}, None),
    ],
)
def test_the_default_is_the_blas_thread_count_where_set_else_the_cores(
    monkeypatch, environ, expected
):
    """The cores this process may run on (its own affinity, not another's)."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2} if pid == 0 else {0})
    assert threads.default_threads(environ) == (3 if expected is None else expected)


@pytest.mark.parametrize(("cpu_count", "expected"), [(6, 6), (None, 1)])
def test_without_affinity_the_default_is_the_cpu_count_or_one(monkeypatch, cpu_count, expected):
    """Where the system cannot tell a process's cores (macOS), os.cpu_count(); one where
    that cannot tell either."""
    monkeypatch.delattr(threads.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: cpu_count)
    assert threads.default_threads({}) == expected


def test_a_data_parallel_rank_takes_its_share_of_the_cores_for_blas_and_engine(
    monkeypatch, on_threads
):
    """Ranks on one machine share its cores: 4 cores, 2 ranks -> 2 threads each; 3 ranks on
    2 cores -> 1 each."""
    import threadpoolctl

    from numpy_engine import cli_train

    blas = []
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", blas.append)
    for cores, ranks, share in ((4, 2, 2), (2, 3, 1)):
        monkeypatch.setattr(cli_train.os, "cpu_count", lambda cores=cores: cores)
        cli_train._share_the_cores(ranks)
        assert blas[-1] == share and threads.threads() == share
