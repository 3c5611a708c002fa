"""Every layer pair against two witnesses: central finite differences (float64) and PyTorch
autograd (float64 within 1e-10; float32 within the rounding bound of crosscheck/compare.py).

Hypothesis draws shapes, masks, activations and a seed; values come from the seed, and each
layer's case is built in layer_cases.py. The activations' own tests are in
test_activations.py.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_engine import layers as L
from numpy_engine import losses
from parity_tests import layer_cases as cases
from parity_tests.helpers import (
    assert_all_close_float64,
    assert_matches_finite_differences,
    assert_matches_torch,
    check_layer,
    folding_every_layernorm,
    only_row_dots,
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
