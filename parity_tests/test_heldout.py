"""A language model's held-out evaluation (numpy_engine/evaluation.py): the held-out part is
never trained on and its loss weighs every held-out target; evaluation in micro-batches,
holding one logits array and one block's activations; a holdout out of range or too small
refused; runs with a holdout, and runs saved before it, resumed. The copy task's evaluation
and training at defaults: test_training.py."""

from __future__ import annotations

import io
import itertools
import math
import re
import tracemalloc
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine import evaluation, tasks, train
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.tasks import CharCorpus
from numpy_engine.train import CharTrainConfig, resume, save_run, train_char_lm


@pytest.mark.parametrize("holdout", [-0.1, 1.0, math.nan])
def test_a_holdout_outside_0_to_1_is_refused_by_name(holdout):
    """0 holds nothing out; 1 would hold out everything. (A config from Python.)"""
    cfg = CharTrainConfig(steps=1, holdout=holdout)
    with pytest.raises(
        ValueError, match=rf"^holdout must be a fraction in \[0, 1\), got {holdout}$"
    ):
        train_char_lm(cfg, progress_stream=None)


def test_language_model_runs_saved_before_the_holdout_resume(tmp_path):
    """Runs saved before 2026-12-02 kept an eval_every that nothing read; those saved until
    the holdout came kept neither. Both resume to the same bits as a run saved now, which
    holds nothing out and evaluates nothing."""
    run = train_char_lm(CharTrainConfig(steps=2, context=8), progress_stream=None)
    kept_then = {"oldest": {"eval_every": 50}, "old": {}, "new": None}
    for name, kept in kept_then.items():
        save_run(run, tmp_path / name)
        if kept is None:
            continue
        saved = load_checkpoint(tmp_path / name)
        settings = saved.meta["train_config"]
        settings = {k: v for k, v in settings.items() if k not in ("holdout", "eval_every")}
        meta = saved.meta | {"train_config": settings | kept}
        save_checkpoint(tmp_path / name, saved.model, saved.optimizer_state, meta)
    *older, new = (resume(tmp_path / name, None, steps=3) for name in kept_then)
    for old in older:
        assert np.array_equal(old.model.flat, new.model.flat) and "eval" not in old.history
        assert old.history == new.history and len(old.history["step"]) == 3


HELD_OUT_TEXT = "ab" * 150 + "cd" * 50  # holdout=0.25: the last 100 tokens, "cdcd...", held out


