"""benchmarks/call_count.py: the NumPy calls, products and broadcasts of a step, each counted
once from the caller's side (its replay is test_call_replay.py's)."""

from __future__ import annotations

import numpy as np

from benchmarks import workloads
from benchmarks.call_count import Counted


def test_call_count_counts_each_call_from_the_callers_side_once():
    """Operators, in-place operators, reductions, matmul, NumPy functions and indexing each
    count once; np.where's inner calls do not; views and attributes do not. `.mean()`, a
    method NumPy writes in Python, counts as the two ufunc calls it makes."""
    a = np.arange(6.0).reshape(2, 3).view(Counted)
    Counted.calls.clear()
    Counted.products.clear()
    Counted.product_seconds.clear()
    b = a * 2.0  # multiply
    b += a  # add
    c = np.exp(b) @ a.T  # exp, matmul
    _ = c.sum(), a.mean(axis=0)  # add.reduce, mean
    d = np.where(a > 1, a, 0.0)  # greater, where
    d[0, 1] = a[1, 2]  # index, index write
    _ = a.reshape(3, 2), a.T, a.shape  # views and attributes: not calls
    assert type(d) is Counted and type(c) is Counted
    assert Counted.products == [((2, 3), (3, 2), np.float64)]  # the product, and its time
    assert len(Counted.product_seconds) == 1 and 0 < Counted.product_seconds[0] < 1
    assert dict(Counted.calls) == {
        "multiply.__call__": 1,
        "add.__call__": 1,
        "exp.__call__": 1,
        "matmul.__call__": 1,
        "add.reduce": 2,  # .sum() and .mean()'s
        "divide.__call__": 1,  # .mean()'s
        "greater.__call__": 1,
        "where": 1,
        "index": 1,
        "index write": 1,
    }


def test_call_count_records_the_calls_that_spread_an_operand_over_rows():
    """A binary ufunc call with an array operand of more than one number and less than the
    whole shape is a broadcast, recorded with its operands' shapes and dtypes; a scalar, an
    array of one number, equal shapes, a product and a vecdot (a gufunc: its rows are its
    core axes, not spread) are not."""
    f64 = np.dtype(np.float64)
    a = np.ones((2, 3)).view(Counted)
    row, one = np.ones(3).view(Counted), np.ones((1, 1)).view(Counted)
    Counted.broadcasts.clear()
    _ = a * 2.0, a + a, a * one, a @ a.T, np.exp(a), np.vecdot(a, row)  # none of them
    a += row  # a row over both rows, in place
    _ = a - a.sum(axis=1, keepdims=True)  # a column over its row (the sum is a reduction)
    _ = np.where(a > row, a, 0.0)  # the compare is the outermost call; where is not binary
    assert Counted.broadcasts == [
        (np.add, (((2, 3), f64), ((3,), f64))),
        (np.subtract, (((2, 3), f64), ((2, 1), f64))),
        (np.greater, (((2, 3), f64), ((3,), f64))),
    ]


def test_a_counted_step_counts_the_calls_on_arrays_it_makes_and_on_the_moments():
    """An array the engine makes in the step (heads_buffer's np.empty, split into heads: an
    index a part) and the optimizer's moments (Adam's sqrt is of its second moment alone)
    are Counted for the step; after it the optimizer holds plain arrays of the same memory,
    the engine's modules see NumPy itself, and a cached vector made during the step is
    plain (a cache keeps it for the steps after)."""
    from benchmarks.call_count import Counted, _holds_arrays, _views, calls_per_step
    from numpy_engine import multihead, reductions
    from numpy_engine.kvcache import KeysValues

    model, optimizer, batches = workloads.build(workloads.WORKLOADS["copy"], 2)
    workloads.engine_step(model, optimizer, batches[0])
    second = optimizer.flat_state["exp_avg_sq"]

    def made(model, optimizer, batch):
        reductions._filled.cache_clear()  # made again inside the step, for the cache
        merged = multihead.heads_buffer((2, 3), 8, 2, 3, np.float32)[0]  # np.empty's
        merged.fill(1.0)  # not a counted call; a sum of empty memory could overflow
        reductions.sum_last(merged)

    def update(model, optimizer, batch):
        grads = {key: np.full(value.shape, 0.5, value.dtype) for key, value in model.params.items()}
        optimizer.step(model.flat, grads)

    calls, _ = calls_per_step(model, optimizer, batches[1], made)
    assert dict(calls) == {"index": 4, "dot": 1}  # three parts and tuple()'s end; sum_last
    calls, _ = calls_per_step(model, optimizer, batches[1], update)
    # sqrt(v) and m / (sqrt(v) + eps) read the moments alone, m *= b1 and v *= b2 write them
    assert calls["sqrt.__call__"] == calls["divide.__call__"] == 1
    assert calls["multiply.__call__"] >= 2
    assert type(optimizer.flat_state["exp_avg_sq"]) is np.ndarray
    assert np.shares_memory(optimizer.flat_state["exp_avg_sq"], second)
    assert type(optimizer.scratch) is np.ndarray and type(optimizer.gathered) is np.ndarray
    assert all(type(v) is np.ndarray for s in optimizer.state.values() for v in s.values())
    assert multihead.np is np and reductions.np is np
    assert type(reductions._filled(24, np.dtype(np.float32))) is np.ndarray  # the cached one
    assert not isinstance(model.flat, Counted)
    # an optimizer's arrays in nested dicts, lists and named tuples are found and viewed too
    held = {"moments": [KeysValues(np.zeros(2), np.ones(2)), (np.ones(3), 0.9)], "lr": 0.1}
    viewed = _views(held, Counted)
    assert type(viewed["moments"][0]) is KeysValues and viewed["lr"] == 0.1
    assert [type(a) for a in (*viewed["moments"][0], viewed["moments"][1][0])] == [Counted] * 3
    assert _holds_arrays(held) and not _holds_arrays({"betas": (0.9, 0.999)})
