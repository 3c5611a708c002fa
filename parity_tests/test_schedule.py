"""Learning-rate schedules against transformers' own (the lr each update takes), through
training and resuming, and against torch.optim.AdamW stepping under transformers' scheduler."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from crosscheck.compare import compare
from numpy_engine.checks import InputError
from numpy_engine.cli import main as engine_main
from numpy_engine.configs import CharTrainConfig, SequenceTrainConfig
from numpy_engine.loop import check_run_config
from numpy_engine.optim import AdamW, Optimizer
from numpy_engine.params import flatten, unflatten
from numpy_engine.schedule import SCHEDULES, lr_factor, scheduled_lr
from numpy_engine.train import Checkpointing, resume, run_task
from parity_tests.strategies import seeds


def transformers_lrs(schedule: str, lr: float, warmup: int, steps: int, min_lr: float) -> list:
    """The lr of each of `steps` updates of a torch optimizer under transformers' schedule."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    if schedule == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
    elif schedule == "linear":
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, steps)
    else:
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, warmup, steps, min_lr=min_lr
        )
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@st.composite
def schedules(draw, with_min_lr: bool = True) -> CharTrainConfig:
    """A run's schedule: steps, warmup below them, lr, and for cosine a min_lr up to lr."""
    steps = draw(st.integers(1, 60))
    lr = draw(st.floats(1e-5, 1e-1))
    schedule = draw(st.sampled_from(SCHEDULES))
    share = draw(st.floats(0.0, 1.0)) if with_min_lr and schedule == "cosine" else 0.0
    warmup = draw(st.integers(0, steps - 1))
    return CharTrainConfig(steps=steps, lr=lr, schedule=schedule, warmup=warmup, min_lr=lr * share)


@given(cfg=schedules())
def test_each_update_takes_transformers_lr_to_the_last_bit(cfg):
    check_run_config(cfg)
    ours = [scheduled_lr(cfg, k) for k in range(cfg.steps)]
    theirs = transformers_lrs(cfg.schedule, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr)
    assert ours == theirs
    if cfg.min_lr == 0:  # lr_factor's own default: no floor
        factors = [lr_factor(k, cfg.schedule, cfg.warmup, cfg.steps) for k in range(cfg.steps)]
        assert [cfg.lr * factor for factor in factors] == theirs


@given(steps=st.integers(2, 60), share=st.floats(0.01, 0.99), data=st.data())
def test_linear_decay_to_a_floor_is_transformers_line_raised_onto_it(steps, share, data):
    """transformers' linear schedule has no floor: ours with min_lr is its line, scaled to
    fall from lr to min_lr instead of to 0 (cosine's floor, which it has, is as above)."""
    warmup = data.draw(st.integers(0, steps - 1))
    lr = 3e-3
    cfg = CharTrainConfig(steps=steps, lr=lr, schedule="linear", warmup=warmup, min_lr=lr * share)
    check_run_config(cfg)
    line = transformers_lrs("linear", lr, warmup, steps, 0.0)
    for k in range(steps):
        ours = scheduled_lr(cfg, k)
        if k < warmup:
            assert ours == line[k]
        else:
            expected = cfg.min_lr + (lr - cfg.min_lr) * line[k] / lr
            assert abs(ours - expected) <= 1e-15, (k, ours, expected)
    assert scheduled_lr(cfg, warmup) == pytest.approx(lr, rel=1e-15)
    if warmup < steps - 1:  # it decays
        assert cfg.min_lr < scheduled_lr(cfg, steps - 1) < scheduled_lr(cfg, warmup)


def recorded_lrs(monkeypatch) -> list:
    """The lr of every optimizer step from here on, read as the step begins."""
    seen, step = [], Optimizer.step

    def recording(self, *args, **kwargs):
        seen.append(self.lr)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Optimizer, "step", recording)
    return seen


