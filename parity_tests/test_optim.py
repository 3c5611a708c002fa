"""Optimizers against torch.optim, float64: SGD, Adam and AdamW, their defaults, AdamW's
undecayed parameters, the state a checkpoint keeps, and what a step refuses.

Ten steps from the same parameters and the same gradient sequence; parameters and
every moment must agree within 1e-12 relative (normwise per tensor). The engine's side
works as a model does: named views of one flat vector, stepped with one flat gradient
(parity_tests/optim_cases.py). Clipping and the gradients read block by block:
test_clipping.py; the step on the engine's threads: test_optimizer_threads.py.
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

from numpy_engine import clipping
from numpy_engine.checks import InputError
from numpy_engine.optim import SGD, Adam, AdamW, no_decay_keys
from numpy_engine.params import unflatten
from parity_tests.optim_cases import (
    SHAPES,
    assert_state_matches,
    learning_rates,
    random_params,
    run_both,
    weight_decays,
)
from parity_tests.strategies import seeds


@given(
    lr=learning_rates,
    momentum=st.sampled_from([0.0, 0.5, 0.9]),
    weight_decay=weight_decays,
    seed=seeds,
)
def test_sgd_matches_torch(lr, momentum, weight_decay, seed):
    run = run_both(
        lambda p: SGD(p, lr=lr, momentum=momentum, weight_decay=weight_decay),
        lambda t: torch.optim.SGD(t, lr=lr, momentum=momentum, weight_decay=weight_decay),
        seed,
    )
    assert_state_matches(*run[:4], ["momentum_buffer"] if momentum else [])


@given(
    lr=learning_rates, beta2=st.sampled_from([0.99, 0.999]), weight_decay=weight_decays, seed=seeds
)
def test_adam_matches_torch(lr, beta2, weight_decay, seed):
    betas = (0.9, beta2)
    run = run_both(
        lambda p: Adam(p, lr=lr, betas=betas, weight_decay=weight_decay),
        lambda t: torch.optim.Adam(t, lr=lr, betas=betas, weight_decay=weight_decay),
        seed,
    )
    assert_state_matches(*run[:4], ["exp_avg", "exp_avg_sq"])


@given(lr=learning_rates, weight_decay=st.sampled_from([0.0, 0.01, 0.1]), seed=seeds)
@example(lr=1e-3, weight_decay=0.0, seed=0)  # no decay: the step skips its pass
def test_adamw_matches_torch_with_its_decoupled_decay(lr, weight_decay, seed):
    run = run_both(
        lambda p: AdamW(p, lr=lr, weight_decay=weight_decay),
        lambda t: torch.optim.AdamW(t, lr=lr, weight_decay=weight_decay),
        seed,
    )
    assert_state_matches(*run[:4], ["exp_avg", "exp_avg_sq"])


@pytest.mark.parametrize("ours, theirs", [(Adam, torch.optim.Adam), (AdamW, torch.optim.AdamW)])
def test_adam_and_adamw_defaults_are_torchs(ours, theirs):
    """lr, betas, eps and weight decay (AdamW's decoupled, Adam's L2) as torch's defaults."""
    optimizer, defaults = ours({"w": np.zeros(1)}), theirs([torch.zeros(1)]).defaults
    decay = getattr(optimizer, "decoupled_weight_decay", optimizer.weight_decay)
    got = (optimizer.lr, optimizer.betas, optimizer.eps, decay)
    assert got == (defaults["lr"], defaults["betas"], defaults["eps"], defaults["weight_decay"])
    assert decay == (0.01 if ours is AdamW else 0.0)


def test_sgd_defaults_are_torchs():
    """momentum and weight decay 0, as torch.optim.SGD's (the lr has no default here)."""
    optimizer = SGD({"w": np.zeros(1)}, lr=0.1)
    defaults = torch.optim.SGD([torch.zeros(1)], lr=0.1).defaults
    got = (optimizer.momentum, optimizer.weight_decay)
    assert got == (defaults["momentum"], defaults["weight_decay"]) == (0, 0)


def torch_without_decay_on(torch_class, no_decay, lr: float, weight_decay: float):
    """torch_class (torch.optim.Adam or AdamW) over SHAPES' tensors, those named in no_decay
    in a param group of weight_decay 0 (an empty group left out: torch refuses it)."""

    def make(tensors: list) -> torch.optim.Optimizer:
        named = dict(zip(SHAPES, tensors, strict=True))
        decayed = [t for key, t in named.items() if key not in no_decay]
        plain = [t for key, t in named.items() if key in no_decay]
        groups = [{"params": decayed}, {"params": plain, "weight_decay": 0.0}]
        return torch_class([g for g in groups if g["params"]], lr, weight_decay=weight_decay)

    return make


