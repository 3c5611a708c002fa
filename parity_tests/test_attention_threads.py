"""Attention's work on the engine's threads (attention.py, attention_blocks.py): the
pieces of its blocks of queries (batch rows x heads), or its batch groups where it takes no
blocks, shared by two threads with NumPy's BLAS on one meanwhile, give one thread's bits;
and how a group's heads are cut into pieces for the threads. The blocks themselves:
test_query_blocks.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_engine import masks
from parity_tests.test_query_blocks import force_blocks_of_any_mask


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "mask, B, pieces_on_one, pieces_on_two",
    [
        ("shared causal", 1, [(1, 3)], [(1, 1), (1, 2)]),  # one group: its heads in two parts
        ("causal & padding", 3, [(3, 3)], [(3, 1), (3, 2)]),
        ("padding", 3, [(1, 1)] * 9, [(1, 1)] * 9),  # one-head blocks, groups of a row
        ("padding, no blocks", 3, [(1, 3)] * 3, [(1, 3)] * 3),  # groups of a row, whole
    ],
)
@pytest.mark.usefixtures("only_the_engines_threads")
def test_attention_blocks_on_two_threads_give_one_threads_bits(
    monkeypatch, on_threads, blas_on_two_threads, mask, B, pieces_on_one, pieces_on_two, dtype
):
    """The blocks' pieces (batch rows x heads), or the batch groups where no blocks are taken,
    shared by two of the engine's threads, NumPy's BLAS on one thread meanwhile, with a
    dropout mask: the same bits as on one thread, where blocks of every head run all their
    heads at once and the BLAS keeps its two threads; in float64, the whole scores' values
    too (the same bits twice could be the same mistake twice)."""
    from numpy_engine import attention as A
    from numpy_engine import attention_blocks as AB
    from numpy_engine.dropout import Dropout

    rng = np.random.default_rng(B)
    H, T, hs = 3, 7, 4
    q, k, v, dy = (rng.standard_normal((B, H, T, hs)).astype(dtype) for _ in range(4))
    drop = Dropout(rng, attn=0.4).mask("attn", (B, H, T, T), dtype)
    ids = np.array([[3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 0, 0, 0, 0], [3, 4, 5, 6, 7, 0, 0]])[:B]
    visible = masks.causal_visible(T) if mask == "shared causal" else masks.padding_visible(ids, 0)
    if mask == "causal & padding":
        visible = visible & masks.causal_visible(T)
    whole_y, whole_cache = A.attention_forward(q, k, v, visible, drop=drop)
    whole = (whole_y, whole_cache.weights, *A.attention_backward(dy, whole_cache))
    assert whole_cache.query_blocks is None
    monkeypatch.setattr(AB, "QUERY_BLOCK", 2)
    force_blocks_of_any_mask(monkeypatch, H, T, 4)
    if mask.startswith("padding"):
        monkeypatch.setattr(AB, "ONE_HEAD_WIDTH", hs)
        monkeypatch.setattr(AB, "WHOLE_BYTES", 0)
    names = ("_head_blocks_forward", "_head_blocks_backward")
    if mask == "padding, no blocks":  # each group a batch row's scores
        monkeypatch.setattr(AB, "GROUP_BYTES", H * T * T * q.itemsize)
        names = ("_weights", "_group_backward")
    pieces = []  # (thread, BLAS threads, (rows, heads)) of each piece's forward and backward
    for name in names:
        monkeypatch.setattr(A, name, spied(getattr(A, name), pieces, blas_on_two_threads))
    results = {}
    for n in (1, 2):
        on_threads(n)
        pieces.clear()
        y, cache = A.attention_forward(q, k, v, visible, drop=drop)
        results[n] = (y, cache.weights, *A.attention_backward(dy, cache))
        expected = pieces_on_one if n == 1 else pieces_on_two
        assert sorted(shape for _, _, shape in pieces) == sorted(expected * 2)
        assert {blas for _, blas, _ in pieces} == {3 - n}  # 2 on one thread, 1 on two
        assert len({thread for thread, _, _ in pieces}) == n
    for one, two, whole_values in zip(results[1], results[2], whole, strict=True):
        assert one.dtype == dtype and np.array_equal(one, two)
        if dtype == np.float64:
            scale = np.abs(whole_values).max()
            np.testing.assert_allclose(two, whole_values, rtol=1e-12, atol=1e-14 * scale)


def spied(work_of_a_piece, pieces: list, blas):
    """work_of_a_piece, noting in pieces the thread it ran on, the BLAS's threads then, and
    its piece's (batch rows, heads)."""
    import threading

    def run(*args, **kwargs):
        pieces.append((threading.get_ident(), blas.get_threads(), args[0].shape[:2]))
        return work_of_a_piece(*args, **kwargs)

    return run


ALL_HEADS = (slice(None),)


@pytest.mark.parametrize(
    "n_threads, n_groups, H, heads, expected",
    [
        (2, 1, 3, ALL_HEADS, (slice(0, 1), slice(1, 3))),
        (2, 1, 8, ALL_HEADS, (slice(0, 4), slice(4, 8))),
        (2, 1, 2, ALL_HEADS, (slice(0, 1), slice(1, 2))),
        (3, 1, 2, ALL_HEADS, (slice(0, 1), slice(1, 2))),  # no more parts than heads
        (3, 2, 4, ALL_HEADS, (slice(0, 1), slice(1, 2), slice(2, 4))),  # fewer groups
        (2, 1, 1, ALL_HEADS, ALL_HEADS),  # one head: nothing to split
        (2, 2, 4, ALL_HEADS, ALL_HEADS),  # a group a thread
        (1, 1, 4, ALL_HEADS, ALL_HEADS),
        (3, 1, 2, (slice(0, 1), slice(1, 2)), (slice(0, 1), slice(1, 2))),  # one-head blocks
    ],
)
def test_pieces_are_each_groups_heads_split_only_where_groups_are_fewer_than_threads(
    on_threads, n_threads, n_groups, H, heads, expected
):
    """Blocks of every head over fewer batch groups than the engine's threads take their
    heads in as many parts as threads (at most one a head), for the threads to share;
    blocks of one head keep theirs."""
    from numpy_engine import attention_blocks as AB

    assert ALL_HEADS == AB.ALL_HEADS
    on_threads(n_threads)
    groups = [slice(i, i + 1) for i in range(n_groups)]
    blocks = AB.QueryBlocks((slice(0, 4),), (4,), causal=False, heads=heads)
    assert AB.pieces_of(groups, blocks, H) == [(g, h) for g in groups for h in expected]