@pytest.mark.parametrize(
    ("cfg", "schedule"),
    [
        (SequenceTrainConfig(steps=9, eval_every=9), ("linear", 3, 0.0)),  # Adam
        (CharTrainConfig(steps=9, eval_every=9), ("cosine", 2, 1e-4)),  # AdamW
        (CharTrainConfig(steps=9, eval_every=9), ("constant", 4, 0.0)),
    ],
)
def test_a_training_run_steps_with_the_scheduled_lr(monkeypatch, cfg, schedule):
    name, warmup, min_lr = schedule
    cfg = type(cfg)(**vars(cfg) | dict(schedule=name, warmup=warmup, min_lr=min_lr))
    seen = recorded_lrs(monkeypatch)
    run = run_task(cfg, None, None)
    assert seen == transformers_lrs(name, cfg.lr, warmup, cfg.steps, min_lr) == run.history["lr"]


def test_an_unscheduled_run_keeps_its_lr_and_shows_none(monkeypatch, capsys):
    seen = recorded_lrs(monkeypatch)
    run = run_task(SequenceTrainConfig(steps=5, eval_every=5), None, None)
    assert seen == [1e-3] * 5 and "lr" not in run.history  # the config says it
    assert engine_main(["train", "copy", "--steps", "3"]) == 0
    assert " lr " not in capsys.readouterr().err


def test_progress_lines_show_the_scheduled_lr(capsys):
    args = ["train", "char-lm", "--steps", "10", "--schedule", "cosine", "--warmup", "4"]
    assert engine_main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("step     1/10  loss ") and "  lr 0.00e+00  " in lines[0]
    assert lines[4].startswith("step     5/10  loss ") and "  lr 3.00e-03  " in lines[4]


@pytest.mark.parametrize("warmup", [1, 3])
def test_each_progress_line_shows_its_steps_loss_and_lr(warmup):
    """A warmup alone is a schedule too: its lines show the lr."""
    cfg = SequenceTrainConfig(steps=10, eval_every=10, warmup=warmup)
    stream = io.StringIO()
    run = run_task(cfg, None, stream)
    lrs = transformers_lrs("constant", cfg.lr, warmup, cfg.steps, 0.0)
    for line in stream.getvalue().splitlines():
        step = int(line.split()[1].split("/")[0])
        loss, lr = run.history["train_loss"][step - 1], lrs[step - 1]
        assert line.startswith(f"step {step:>5}/10  loss {loss:.4f}  lr {lr:.2e}  "), line


def test_a_resumed_run_goes_on_along_its_schedule_bit_for_bit(tmp_path):
    cfg = SequenceTrainConfig(steps=12, eval_every=6, schedule="cosine", warmup=3, min_lr=1e-4)
    with threadpool_limits(1):  # the same bits in both runs
        whole = run_task(cfg, None, None)
        run_task(cfg, None, None, Checkpointing(tmp_path, 5))  # its last save: step 10
        resumed = resume(tmp_path, None)
    assert resumed.result["resumed_from_step"] == 10
    for key, value in whole.model.params.items():
        assert np.array_equal(value, resumed.model.params[key]), key
    assert whole.history == resumed.history


def test_only_a_constant_schedules_run_takes_more_steps(tmp_path):
    decaying, constant = tmp_path / "decaying", tmp_path / "constant"
    cfg = SequenceTrainConfig(steps=6, eval_every=6, schedule="linear")
    run_task(cfg, None, None, Checkpointing(decaying, 4))  # saved at step 4
    lowers = r"^--steps 9: the run in .* lowers its lr over its 6 steps \(--schedule linear\)"
    with pytest.raises(InputError, match=lowers):
        resume(decaying, None, steps=9)
    assert resume(decaying, None, steps=6).history["step"][-1] == 6  # its own steps: taken
    with pytest.raises(InputError, match=r"Resume it without --steps \(a run with --schedule "):
        resume(decaying, None, steps=9)  # saved at step 4: it can go on
    warm = SequenceTrainConfig(steps=6, eval_every=6, warmup=4)
    with threadpool_limits(1):
        run_task(warm, None, None, Checkpointing(constant, 3))
        longer = resume(constant, None, steps=9)
        whole = run_task(SequenceTrainConfig(steps=9, eval_every=6, warmup=4), None, None)
    for key, value in whole.model.params.items():
        assert np.array_equal(value, longer.model.params[key]), key


