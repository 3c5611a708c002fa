"""A checkpoint's saved run (its meta's task, step, train_config, sampler_state and history)
that cannot be read back: `train --resume` and `train.resume` refuse it naming the entry,
`info` says so on its run line, and the checkpoint is left as it was. Each was a traceback
(AttributeError, KeyError, TypeError or numpy's ValueError) in resume, and most in info."""

from __future__ import annotations

import json

import pytest

from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.cli import main
from numpy_engine.train import resume
from parity_tests.helpers import info_lines


def _with_history(meta: dict, **changes) -> dict:
    return meta | {"history": meta["history"] | changes}


def _with_setting(meta: dict, **changes) -> dict:
    return meta | {"train_config": meta["train_config"] | changes}


DAMAGES = {  # what is wrong: (a change to a 20-step copy run's meta, what is said of it)
    "a number for the task": (lambda m: m | {"task": 5}, 'state is damaged: "task" is not a'),
    "a text step": (
        lambda m: m | {"step": "20"},
        "state is damaged: \"step\" is not a count of steps: '20'",
    ),
    "a listed train_config": (
        lambda m: m | {"train_config": [1]},
        'state is damaged: "train_config" is not a JSON object: [1]',
    ),
    "a setting not known": (
        lambda m: _with_setting(m, zzz=1),
        "train_config has settings not known here: ['zzz']",
    ),
    "steps as text": (
        lambda m: _with_setting(m, steps="30"),
        "train_config has steps='30', not of its default's kind (800)",
    ),
    "another generator's state": (
        lambda m: m | {"sampler_state": {"bit_generator": "MT19937", "state": {}}},
        'state is damaged: "sampler_state" is not the state of numpy\'s default random',
    ),
    "a number for the history": (
        lambda m: m | {"history": 5},
        'state is damaged: "history": not a JSON object with step and train_loss lists: a number',
    ),
    "a loss short": (
        lambda m: _with_history(m, train_loss=m["history"]["train_loss"][:-1]),
        'state is damaged: "history": "train_loss" has 19 values and "step" 20',
    ),
    "a text gradient norm": (
        lambda m: _with_history(m, grad_norm=["x"] * 20),
        'state is damaged: "history": "grad_norm" is not a list of numbers',
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_run_is_refused_by_resume_and_named_by_info(
    trained_copy, tmp_path, capsys, damage
):
    change, said = DAMAGES[damage]
    checkpoint = load_checkpoint(trained_copy)
    run = tmp_path / "run"
    meta = change(json.loads(json.dumps(checkpoint.meta)))  # a deep copy, changed
    saved = save_checkpoint(run, checkpoint.model, checkpoint.optimizer_state, meta)
    before = saved.read_bytes()
    refusal = f"checkpoint in {run}: its run's {said}"
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--steps", "30", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"error: {refusal}" in err and "Traceback" not in err, err
    with pytest.raises(InputError) as refused:
        resume(run, progress_stream=None, steps=30)
    assert str(refused.value).startswith(refusal), refused.value
    run_line = info_lines(capsys, run)["run"]
    assert run_line.startswith(f"not readable here: {refusal}"), run_line
    assert saved.read_bytes() == before and sorted(p.name for p in run.iterdir()) == [saved.name]


def test_a_run_without_its_step_is_named_as_no_run(trained_copy, tmp_path, capsys):
    """A meta with the run's task and settings and no step: --resume says what it lacks, and
    info shows no run, as for an import (the checks read only the keys that are there)."""
    checkpoint = load_checkpoint(trained_copy)
    run = tmp_path / "run"
    meta = {key: value for key, value in checkpoint.meta.items() if key != "step"}
    save_checkpoint(run, checkpoint.model, checkpoint.optimizer_state, meta)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--steps", "30", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(
        f"numpy-engine train: error: checkpoint in {run} cannot be resumed: it holds no "
        "training run's state (its meta lacks ['step'])"
    )
    assert info_lines(capsys, run)["run"] == "none recorded (task copy)"
