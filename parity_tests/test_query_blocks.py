"""Attention by blocks of queries (attention.query_blocks): causal self-attention past two
blocks of 64 queries, and any other mask where a batch row's scores pass GROUP_BYTES, for
heads wider than NARROW_HEAD only where the blocks skip enough scores (WIDE_KEPT). Where the
blocks start and how many they are at the sizes training takes; blocks forced small held to
torch, finite differences and the float32 bound; each block's keys; and the blocks' values
against the whole scores'. Models at those sizes against their twins: test_models.py; the
blocks' pieces on the engine's threads: test_attention_threads.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_engine import masks
from parity_tests import layer_cases as cases
from parity_tests.helpers import check_layer


@pytest.mark.parametrize("T, block", [(7, 2), (7, 3), (9, 1)])
def test_causal_attention_by_query_blocks_holds_to_torch_and_finite_differences(
    monkeypatch, T, block
):
    """Causal self-attention past two attention.QUERY_BLOCKs' positions runs a block of
    queries at a time, each against the keys it sees (query_blocks): forced here onto
    small blocks (the last one short where T is no multiple of them) and held to both
    witnesses as test_layers.py holds the whole, float32's bound too; every hidden weight is
    exactly 0, as the whole path leaves it."""
    from numpy_engine import attention_blocks as AB

    monkeypatch.setattr(AB, "QUERY_BLOCK", block)
    rng = np.random.default_rng(T * block)
    case = cases.attention(rng, 2, 3, T, T, 4, "shared causal")
    _, cache = case.forward(case.inputs)
    rows = tuple(slice(a, min(a + block, T)) for a in range(0, T, block))
    assert cache.query_blocks == (rows, tuple(r.stop for r in rows), True, AB.ALL_HEADS)
    assert not np.triu(cache.weights, 1).any()
    check_layer(case, rng)


def test_causal_blocks_start_past_two_blocks_of_queries():
    """Blocks of queries only for causal_visible's own mask, over more than two blocks'
    positions (the measured rule, attention.QUERY_BLOCK), the last block short; the same
    mask as another array, or no mask, runs whole."""
    from numpy_engine import attention_blocks as AB

    n = AB.QUERY_BLOCK

    def found(visible, T: int):
        return AB.query_blocks(visible, (2, 3, T, T), 4, 4)

    assert found(masks.causal_visible(2 * n), 2 * n) is None
    assert found(masks.causal_visible(2 * n + 1), 2 * n + 1) == (
        (slice(0, n), slice(n, 2 * n), slice(2 * n, 2 * n + 1)),
        (n, 2 * n, 2 * n + 1),
        True,
        AB.ALL_HEADS,
    )
    assert len(found(masks.causal_visible(5 * n), 5 * n).rows) == 5
    assert found(np.array(masks.causal_visible(3 * n)), 3 * n) is None  # a copy: not shared
    assert found(None, 3 * n) is None


def force_blocks_of_any_mask(monkeypatch, H: int, Tk: int, queries: int) -> None:
    """Blocks of `queries` float32 queries (half as many float64 ones, at least one) past
    any score of a batch row: query_blocks' general rule at a test's size."""
    from numpy_engine import attention_blocks as AB

    monkeypatch.setattr(AB, "GROUP_BYTES", 0)
    monkeypatch.setattr(AB, "BLOCK_BYTES", queries * H * Tk * 4)


@pytest.mark.parametrize("heads", ["every head", "one head"])
@pytest.mark.parametrize(
    "kind, Tq, Tk",
    [
        ("padding", 9, 7),
        ("random", 7, 6),
        ("random", 2, 5),
        ("shared", 7, 5),  # one (Tq, Tk) mask for every row and head: a limit, not square
        ("causal", 8, 8),
        ("none", 5, 9),
    ],
)
def test_attention_by_query_blocks_under_any_mask_holds_to_torch_and_finite_differences(
    monkeypatch, kind, Tq, Tk, heads
):
    """Past GROUP_BYTES of a batch row's scores, under any mask but the shared causal one,
    attention runs by blocks of queries, each against the keys up to the last one any of
    its queries sees (query_blocks): forced here onto blocks of 2 queries (float32) and of
    1 (float64), held to both witnesses. A causal mask of its own array stops each block's
    keys at the block's end; padding, at the longest row's. With the heads counted at least
    ONE_HEAD_WIDTH, the masks whose blocks all stop at the same key (every mask here but the
    causal one) take blocks of one head, of 3 float64 queries; the causal, of every head."""
    from numpy_engine import attention_blocks as AB

    force_blocks_of_any_mask(monkeypatch, 3, Tk, 2)
    if heads == "one head":
        monkeypatch.setattr(AB, "ONE_HEAD_WIDTH", 4)
    rng = np.random.default_rng(Tq * Tk)
    case = cases.attention(rng, 2, 3, Tq, Tk, 4, kind)
    _, cache = case.forward(case.inputs)
    if heads == "one head" and kind != "causal":
        assert cache.query_blocks.rows == tuple(slice(t, min(t + 3, Tq)) for t in range(0, Tq, 3))
        assert cache.query_blocks.heads == (slice(0, 1), slice(1, 2), slice(2, 3))
    else:
        assert cache.query_blocks.rows == tuple(slice(t, t + 1) for t in range(Tq))
        assert cache.query_blocks.heads == AB.ALL_HEADS
    if kind == "causal":
        assert cache.query_blocks.stops == tuple(range(1, Tq + 1))
        assert not np.triu(cache.weights, 1).any()
    check_layer(case, rng)


def test_blocks_of_any_mask_start_past_a_rows_group_bytes():
    """The general rule at its real sizes: a batch row's scores past GROUP_BYTES (1 MiB),
    BLOCK_BYTES (1 MiB) of scores a block; each block's keys end after the last any of its
    queries sees. Heads narrower than ONE_HEAD_WIDTH (16) take blocks of every head; heads at
    least that wide, blocks of one head where every block would stop at the same key."""
    from numpy_engine import attention as A
    from numpy_engine import attention_blocks as AB

    assert AB.GROUP_BYTES == AB.BLOCK_BYTES == 1 << 20 and AB.ONE_HEAD_WIDTH == 16
    found = AB.query_blocks(None, (2, 4, 1000, 1000), 4, 8)  # 16 KB a query: 65 a block
    assert found.rows[:2] == (slice(0, 65), slice(65, 130)) and found.rows[-1] == slice(975, 1000)
    assert len(found.rows) == 16 and found.stops == (1000,) * 16 and not found.causal
    assert found.heads == AB.ALL_HEADS
    one_head = tuple(slice(h, h + 1) for h in range(4))
    for hs in (16, 32, 64):  # a head's 4 KB a query: 262 a block
        found = AB.query_blocks(None, (2, 4, 1000, 1000), 4, hs)
        assert found.rows == (slice(0, 262), slice(262, 524), slice(524, 786), slice(786, 1000))
        assert found.stops == (1000,) * 4 and found.heads == one_head
    for hs, heads in ((8, AB.ALL_HEADS), (16, one_head[:2])):  # the width: q's last axis
        q = np.zeros((1, 2, 300, hs))  # float64, 2 heads: 1.4 MB of scores
        assert A.attention_forward(q, q, q, None)[1].query_blocks.heads == heads
    cross = AB.query_blocks(None, (2, 4, 100, 3000), 4, 8)  # 48 KB a query: 21 a block
    assert cross.rows[0] == slice(0, 21) and len(cross.rows) == 5 and cross.stops[0] == 3000
    assert AB.query_blocks(None, (2, 4, 256, 256), 4, 16) is None  # 1 MiB a row: whole
    assert len(AB.query_blocks(None, (2, 4, 257, 257), 4, 8).rows) == 2  # 255, 2
    assert len(AB.query_blocks(None, (2, 4, 257, 257), 8, 8).rows) == 3  # float64: 127 a block
    ids = np.ones((2, 300), dtype=np.int64)
    ids[0, 290:], ids[1, 280:] = 0, 0  # right padding: the longest row has 290 tokens
    padding = masks.padding_visible(ids, 0)
    padded = AB.query_blocks(padding, (2, 8, 300, 300), 4, 8)
    assert padded.stops == (290, 290, 290)  # 8 heads: blocks of 109 queries
    padded = AB.query_blocks(padding, (2, 8, 300, 300), 4, 16)  # one head: all 300 queries
    assert padded.rows == (slice(0, 300),) and padded.stops == (290,) and len(padded.heads) == 8
    both = masks.causal_visible(300) & padding  # (2, 1, 300, 300): the stops differ
    found = AB.query_blocks(both, (2, 8, 300, 300), 4, 16)
    assert found.stops == (109, 218, 290) and found.heads == AB.ALL_HEADS


def test_wider_heads_take_blocks_of_every_head_only_where_they_keep_at_most_wide_kept():
    """Heads wider than NARROW_HEAD (64, as GPT-2's) at real sizes, where the blocks would
    stop at different keys: blocks of every head where those compute at most WIDE_KEPT (3/4)
    of the scores, else whole. A seq2seq decoder's causal & padding mask keeps about half.
    Queries 0..519 seeing keys 0..K-1 and the others every key keep (520 K + 480 x 1000) /
    10^6: blocks at K = 519, whole at 520. Where every block would stop at the same key, one
    head a block (the test above)."""
    from numpy_engine import attention as A
    from numpy_engine import attention_blocks as AB

    assert AB.WIDE_KEPT == 0.75 and AB.NARROW_HEAD == 32
    shape = (2, 4, 1000, 1000)  # float32: 16 KB a query, 65 queries a block of every head
    ids = np.ones((2, 1000), dtype=np.int64)
    ids[1, 900:] = 0
    decoder = AB.query_blocks(
        masks.causal_visible(1000) & masks.padding_visible(ids, 0), shape, 4, 64
    )
    assert decoder.stops == tuple(range(65, 1000, 65)) + (1000,) and not decoder.causal
    assert decoder.heads == AB.ALL_HEADS
    for keys, blocked in ((519, True), (520, False)):  # 520 = 8 blocks of 65 queries
        visible = np.ones((1, 1, 1000, 1000), dtype=bool)
        visible[..., :520, keys:] = False
        found = AB.query_blocks(visible, shape, 4, 64)
        assert (found is not None) == blocked
        assert not blocked or found.stops == (keys,) * 8 + (1000,) * 8
    assert AB.query_blocks(visible, shape, 4, 32).stops == (520,) * 8 + (1000,) * 8  # narrow
    q = np.zeros((1, 4, 300, 64))  # float64, 4 heads: 2.9 MB of scores, 109 queries a block
    both = masks.causal_visible(300) & masks.padding_visible(np.ones((1, 300), np.int64), 0)
    assert A.attention_forward(q, q, q, both)[1].query_blocks.stops == (109, 218, 300)


def test_each_blocks_keys_stop_after_the_last_any_of_its_queries_sees(monkeypatch):
    """A block's stop is one past the last key a query of it sees, in any batch row or head,
    whatever axes the mask has ((Tq, Tk), (H, Tq, Tk), (B, H, Tq, Tk)): blocks of one query
    forced here, over two queries."""
    from numpy_engine import attention_blocks as AB

    force_blocks_of_any_mask(monkeypatch, 2, 4, 1)  # one float32 query a block
    first_sees_one = np.array([[True, False, False, False], [True, True, True, False]])
    for visible in (first_sees_one, first_sees_one[None], first_sees_one[None, None]):
        assert AB.query_blocks(visible, (3, 2, 2, 4), 4, 4).stops == (1, 3)
    per_head = np.stack([first_sees_one, first_sees_one[::-1]])  # (H, Tq, Tk): head 1 swapped
    assert AB.query_blocks(per_head, (3, 2, 2, 4), 4, 4).stops == (3, 3)
    per_row = np.zeros((3, 1, 2, 4), dtype=bool)
    per_row[:, :, :, 0], per_row[2, 0, 1, 3] = True, True  # only row 2's last query sees key 3
    assert AB.query_blocks(per_row, (3, 2, 2, 4), 4, 4).stops == (1, 4)


@pytest.mark.parametrize("mask", ["shared causal", "causal & padding"])
@pytest.mark.parametrize("dropped", [False, True], ids=["", "dropout"])
@pytest.mark.parametrize("offset", [0.0, 100.0])
@pytest.mark.parametrize("rows", [None, 1], ids=["one group", "groups of a row"])
def test_attention_by_query_blocks_equals_the_whole_scores(
    monkeypatch, rows, offset, dropped, mask
):
    """Blocks of 2 queries (7 positions: the last block one) against the whole (T, T)
    scores, float64: in one group and in groups of a batch row, with a dropout mask on the
    weights (each block reads its rows of it), and at offset 100, where every softmax takes
    the textbook path; under the shared causal mask and under a per-row causal & padding
    mask (query_blocks' general rule, a seq2seq decoder's), whose last row's padding ends
    the last block's keys early. The same values to rounding; the hidden weights exactly 0,
    the gradients of keys no query sees too."""
    from numpy_engine import attention as A
    from numpy_engine import attention_blocks as AB
    from numpy_engine.dropout import Dropout

    rng = np.random.default_rng(1)
    B, H, T, hs = 3, 2, 7, 4
    q, k, v, dy = (rng.standard_normal((B, H, T, hs)) for _ in range(4))
    if offset:
        q[..., 0], k[..., 0] = offset * np.sqrt(hs), 1.0  # scores = offset + N(0, 3/4)
    drop = Dropout(rng, attn=0.4).mask("attn", (B, H, T, T), np.float64) if dropped else None
    visible = masks.causal_visible(T)
    if mask == "causal & padding":  # every row's last key is padding: no query sees it
        ids = np.array([[3, 4, 5, 6, 7, 8, 0], [3, 4, 5, 0, 0, 0, 0], [3, 4, 5, 6, 7, 0, 0]])
        visible = visible & masks.padding_visible(ids, 0)
    whole_y, whole_cache = A.attention_forward(q, k, v, visible, drop=drop)
    whole_grads = A.attention_backward(dy, whole_cache)
    assert whole_cache.query_blocks is None  # 7 positions are not past two blocks of 64
    monkeypatch.setattr(AB, "QUERY_BLOCK", 2)
    force_blocks_of_any_mask(monkeypatch, H, T, 4)  # 2 float64 queries a block
    if rows is not None:
        monkeypatch.setattr(AB, "WHOLE_BYTES", 0)
    y, cache = A.attention_forward(q, k, v, visible, drop=drop)
    assert len(AB.batch_groups(cache.weights.shape, 8)) == (B if rows else 1)
    stops = (2, 4, 6, 7) if mask == "shared causal" else (2, 4, 6, 6)
    assert cache.query_blocks.stops == stops and not np.triu(cache.weights, 1).any()
    pairs = [(y, whole_y), (cache.weights, whole_cache.weights)]
    pairs += zip(A.attention_backward(dy, cache), whole_grads, strict=True)
    for blocked, whole in pairs:
        np.testing.assert_allclose(blocked, whole, rtol=1e-12, atol=1e-14 * np.abs(whole).max())
    if mask == "causal & padding":
        assert not pairs[3][0][:, :, 6].any() and not pairs[4][0][:, :, 6].any()  # dk, dv


@pytest.mark.parametrize("mask", ["shared causal", "padding"])
def test_blocks_backward_into_views_of_merged_gradients_gives_the_same_bits(monkeypatch, mask):
    """Multi-head attention passes the backward views of merged (B, T, C) gradients as out
    (split_heads): the blocks sum dk and dv in contiguous arrays and copy them in at the end.
    Into views that start as NaN, the same bits as into new arrays, every entry written."""
    from numpy_engine import attention as A
    from numpy_engine import attention_blocks as AB
    from numpy_engine.multihead import split_heads

    monkeypatch.setattr(AB, "QUERY_BLOCK", 2)
    force_blocks_of_any_mask(monkeypatch, 3, 7, 4)  # 2 float64 queries a block
    rng = np.random.default_rng(5)
    B, H, T, hs = 2, 3, 7, 4
    q, k, v, dy = (rng.standard_normal((B, H, T, hs)) for _ in range(4))
    ids = np.array([[3, 4, 5, 6, 7, 0, 0], [3, 4, 5, 6, 0, 0, 0]])
    visible = masks.causal_visible(T) if mask == "shared causal" else masks.padding_visible(ids, 0)
    _, cache = A.attention_forward(q, k, v, visible)
    assert len(cache.query_blocks.rows) == 4
    merged = [np.full((B, T, H * hs), np.nan) for _ in range(3)]
    views = tuple(split_heads(m, H) for m in merged)
    assert not any(view.flags.c_contiguous for view in views)
    A.attention_backward(dy, cache, out=views)
    for view, new in zip(views, A.attention_backward(dy, cache), strict=True):
        assert np.array_equal(view, new)  # no NaN left, and the same bits


@pytest.mark.parametrize("rows", [None, 1], ids=["one group", "groups of a row"])
@pytest.mark.parametrize(
    "mask_shape", [(3, 1, 7, 7), (3, 2, 1, 7), (3, 2, 7, 7), (1, 2, 7, 7), (1, 1, 7, 7)]
)
def test_one_head_blocks_take_each_heads_part_of_a_mask_and_of_dropout(
    monkeypatch, mask_shape, rows
):
    """Blocks of one head read a mask's head axis where it has one of its own (2 heads here)
    and broadcast the mask where it has not (shared by the heads, by every batch row, or by
    both: a limit), and read the dropout mask's heads, in one group of batch rows and in
    groups of a row (each group's rows of a mask that has its own, the whole of one shared
    by every row): the whole scores' values, float64."""
    from numpy_engine import attention as A
    from numpy_engine import attention_blocks as AB
    from numpy_engine.dropout import Dropout

    rng = np.random.default_rng(sum(mask_shape))
    B, H, T, hs = 3, 2, 7, 4
    q, k, v, dy = (rng.standard_normal((B, H, T, hs)) for _ in range(4))
    visible = rng.random(mask_shape) < 0.6
    visible[..., -1] = True  # every query sees the last key: every block stops at T
    drop = Dropout(rng, attn=0.4).mask("attn", (B, H, T, T), np.float64)
    whole_y, whole_cache = A.attention_forward(q, k, v, visible, drop=drop)
    whole_grads = A.attention_backward(dy, whole_cache)
    assert whole_cache.query_blocks is None
    force_blocks_of_any_mask(monkeypatch, H, T, 4)  # one head's 4 float64 queries a block
    monkeypatch.setattr(AB, "ONE_HEAD_WIDTH", hs)
    if rows is not None:
        monkeypatch.setattr(AB, "WHOLE_BYTES", 0)
    y, cache = A.attention_forward(q, k, v, visible, drop=drop)
    assert len(AB.batch_groups(cache.weights.shape, 8)) == (B if rows else 1)
    assert cache.query_blocks.heads == (slice(0, 1), slice(1, 2))
    assert cache.query_blocks.rows == (slice(0, 4), slice(4, 7))
    pairs = [(y, whole_y), (cache.weights, whole_cache.weights)]
    pairs += zip(A.attention_backward(dy, cache), whole_grads, strict=True)
    for blocked, whole in pairs:
        np.testing.assert_allclose(blocked, whole, rtol=1e-12, atol=1e-14 * np.abs(whole).max())