def test_a_resumed_run_refuses_steps_its_warmup_would_outlast(tmp_path, capsys):
    """A constant schedule's run takes more steps, or fewer than it was set to, but not so few
    that its warmup would pass the end: refused by the flags, in one line."""
    run = tmp_path / "run"
    cfg = SequenceTrainConfig(steps=10, eval_every=10, warmup=8)
    run_task(cfg, None, None, Checkpointing(run, 6))  # saved at step 6
    words = f"--steps 8: the run in {run} raises its lr over its first 8 steps (--warmup 8); "
    with pytest.raises(InputError) as refused:
        resume(run, None, steps=8)
    assert str(refused.value) == words + "give --steps N with N > 8"
    assert engine_main(["train", "--resume", str(run), "--steps", "8", "--quiet"]) == 2
    assert capsys.readouterr().err == f"numpy-engine train: error: {refused.value}\n"
    assert resume(run, None, steps=9).history["step"][-1] == 9  # past the warmup: taken


@given(seed=seeds, cfg=schedules())
def test_adamw_under_the_schedule_steps_as_torch_under_transformers(seed, cfg):
    """Ten AdamW steps (weight decay 0.1: its decay is lr times it, at the step's lr) in
    float64 against torch.optim.AdamW under transformers' scheduler."""
    cfg = CharTrainConfig(**vars(cfg) | dict(steps=10, warmup=min(cfg.warmup, 9)))
    rng = np.random.default_rng(seed)
    shapes = {"w": (3, 4), "b": (4,)}
    flat = flatten({key: rng.standard_normal(shape) for key, shape in shapes.items()})
    params = unflatten(flat, {key: np.empty(shape) for key, shape in shapes.items()})
    tensors = [torch.tensor(value, requires_grad=True) for value in params.values()]
    ours = AdamW(params, lr=cfg.lr, weight_decay=0.1)
    theirs = torch.optim.AdamW(tensors, lr=cfg.lr, weight_decay=0.1)
    lrs = transformers_lrs(cfg.schedule, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr)
    for k in range(cfg.steps):
        grads = [rng.standard_normal(shape) for shape in shapes.values()]
        for tensor, grad in zip(tensors, grads, strict=True):
            tensor.grad = torch.tensor(grad)
        theirs.param_groups[0]["lr"] = lrs[k]
        ours.lr = scheduled_lr(cfg, k)
        ours.step(flat, flatten(dict(zip(shapes, grads, strict=True))))
        theirs.step()
    for (key, value), tensor in zip(params.items(), tensors, strict=True):
        c = compare(key, value, tensor.detach().numpy())
        assert c.diff_norm <= 1e-12 * c.ref_norm, c.describe()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(schedule="cos"), "schedule must be one of constant, linear, cosine, got 'cos'"),
        (dict(warmup=20), r"warmup must be an int in \[0, steps=20\)"),
        (dict(warmup=-1), r"warmup must be an int in \[0, steps=20\)"),
        (dict(warmup=True), r"warmup must be an int .* got True"),
        (dict(schedule="linear", min_lr=0.01), r"min_lr must be in \[0, lr=0.001\], got 0.01"),
        (dict(schedule="linear", min_lr=float("nan")), r"min_lr must be in \[0, lr=0.001\]"),
        (dict(min_lr=1e-4), "min_lr=0.0001 is where a decaying schedule ends"),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_by_name(change, words):
    with pytest.raises(InputError, match=words):
        check_run_config(SequenceTrainConfig(steps=20, **change))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--schedule", "cos"], "argument --schedule: must be one of constant, linear, cosine"),
        (["--warmup", "-2"], "argument --warmup: must be a non-negative integer, got -2"),
        (["--steps", "5", "--warmup", "5"], "--warmup must be an int in [0, --steps=5)"),
        (
            ["--lr", "0.01", "--schedule", "linear", "--min-lr", "0.1"],
            "--min-lr must be in [0, --lr=0.01]",
        ),
        (
            ["--min-lr", "0.0001"],
            "--min-lr=0.0001 is where a decaying schedule ends: give --schedule linear",
        ),
    ],
)
def test_the_command_line_refuses_a_bad_schedule_in_one_line(capsys, flags, words):
    """One line that names the flags, also where two flags are wrong together."""
    try:
        status = engine_main(["train", "copy", *flags])
    except SystemExit as stopped:  # argparse's refusal of one flag
        status = stopped.code
    assert status == 2
    err = capsys.readouterr().err
    assert words in err and err.startswith(("usage:", "numpy-engine train: error: ")), err


