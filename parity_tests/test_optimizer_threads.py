"""The optimizer's step on the engine's threads (threads.py, clipping.py): each thread takes
a run of the flat vectors' blocks, and the parameters, moments and gradient norm are one
thread's bits, clipped or not, in blocks of three entries and of the real 256 KB; a NaN in
a helper's blocks stops the step before anything moves. The step on one thread, against
torch: test_optim.py and test_clipping.py.
"""

from __future__ import annotations

import threading
from unittest import mock

import numpy as np
import pytest

from numpy_engine import clipping, optim, threads
from numpy_engine.optim import SGD, Adam, AdamW
from numpy_engine.params import flatten, unflatten
from parity_tests.optim_cases import block_sizes, random_params


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_step_on_several_threads_is_the_one_thread_step_bit_for_bit(kind, dtype):
    """26 entries in blocks of 3 (9 blocks, three of them across two arrays) and at least two
    blocks a thread: on 3 threads each takes a run of blocks (gathering those across arrays
    into its own scratch), and params, moments and norms are one thread's bits, clipped or
    not; a NaN in a helper's blocks stops the step before anything moves."""
    make = {
        "sgd": lambda p: SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
        "adam": lambda p: Adam(p, lr=0.01, weight_decay=0.01),
        "adamw": lambda p: AdamW(p, lr=0.01),
    }[kind]
    rng = np.random.default_rng(0)
    flat, params = random_params(rng)
    flat = flat.astype(dtype)
    params, twin = unflatten(flat, params), flat.copy()
    with block_sizes(3 * flat.itemsize, gather_whole_blocks=1):
        threaded, single = make(params), make(unflatten(twin, params))
    ran_on, block = set(), clipping.Gradients.block

    def recorded(gradients, piece, scratch):
        ran_on.add(threading.get_ident())
        return block(gradients, piece, scratch)

    two_blocks_a_thread = mock.patch.object(clipping, "THREAD_BLOCKS", 2)
    before = threads.threads()
    try:
        for scale in (5.0, 0.01, 5.0):  # clipped, not clipped, clipped
            grads = {
                k: (scale * rng.standard_normal(v.shape)).astype(dtype) for k, v in params.items()
            }
            threads.set_threads(1)
            norm = single.step(twin, grads, max_grad_norm=0.5)
            threads.set_threads(3)
            with mock.patch.object(clipping.Gradients, "block", recorded), two_blocks_a_thread:
                assert threaded.step(flat, grads, max_grad_norm=0.5) == norm
            np.testing.assert_array_equal(flat, twin)
            for name, moment in threaded.flat_state.items():
                np.testing.assert_array_equal(moment, single.flat_state[name])
        assert threading.get_ident() in ran_on and len(ran_on) > 1  # the caller and helpers
        grads["e"][-1, -1] = np.nan  # in the last block: the third thread's
        kept = flat.copy(), {k: v.copy() for k, v in threaded.flat_state.items()}
        with pytest.raises(optim.NonFiniteGradients, match="norm is nan"), two_blocks_a_thread:
            threaded.step(flat, grads, max_grad_norm=0.5, error_if_nonfinite=True)
        np.testing.assert_array_equal(flat, kept[0])
        assert threaded.step_count == 3
    finally:
        threads.set_threads(before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threads_updating_real_blocks_at_once_share_no_scratch(dtype):
    """Blocks of the real size (256 KB), long enough that three threads update theirs at the
    same time: each thread's scratch rows are its own, so the params and moments are one
    thread's bits (rows shared between threads would mix their blocks' intermediates)."""
    shapes = {"a": (30_000,), "b": (100, 700), "c": (45_000,)}  # blocks across arrays
    rng = np.random.default_rng(0)
    flat = flatten({key: rng.standard_normal(shape) for key, shape in shapes.items()})
    flat = flat.astype(dtype)
    twin, like = flat.copy(), {key: np.empty(shape, dtype) for key, shape in shapes.items()}
    threaded, single = AdamW(unflatten(flat, like), lr=0.01), AdamW(unflatten(twin, like), lr=0.01)
    assert len(threaded.pieces) >= 3
    before = threads.threads()
    try:
        for _ in range(3):
            grads = {k: rng.standard_normal(shape).astype(dtype) for k, shape in shapes.items()}
            threads.set_threads(1)
            norm = single.step(twin, grads, max_grad_norm=1.0)
            threads.set_threads(3)
            with mock.patch.object(clipping, "THREAD_BLOCKS", 1):
                assert threaded.step(flat, grads, max_grad_norm=1.0) == norm
            np.testing.assert_array_equal(flat, twin)
            for name, moment in threaded.flat_state.items():
                np.testing.assert_array_equal(moment, single.flat_state[name])
    finally:
        threads.set_threads(before)


@pytest.mark.parametrize(("n_blocks", "scratches"), [(3, 1), (2 * clipping.THREAD_BLOCKS, 2)])
def test_the_optimizer_holds_scratch_rows_for_the_threads_its_step_runs_on(
    on_threads, n_blocks, scratches
):
    """On two threads, a vector of char-lm's 3 blocks is updated on the caller's thread
    alone, so its optimizer holds one set of three scratch rows; one of twice THREAD_BLOCKS
    blocks runs on both threads, each with rows of its own. (The first step had made rows
    for each thread: 0.75 MiB more of char-lm's step peak, never used.)"""
    on_threads(2)
    entries = n_blocks * (clipping.BLOCK_BYTES // 4)  # float32
    flat = np.zeros(entries, np.float32)
    optimizer = AdamW(unflatten(flat, {"w": flat}), lr=0.01)
    assert len(optimizer.pieces) == n_blocks
    optimizer.step(flat, {"w": np.ones(entries, np.float32)}, max_grad_norm=1.0)
    assert [s.shape for s in optimizer.scratches] == [(3, optimizer.block_entries)] * scratches
    assert clipping.thread_runs(optimizer.pieces) == scratches
