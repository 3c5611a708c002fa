"""The paths a layer takes for speed, chosen by size, and what each must keep: layernorms
folded into projections only where that pays (blocks.normed); linear's product by rows and
weight size, of the product's dtype; attention in groups of batch rows, and a mask of fewer
axes or shared by every row, with the same bits as one group and a full mask; and the
elementwise passes' blocks of rows (blocking.py). The paths' results against torch and
finite differences are test_layers.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from numpy_engine import blocks, masks
from numpy_engine import layers as L
from numpy_engine.faster import FasterOfTwo
from parity_tests import layer_cases as cases
from parity_tests.helpers import check_layer, random_visible


def test_few_rows_are_timed_against_the_product_linear_forward_takes_otherwise():
    """Row dots against the path linear_forward would take for as many rows without them
    (layers.FEW_ROW_PATHS, chosen by numpy_engine.faster): x @ W.T for one row, W @ x.T for
    two to FEW_ROWS (each a weight of LARGE_WEIGHT_ENTRIES is at least MID_WEIGHT_ENTRIES)."""
    assert sorted(L.FEW_ROW_PATHS) == list(range(1, L.FEW_ROWS + 1))
    assert L.LARGE_WEIGHT_ENTRIES >= L.MID_WEIGHT_ENTRIES and L.FEW_ROWS <= L.SOME_ROWS
    for rows, chooser in L.FEW_ROW_PATHS.items():
        otherwise = L._product if rows == 1 else L._transposed_product
        assert chooser.paths == (L._row_dots, otherwise)


@pytest.mark.parametrize("x_dtype, weight_dtype", [("float32", "float64"), ("float64", "float32")])
def test_linear_on_some_rows_gives_the_products_dtype(x_dtype, weight_dtype, monkeypatch):
    """The transposed product writes into an array it makes: of x @ W.T's dtype, as the
    other paths return, whichever of x and the weight is the wider."""
    monkeypatch.setattr(L, "MID_WEIGHT_ENTRIES", 1)
    x, weight = np.full((2, 3), 0.1, x_dtype), np.full((4, 3), 0.1, weight_dtype)
    out, _ = L.linear_forward(x, weight, None)
    assert out.dtype == np.float64 and np.array_equal(out, x @ weight.T)


def test_blocks_fold_layernorms_only_into_small_projections_of_many_rows():
    """blocks.normed's rule, at the benchmark's sizes: char-lm's (1024 rows of 64) folds into
    q, k, v (192 outputs) and the FFN (256); GPT-2's 256 rows do not fold into its 2304
    outputs, and the copy model's 128 rows of 32 are too few entries to fold at all."""
    p = {"ln.weight": np.ones(64), "ln.bias": np.zeros(64)}
    assert blocks.normed(np.ones((32, 32, 64)), p, "ln", 192)[2] is not None
    assert blocks.normed(np.ones((32, 32, 64)), p, "ln", 256)[2] is not None
    assert blocks.normed(np.ones((32, 32, 64)), p, "ln", 257)[2] is None
    p = {"ln.weight": np.ones(768), "ln.bias": np.zeros(768)}
    assert blocks.normed(np.ones((4, 64, 768)), p, "ln", 2304)[2] is None
    p = {"ln.weight": np.ones(32), "ln.bias": np.zeros(32)}
    assert blocks.normed(np.ones((32, 4, 32)), p, "ln", 32)[2] is None


