"""A run on disk: save_run writes one (its checkpoint, history and result), and before
train.resume continues one, its checkpoint is checked and read back: that it holds a run
(RUN_STATE_KEYS) whose state can be read (run_state_problem; history_problem serves `plot`
too), its saved config with the settings added since (saved_config), the steps it may be
given, and its optimizer, sampler, step and history as saved."""

from __future__ import annotations

import json
from dataclasses import fields, replace
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
    the class's older_runs_had where that is not the setting's default, else its default.
    A run's state that cannot be read back (run_state_problem) is refused first."""
    problem = run_state_problem(meta)
    if problem:
        raise InputError(f"checkpoint in {out_dir}: its run's state is damaged: {problem}")
    if meta["task"] not in REFERENCE_RUNS:
        raise InputError(
            f"checkpoint in {out_dir} is of task {meta['task']!r}, which is not known here "
            f"(known: {', '.join(REFERENCE_RUNS)})"
        )
    reference = REFERENCE_RUNS[meta["task"]]
    problem = _settings_problem(meta["train_config"], reference)
    if problem:
        raise InputError(f"checkpoint in {out_dir}: its run's train_config {problem}")
    before = getattr(reference, "older_runs_had", {})
    return type(reference)(**{**before, **meta["train_config"]})  # else a new setting's default


def run_state_problem(meta: dict) -> str | None:
    """What in a checkpoint's saved run (those of RUN_STATE_KEYS its meta holds, as train
    wrote them) cannot be read back, or None."""
    kinds = {
        "task": (str, "a task's name"),
        "step": (int, "a count of steps"),
        "train_config": (dict, "a JSON object"),
    }
    for key, (kind, what) in kinds.items():
        if key in meta and not _is_a(meta[key], kind):
            return f'"{key}" is not {what}: {meta[key]!r}'
    if "sampler_state" in meta and not _is_generator_state(meta["sampler_state"]):
        return '"sampler_state" is not the state of numpy\'s default random generator'
    problem = history_problem(meta["history"]) if "history" in meta else None
    return problem and f'"history": {problem}'


def history_problem(history: object) -> str | None:
    """What keeps a run's history (history.json, or a checkpoint's meta["history"]: lists of
    one number a step from loop.empty_history, "lr" on a run with a schedule, evaluations)
    from being read, or None."""
    if not isinstance(history, dict):
        return f"not a JSON object with step and train_loss lists: {_json_kind(history)}"
    steps = history.get("step")
    for key in ("step", "train_loss", *(k for k in ("grad_norm", "lr") if k in history)):
        values = history.get(key)
        if not (isinstance(values, list) and all(_is_a(value, float) for value in values)):
            return f'"{key}" is not a list of numbers'
        if len(values) != len(steps):
            return f'"{key}" has {len(values)} values and "step" {len(steps)}'
    evals = history.get("eval", [])
    keys = ("step", "heldout_loss")
    if not isinstance(evals, list) or not all(_holds_numbers(e, keys) for e in evals):
        return '"eval" is not a list of objects with a step and a heldout_loss'
    if evals and "exact_match" in evals[0]:  # a sequence task's: in every evaluation
        if not all(_holds_numbers(e, ("exact_match",)) for e in evals):
            return '"eval" has an exact_match in its first entry and not in every one'
    return None


def _settings_problem(saved: dict, reference) -> str | None:
    """A saved train_config's setting that its task's config does not have, or whose value
    is not of the kind of the setting's default (any, where that is None), or None."""
    defaults = {field.name: getattr(reference, field.name) for field in fields(reference)}
    unknown = sorted(saved.keys() - defaults.keys())
    if unknown:
        return f"has settings not known here: {unknown}"
    for name, value in saved.items():
        default = defaults[name]
        if default is not None and not _is_a(value, type(default)):
            return f"has {name}={value!r}, not of its default's kind ({default!r})"
    return None


def _is_generator_state(state: object) -> bool:
    try:  # as resumed_state sets it
        np.random.default_rng().bit_generator.state = state
    except (TypeError, ValueError, KeyError):
        return False
    return True


def _json_kind(value: object) -> str:
    """What JSON value read as this Python one."""
    kinds = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return kinds.get(type(value), "a number" if _is_a(value, float) else "an object")


def _holds_numbers(entry: object, keys: tuple) -> bool:
    return isinstance(entry, dict) and all(_is_a(entry.get(key), float) for key in keys)


def _is_a(value: object, kind: type) -> bool:
    """isinstance, but a bool is no number, and an int is a float (as JSON reads them)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, int | float) if kind is float else isinstance(value, kind)
