"""Clipping against torch.nn.utils.clip_grad_norm_, float64, and the gradients as a step reads
them (numpy_engine/clipping.py): the norm in float32, a grads dict read block by block or
gathered whole, and a NaN or inf found before any update. The blocks on several threads:
test_optimizer_threads.py.

The parameters and the ten steps beside torch are optim_cases.py's, as in test_optim.py.
"""

from __future__ import annotations

import math
import re
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_engine import clipping, optim
from numpy_engine.checks import InputError
from numpy_engine.optim import SGD, Adam, AdamW, clip_grad_norm
from numpy_engine.params import flatten, unflatten
from parity_tests.optim_cases import (
    STEPS,
    assert_state_matches,
    block_sizes,
    learning_rates,
    random_params,
    run_both,
)
from parity_tests.strategies import seeds


@given(
    lr=learning_rates,
    max_norm=st.sampled_from([0.5, 1.0, 3.0]),
    kind=st.sampled_from(["adam", "adam-l2", "adamw", "sgd"]),
    fused=st.booleans(),
    seed=seeds,
)
@example(lr=1e-3, max_norm=1.0, kind="adam-l2", fused=True, seed=0)  # clipping before the L2 term
@example(lr=1e-3, max_norm=1.0, kind="adamw", fused=True, seed=0)  # folded into the moments
def test_clipping_matches_torch_and_actually_clips(lr, max_norm, kind, fused, seed):
    """Clipped steps against torch's clip_grad_norm_ then step, the engine clipping before
    its step or inside it (Adam folds the coefficient into its moments' factors)."""
    engine, reference = {
        "adam": (lambda p: Adam(p, lr=lr), lambda t: torch.optim.Adam(t, lr=lr)),
        "adam-l2": (
            lambda p: Adam(p, lr=lr, weight_decay=0.1),
            lambda t: torch.optim.Adam(t, lr=lr, weight_decay=0.1),
        ),
        "adamw": (lambda p: AdamW(p, lr=lr), lambda t: torch.optim.AdamW(t, lr=lr)),
        "sgd": (
            lambda p: SGD(p, lr=lr, momentum=0.9, weight_decay=0.01),
            lambda t: torch.optim.SGD(t, lr=lr, momentum=0.9, weight_decay=0.01),
        ),
    }[kind]
    run = run_both(engine, reference, seed, grad_scale=2.0, clip=max_norm, fused=fused)
    params, tensors, ours, theirs, clipped_steps = run  # norms around 10: every step clips
    assert clipped_steps == STEPS
    names = ["momentum_buffer"] if kind == "sgd" else ["exp_avg", "exp_avg_sq"]
    assert_state_matches(params, tensors, ours, theirs, names)


def test_clipping_leaves_small_gradients_alone_and_returns_the_norm():
    grads = np.array([3.0, 0.0, 0.0, 4.0])  # norm 5
    assert clip_grad_norm(grads, max_norm=10.0) == 5.0
    np.testing.assert_array_equal(grads, [3.0, 0.0, 0.0, 4.0])  # untouched
    assert clip_grad_norm(grads, max_norm=1.0) == 5.0
    np.testing.assert_allclose(grads, np.array([3.0, 0, 0, 4.0]) / (5.0 + 1e-6), rtol=1e-15)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_step_with_max_grad_norm_equals_clip_then_step(kind):
    """The training loop clips inside the optimizer step: the same as the two calls, bit for
    bit where the step scales the gradient by its own pass (SGD), to rounding where the
    coefficient joins the moments' factors (Adam: (1 - b1) c times g, not (1 - b1) times
    c g rounded)."""
    make = {"sgd": lambda p: SGD(p, lr=0.01, momentum=0.9), "adam": lambda p: Adam(p, lr=0.01)}
    rng = np.random.default_rng(0)
    fused, params = random_params(rng)
    separate = fused.copy()
    fused_opt, separate_opt = make[kind](params), make[kind](params)
    for scale in (5.0, 0.01, 5.0):  # clipped, not clipped, clipped
        grads = scale * rng.standard_normal(fused.size)
        clipped = grads.copy()
        norm = fused_opt.step(fused, grads, max_grad_norm=1.0)
        expected_norm = clip_grad_norm(clipped, 1.0)
        separate_opt.step(separate, clipped)
        assert norm == expected_norm
        if kind == "sgd":
            np.testing.assert_array_equal(fused, separate)
        else:  # three steps of a few roundings each on entries of about 1
            np.testing.assert_allclose(fused, separate, rtol=1e-14, atol=0)
    assert fused_opt.step(fused, grads) is None  # no max_grad_norm: no norm computed