@given(
    kind=st.sampled_from(["adam", "adamw"]),
    lr=learning_rates,
    weight_decay=st.sampled_from([0.01, 0.1]),
    no_decay=st.sets(st.sampled_from(sorted(SHAPES))),
    block_entries=st.integers(1, 30),
    seed=seeds,
)
# blocks of 14 over w 0..12, b 12..16, e 16..26: each block holds decayed and undecayed entries
@example(kind="adamw", lr=0.01, weight_decay=0.1, no_decay={"b"}, block_entries=14, seed=0)
@example(kind="adamw", lr=0.01, weight_decay=0.1, no_decay={"w", "e"}, block_entries=14, seed=0)
@example(kind="adam", lr=0.01, weight_decay=0.1, no_decay={"b"}, block_entries=14, seed=0)
@example(kind="adam", lr=0.01, weight_decay=0.1, no_decay={"w", "e"}, block_entries=14, seed=0)
def test_no_decay_is_torchs_param_group_of_weight_decay_0(
    kind, lr, weight_decay, no_decay, block_entries, seed
):
    """The parameters no_decay names take the Adam step alone, as torch.optim.AdamW's (or
    Adam's, whose decay is L2) in a param group of weight_decay 0; in blocks of 1 to 30 of
    the 26 entries, cut between decayed and undecayed parameters or not, to the same bits
    as in one block."""
    ours, theirs = {"adam": (Adam, torch.optim.Adam), "adamw": (AdamW, torch.optim.AdamW)}[kind]

    def in_blocks(params):
        with mock.patch.object(clipping, "BLOCK_BYTES", 8 * block_entries):
            return ours(params, lr=lr, weight_decay=weight_decay, no_decay=no_decay)

    torch_twin = torch_without_decay_on(theirs, no_decay, lr, weight_decay)
    run = run_both(in_blocks, torch_twin, seed)
    assert len(run[2].pieces) == -(-26 // block_entries)
    assert_state_matches(*run[:4], ["exp_avg", "exp_avg_sq"])
    whole = run_both(
        lambda p: ours(p, lr=lr, weight_decay=weight_decay, no_decay=no_decay), torch_twin, seed
    )[0]
    for key, value in run[0].items():
        np.testing.assert_array_equal(value, whole[key])


@pytest.mark.parametrize(
    "no_decay, block_entries, parts",
    [
        ((), 14, {0: None, 14: None}),  # every block decays whole: one pass
        (("b",), 14, {0: [slice(0, 12)], 14: [slice(2, 12)]}),  # w 0..12 | e 16..26
        (("w", "e"), 14, {0: [slice(12, 14)], 14: [slice(0, 2)]}),  # b alone
        (("w", "b", "e"), 14, {0: [], 14: []}),
        (("b",), 16, {0: [slice(0, 12)], 16: None}),  # e starts where the second block does
    ],
)
def test_adamw_decays_the_parts_of_each_block_that_hold_decayed_parameters(
    no_decay, block_entries, parts
):
    """Blocks over w 0..12, b 12..16, e 16..26: the slices of each block that decay."""
    _, params = random_params(np.random.default_rng(0))
    with mock.patch.object(clipping, "BLOCK_BYTES", 8 * block_entries):
        optimizer = AdamW(params, no_decay=no_decay)
    assert optimizer.decayed == parts


@pytest.mark.parametrize("kind", [Adam, AdamW])
def test_a_no_decay_key_that_names_no_parameter_is_refused(kind):
    _, params = random_params(np.random.default_rng(0))
    with pytest.raises(InputError, match=re.escape("no_decay names no parameter: ['bias']")):
        kind(params, no_decay=["b", "bias"])


def test_no_decay_keys_are_every_parameter_that_is_not_a_matrix():
    """Biases and layernorms: what Hugging Face's Trainer and nanoGPT leave undecayed."""
    params = {"emb": np.zeros((5, 2)), "w": np.zeros((2, 2)), "b": np.zeros(2), "ln": np.zeros(2)}
    assert no_decay_keys(params) == ["b", "ln"]


def test_state_dict_round_trip_continues_identically():
    rng = np.random.default_rng(0)
    flat, params = random_params(rng)
    twin_flat = flat.copy()
    first = AdamW(params, lr=0.01)
    second = AdamW(unflatten(twin_flat, params), lr=0.01)
    for step in range(6):
        grads = rng.standard_normal(flat.size)
        if step == 3:
            second.load_state_dict(first.state_dict())
            twin_flat[...] = flat
        first.step(flat, grads.copy())
        if step >= 3:
            second.step(twin_flat, grads.copy())
    np.testing.assert_array_equal(flat, twin_flat)
    assert second.step_count == 6


@pytest.mark.parametrize("consume", [False, True])
def test_a_state_dict_is_refused_whole_and_loaded_whole(consume):
    """A missing key or a wrong shape anywhere is refused before any state is written, and the
    given dict is left as it was; accepted, its arrays are copied in (consume: popped from it,
    so that each goes once copied)."""
    _, params = random_params(np.random.default_rng(0))
    saved = AdamW(params).state_dict()
    rng = np.random.default_rng(1)
    saved = {key: rng.standard_normal(value.shape) for key, value in saved.items()} | {
        "step": np.array(7)
    }
    optimizer = AdamW(params)
    wrong_shape = saved | {"exp_avg_sq.e": saved["exp_avg_sq.e"].T}
    said = r"^optimizer state exp_avg_sq.e has shape \(2, 5\), expected \(5, 2\)$"
    missing = {key: value for key, value in saved.items() if key != "exp_avg.w"}
    extra = saved | {"exp_avg.x": saved["exp_avg.w"]}
    for refused, message in [
        (wrong_shape, said),
        (missing, r"missing keys \['exp_avg.w'\], unexpected keys \[\]$"),
        (extra, r"missing keys \[\], unexpected keys \['exp_avg.x'\]$"),
    ]:
        given = dict(refused)
        with pytest.raises(InputError, match=message):
            optimizer.load_state_dict(given, consume)
        assert given.keys() == refused.keys() and optimizer.step_count == 0
        assert all(not vector.any() for vector in optimizer.flat_state.values())
    given = dict(saved)
    optimizer.load_state_dict(given, consume)
    assert given.keys() == (set() if consume else saved.keys()) and optimizer.step_count == 7
    for key, value in optimizer.state_arrays().items():
        np.testing.assert_array_equal(value, saved[key])


def test_a_model_step_updates_its_params_through_the_flat_vector():
    """model.params are views of model.flat: stepping the vector moves every named tensor,
    exactly as the same step on a separate copy of the vector."""
    import numpy_engine as ne

    model = ne.MiniGPT(ne.GPTConfig(n_layers=1, dtype="float64"), seed=0)
    copy, initial = model.flat.copy(), model.flat.copy()
    model_opt, copy_opt = AdamW(model.params, lr=0.01), AdamW(model.params, lr=0.01)
    rng = np.random.default_rng(0)
    for _ in range(3):
        grads = {key: rng.standard_normal(value.shape) for key, value in model.params.items()}
        flat_grads = model.flat_grads(grads)
        np.testing.assert_array_equal(unflatten(flat_grads, grads)["head.bias"], grads["head.bias"])
        model_opt.step(model.flat, flat_grads.copy())
        copy_opt.step(copy, flat_grads)
    assert not np.array_equal(model.flat, initial)  # it moved
    for key, value in unflatten(copy, model.params).items():
        np.testing.assert_array_equal(model.params[key], value)
        assert np.shares_memory(model.params[key], model.flat)


@pytest.mark.parametrize("lr", [0.0, -1e-3, math.inf, math.nan])
@pytest.mark.parametrize("optimizer_class", [SGD, Adam, AdamW])
def test_a_learning_rate_that_is_not_positive_and_finite_is_refused(optimizer_class, lr):
    with pytest.raises(InputError, match=f"lr must be a positive finite number, got {lr}"):
        optimizer_class(random_params(np.random.default_rng(0))[1], lr=lr)


@pytest.mark.parametrize(
    ("optimizer_class", "setting", "words"),
    [
        (Adam, dict(betas=(1.0, 0.999)), "betas[0] must be a number in [0, 1), got 1.0"),
        (AdamW, dict(betas=(0.9, -0.1)), "betas[1] must be a number in [0, 1), got -0.1"),
        (Adam, dict(betas=(0.9, math.nan)), "betas[1] must be a number in [0, 1), got nan"),
        (AdamW, dict(betas=(0.9,)), "betas must be a pair (beta1, beta2), got (0.9,)"),
        (Adam, dict(betas=0.9), "betas must be a pair (beta1, beta2), got 0.9"),
        (AdamW, dict(betas=("0.9", 0.999)), "betas[0] must be a number in [0, 1), got 0.9"),
        (Adam, dict(eps=-1e-8), "eps must be a finite number >= 0, got -1e-08"),
        (AdamW, dict(eps=math.inf), "eps must be a finite number >= 0, got inf"),
        (Adam, dict(weight_decay=-0.01), "weight_decay must be a finite number >= 0, got -0.01"),
        (AdamW, dict(weight_decay=math.nan), "weight_decay must be a finite number >= 0, got nan"),
        (AdamW, dict(weight_decay=True), "weight_decay must be a finite number >= 0, got True"),
        (SGD, dict(momentum=-0.9), "momentum must be a finite number >= 0, got -0.9"),
        (SGD, dict(weight_decay=-1), "weight_decay must be a finite number >= 0, got -1"),
    ],
)
def test_settings_torch_refuses_are_refused(optimizer_class, setting, words):
    """torch.optim's own bounds (betas in [0, 1), eps, weight_decay and momentum >= 0),
    and finite: at beta 1 the bias correction divides by 0."""
    with pytest.raises(InputError, match=re.escape(words)):
        optimizer_class(random_params(np.random.default_rng(0))[1], lr=1e-3, **setting)


def test_the_bounds_themselves_are_accepted():
    params = random_params(np.random.default_rng(0))[1]
    adam = Adam(params, lr=1e-3, betas=[0.0, 0.0], eps=0.0, weight_decay=0.0)
    assert adam.betas == (0.0, 0.0) and adam.eps == 0.0
    assert AdamW(params, lr=1e-3, betas=(np.float32(0.5), 0.99)).betas == (0.5, 0.99)
    assert SGD(params, lr=1e-3, momentum=0, weight_decay=0).momentum == 0


@pytest.mark.parametrize("max_norm", [0.0, -1.0, math.nan, "1"])
@pytest.mark.parametrize("optimizer_class", [SGD, Adam, AdamW])
def test_a_clipping_norm_that_is_not_above_0_is_refused_before_any_update(
    optimizer_class, max_norm
):
    """torch's clip_grad_norm_ would take it: at 0 every gradient becomes 0, below 0 each
    turns around (an ascent), at NaN every one becomes NaN."""
    flat, params = random_params(np.random.default_rng(0))
    before, grads = flat.copy(), np.ones_like(flat)
    optimizer = optimizer_class(params, lr=1e-3)
    words = f"max_grad_norm must be a positive number (inf clips nothing), got {max_norm}"
    with pytest.raises(InputError, match=re.escape(words)):
        optimizer.step(flat, grads, max_grad_norm=max_norm)
    assert optimizer.step_count == 0
    np.testing.assert_array_equal(flat, before)
    with pytest.raises(InputError, match=re.escape(words.replace("max_grad_norm", "max_norm"))):
        clipping.clip_grad_norm(grads, max_norm)
    np.testing.assert_array_equal(grads, np.ones_like(flat))


def test_an_infinite_clipping_norm_returns_the_norm_and_clips_nothing():
    """torch's idiom for the gradients' norm alone: clip_grad_norm_(params, inf)."""
    flat, params = random_params(np.random.default_rng(0))
    grads = np.full_like(flat, 2.0)
    assert clipping.clip_grad_norm(grads, math.inf) == 2.0 * math.sqrt(flat.size)
    np.testing.assert_array_equal(grads, np.full_like(flat, 2.0))
    clipped, unclipped = flat.copy(), flat.copy()
    norm = Adam(params, lr=1e-3).step(clipped, grads, max_grad_norm=math.inf)
    assert norm == 2.0 * math.sqrt(flat.size)
    Adam(params, lr=1e-3).step(unclipped, grads)
    np.testing.assert_array_equal(clipped, unclipped)


@pytest.mark.parametrize(
    ("flat", "grads", "words"),
    [
        (np.zeros(26), np.zeros(25), "flat_grads must be a vector of 26 entries, got (25,)"),
        (np.zeros((2, 13)), np.zeros(26), "flat_params must be a vector of 26 entries"),
        ([0.0] * 26, np.zeros(26), "flat_params must be a vector of 26 entries, got list"),
        (np.zeros(26), np.zeros(26, np.float32), "flat_grads must have dtype float64"),
    ],
)
def test_step_refuses_vectors_that_do_not_fit_the_layout(flat, grads, words):
    optimizer = Adam(random_params(np.random.default_rng(0))[1], lr=0.01)
    with pytest.raises(InputError, match=re.escape(words)):
        optimizer.step(flat, grads)
    assert optimizer.step_count == 0
