"""Every layer pair against two witnesses: central finite differences (float64) and PyTorch
autograd (float64 within 1e-10; float32 within the rounding bound of crosscheck/compare.py).

Hypothesis draws shapes, masks, activations and a seed; values come from the seed, and each
layer's case is built in layer_cases.py. The activations' own tests are in
test_activations.py.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_engine import blocks, losses, masks
from numpy_engine import layers as L
from numpy_engine.faster import FasterOfTwo
from parity_tests import layer_cases as cases
from parity_tests.helpers import (
    assert_all_close_float64,
    assert_matches_finite_differences,
    assert_matches_torch,
    check_layer,
    folding_every_layernorm,
    only_row_dots,
    random_visible,
)
from parity_tests.strategies import activations, model_widths, seeds

small = st.integers(1, 4)
mask_kinds = st.sampled_from(["none", "causal", "padding", "random"])
ignore_indices = st.sampled_from([0, -100])


def rng_of(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "folded input affine"])
@given(B=small, T=small, c_in=small, c_out=small, seed=seeds)
@example(B=1, T=1, c_in=1, c_out=1, seed=0)
def test_linear(affine, B, T, c_in, c_out, seed):
    rng = rng_of(seed)
    check_layer(cases.linear(rng, B, T, c_in, c_out, affine=affine), rng)
    check_layer(cases.linear(rng, B, T, c_in, c_out, bias=False, affine=affine), rng)


@given(B=st.integers(1, 2), T=st.integers(1, 2), c_in=small, c_out=small, seed=seeds)
@example(B=2, T=2, c_in=3, c_out=2, seed=0)
def test_linear_on_few_rows_as_row_dots(B, T, c_in, c_out, seed):
    """Decoding's path (at most FEW_ROWS rows against a large weight: np.vecdot), made to
    run on small weights, against torch and finite differences."""
    rng = rng_of(seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(L, "LARGE_WEIGHT_ENTRIES", 1)
        patch.setattr(L, "FEW_ROW_PATHS", only_row_dots())
        assert L._few_rows(B * T, (c_out, c_in))
        check_layer(cases.linear(rng, B, T, c_in, c_out), rng)
        check_layer(cases.linear(rng, B, T, c_in, c_out, bias=False), rng)


def test_few_rows_are_timed_against_the_product_linear_forward_takes_otherwise():
    """Row dots against the path linear_forward would take for as many rows without them
    (layers.FEW_ROW_PATHS, chosen by numpy_engine.faster): x @ W.T for one row, W @ x.T for
    two to FEW_ROWS (each a weight of LARGE_WEIGHT_ENTRIES is at least MID_WEIGHT_ENTRIES)."""
    assert sorted(L.FEW_ROW_PATHS) == list(range(1, L.FEW_ROWS + 1))
    assert L.LARGE_WEIGHT_ENTRIES >= L.MID_WEIGHT_ENTRIES and L.FEW_ROWS <= L.SOME_ROWS
    for rows, chooser in L.FEW_ROW_PATHS.items():
        otherwise = L._product if rows == 1 else L._transposed_product
        assert chooser.paths == (L._row_dots, otherwise)


@given(B=small, T=st.integers(2, 4), c_in=small, c_out=small, seed=seeds)
@example(B=1, T=2, c_in=3, c_out=2, seed=0)
def test_linear_on_some_rows_as_a_transposed_product(B, T, c_in, c_out, seed):
    """The path of 2 to SOME_ROWS rows against a mid-size weight (W @ x.T, copied into rows),
    made to run on small weights, in blocks of 2 outputs (a short last block where c_out is
    odd), against torch and finite differences."""
    rng = rng_of(seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(L, "MID_WEIGHT_ENTRIES", 1)
        patch.setattr(L, "TRANSPOSED_OUTPUTS", 2)
        assert L._some_rows(B * T, (c_out, c_in)) and not L._few_rows(B * T, (c_out, c_in))
        check_layer(cases.linear(rng, B, T, c_in, c_out), rng)
        check_layer(cases.linear(rng, B, T, c_in, c_out, bias=False), rng)


@pytest.mark.parametrize("x_dtype, weight_dtype", [("float32", "float64"), ("float64", "float32")])
def test_linear_on_some_rows_gives_the_products_dtype(x_dtype, weight_dtype, monkeypatch):
    """The transposed product writes into an array it makes: of x @ W.T's dtype, as the
    other paths return, whichever of x and the weight is the wider."""
    monkeypatch.setattr(L, "MID_WEIGHT_ENTRIES", 1)
    x, weight = np.full((2, 3), 0.1, x_dtype), np.full((4, 3), 0.1, weight_dtype)
    out, _ = L.linear_forward(x, weight, None)
    assert out.dtype == np.float64 and np.array_equal(out, x @ weight.T)


@given(B=small, T=small, C=small, V=st.integers(2, 9), bias=st.booleans(), seed=seeds)
def test_fused_readout_and_loss_equals_the_layers_it_fuses(B, T, C, V, bias, seed):
    """linear_cross_entropy against linear -> cross-entropy -> their backwards, float64; with
    a block of 2 rows, so the blocks and their edges are exercised. Its loss alone, for
    evaluation (linear_cross_entropy_loss), is the same bits."""
    rng = rng_of(seed)
    x, weight = rng.standard_normal((B, T, C)), rng.standard_normal((V, C))
    b = rng.standard_normal(V) if bias else None
    targets = rng.integers(0, V, (B, T))
    targets[rng.random((B, T)) < 0.3] = -100
    targets[0, 0] = 1  # at least one counted
    logits, linear_cache = L.linear_forward(x, weight, b)
    loss, ce_cache = losses.cross_entropy_forward(logits, targets, -100)
    dx, grads = L.linear_backward(losses.cross_entropy_backward(1.0, ce_cache), linear_cache)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(losses, "FUSED_BLOCK_BYTES", 2 * V * x.itemsize)
        fused_loss, fused_dx, fused_grads = losses.linear_cross_entropy(x, weight, b, targets, -100)
        evaluation_loss = losses.linear_cross_entropy_loss(x, weight, b, targets, -100)
    assert abs(fused_loss - loss) <= 1e-13 * abs(loss) and evaluation_loss == fused_loss
    assert_all_close_float64(
        "fused readout and loss", {"x": fused_dx} | fused_grads, {"x": dx} | grads
    )


@given(B=small, T=st.integers(1, 6), V=st.integers(2, 6), C=small, seed=seeds)
@example(B=2, T=3, V=2, C=1, seed=0)  # two ids only: heavy repeats and padding
@example(B=2, T=6, V=3, C=4, seed=1)  # V <= C: the one-hot product
def test_embedding_with_padding_and_repeats(B, T, V, C, seed):
    rng = rng_of(seed)
    ids = rng.integers(0, V, size=(B, T))  # id 0 is padding; repeats are likely
    ids[0, 0] = V - 1  # the table has V rows
    case = cases.embedding(rng, ids, C)
    assert_matches_torch(case, rng)  # the whole table: the padding row's gradient is 0 in both

    # Against finite differences: the padding row's zero gradient is PyTorch's rule, not
    # calculus, so the padding row is held at zero and the other rows are nudged.
    def forward_rest(i):
        weight = np.concatenate([np.zeros((1, C)), i["weight[1:]"]])  # (V, C)
        return L.embedding_forward(ids, weight, padding_idx=0)

    def backward_rest(dout, cache):
        _, grads = L.embedding_backward(dout, cache)
        return {"weight[1:]": grads["weight"][1:]}

    rest = {"weight[1:]": case.inputs["weight"][1:].copy()}
    assert_matches_finite_differences("embedding", forward_rest, backward_rest, rest, rng)


@given(B=small, T=small, C=small, seed=seeds)
def test_sinusoidal_positions(B, T, C, seed):
    rng = rng_of(seed)
    check_layer(cases.sinusoidal_positions(rng, B, T, C), rng)


@given(B=small, T=small, extra=st.integers(0, 3), C=small, seed=seeds)
def test_learned_positions(B, T, extra, C, seed):
    rng = rng_of(seed)
    check_layer(cases.learned_positions(rng, B, T, extra, C), rng)


# Over 2 channels layernorm's dx is ~eps in exact arithmetic whatever x is: float64 and
# finite differences judge it with mean 1, while a mean of 1000 would leave it rounding noise
# in float64 too, and float32 is rounding noise that no sensitivity of the inputs bounds.
@given(B=small, T=small, C=st.integers(2, 8), mean=st.sampled_from([1.0, 1000.0]), seed=seeds)
@example(B=1, T=1, C=2, mean=1.0, seed=0)
@example(B=2, T=3, C=4, mean=1000.0, seed=0)  # E[x^2] - E[x]^2 would lose the variance here
def test_layernorm(B, T, C, mean, seed):
    rng = rng_of(seed)
    mean = mean if C >= 3 else 1.0
    check_layer(cases.layernorm(rng, B, T, C, mean), rng, float32=C >= 3)


@given(kind=activations, B=small, T=small, C=small, F_=st.integers(1, 8), seed=seeds)
def test_feed_forward(kind, B, T, C, F_, seed):
    rng = rng_of(seed)
    check_layer(cases.feed_forward(rng, kind, B, T, C, F_), rng)


@given(B=small, T=small, V=st.integers(2, 7), ignore_index=ignore_indices, seed=seeds)
@example(B=1, T=1, V=2, ignore_index=-100, seed=0)
@example(B=1, T=1, V=2, ignore_index=0, seed=3_094_535_186)  # float32: p_y - 1 cancelled
def test_cross_entropy_with_ignore_index(B, T, V, ignore_index, seed):
    rng = rng_of(seed)
    check_layer(cases.cross_entropy(rng, B, T, V, ignore_index), rng)


@given(B=small, T=small, V=st.integers(2, 7), ignore_index=ignore_indices, seed=seeds)
@example(B=1, T=1, V=2, ignore_index=0, seed=3_094_535_186)  # a confident model, float32
@example(B=1, T=2, V=4, ignore_index=0, seed=93_394_809)  # log(1 + small) lost the loss
def test_cross_entropy_when_confident(B, T, V, ignore_index, seed):
    """Large logit gaps: p_y - 1 must not be computed by subtraction, nor the loss as
    log(1 + small mass)."""
    rng = rng_of(seed)
    check_layer(cases.confident_cross_entropy(rng, B, T, V, ignore_index), rng)


@given(B=small, H=st.integers(1, 3), Tq=small, Tk=small, hs=small, kind=mask_kinds, seed=seeds)
@example(B=1, H=1, Tq=3, Tk=3, hs=1, kind="causal", seed=0)
def test_scaled_dot_product_attention(B, H, Tq, Tk, hs, kind, seed):
    rng = rng_of(seed)
    check_layer(cases.attention(rng, B, H, Tq, Tk, hs, kind), rng)


@given(
    B=small,
    H=st.integers(1, 3),
    T=small,
    hs=small,
    offset=st.sampled_from([100.0, -100.0]),
    kind=mask_kinds,
    seed=seeds,
)
def test_attention_with_scores_far_from_zero_matches_torch(B, H, T, hs, offset, kind, seed):
    """Every score near +100 (exp would overflow) or -100 (every exp tiny): softmax_last must
    take the textbook path, with the row max. Finite differences are meaningless this far out,
    so the witness is PyTorch alone, in float64 and float32."""
    rng = rng_of(seed)
    assert_matches_torch(cases.attention(rng, B, H, T, T, hs, kind, offset), rng)


@given(B=small, H=st.integers(1, 3), T=small, hs=small, causal=st.booleans(), seed=seeds)
def test_multi_head_self_attention(B, H, T, hs, causal, seed):
    rng = rng_of(seed)
    check_layer(cases.self_attention(rng, B, H, T, hs, causal), rng)


@given(B=small, H=st.integers(1, 3), T=small, S=small, hs=small, seed=seeds)
def test_multi_head_cross_attention(B, H, T, S, hs, seed):
    rng = rng_of(seed)
    check_layer(cases.cross_attention(rng, B, H, T, S, hs), rng)


# Blocks draw C >= 3 (model_widths): a layernorm over 1 or 2 channels leaves gradients
# that are rounding noise in both engines (see parity_tests/strategies.py).
@given(
    B=small,
    widths=model_widths(),
    T=small,
    F_=small,
    kind=activations,
    causal=st.booleans(),
    fold=st.booleans(),
    seed=seeds,
)
@example(B=2, widths=(2, 2), T=3, F_=3, kind="gelu", causal=True, fold=True, seed=0)
def test_self_attention_block(B, widths, T, F_, kind, causal, fold, seed):
    """fold: every layernorm folded into the projection it feeds (blocks.normed)."""
    rng = rng_of(seed)
    with folding_every_layernorm() if fold else contextlib.nullcontext():
        check_layer(cases.self_attention_block(rng, B, *widths, T, F_, kind, causal), rng)


@given(
    B=small,
    widths=model_widths(),
    T=small,
    S=small,
    F_=small,
    kind=activations,
    fold=st.booleans(),
    seed=seeds,
)
@example(B=2, widths=(2, 2), T=3, S=2, F_=3, kind="relu", fold=True, seed=0)
def test_decoder_block(B, widths, T, S, F_, kind, fold, seed):
    rng = rng_of(seed)
    with folding_every_layernorm() if fold else contextlib.nullcontext():
        check_layer(cases.decoder_block(rng, B, *widths, T, S, F_, kind), rng)


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
    rng = rng_of(0)
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

    rng = rng_of(0)
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


def test_a_mask_of_fewer_axes_broadcasts_as_numpy_does():
    """visible given as (Tq, Tk) or (H, Tq, Tk) is read as (1, 1, Tq, Tk) or (1, H, Tq, Tk):
    the same bits, weights too."""
    from numpy_engine import attention as A

    rng = rng_of(0)
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

    rng = rng_of(0)
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