@given(
    block_entries=st.integers(1, 30),
    gather_whole=st.booleans(),
    max_norm=st.sampled_from([None, 0.5]),
    kind=st.sampled_from(["sgd", "adam", "adamw"]),
    seed=seeds,
)
# blocks of 3: 15..18 spans b and e; of 14: 0..14 spans w and b, the last, 14..26 (short), b and e;
# of 13: 13..26 takes b from its second entry to its end, then all of e
@example(block_entries=3, gather_whole=False, max_norm=None, kind="adam", seed=0)
@example(block_entries=13, gather_whole=False, max_norm=0.5, kind="adam", seed=0)
@example(block_entries=14, gather_whole=False, max_norm=0.5, kind="adamw", seed=0)
@example(block_entries=14, gather_whole=True, max_norm=0.5, kind="sgd", seed=0)
def test_a_step_reads_the_grads_dict_as_the_flat_vector_block_by_block(
    block_entries, gather_whole, max_norm, kind, seed
):
    """The grads dict, read in blocks that lie inside one array or span several (entries of
    26 in blocks of 1 to 30), or gathered whole first (gather_whole: a vector of a few
    blocks), steps the parameters to the same bits as the flat gradient in the same blocks,
    and to within rounding of the flat gradient in one block (the norm's squares are summed
    block by block); no gradient is changed by the step."""
    make = {
        "sgd": lambda p: SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
        "adam": lambda p: Adam(p, lr=0.01, weight_decay=0.01),
        "adamw": lambda p: AdamW(p, lr=0.01),
    }[kind]
    rng = np.random.default_rng(seed)
    flat, params = random_params(rng)
    twin, whole_twin = flat.copy(), flat.copy()
    few_blocks = 10**9 if gather_whole else 1  # GATHER_WHOLE_BLOCKS: every vector, or none
    with block_sizes(8 * block_entries, gather_whole_blocks=few_blocks):
        from_dict, from_flat = make(params), make(unflatten(twin, params))
    whole = make(unflatten(whole_twin, params))
    assert len(from_dict.pieces) == -(-flat.size // block_entries) and len(whole.pieces) == 1
    for scale in (5.0, 0.01, 5.0):  # clipped, not clipped, clipped (with max_norm)
        grads = {key: scale * rng.standard_normal(v.shape) for key, v in params.items()}
        flat_grads, kept = flatten(grads), {key: v.copy() for key, v in grads.items()}
        norm = from_dict.step(flat, grads, max_grad_norm=max_norm)
        assert norm == from_flat.step(twin, flat_grads, max_grad_norm=max_norm)
        np.testing.assert_array_equal(flat, twin)
        whole_norm = whole.step(whole_twin, flat_grads, max_grad_norm=max_norm)
        if max_norm is not None:
            assert abs(norm - whole_norm) <= 1e-15 * whole_norm
        np.testing.assert_allclose(flat, whole_twin, rtol=1e-13, atol=0)
        np.testing.assert_array_equal(flat_grads, flatten(kept))
        for key, value in kept.items():
            np.testing.assert_array_equal(grads[key], value)


@pytest.mark.parametrize(
    "shapes, block_entries",
    [
        ({"a": (3,), "row": (1, 4), "z": (2,)}, 5),  # 0..5 ends in the row, 5..9 starts in it
        # 0..6 ends after the row's first entry; the row (array 2) has 2 entries, so a
        # whole-array check that read the array's index for the block's end would take both
        ({"a": (3,), "z": (2,), "row": (1, 2)}, 6),
    ],
)
def test_a_block_ending_inside_a_one_row_array_gathers_every_array_it_spans(shapes, block_entries):
    """Blocks that span the first arrays and end inside a one-row array, and the blocks after
    them: the dict steps to the flat gradient's bits."""
    rng = np.random.default_rng(0)
    flat = flatten({key: rng.standard_normal(shape) for key, shape in shapes.items()})
    params, twin = unflatten(flat, {k: np.empty(s) for k, s in shapes.items()}), flat.copy()
    with block_sizes(8 * block_entries, gather_whole_blocks=1):  # block by block
        from_dict, from_flat = Adam(params, lr=0.01), Adam(unflatten(twin, params), lr=0.01)
    grads = {key: rng.standard_normal(shape) for key, shape in shapes.items()}
    from_dict.step(flat, grads)
    from_flat.step(twin, flatten(grads))
    np.testing.assert_array_equal(flat, twin)


@pytest.mark.parametrize(
    ("max_norm", "error_if_nonfinite", "reads"),
    [(None, False, 9), (None, True, 18), (1.0, False, 18)],
)
def test_a_step_reads_each_gradient_block_once_unless_it_takes_the_norm(
    max_norm, error_if_nonfinite, reads
):
    """26 entries in 9 blocks of 3: the update reads each block once, and the norm (for
    clipping, or to find a NaN) once more; a step that needs no norm takes none."""
    flat, params = random_params(np.random.default_rng(0))
    with block_sizes(8 * 3, gather_whole_blocks=1):
        optimizer = AdamW(params, lr=0.01)
    grads = {key: np.ones_like(value) for key, value in params.items()}
    read, block = [], clipping.Gradients.block

    def counted(gradients, piece, scratch):
        read.append(piece)
        return block(gradients, piece, scratch)

    with mock.patch.object(clipping.Gradients, "block", counted):
        optimizer.step(flat, grads, max_grad_norm=max_norm, error_if_nonfinite=error_if_nonfinite)
    assert len(read) == reads


@pytest.mark.parametrize("block_entries, gathers", [(26, 1), (14, 1), (7, 1), (6, 2)])  # 1-5 blocks
def test_a_grads_dict_of_a_few_blocks_is_gathered_once_whole(block_entries, gathers):
    """26 entries (w 0..12, b 12..16, e 16..26) in 1 to GATHER_WHOLE_BLOCKS (4) blocks: one
    np.concatenate of the whole dict a step (one block: into the scratch row). In 5 blocks
    of 6, block by block: the one block that spans arrays, 12..18, is gathered for the norm
    and again for the update."""
    flat, params = random_params(np.random.default_rng(0))
    with mock.patch.object(clipping, "BLOCK_BYTES", 8 * block_entries):
        optimizer = AdamW(params, lr=0.01)
    grads = {key: np.ones_like(value) for key, value in params.items()}
    with mock.patch.object(optim.np, "concatenate", wraps=np.concatenate) as concatenate:
        optimizer.step(flat, grads, max_grad_norm=1.0)
    assert concatenate.call_count == gathers


@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_error_if_nonfinite_leaves_a_finite_step_as_it_was(max_norm):
    """The flag only looks at the norm: finite gradients step to the same bits with it as
    without, clipped or not, and the step returns the norm only when it clips."""
    flat, params = random_params(np.random.default_rng(0))
    twin = flat.copy()
    flagged, plain = AdamW(params, lr=0.01), AdamW(unflatten(twin, params), lr=0.01)
    grads = {key: np.full(value.shape, 3.0) for key, value in params.items()}
    norm = flagged.step(flat, grads, max_grad_norm=max_norm, error_if_nonfinite=True)
    assert norm == plain.step(twin, grads, max_grad_norm=max_norm)
    assert (norm is None) == (max_norm is None)
    np.testing.assert_array_equal(flat, twin)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_error_if_nonfinite_refuses_a_nan_or_inf_gradient_before_any_update(bad, max_norm):
    """As torch's clip_grad_norm_(error_if_nonfinite=True): the norm the step computes finds
    a NaN or inf anywhere, and nothing (params, moments, step count) moves; without the flag
    the NaN flows into the update, as in torch."""
    flat, params = random_params(np.random.default_rng(0))
    optimizer = AdamW(params, lr=0.01)
    optimizer.step(flat, np.ones(flat.size))
    before = flat.copy(), {k: v.copy() for k, v in optimizer.flat_state.items()}
    grads = {key: np.ones_like(value) for key, value in params.items()}
    grads["b"][2] = bad
    with pytest.raises(optim.NonFiniteGradients, match="the gradients' norm is (nan|inf)"):
        optimizer.step(flat, grads, max_grad_norm=max_norm, error_if_nonfinite=True)
    assert optimizer.step_count == 1
    np.testing.assert_array_equal(flat, before[0])
    for name, value in optimizer.flat_state.items():
        np.testing.assert_array_equal(value, before[1][name])
    with np.errstate(invalid="ignore", divide="ignore"):  # inf / inf, inf * 0
        optimizer.step(flat, grads, max_grad_norm=max_norm)
    assert not np.isfinite(flat).all() and optimizer.step_count == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda g: {k: g[k] for k in ("b", "w", "e")},
            "grads must have exactly the parameters' keys, in their order",
        ),
        (lambda g: {k: v for k, v in g.items() if k != "e"}, "missing ['e'], unexpected []"),
        (lambda g: g | {"b": np.zeros(5)}, "grads['b'] must have shape (4,), got (5,)"),
        (lambda g: g | {"e": g["e"].astype(np.float32)}, "grads['e'] must have dtype float64"),
        (lambda g: g | {"w": g["w"].tolist()}, "grads['w'] must be an array, got list"),
    ],
)
@pytest.mark.parametrize("block_bytes", [clipping.BLOCK_BYTES, 40])  # one block; blocks of 5
def test_step_refuses_a_grads_dict_that_does_not_fit_the_params(change, words, block_bytes):
    flat, params = random_params(np.random.default_rng(0))
    with mock.patch.object(clipping, "BLOCK_BYTES", block_bytes):
        optimizer, before = Adam(params, lr=0.01), flat.copy()
    grads = {key: np.ones_like(value) for key, value in params.items()}
    with pytest.raises(InputError, match=re.escape(words)):
        optimizer.step(flat, change(grads))
    assert optimizer.step_count == 0
    np.testing.assert_array_equal(flat, before)