@pytest.mark.parametrize(
    "x_shape, weight_shape, path",
    [
        ((1, 1, 768), (50257, 768), "timed"),  # GPT-2 decoding one sequence: the tied head
        ((1, 1, 3072), (768, 3072), "timed"),  # and a wide weight (fc2)
        ((2, 2, 256), (2048, 256), "timed"),  # 4 rows, 2**19 entries
        ((0, 1, 256), (2048, 256), "product"),  # no rows: an empty (0, out) result
        ((1, 5, 256), (2048, 256), "transposed"),  # 5 rows: a short prompt
        ((4, 1, 256), (2047, 256), "transposed"),  # one row of the weight short of 2**19
        ((2, 32, 768), (2304, 768), "transposed"),  # 64 rows: a prompt, a small batch
        ((5, 13, 768), (2304, 768), "product"),  # 65 rows
        ((8, 1, 128), (256, 128), "transposed"),  # batched decoding, 2**15 entries
        ((8, 1, 128), (255, 128), "product"),  # one row of the weight short of 2**15
        ((1, 1, 256), (1024, 256), "product"),  # one row: a matrix-vector product
        ((1, 1, 64), (256, 64), "product"),  # MiniGPT decoding: a weight that stays in L2
    ],
)
def test_linear_chooses_its_product_by_rows_and_weight_size(
    x_shape, weight_shape, path, monkeypatch
):
    """linear_forward's rule, which only speed tells apart (layers.FEW_ROWS,
    LARGE_WEIGHT_ENTRIES, SOME_ROWS, MID_WEIGHT_ENTRIES): rows of x are counted over every
    leading axis; 1 to 4 against a weight of 2**19 entries or more are timed (row dots
    or the product, FEW_ROW_PATHS); 2 to 64 against one of 2**15 or more are W @ x.T;
    anything else is x @ W.T."""
    taken = []
    for name in ("_product", "_transposed_product"):
        chosen = getattr(L, name)
        monkeypatch.setattr(L, name, lambda x2, w, f=chosen, n=name: taken.append(n) or f(x2, w))

    def noting(rows: int, chooser: FasterOfTwo):
        """A FEW_ROW_PATHS entry that notes its rows and the work it is told of (rows x the
        weight's entries), then times the same two paths on its own, leaving the module's."""
        copy = FasterOfTwo(*chooser.paths)

        def path(x2, w, work):
            taken.append(("timed", rows, work))
            return copy(x2, w, work=work)

        return path

    timed = {rows: noting(rows, chooser) for rows, chooser in L.FEW_ROW_PATHS.items()}
    monkeypatch.setattr(L, "FEW_ROW_PATHS", timed)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight = rng.standard_normal(weight_shape).astype(np.float32)
    out, _ = L.linear_forward(x, weight, None)
    rows = math.prod(x_shape[:-1])
    expected = {
        "timed": [("timed", rows, rows * math.prod(weight_shape))],
        "transposed": ["_transposed_product"],
        "product": ["_product"],
    }
    assert taken == expected[path]
    assert out.shape == (*x_shape[:-1], weight_shape[0]) and out.flags.c_contiguous
    np.testing.assert_allclose(out, x @ weight.T, rtol=2e-5, atol=2e-5 * math.sqrt(x_shape[-1]))