@pytest.mark.parametrize(
    ("cfg", "hint"),
    [
        (SequenceTrainConfig(steps=4, eval_every=4, schedule="cosine"), r"It has taken all 4$"),
        (
            CharTrainConfig(steps=4, eval_every=4, schedule="cosine"),
            r"It has taken all 4; to train its weights on, start a new run: train lm --init .*run$",
        ),
    ],
)
def test_a_finished_decaying_run_asked_for_more_steps_says_what_can_be_done(tmp_path, cfg, hint):
    run_task(cfg, None, None, Checkpointing(tmp_path / "run", 4))  # saved at its last step
    with pytest.raises(InputError, match=r"^--steps 6: .*from the start. " + hint):
        resume(tmp_path / "run", None, steps=6)


@pytest.mark.parametrize(
    ("schedule", "what_may_change"),
    [
        ("constant", "only --steps may change"),
        ("linear", "its lr decays over its steps, so not even --steps may change"),
    ],
)
def test_a_resumed_runs_conflicting_flag_says_whether_steps_may_change(
    tmp_path, capsys, schedule, what_may_change
):
    from numpy_engine.cli import main

    cfg = SequenceTrainConfig(steps=6, eval_every=6, schedule=schedule)
    run_task(cfg, None, None, Checkpointing(tmp_path / "run", 4))  # saved at step 4
    assert main(["train", "--resume", str(tmp_path / "run"), "--lr", "0.01", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--lr 0.01 conflicts with the checkpoint's lr=0.001" in err
    assert err.endswith(f"the settings it was started with ({what_may_change})\n"), err


K_REFUSED = "k, the update's number from 0, must be a non-negative int, got"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((1, "cosin", 0, 10), "schedule must be one of constant, linear, cosine, got 'cosin'"),
        ((-1, "linear", 0, 10), f"{K_REFUSED} -1"),
        ((1.0, "linear", 0, 10), f"{K_REFUSED} 1.0"),
        ((1, "cosine", 10, 10), "warmup must be an int in [0, steps=10), got 10"),
        ((1, "cosine", -1, 10), "warmup must be an int in [0, steps=10), got -1"),
        ((1, "cosine", 1.5, 10), "warmup must be an int in [0, steps=10), got 1.5"),
        ((1, "cosine", True, 10), "warmup must be an int in [0, steps=10), got True"),
        ((True, "linear", 0, 10), f"{K_REFUSED} True"),
        ((1, "linear", 0, 10, True), "min_ratio must be a number in [0, 1], got True"),
        ((1, "linear", 0, 10, "0.5"), "min_ratio must be a number in [0, 1], got '0.5'"),
        ((1, "constant", 0, 0), "steps must be positive, got 0"),
        ((1, "linear", 0, 10, 1.5), "min_ratio must be a number in [0, 1], got 1.5"),
        ((1, "linear", 0, 10, float("nan")), "min_ratio must be a number in [0, 1], got nan"),
    ],
)
def test_lr_factor_refuses_what_a_run_would_and_names_it(args, words):
    """The README's own loop calls lr_factor: an unknown schedule read as cosine before."""
    with pytest.raises(InputError, match=re.escape(words)):
        lr_factor(*args)


def test_lr_factor_takes_numpy_ints_and_a_k_past_the_end():
    assert lr_factor(np.int64(5), "constant", np.int64(2), np.int64(10)) == 1.0
    assert lr_factor(20, "linear", 0, 10) == 0.0  # never below 0