FLOAT32_ROW_BOUND = clipping.SQUARES_ROW * float(np.finfo(np.float32).epsneg) / 2  # 7.6e-6


def test_float32_norm_sums_squares_in_short_rows_then_in_float64():
    """The norm of float32 gradients: each row of SQUARES_ROW squares summed in float32 (at
    most 255 roundings, a relative error below 255 u on the squares, half that on the norm),
    the rows' sums in float64. One float32 dot over a 64K block fails the bound where one
    entry dominates (its accumulator stops taking the others: ~1e-4 here)."""
    rng = np.random.default_rng(0)
    grads = rng.standard_normal(1_000_000).astype(np.float32)
    exact = float(np.linalg.norm(grads.astype(np.float64)))
    assert abs(clip_grad_norm(grads, max_norm=1.0) - exact) <= FLOAT32_ROW_BOUND * exact
    dominated = np.ones(1 << 16, np.float32)
    dominated[0] = 4096.0  # 4096^2 = 2^24: a float32 sum there no longer takes a 1
    exact = float(np.linalg.norm(dominated.astype(np.float64)))
    one_dot = math.sqrt(float(np.dot(dominated, dominated)))
    assert abs(one_dot - exact) > FLOAT32_ROW_BOUND * exact  # the failure the rows avoid
    assert abs(clipping.global_norm(dominated) - exact) <= FLOAT32_ROW_BOUND * exact


