"""A run on disk: save_run writes one (its checkpoint, history and result), and before
train.resume continues one, its checkpoint is checked and read back: that it holds a run
(RUN_STATE_KEYS), its saved config with the settings added since (saved_config), the steps
it may be given, and its optimizer, sampler, step and history as saved."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from numpy_engine.checkpoint import Checkpoint, resolve, save_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.configs import REFERENCE_RUNS
from numpy_engine.evaluation import BEST, best_evaluation
from numpy_engine.loop import TrainRun, TrainState


def save_run(run: TrainRun, out_dir: str | Path) -> Path:
    """result.json, history.json and checkpoint.npz (weights, optimizer state, meta) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(out, run.model, run.optimizer.state_arrays(), run.meta)
    (out / "history.json").write_text(json.dumps(run.history) + "\n")
    (out / "result.json").write_text(json.dumps(run.result, indent=2) + "\n")
    return out


RUN_STATE_KEYS = frozenset({"task", "train_config", "step", "sampler_state", "history"})  # meta's


def resumable_config(out_dir, checkpoint: Checkpoint, steps: int | None):
    """The run's saved config, to `steps` if given; refused, each with a line saying why:
    a checkpoint of no run, a run done, a new --steps that a decaying lr or the warmup
    does not allow."""
    meta = checkpoint.meta
    missing = RUN_STATE_KEYS - meta.keys()
    if missing:
        hint = ""
        if checkpoint.model.continues_prompt:  # an imported GPT-2, say: weights, no run
            hint = f"; to train it, start a run from it: train lm --init {out_dir}"
        raise InputError(
            f"checkpoint in {out_dir} cannot be resumed: it holds no training run's state "
            f"(its meta lacks {sorted(missing)}){hint}"
        )
    cfg = saved_config(out_dir, meta)
    if steps and steps != cfg.steps and cfg.schedule != "constant":
        _refuse_other_steps(out_dir, cfg, steps, meta["step"], checkpoint.model)
    cfg = replace(cfg, steps=steps or cfg.steps)
    if meta["step"] >= cfg.steps:
        raise InputError(
            f"the run in {out_dir} has done {meta['step']} steps of {cfg.steps}: nothing to "
            f"resume; give --steps N with N > {meta['step']} to train it further"
        )
    if cfg.warmup >= cfg.steps:  # only a new --steps can put the warmup past the run's end
        raise InputError(
            f"--steps {steps}: the run in {out_dir} raises its lr over its first {cfg.warmup} "
            f"steps (--warmup {cfg.warmup}); give --steps N with N > {cfg.warmup}"
        )
    return cfg


def resumed_state(cfg, checkpoint: Checkpoint) -> TrainState:
    """The run's state as saved: its model, optimizer (the checkpoint's optimizer_state is
    consumed as it is read), batch sampler, step and history."""
    meta = checkpoint.meta
    sampler = np.random.default_rng()
    sampler.bit_generator.state = meta["sampler_state"]
    optimizer = cfg.optimizer(checkpoint.model.params)
    optimizer.load_state_dict(checkpoint.optimizer_state, consume=True)
    return TrainState(checkpoint.model, optimizer, sampler, meta["step"], meta["history"])


def refuse_a_best_already_lost(out: Path, history: dict) -> None:
    """--keep-best on resuming a run that evaluated without it: its lowest held-out loss so
    far, which later evaluations must beat to be kept, has no weights in out/BEST."""
    best = best_evaluation(history.get("eval", []))
    if best is not None and not resolve(out / BEST).exists():
        raise InputError(
            f"--keep-best: the run in {out} was not kept at its best so far (held-out loss "
            f"{best['heldout_loss']:.4f} at step {best['step']}, without --keep-best): resume "
            "it without --keep-best, or start the run again with it"
        )


def _refuse_other_steps(out_dir, cfg, steps: int, done: int, model) -> None:
    """--steps for a run whose lr decays over its own steps: refused, saying what can be done
    instead (resume it as it is; a finished language model's weights can start a new run)."""
    instead = "Resume it without --steps (a run with --schedule constant can be given more)"
    if done >= cfg.steps:
        instead = f"It has taken all {cfg.steps}"
        if model.continues_prompt:
            instead += f"; to train its weights on, start a new run: train lm --init {out_dir}"
    raise InputError(
        f"--steps {steps}: the run in {out_dir} lowers its lr over its {cfg.steps} steps "
        f"(--schedule {cfg.schedule}); over {steps} steps its lr would have been another from "
        f"the start. {instead}"
    )


def saved_config(out_dir, meta: dict):
    """The run's config: the class of its task's reference run, with the saved settings. A
    setting added since the run was saved takes what the run was trained with: the value in
    the class's older_runs_had where that is not the setting's default, else its default."""
    if meta["task"] not in REFERENCE_RUNS:
        raise InputError(
            f"checkpoint in {out_dir} is of task {meta['task']!r}, which is not known here "
            f"(known: {', '.join(REFERENCE_RUNS)})"
        )
    config_class = type(REFERENCE_RUNS[meta["task"]])
    before = getattr(config_class, "older_runs_had", {})
    return config_class(**{**before, **meta["train_config"]})  # else a new setting's default
