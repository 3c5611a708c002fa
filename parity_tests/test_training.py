"""Learning: the defaults train both tasks to the numbers the issue asks for; a run's progress,
its settings refused by name, and its steps those of a hand-written loop. A language model's
held-out evaluation: test_heldout.py; a run's weight decay: test_weight_decay.py."""

from __future__ import annotations

import io
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine import loop
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.generate import greedy_decode
from numpy_engine.loop import TrainState, empty_history
from numpy_engine.optim import Adam
from numpy_engine.tasks import DEFAULT_TEXT, CharCorpus, sequence_task
from numpy_engine.train import (
    CharTrainConfig,
    SequenceTrainConfig,
    _strip,
    save_run,
    train_char_lm,
    train_sequence_task,
)


@pytest.fixture(scope="module")
def copy_run():
    return train_sequence_task(SequenceTrainConfig(), progress_stream=None)


@pytest.fixture(scope="module")
def char_run():
    return train_char_lm(CharTrainConfig(), progress_stream=None)


def test_copy_task_at_defaults_reaches_097_exact_match(copy_run):
    result = copy_run.result
    assert (result["train_size"], result["test_size"], result["steps"]) == (467, 117, 800)
    assert result["exact_match"] >= 0.97
    assert result["heldout_loss"] < 0.1 < result["initial_train_loss"]
    assert len(result["examples"]) == 3
    for example in result["examples"]:
        assert example["expected"] == [*example["source"], 2]  # the copy, then EOS


def test_copy_history_has_every_step_and_evaluations(copy_run):
    history = copy_run.history
    assert history["step"] == list(range(1, 801)) and len(history["train_loss"]) == 800
    norms = np.array(history["grad_norm"])  # each step's gradient norm, before clipping
    assert norms.shape == (800,) and np.isfinite(norms).all() and norms.min() > 0
    # the gradient shrinks as it learns; medians, as constant-rate Adam still spikes late (the
    # 2026-12-02 code's last ten norms: median 0.043 and one of 1.19, against 1.17 at first)
    assert np.median(norms[:10]) > 10 * np.median(norms[-10:])
    assert [e["step"] for e in history["eval"]] == list(range(100, 801, 100))
    assert history["eval"][-1]["exact_match"] == copy_run.result["exact_match"]


def test_char_lm_learns_the_line(char_run):
    result = char_run.result
    assert abs(result["initial_train_loss"] - math.log(13)) < 0.15
    assert result["final_train_loss"] < 0.6
    assert "to be" in result["greedy_sample"]


def test_reverse_task_learns(tmp_path):
    run = train_sequence_task(SequenceTrainConfig(task="reverse", steps=1000), progress_stream=None)
    assert run.result["exact_match"] >= 0.9


def test_bad_training_settings():
    with pytest.raises(ValueError, match="steps must be a positive int"):
        train_sequence_task(SequenceTrainConfig(steps=0), progress_stream=None)
    with pytest.raises(ValueError, match="lr must be a positive finite number, got -1.0"):
        train_char_lm(CharTrainConfig(lr=-1.0), progress_stream=None)


def test_a_run_without_weight_decay_takes_any_positive_lr():
    """Adam's runs (copy, reverse) have no weight decay: lr * weight_decay < 1 asks nothing of
    their lr (a decay of 0, not some default, is what the check multiplies)."""
    from numpy_engine.loop import check_run_config

    assert check_run_config(SequenceTrainConfig(lr=2.0)) is None  # nothing refused
    with pytest.raises(ValueError, match="weight_decay 0.5 with lr 2"):
        check_run_config(CharTrainConfig(lr=2.0, weight_decay=0.5))


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("seed", -1, "a non-negative int, got -1"),
        ("lr", math.inf, "a positive finite number, got inf"),
        ("lr", 0.0, "a positive finite number, got 0.0"),
        ("clip", 0.0, "a positive finite number, got 0.0"),
        ("clip", math.nan, "a positive finite number, got nan"),
        ("context", 0, "a positive int, got 0"),
    ],
)
def test_a_training_config_out_of_range_is_refused_by_name(name, value, words):
    """Refused before any data or weights are drawn (a config from Python, not flags)."""
    with pytest.raises(ValueError, match=f"{name} must be {words}"):
        train_char_lm(CharTrainConfig(**{name: value}), progress_stream=None)