@pytest.mark.parametrize(
    "entries, words",
    [
        ([1e20, 3.0], "a square overflows float32"),
        ([1e-25] * 300, "every square underflows"),
        ([1e-25] * 299 + [2e-20], "subnormal squares"),
        ([0.0] * 300, "all zero"),
    ],
)
def test_float32_squares_out_of_range_are_summed_in_float64(entries, words):
    """Past 1.8e19 a float32 square overflows and below 1e-19 it is subnormal or zero: such
    blocks are summed in float64, so an entry of 1e20 does not zero the rest on clipping,
    and tiny gradients keep their norm."""
    grads = np.array(entries, np.float32)
    exact = float(np.linalg.norm(grads.astype(np.float64)))
    norm = clip_grad_norm(grads, max_norm=1.0)
    assert abs(norm - exact) <= 1e-15 * exact, f"{words}: norm {norm!r} vs float64 {exact!r}"
    if exact > 1.0:
        assert np.isfinite(grads).all() and grads[0] > 0.99
        assert grads[1] > 0, "the small entry was zeroed: the norm overflowed to inf"


@pytest.mark.parametrize(
    "blocks",
    [
        [np.linspace(-3.0, 3.0, 256), np.r_[1e20, np.ones(255)]],  # a later block overflows
        [np.full(256, 1e-25), np.full(256, 3e-25), np.full(100, 2e-25)],  # three underflow
    ],
    ids=["overflow-after-an-ordinary-block", "underflow-three-times-the-last-short"],
)
def test_float32_blocks_out_of_range_anywhere_in_the_vector_are_summed_in_float64(
    monkeypatch, blocks
):
    """Blocks of 256 entries (clipping.BLOCK_BYTES patched): each block whose float32 squares
    leave float32's range is redone in float64, whichever block it is, in one float64
    scratch that a short last block uses only the start of."""
    monkeypatch.setattr(clipping, "BLOCK_BYTES", 256 * 4)
    grads = np.concatenate(blocks).astype(np.float32)
    exact = float(np.linalg.norm(grads.astype(np.float64)))
    assert abs(clipping.global_norm(grads) - exact) <= 1e-15 * exact


@pytest.mark.parametrize(
    ("flat_grads", "words"),
    [
        (np.ones((3, 3)), "flat_grads must be a vector (model.flat_grads(grads)), got (3, 3)"),
        ([1.0, 2.0], "flat_grads must be a vector (model.flat_grads(grads)), got list"),
        (np.ones(3, int), "flat_grads must be float32 or float64, got int64"),
    ],
)
def test_clip_grad_norm_refuses_what_it_cannot_scale_in_place(flat_grads, words):
    with pytest.raises(InputError, match=re.escape(words)):
        clipping.clip_grad_norm(flat_grads, 1.0)
