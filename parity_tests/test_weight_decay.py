"""A training run's weight decay: the decay a run is given shrinks its weights by lr times
it, on the matrices and embeddings by default or on every parameter; runs saved before the
choice existed resume decaying every parameter; and a decay that is out of range, or that
would zero or flip the weights, is refused by name. The update rule itself, against torch:
test_optim.py."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine import loop
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.train import CharTrainConfig, resume, save_run, train_char_lm


@pytest.mark.parametrize("decayed", ["matrices", "all", None])  # None: the default
def test_the_weight_decay_a_run_is_given_shrinks_its_weights_by_lr_times_it(tmp_path, decayed):
    """One step from the same weights on the same batch: the Adam part of the update is the
    same, so the runs differ by AdamW's decay alone, p (1 - lr wd) against p: on every
    parameter, or (the default) on the matrices and embeddings alone, the biases and
    layernorms taking the same bits as without decay."""
    from numpy_engine.cli import main

    runs = {wd: tmp_path / str(wd) for wd in ("0", "0.5")}
    for wd, out in runs.items():
        args = ["train", "char-lm", "--steps", "1", "--weight-decay", wd, "--out", str(out)]
        args += ["--weight-decay-on", decayed] if decayed else []
        assert main([*args, "--quiet"]) == 0
    plain, decayed_run = (load_checkpoint(out) for out in runs.values())
    saved = decayed_run.meta["train_config"]
    assert (saved["weight_decay"], saved["weight_decay_on"]) == (0.5, decayed or "matrices")
    first = ne.MiniGPT(plain.model.config, seed=7).params  # the runs' initial weights (seed 7)
    undecayed = 0
    for key, p1 in plain.model.params.items():
        if decayed != "all" and p1.ndim < 2:  # a bias or a layernorm's scale or shift
            np.testing.assert_array_equal(decayed_run.model.params[key], p1, err_msg=key)
            undecayed += 1
            continue
        expected = p1 - 3e-3 * 0.5 * first[key]
        assert np.allclose(decayed_run.model.params[key], expected, rtol=0, atol=1e-7), key
        if np.any(first[key]):  # not a bias, which starts at 0 and so decays by 0
            assert not np.array_equal(decayed_run.model.params[key], p1), key
    # each of 3 blocks' 2 layernorms and 6 biases, the final layernorm and the head's bias
    assert undecayed == (0 if decayed == "all" else 3 * 10 + 2 + 1)


def test_language_model_runs_saved_before_weight_decay_on_resume_decaying_every_parameter(
    tmp_path, capsys
):
    """Runs saved before weight_decay_on existed (2026-12-04) decayed every parameter: they
    resume so, to the same bits as a run of weight_decay_on="all" that never stopped, and
    refuse --weight-decay-on matrices; a new run decays the matrices alone by default."""
    from numpy_engine.cli import main

    cfg = CharTrainConfig(steps=4, context=8, weight_decay=0.5, weight_decay_on="all")
    straight = train_char_lm(cfg, progress_stream=None)
    save_run(train_char_lm(replace(cfg, steps=2), progress_stream=None), tmp_path / "old")
    saved = load_checkpoint(tmp_path / "old")
    settings = saved.meta["train_config"]
    del settings["weight_decay_on"]
    save_checkpoint(tmp_path / "old", saved.model, saved.optimizer_state, saved.meta)
    flags = ["train", "--resume", str(tmp_path / "old"), "--steps", "4", "--quiet"]
    assert main([*flags, "--weight-decay-on", "matrices"]) == 2
    assert "--weight-decay-on matrices conflicts with the checkpoint's weight_decay_on=all" in (
        capsys.readouterr().err
    )
    resumed = resume(tmp_path / "old", None, steps=4)
    assert resumed.meta["train_config"]["weight_decay_on"] == "all"
    assert np.array_equal(resumed.model.flat, straight.model.flat)
    default = train_char_lm(replace(cfg, weight_decay_on="matrices"), progress_stream=None)
    assert not np.array_equal(default.model.flat, straight.model.flat)
    assert CharTrainConfig().weight_decay_on == "matrices"


def test_a_weight_decay_on_other_than_matrices_or_all_is_refused_by_name(capsys):
    refused = r"^weight_decay_on must be one of matrices, all, got 'biases'$"
    with pytest.raises(ValueError, match=refused):
        loop.check_run_config(CharTrainConfig(steps=1, weight_decay_on="biases"))
    from numpy_engine.cli import main

    with pytest.raises(SystemExit) as exited:  # argparse's exit, as for every bad flag value
        main(["train", "char-lm", "--weight-decay-on", "biases", "--steps", "1"])
    assert exited.value.code == 2
    assert "argument --weight-decay-on: must be one of matrices, all, got 'biases'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("weight_decay", [-0.1, math.nan, math.inf])
def test_a_weight_decay_that_is_not_finite_and_non_negative_is_refused_by_name(weight_decay):
    refused = rf"^weight_decay must be a finite number >= 0, got {weight_decay}$"
    with pytest.raises(ValueError, match=refused):
        loop.check_run_config(CharTrainConfig(steps=1, weight_decay=weight_decay))


def test_a_weight_decay_that_would_zero_or_flip_the_weights_is_refused_by_name(capsys):
    """--weight-decay 1e9 at lr 0.003 trained until the weights overflowed at step 3, and the
    stop blamed the learning rate. lr * weight_decay just below 1 is taken."""
    from numpy_engine.cli import main

    loop.check_run_config(CharTrainConfig(steps=1, lr=0.5, weight_decay=1.999))
    refused = (
        r"^weight_decay 2 with lr 0.5: each step multiplies the decayed weights by 1 - lr \* "
        r"weight_decay = 0, which zeroes or flips them; give lr \* weight_decay below 1$"
    )
    with pytest.raises(ValueError, match=refused):
        loop.check_run_config(CharTrainConfig(steps=1, lr=0.5, weight_decay=2.0))
    assert main(["train", "char-lm", "--weight-decay", "1e9", "--steps", "1", "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "numpy-engine train: error: --weight-decay 1e+09 with --lr 0.003: each step multiplies "
        "the decayed weights by 1 - lr * weight_decay = -3e+06, which zeroes or flips them; "
        "give lr * weight_decay below 1\n"
    )