def test_progress_prints_every_tenth_and_the_first_and_last_steps_with_speed_and_time_left(
    monkeypatch,
):
    """A run resumed at step 10 of 40 prints its first step (11), every fourth, the last,
    and any step with an evaluation's text; each line with its loss, its speed since the
    start, and the time left at that speed."""
    clock = iter(100.0 + k / 2 for k in range(100))  # half a second a reading, one a step
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    progress = loop.Progress(40, stream, first_step=10)  # reads 100.0
    for step in range(11, 41):
        progress.update(step, loss=1.0 / step, extra="  eval" if step == 13 else "")
    lines = stream.getvalue().splitlines()
    printed = [int(line.split()[1].split("/")[0]) for line in lines]
    assert printed == [11, 12, 13, 16, 20, 24, 28, 32, 36, 40]
    for step, line in zip(printed, lines, strict=True):  # step s reads 100 + (s - 10) / 2
        assert line.startswith(f"step {step:>5}/40  loss {1.0 / step:.4f}     2.0 steps/s")
        assert line.endswith(f"{(40 - step) / 2:5.1f} s left" + "  eval" * (step == 13))
    loop.Progress(40, None).update(40, 1.0)  # no stream: nothing printed, no error
    short_run = io.StringIO()
    short = loop.Progress(19, short_run)  # a tenth of it is under two steps: every step
    for step in range(1, 20):
        short.update(step, loss=1.0)
    assert len(short_run.getvalue().splitlines()) == 19
    monkeypatch.setattr(loop.time, "perf_counter", lambda: 7.0)  # a clock too coarse to move
    loop.Progress(40, stream).update(1, 2.0)
    last = stream.getvalue().splitlines()[-1]
    assert last == "step     1/40  loss 2.0000     inf steps/s    0.0 s left"


def test_progress_of_slow_steps_comes_every_30_seconds_in_seconds_a_step(monkeypatch):
    """Steps of 3 s (a 124M GPT-2's here): besides every tenth of the run, a line whenever
    30 s have gone by since the last one; the speed in seconds a step, the time left in
    minutes or hours."""
    clock = iter(3.0 * k for k in range(10_000))  # three seconds a reading, one a step
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    progress = loop.Progress(5000, stream)  # reads 0
    for step in range(1, 1202):
        progress.update(step, loss=2.0)
    lines = stream.getvalue().splitlines()
    printed = [int(line.split()[1].split("/")[0]) for line in lines]
    # 30 s after step 1, then after each line; a tenth of the run (500, 1000) starts it anew
    assert printed == [1, *range(11, 500, 10), *range(500, 1201, 10)]  # not 1201: 3 s on
    assert lines[0] == "step     1/5000  loss 2.0000    3.00 s/step  4 h 10 min left"
    assert lines[-1] == "step  1200/5000  loss 2.0000    3.00 s/step  3 h 10 min left"
    assert loop.duration(59.94) == " 59.9 s" and loop.duration(59.96) == " 60.0 s"
    assert loop.duration(60.0) == " 1 min 00 s"
    assert loop.duration(61.0) == " 1 min 01 s" and loop.duration(3599.4) == "59 min 59 s"
    assert loop.duration(3599.6) == "1 h 00 min" and loop.duration(7259.0) == "2 h 01 min"
    assert loop.speed(1.0) == "   1.0 steps/s" and loop.speed(0.999) == "  1.00 s/step"


LEAST = dict(steps=1, batch_size=1, eval_every=1, context=1, seed=0)


@pytest.mark.parametrize("name", sorted(LEAST))
def test_a_training_configs_counts_are_taken_down_to_their_least_and_no_lower(name):
    """Each count at its least is a valid run; one less, a float or a bool is refused by
    name. (A config from Python: the flags are checked as they are parsed.)"""
    least = SimpleNamespace(**LEAST, lr=1e-3, clip=1.0, schedule="constant", warmup=0, min_lr=0)
    loop.check_run_config(least)  # nothing to refuse
    kind = "a positive" if LEAST[name] else "a non-negative"
    for bad in (LEAST[name] - 1, float(LEAST[name]), bool(LEAST[name])):
        with pytest.raises(ValueError, match=f"^{name} must be {kind} int, got {bad!r}$"):
            loop.check_run_config(SimpleNamespace(**{**vars(least), name: bad}))
    del least.context  # a sequence task's run has no context: not checked
    loop.check_run_config(least)