def test_a_holdout_is_never_trained_on_and_its_loss_weighs_every_held_out_target(monkeypatch):
    seen = []

    def spy(ids, rng, batch_size, context):  # the run's training batches
        seen.append(tasks.random_windows(ids, rng, batch_size, context))
        return seen[-1]

    monkeypatch.setattr(train, "random_windows", spy)
    # the evaluation's clock: each reading 1.5 s after the last, from 100 s (a clock's zero
    # is arbitrary): each evaluation shows the 1.5 s between its first reading and its last
    clock = itertools.count(100.0, 1.5)
    monkeypatch.setattr(evaluation, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    cfg = CharTrainConfig(steps=6, context=8, batch_size=4, holdout=0.25, eval_every=4)
    progress = io.StringIO()
    run = train_char_lm(cfg, HELD_OUT_TEXT, progress_stream=progress)
    corpus = CharCorpus(HELD_OUT_TEXT)
    held_out_ids = [corpus.index["c"], corpus.index["d"]]
    assert len(seen) == 6 and not np.isin(np.stack(seen), held_out_ids).any()
    assert [e["step"] for e in run.history["eval"]] == [4, 6]
    # windows of 8 targets from the held-out part's start, the last of 3: 99 = 12 * 8 + 3,
    # evaluated 4 windows a batch, so an unweighted mean of the batches' means would differ
    total, heldout = 0.0, corpus.ids[-100:]
    for start in range(0, 99, 8):
        window = heldout[start : start + 9]
        logits = run.model.forward(window[None, :-1])[0][0].astype(np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        total -= log_p[np.arange(len(window) - 1), window[1:]].sum()
    result = run.result
    assert result["heldout_targets"] == 99
    assert result["heldout_loss"] == run.history["eval"][-1]["heldout_loss"]
    shown = re.findall(
        r"step +(\d+)/6 .* held-out loss (\S+) \(99 tokens, 1\.5 s\)\n", progress.getvalue()
    )
    assert shown == [(str(e["step"]), f"{e['heldout_loss']:.4f}") for e in run.history["eval"]]
    assert abs(result["heldout_loss"] - total / 99) <= 1e-6 * total / 99


def test_a_run_in_micro_batches_evaluates_in_micro_batches(monkeypatch):
    """--accumulate saves memory: the held-out windows go through the model as many at a
    time as a micro-batch, and their mean loss is the same to rounding."""
    rows, measure = [], evaluation.heldout_loss

    def spy(model, windows, batch_size, group):  # the windows a forward pass takes
        rows.append(batch_size)
        return measure(model, windows, batch_size, group)

    monkeypatch.setattr(evaluation, "heldout_loss", spy)
    cfg = CharTrainConfig(steps=2, context=8, batch_size=8, holdout=0.25, eval_every=2)
    whole = train_char_lm(cfg, HELD_OUT_TEXT, progress_stream=None)
    micro = DataParallel(OneProcess(), accumulate=3)  # micro-batches of 3, 3 and 2 windows
    parts = train_char_lm(cfg, HELD_OUT_TEXT, progress_stream=None, parallel=micro)
    assert rows == [8, 3]
    gap = abs(parts.result["heldout_loss"] - whole.result["heldout_loss"])
    assert gap <= 1e-6 * whole.result["heldout_loss"]


@pytest.mark.parametrize("kind", ["MiniGPT", "GPT2"])
def test_the_head_and_loss_hold_one_logits_array_in_training_and_in_evaluation(kind):
    """A language model's readout and loss, fused (losses.linear_cross_entropy and its loss
    alone), never hold a second (B, T, V) array: at GPT-2's 50257 classes that is 51 MB
    each at batch 4 x 64. A wide vocabulary over a tiny trunk makes the logits nearly all
    that a step allocates; the unfused loss, logits -> cross_entropy_forward, peaks at 4.07
    logits arrays here, and the fused ones at 1.07 (evaluation) and 1.23 (training, the
    gradients' 0.13 (GPT2) or 0.27 (MiniGPT) included)."""
    model_class = getattr(ne.models, kind)
    sizes = dict(max_len=16, d_model=8, n_heads=2, n_layers=1, d_ff=8, dtype="float32")
    model = model_class(model_class.config_class(4096, **sizes), seed=0)
    idx = np.random.default_rng(0).integers(0, 4096, (4, 16))
    targets = np.roll(idx, -1, axis=1)
    logits_bytes = idx.size * 4096 * 4  # one (B, T, V) float32 array: one block of the loss
    gradients_bytes = model.flat.nbytes
    for measured, other_bytes in ((model.loss, 0), (model.loss_and_grads, gradients_bytes)):
        measured(idx, targets)  # warm: caches built on first use
        tracemalloc.start()
        measured(idx, targets)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak - other_bytes <= 1.5 * logits_bytes, (measured.__name__, peak / logits_bytes)
    assert model.loss(idx, targets) == model.loss_and_grads(idx, targets)[0]  # the same bits


def _evaluation_peak_bytes(model_class, n_layers: int) -> int:
    """tracemalloc's peak over one model.loss of a batch 8 x 32, d_model 64, vocab 16."""
    sizes = dict(max_len=32, d_model=64, n_heads=4, n_layers=n_layers, d_ff=256)
    model = model_class(model_class.config_class(16, **sizes), seed=0)
    idx = np.random.default_rng(0).integers(0, 16, (8, 32))
    targets = np.roll(idx, -1, axis=1)
    model.loss(idx, targets)  # warm: caches built on first use
    tracemalloc.start()
    model.loss(idx, targets)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize("kind", ["MiniGPT", "GPT2"])
def test_evaluation_holds_one_blocks_activations_at_any_depth(kind):
    """A language model's evaluation keeps no block's activations for a backward: its peak
    is one block's, whatever the depth (measured 1.0001x from 1 to 8 layers; keeping every
    block's cache, as the training step must, 5.57x). GPT-2's 4 x 64 evaluation: 284.6 ->
    50.6 MiB above the model."""
    model_class = getattr(ne.models, kind)
    shallow, deep = (_evaluation_peak_bytes(model_class, n) for n in (1, 8))
    assert deep <= 1.1 * shallow, deep / shallow


def test_a_holdout_too_small_for_one_window_is_refused_before_training():
    cfg = CharTrainConfig(steps=1, context=8, holdout=0.01)
    message = "holdout=0.01 leaves the held-out part 4 of the text's 400 tokens; a context of 8"
    with pytest.raises(ValueError, match=message):
        train_char_lm(cfg, HELD_OUT_TEXT, progress_stream=None)


def test_a_run_with_a_holdout_resumes_to_the_same_evaluations(tmp_path):
    cfg = CharTrainConfig(steps=4, context=8, batch_size=4, holdout=0.25, eval_every=2)
    straight = train_char_lm(cfg, HELD_OUT_TEXT, progress_stream=None)
    save_run(train_char_lm(replace(cfg, steps=2), HELD_OUT_TEXT, None), tmp_path / "run")
    resumed = resume(tmp_path / "run", None, steps=4)
    assert np.array_equal(resumed.model.flat, straight.model.flat)
    evaluations = straight.history["eval"]
    assert resumed.history["eval"] == evaluations and [e["step"] for e in evaluations] == [2, 4]
    assert resumed.result["heldout_loss"] == straight.result["heldout_loss"]