@pytest.mark.parametrize("B, rows", [(5, 2), (2, 1)])
@pytest.mark.parametrize("offset", [0.0, 100.0])
@pytest.mark.parametrize("mask", ["causal", "padding", "per head", "none", "cross"])
@pytest.mark.parametrize("dropped", [False, True], ids=["", "dropout"])
def test_attention_in_batch_groups_is_bit_identical_to_one_group(
    monkeypatch, dropped, mask, offset, B, rows
):
    """Attention runs a group of batch rows at a time past attention.WHOLE_BYTES: forced here
    onto groups of `rows` batch rows of B (5 in groups of 2 has a short last group), the
    same bits as one group, weights too. At offset 100 every score is near 100, so each
    group's softmax takes the textbook path (softmax_last), which must write its weights
    into the group's rows too. dropped: with a dropout mask on the weights, whose group
    rows go with the scores'. cross: three queries over four keys, as cross-attention has."""
    from numpy_engine import attention as A
    from numpy_engine.dropout import Dropout

    rng = np.random.default_rng(0)
    Tq = 3 if mask == "cross" else 4
    k, v = (rng.standard_normal((B, 3, 4, 6)).astype(np.float32) for _ in range(2))
    q, dy = (rng.standard_normal((B, 3, Tq, 6)).astype(np.float32) for _ in range(2))
    if offset:
        q[..., 0], k[..., 0] = offset * np.sqrt(6), 1.0  # scores = offset + N(0, 5/6)
    ids = np.array([[1, 1, 1, 0]] * (B - 1) + [[1, 0, 0, 0]])  # the last row sees one key
    visible = {
        "causal": masks.causal_visible(4),
        "padding": masks.padding_visible(ids, pad_id=0),
        "per head": random_visible(rng, (1, 3, 4, 4), "random"),  # shared by the batch rows
        "none": None,
        "cross": masks.padding_visible(ids, pad_id=0),
    }[mask]
    drop = Dropout(rng, attn=0.4).mask("attn", (B, 3, Tq, 4), np.float32) if dropped else None
    one_y, one_cache = A.attention_forward(q, k, v, visible, drop=drop)
    one_grads = A.attention_backward(dy, one_cache)
    monkeypatch.setattr(A, "WHOLE_BYTES", 0)
    monkeypatch.setattr(A, "GROUP_BYTES", rows * 3 * Tq * 4 * 4)  # rows of float32 scores
    assert len(A.batch_groups((B, 3, Tq, 4), 4)) == -(-B // rows)
    y, cache = A.attention_forward(q, k, v, visible, drop=drop)
    assert np.array_equal(y, one_y) and y.dtype == np.float32
    assert np.array_equal(cache.weights, one_cache.weights)
    for grouped, whole in zip(A.attention_backward(dy, cache), one_grads, strict=True):
        assert np.array_equal(grouped, whole) and grouped.dtype == np.float32  # no upcast


@pytest.mark.parametrize("T, block", [(7, 2), (7, 3), (9, 1)])
def test_causal_attention_by_query_blocks_holds_to_torch_and_finite_differences(
    monkeypatch, T, block
):
    """Causal self-attention past two attention.QUERY_BLOCKs' positions runs a block of
    queries at a time, each against the keys it sees (query_blocks): forced here onto
    small blocks (the last one short where T is no multiple of them) and held to both
    witnesses as test_layers.py holds the whole, float32's bound too; every hidden weight is
    exactly 0, as the whole path leaves it."""
    from numpy_engine import attention as A

    monkeypatch.setattr(A, "QUERY_BLOCK", block)
    rng = np.random.default_rng(T * block)
    case = cases.attention(rng, 2, 3, T, T, 4, "shared causal")
    _, cache = case.forward(case.inputs)
    rows = tuple(slice(a, min(a + block, T)) for a in range(0, T, block))
    assert cache.query_blocks == (rows, tuple(r.stop for r in rows), True)
    assert not np.triu(cache.weights, 1).any()
    check_layer(case, rng)


def test_causal_blocks_start_past_two_blocks_of_queries():
    """Blocks of queries only for causal_visible's own mask, over more than two blocks'
    positions (the measured rule, attention.QUERY_BLOCK), the last block short; the same
    mask as another array, or no mask, runs whole."""
    from numpy_engine import attention as A

    n = A.QUERY_BLOCK

    def found(visible, T: int):
        return A.query_blocks(visible, (2, 3, T, T), 4, 4)

    assert found(masks.causal_visible(2 * n), 2 * n) is None
    assert found(masks.causal_visible(2 * n + 1), 2 * n + 1) == (
        (slice(0, n), slice(n, 2 * n), slice(2 * n, 2 * n + 1)),
        (n, 2 * n, 2 * n + 1),
        True,
    )
    assert len(found(masks.causal_visible(5 * n), 5 * n).rows) == 5
    assert found(np.array(masks.causal_visible(3 * n)), 3 * n) is None  # a copy: not shared
    assert found(None, 3 * n) is None


def force_blocks_of_any_mask(monkeypatch, A, H: int, Tk: int, queries: int) -> None:
    """Blocks of `queries` float32 queries (half as many float64 ones, at least one) past
    any score of a batch row: query_blocks' general rule at a test's size."""
    monkeypatch.setattr(A, "GROUP_BYTES", 0)
    monkeypatch.setattr(A, "BLOCK_BYTES", queries * H * Tk * 4)


@pytest.mark.parametrize(
    "kind, Tq, Tk",
    [("padding", 9, 7), ("random", 7, 6), ("random", 2, 5), ("causal", 8, 8), ("none", 5, 9)],
)
def test_attention_by_query_blocks_under_any_mask_holds_to_torch_and_finite_differences(
    monkeypatch, kind, Tq, Tk
):
    """Past GROUP_BYTES of a batch row's scores, under any mask but the shared causal one,
    attention runs by blocks of queries, each against the keys up to the last one any of
    its queries sees (query_blocks): forced here onto blocks of 2 queries (float32) and of
    1 (float64), held to both witnesses. A causal mask of its own array stops each block's
    keys at the block's end; padding, at the longest row's."""
    from numpy_engine import attention as A

    force_blocks_of_any_mask(monkeypatch, A, 3, Tk, 2)
    rng = np.random.default_rng(Tq * Tk)
    case = cases.attention(rng, 2, 3, Tq, Tk, 4, kind)
    _, cache = case.forward(case.inputs)
    assert cache.query_blocks.rows == tuple(slice(t, t + 1) for t in range(Tq))
    if kind == "causal":
        assert cache.query_blocks.stops == tuple(range(1, Tq + 1))
        assert not np.triu(cache.weights, 1).any()
    check_layer(case, rng)


def test_blocks_of_any_mask_start_past_a_rows_group_bytes():
    """The general rule at its real sizes: a batch row's scores past GROUP_BYTES (1 MiB), heads
    of at most NARROW_HEAD, BLOCK_BYTES (1 MiB) of scores a block; each block's keys end
    after the last any of its queries sees."""
    from numpy_engine import attention as A

    assert A.GROUP_BYTES == A.BLOCK_BYTES == 1 << 20 and A.NARROW_HEAD == 32
    found = A.query_blocks(None, (2, 4, 1000, 1000), 4, 16)  # 16 KB a query: 65 a block
    assert found.rows[:2] == (slice(0, 65), slice(65, 130)) and found.rows[-1] == slice(975, 1000)
    assert len(found.rows) == 16 and found.stops == (1000,) * 16 and not found.causal
    assert A.query_blocks(None, (2, 4, 1000, 1000), 4, 33) is None  # wider heads: whole
    assert len(A.query_blocks(None, (2, 4, 1000, 1000), 4, 32).rows) == 16  # 32 wide: blocks
    for hs, blocked in ((16, True), (33, False)):  # attention reads the width off q's last axis
        q = np.zeros((1, 2, 300, hs))  # float64, 2 heads: 1.4 MB of scores
        assert (A.attention_forward(q, q, q, None)[1].query_blocks is not None) == blocked
    cross = A.query_blocks(None, (2, 4, 100, 3000), 4, 16)  # 48 KB a query: 21 a block
    assert cross.rows[0] == slice(0, 21) and len(cross.rows) == 5 and cross.stops[0] == 3000
    assert A.query_blocks(None, (2, 4, 256, 256), 4, 16) is None  # 1 MiB a row: whole
    assert len(A.query_blocks(None, (2, 4, 257, 257), 4, 16).rows) == 2  # 255, 2
    assert len(A.query_blocks(None, (2, 4, 257, 257), 8, 16).rows) == 3  # float64: 127 a block
    ids = np.ones((2, 300), dtype=np.int64)
    ids[0, 290:], ids[1, 280:] = 0, 0  # right padding: the longest row has 290 tokens
    padded = A.query_blocks(masks.padding_visible(ids, 0), (2, 8, 300, 300), 4, 16)
    assert padded.stops == (290, 290, 290)  # 8 heads: blocks of 109 queries
    both = masks.causal_visible(300) & masks.padding_visible(ids, 0)  # (2, 1, 300, 300)
    assert A.query_blocks(both, (2, 8, 300, 300), 4, 16).stops == (109, 218, 290)


def test_wider_heads_take_blocks_only_where_the_blocks_keep_at_most_wide_kept():
    """Heads wider than NARROW_HEAD (64, as GPT-2's) at real sizes: blocks where their keys
    stop early enough that they compute at most WIDE_KEPT (3/4) of the scores, else whole. A
    seq2seq decoder's causal & padding mask keeps about half; a padding mask whose longest
    row is whole keeps all; every row padded after 750 of 1000 keys keeps exactly 3/4."""
    from numpy_engine import attention as A

    assert A.WIDE_KEPT == 0.75
    shape = (2, 4, 1000, 1000)  # float32: 16 KB a query, 65 queries a block
    ids = np.ones((2, 1000), dtype=np.int64)
    ids[1, 900:] = 0  # row 0 is whole
    padding = masks.padding_visible(ids, 0)
    decoder = A.query_blocks(masks.causal_visible(1000) & padding, shape, 4, 64)
    assert decoder.stops == tuple(range(65, 1000, 65)) + (1000,) and not decoder.causal
    assert A.query_blocks(padding, shape, 4, 64) is None
    for kept, blocked in ((750, True), (751, False)):  # 3/4 of the scores, and one key more
        ids[:, :kept], ids[:, kept:] = 1, 0
        found = A.query_blocks(masks.padding_visible(ids, 0), shape, 4, 64)
        assert (found is not None) == blocked
        assert not blocked or found.stops == (750,) * 16
    q = np.zeros((1, 4, 300, 64))  # float64, 4 heads: 2.9 MB of scores, 109 queries a block
    both = masks.causal_visible(300) & masks.padding_visible(np.ones((1, 300), np.int64), 0)
    assert A.attention_forward(q, q, q, both)[1].query_blocks.stops == (109, 218, 300)
    assert A.attention_forward(q, q, q, None)[1].query_blocks is None


def test_each_blocks_keys_stop_after_the_last_any_of_its_queries_sees(monkeypatch):
    """A block's stop is one past the last key a query of it sees, in any batch row or head,
    whatever axes the mask has ((Tq, Tk), (H, Tq, Tk), (B, H, Tq, Tk)): blocks of one query
    forced here, over two queries."""
    from numpy_engine import attention as A

    force_blocks_of_any_mask(monkeypatch, A, 2, 4, 1)  # one float32 query a block
    first_sees_one = np.array([[True, False, False, False], [True, True, True, False]])
    for visible in (first_sees_one, first_sees_one[None], first_sees_one[None, None]):
        assert A.query_blocks(visible, (3, 2, 2, 4), 4, 4).stops == (1, 3)
    per_head = np.stack([first_sees_one, first_sees_one[::-1]])  # (H, Tq, Tk): head 1 swapped
    assert A.query_blocks(per_head, (3, 2, 2, 4), 4, 4).stops == (3, 3)
    per_row = np.zeros((3, 1, 2, 4), dtype=bool)
    per_row[:, :, :, 0], per_row[2, 0, 1, 3] = True, True  # only row 2's last query sees key 3
    assert A.query_blocks(per_row, (3, 2, 2, 4), 4, 4).stops == (1, 4)


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
    monkeypatch.setattr(A, "QUERY_BLOCK", 2)
    force_blocks_of_any_mask(monkeypatch, A, H, T, 4)  # 2 float64 queries a block
    if rows is not None:
        monkeypatch.setattr(A, "WHOLE_BYTES", 0)
    y, cache = A.attention_forward(q, k, v, visible, drop=drop)
    assert len(A.batch_groups(cache.weights.shape, 8)) == (B if rows else 1)
    stops = (2, 4, 6, 7) if mask == "shared causal" else (2, 4, 6, 6)
    assert cache.query_blocks.stops == stops and not np.triu(cache.weights, 1).any()
    pairs = [(y, whole_y), (cache.weights, whole_cache.weights)]
    pairs += zip(A.attention_backward(dy, cache), whole_grads, strict=True)
    for blocked, whole in pairs:
        np.testing.assert_allclose(blocked, whole, rtol=1e-12, atol=1e-14 * np.abs(whole).max())
    if mask == "causal & padding":
        assert not pairs[3][0][:, :, 6].any() and not pairs[4][0][:, :, 6].any()  # dk, dv


def test_a_mask_of_fewer_axes_broadcasts_as_numpy_does():
    """visible given as (Tq, Tk) or (H, Tq, Tk) is read as (1, 1, Tq, Tk) or (1, H, Tq, Tk):
    the same bits, weights too."""
    from numpy_engine import attention as A

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    per_head = random_visible(rng, (1, 3, 4, 4), "random")[0]  # (H, Tq, Tk)
    for visible, four_axes in ((per_head[0], per_head[None, None, 0]), (per_head, per_head[None])):
        y, cache = A.attention_forward(q, k, v, visible)
        expected_y, expected_cache = A.attention_forward(q, k, v, four_axes)
        np.testing.assert_array_equal(y, expected_y)
        np.testing.assert_array_equal(cache.weights, expected_cache.weights)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_shared_mask_hides_as_the_same_mask_given_per_batch_row(dtype):
    """A causal mask shared by every row (np.fmin against masks.hidden_limit) against the
    same mask repeated per batch row (np.copyto(where=)): the same bits, and a NaN key hides
    from every earlier query (its scores there are NaN, and hidden)."""
    from numpy_engine import attention as A

    rng = np.random.default_rng(0)
    q, k, v, dy = (rng.standard_normal((3, 2, 5, 4)).astype(dtype) for _ in range(4))
    k[:, :, -1] = np.nan  # seen only by the last query
    shared = masks.causal_visible(5)  # (1, 1, 5, 5)
    per_row = np.broadcast_to(shared, (3, 1, 5, 5)).copy()
    with np.errstate(invalid="ignore"):  # the last query's NaN row
        y, cache = A.attention_forward(q, k, v, shared)
        expected_y, expected_cache = A.attention_forward(q, k, v, per_row)
        grads = A.attention_backward(dy, cache)
        expected = A.attention_backward(dy, expected_cache)
    assert np.isfinite(y[:, :, :-1]).all() and np.isnan(y[:, :, -1]).all()
    np.testing.assert_array_equal(y, expected_y)  # NaN where NaN
    np.testing.assert_array_equal(cache.weights, expected_cache.weights)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_slices_cover_the_range_in_blocks_of_about_block_bytes():
    from numpy_engine.blocking import slices

    assert slices(10, 4, 12) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    assert slices(6, 4, 12) == [slice(0, 3), slice(3, 6)]
    assert slices(3, 100, 12) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # one item a block
    assert slices(10, 4, 12, whole_bytes=40) == [slice(0, 10)]  # all fits: one slice
    assert len(slices(10, 4, 12, whole_bytes=39)) == 4  # a byte short of it: blocks
    assert slices(10, 1, 4) == [slice(0, 4), slice(4, 8), slice(8, 10)]  # 1-byte items
    assert slices(3, 0, 4) == [slice(0, 3)]  # items of no bytes (rows of width 0): one block
    assert slices(0, 4, 12) == [slice(0, 0)]  # nothing: one empty slice (it fits)


def test_row_blocks_hold_about_block_bytes_of_the_first_input(monkeypatch):
    """in_row_blocks cuts by the first input's row size: rows of 7 float32 (28 bytes) in
    blocks of 84 bytes are 3 rows a block, whatever the outputs' widths."""
    from numpy_engine import blocking

    monkeypatch.setattr(blocking, "BLOCK_BYTES", 3 * 7 * 4)
    rows_seen = []
    x, out = np.ones((10, 7), np.float32), np.zeros((10, 2), np.float64)
    blocking.in_row_blocks(lambda a, o: rows_seen.append((len(a), len(o))), (x,), (out,))
    assert rows_seen == [(3, 3), (3, 3), (3, 3), (1, 1)]
    strided = np.zeros((2, 10), np.float64).T  # (10, 2), not C-contiguous
    with pytest.raises(ValueError, match="every output must be C-contiguous"):
        blocking.in_row_blocks(lambda a, o: None, (x,), (strided,))