@pytest.mark.parametrize("first_step", [0, 10])  # a new run, one resumed at step 10
def test_a_run_reports_the_seconds_it_took_and_its_steps_per_second(first_step):
    model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(), seed=7)
    history = empty_history()
    state = TrainState(model, Adam(model.params), np.random.default_rng(1), first_step, history)
    cfg = SequenceTrainConfig(steps=30, eval_every=15)  # eval_every: not a step count here
    stream, start = io.StringIO(), time.perf_counter()
    result = train_sequence_task(cfg, None, stream, None, state).result
    elapsed = time.perf_counter() - start
    assert stream.getvalue().splitlines()[-1].startswith("step    30/30  loss")
    # seconds is rounded to the millisecond, so up to half of one past the time it took
    assert result["resumed_from_step"] == first_step and 0 < result["seconds"] <= elapsed + 5e-4
    # printed in the result: to the millisecond, and to four significant digits
    s, speed = result["seconds"], result["steps_per_second"]
    assert s == round(s, 3) and speed == float(f"{speed:.4g}")
    # both rounded: the speed by at most half a unit of its fourth digit (5e-4 of it), and
    # seconds to 1 ms, which moves steps / seconds by at most steps * 0.0005 / (s (s - 0.0005)):
    # under twice exact * 0.0005 / s
    exact = (30 - first_step) / s
    assert abs(speed - exact) <= 5e-4 * speed + 2 * exact * 0.0005 / s


@pytest.mark.parametrize(
    "steps, seconds, shown",
    [(2, 92.216, 0.02169), (100, 241.7, 0.4137), (800, 1.7043, 469.4), (800, 0.5, 1600.0)],
)
def test_the_steps_per_second_keep_four_digits_however_slow_the_steps(steps, seconds, shown):
    # a tenth of a step a second, as the result read before, showed 2 steps in 92 s as 0.0
    assert loop.steps_per_second(steps, seconds) == shown


def test_run_loop_takes_the_steps_a_hand_written_loop_takes():
    """Batch, gradients, clipping at cfg.clip, update, bit for bit: the MPI runs' gpt
    scenario in one process (its clip of 0.5 is below its gradients' norms)."""
    from parity_tests.mpi_runs import STEPS, gpt_run, train

    looped, _ = train("gpt", None)
    model, cfg, next_batch = gpt_run()
    _, norms = hand_written_steps(model, cfg, next_batch, np.random.default_rng([7, 1]), STEPS)
    assert max(norms) > cfg.clip  # so the clip changed the steps
    assert np.array_equal(looped, model.flat)


def hand_written_steps(model, cfg, next_batch, sampler, steps: int) -> tuple[list, list]:
    """A training loop written out: batch, gradients, clipping at cfg.clip, cfg's optimizer
    updating model.flat in place. Returns each step's loss and gradient norm."""
    optimizer, losses, norms = cfg.optimizer(model.params), [], []
    for _ in range(steps):
        loss, grads = model.loss_and_grads(*next_batch(sampler))
        norms.append(optimizer.step(model.flat, grads, max_grad_norm=cfg.clip))
        losses.append(loss)
    return losses, norms


def test_an_examples_ids_end_at_the_first_end_of_sequence_without_padding():
    """What a result's examples show: a prediction may go on after EOS; that is cut off."""
    assert _strip(np.array([5, 0, 6, 2, 7, 2, 0])) == [5, 6, 2]  # 0 PAD, 2 EOS
    assert _strip(np.array([5, 6, 0])) == [5, 6]  # no EOS: every id but padding


