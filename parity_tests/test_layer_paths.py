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
from parity_tests.helpers import random_visible


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
    from numpy_engine import attention_blocks as AB
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
    monkeypatch.setattr(AB, "WHOLE_BYTES", 0)
    monkeypatch.setattr(AB, "GROUP_BYTES", rows * 3 * Tq * 4 * 4)  # rows of float32 scores
    assert len(AB.batch_groups((B, 3, Tq, 4), 4)) == -(-B // rows)
    y, cache = A.attention_forward(q, k, v, visible, drop=drop)
    assert np.array_equal(y, one_y) and y.dtype == np.float32
    assert np.array_equal(cache.weights, one_cache.weights)
    for grouped, whole in zip(A.attention_backward(dy, cache), one_grads, strict=True):
        assert np.array_equal(grouped, whole) and grouped.dtype == np.float32  # no upcast


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


@pytest.mark.parametrize("Tq, Tk, hs", [(8, 7, 4), (5, 4, 4), (5, 7, 8)])
@pytest.mark.parametrize("dropped", [False, True], ids=["", "dropout"])
def test_attention_takes_each_softmax_rows_sum_from_the_shorter_dot(
    monkeypatch, dropped, Tq, Tk, hs
):
    """The softmax's backward subtracts each row's sum of s dweights * weights. Where the
    keys outnumber the head's width, attention_backward takes it as s dy . y
    (attention.scaled_row_dots, from y = (weights * drop) v), else over the keys: float64,
    the sum itself and the gradients each way agree to rounding, dropout or not. (The
    queries, 5 or 8, are no part of the rule.)"""
    from numpy_engine import attention as A
    from numpy_engine.dropout import Dropout

    rng = np.random.default_rng(1)
    q, dy = (rng.standard_normal((2, 3, Tq, hs)) for _ in range(2))
    k, v = (rng.standard_normal((2, 3, Tk, hs)) for _ in range(2))
    visible = random_visible(rng, (2, 3, Tq, Tk), "random")
    drop = Dropout(rng, attn=0.4).mask("attn", (2, 3, Tq, Tk), np.float64) if dropped else None
    y, cache = A.attention_forward(q, k, v, visible, drop=drop)
    s_dweights = dy @ v.swapaxes(-1, -2) / math.sqrt(hs)  # dweights times the scale
    if drop is not None:
        s_dweights *= drop
    expected = (s_dweights * cache.weights).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(A.scaled_row_dots(dy, y), expected, rtol=0, atol=1e-14)
    taken = []
    monkeypatch.setattr(A, "scaled_row_dots", lambda *a: taken.append(a) or expected)
    with_sums = A.attention_backward(dy, cache)
    assert len(taken) == (Tk > hs)
    monkeypatch.setattr(A, "scaled_row_dots", lambda *a: None)  # always over the keys
    for got, over_keys in zip(with_sums, A.attention_backward(dy, cache), strict=True):
        np.testing.assert_allclose(got, over_keys, rtol=0, atol=1e-13)


def _attention_handing_sums(monkeypatch, path: str, hs: int, rng) -> tuple:
    """Attention over 8 queries and 7 keys of hs channels on a forced path (one group, batch
    groups, blocks), its backward with each softmax_backward call's row sums recorded:
    (grads, the sums each call was handed, the one-group grads, dy, y)."""
    from numpy_engine import attention as A
    from numpy_engine import attention_blocks as AB

    q, dy = (rng.standard_normal((3, 2, 8, hs)) for _ in range(2))
    k, v = (rng.standard_normal((3, 2, 7, hs)) for _ in range(2))
    visible = random_visible(rng, (3, 2, 8, 7), "padding")
    one_group = A.attention_backward(dy, A.attention_forward(q, k, v, visible)[1])
    if path == "batch groups":  # one batch row's float64 scores a group
        monkeypatch.setattr(AB, "WHOLE_BYTES", 0)
        monkeypatch.setattr(AB, "GROUP_BYTES", 2 * 8 * 7 * 8)
    elif path == "blocks":  # 3 queries a block, of every head
        monkeypatch.setattr(AB, "GROUP_BYTES", 0)
        monkeypatch.setattr(AB, "BLOCK_BYTES", 3 * 2 * 7 * 8)
    y, cache = A.attention_forward(q, k, v, visible)
    assert (cache.query_blocks is not None) == (path == "blocks")
    handed, softmax_backward = [], A.softmax_backward
    monkeypatch.setattr(
        A,
        "softmax_backward",
        lambda d, w, sums=None: handed.append(sums) or softmax_backward(d, w, sums),
    )
    grads = A.attention_backward(dy, cache)
    assert len(handed) >= {"one group": 1, "batch groups": 3, "blocks": 3}[path]
    return grads, handed, one_group, dy, y


@pytest.mark.parametrize("path", ["one group", "batch groups", "blocks"])
def test_each_softmax_row_is_handed_its_sum_once_on_every_path(monkeypatch, path):
    """Where the keys (7) outnumber the channels (4), every softmax_backward call of
    attention's backward, on each of its paths, is handed its rows' sums from
    scaled_row_dots: all the calls' sums together are every row's, each once."""
    from numpy_engine import attention as A

    rng = np.random.default_rng(2)
    _, handed, _, dy, y = _attention_handing_sums(monkeypatch, path, 4, rng)
    assert all(sums is not None for sums in handed)
    every = np.sort(np.concatenate([sums.ravel() for sums in handed]))
    assert np.array_equal(every, np.sort(A.scaled_row_dots(dy, y).ravel()))


def test_blocks_over_more_channels_than_keys_take_the_sums_over_the_keys(monkeypatch):
    """Over 8 channels and 7 keys no softmax_backward call is handed sums, and the blocks'
    gradients are one group's to rounding (float64)."""
    grads, handed, one_group, _, _ = _attention_handing_sums(
        monkeypatch, "blocks", 8, np.random.default_rng(3)
    )
    assert all(sums is None for sums in handed)
    for got, expected in zip(grads, one_group, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