def test_a_sequence_run_takes_the_steps_a_hand_written_loop_takes():
    """A reverse run: the split and the weights from the run's seed, batches drawn from every
    training row, Adam with the run's clip, then evaluated on the held-out rows: bit for bit."""
    cfg = SequenceTrainConfig(task="reverse", steps=6, seed=3, batch_size=8, eval_every=6)
    run = train_sequence_task(cfg, progress_stream=None)
    task = sequence_task("reverse", seed=3)
    model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(), seed=3)

    def next_batch(sampler):
        return task.train.take(sampler.integers(0, len(task.train), size=cfg.batch_size))

    losses, _ = hand_written_steps(model, cfg, next_batch, np.random.default_rng([3, 1]), 6)
    assert np.array_equal(run.model.flat, model.flat)
    assert run.result["initial_train_loss"] == losses[0]
    assert (run.result["task"], run.result["seed"]) == ("reverse", 3)
    assert run.result["heldout_loss"] == model.loss(*task.test.take(slice(None)))
    examples = run.result["examples"]  # _strip: tested on its own, above
    assert [example["source"] for example in examples] == list(map(_strip, task.test.source[:3]))
    generated = greedy_decode(model, task.test.source[:3], max_new_tokens=4)
    assert [example["generated"] for example in examples] == list(map(_strip, generated))


def test_a_language_model_run_takes_the_steps_a_hand_written_loop_takes():
    """A MiniGPT from the run's seed over the text's characters, windows drawn by the run's
    sampler, AdamW with its clip; then a greedy sample of 60 characters from "to "."""
    cfg = CharTrainConfig(steps=4, seed=5, batch_size=6, context=12)
    run = train_char_lm(cfg, progress_stream=None)
    corpus = CharCorpus(DEFAULT_TEXT)
    model = ne.MiniGPT(ne.GPTConfig(corpus.vocab_size, max_len=12), seed=5)

    def next_batch(sampler):
        return corpus.batch(sampler, 6, 12)

    losses, _ = hand_written_steps(model, cfg, next_batch, np.random.default_rng([5, 1]), 4)
    assert np.array_equal(run.model.flat, model.flat) and run.history["train_loss"] == losses
    assert run.result["initial_train_loss"] == losses[0]
    assert (run.result["task"], run.result["seed"], run.result["prompt"]) == ("char-lm", 5, "to ")
    assert len(run.result["greedy_sample"]) == 3 + 60


def test_a_language_model_run_samples_from_its_prompt_and_refuses_what_does_not_fit():
    cfg = CharTrainConfig(steps=2, prompt="be")
    run = train_char_lm(cfg, progress_stream=None)
    assert run.result["prompt"] == "be" and run.result["greedy_sample"].startswith("be")
    with pytest.raises(ValueError, match=r"batch_size=10000000 with context=32 \(320,000,000"):
        train_char_lm(CharTrainConfig(batch_size=10**7), progress_stream=None)


def test_save_run_writes_the_runs_three_files_and_returns_their_directory(tmp_path):
    """Given as a str or a Path, the directory comes back as a Path holding the checkpoint,
    the history and the result, each as the run holds it."""
    run = train_char_lm(CharTrainConfig(steps=1, context=8), progress_stream=None)
    for given in (str(tmp_path / "as-str"), tmp_path / "as-path"):
        out = save_run(run, given)
        assert isinstance(out, Path) and out == Path(given)
        assert sorted(p.name for p in out.iterdir()) == [
            "checkpoint.npz",
            "history.json",
            "result.json",
        ]
        assert json.loads((out / "result.json").read_text()) == run.result
        assert json.loads((out / "history.json").read_text()) == run.history
        assert load_checkpoint(out).meta["step"] == 1


def test_fine_tuning_starts_from_the_checkpoints_weights_and_refuses_a_longer_context(tmp_path):
    start = train_char_lm(CharTrainConfig(steps=2, context=8), progress_stream=None)
    save_run(start, tmp_path / "start")
    cfg = CharTrainConfig(steps=3, context=8, init=str(tmp_path / "start"))
    tuned = train_char_lm(cfg, progress_stream=None)
    first_batch = CharCorpus(DEFAULT_TEXT).batch(np.random.default_rng([7, 1]), 32, 8)
    assert tuned.history["train_loss"][0] == start.model.loss(*first_batch)
    cfg = replace(cfg, context=16)
    words = r"context=16 is longer than the model's 8 positions \(its max_len\): give --context 8"
    with pytest.raises(ValueError, match=words):
        train_char_lm(cfg, progress_stream=None)
