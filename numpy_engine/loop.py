"""The training loop every task shares: state, one guarded step after another, progress
lines, checkpoints along the way. The tasks themselves (data, evaluation, the model they
start from) are in train.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import numpy as np

from numpy_engine.checkpoint import resolve, save_checkpoint
from numpy_engine.checks import InputError, check_number_in, check_positive_finite
from numpy_engine.configs import WEIGHT_DECAY_ON
from numpy_engine.dropout import training_rng
from numpy_engine.models import Model
from numpy_engine.optim import NonFiniteGradients, Optimizer
from numpy_engine.params import unflatten
from numpy_engine.schedule import check_schedule, is_scheduled, scheduled_lr
from numpy_engine.stopping import StopRequests, TrainingInterrupted


@dataclass
class TrainState:
    """Everything the loop reads and writes; a checkpoint saves all of it."""

    model: Model
    optimizer: Optimizer
    sampler: np.random.Generator
    step: int = 0
    history: dict = field(default_factory=dict)


def empty_history(evaluations: bool = True) -> dict[str, list]:
    """A new run's history: what run_loop records each step, and (a task with a held-out
    split) each evaluation."""
    history = {"step": [], "train_loss": [], "grad_norm": []}
    return history | {"eval": []} if evaluations else history


@dataclass
class TrainRun:
    model: Model
    optimizer: Optimizer
    result: dict  # the final JSON summary
    history: dict = field(default_factory=dict)  # loss per step, evaluations
    meta: dict = field(default_factory=dict)  # what a checkpoint needs to be used again


@dataclass(frozen=True)
class Checkpointing:
    out: Path
    every: int | None  # steps between checkpoints; None: only when a signal stops the run
    keep_best: bool = False  # a language model's run: also out/BEST, its best held-out weights

    def make_directory(self) -> None:
        """out, made before the first step: a place where no checkpoint can be written is
        refused then, not when the run ends (or at its first checkpoint) with its steps lost.
        A path that checkpoint.resolve reads as the checkpoint file itself (a name ending in
        .npz) is refused too: the run's files could not go into it."""
        if resolve(self.out) == self.out:
            raise InputError(
                f"{self.out}: a run's directory cannot end in .npz, which names a checkpoint "
                "file; give a directory (the run writes its checkpoint.npz into it)"
            )
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            message = f"{self.out}: cannot make the run's directory ({error.strerror})"
            raise InputError(message) from None


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: training stops before the update that would spread it."""


PROGRESS_SECONDS = 30.0  # a progress line at least this often, however slow the steps


class Progress:
    """A line every tenth of the run, at each evaluation, and whenever PROGRESS_SECONDS have
    gone by since the last (a tenth of 1,000 steps of a 124M GPT-2, ~3 s a step here, is five
    minutes): step, loss, speed, time left."""

    def __init__(self, total_steps: int, stream: TextIO | None, first_step: int = 0) -> None:
        self.total, self.stream, self.first = total_steps, stream, first_step
        self.every = max(total_steps // 10, 1)
        self.start = self.last_line = time.perf_counter()

    def update(self, step: int, loss: float, extra: str = "", lr: float | None = None) -> None:
        """A line for step (done) if one is due; extra: an evaluation; lr: the step's, shown."""
        if self.stream is None:
            return
        now = time.perf_counter()
        due = step % self.every == 0 or step in (self.first + 1, self.total) or extra
        if not due and now - self.last_line < PROGRESS_SECONDS:
            return
        self.last_line, elapsed = now, now - self.start
        rate = (step - self.first) / elapsed if elapsed > 0 else float("inf")
        left = (self.total - step) / rate
        shown_lr = "" if lr is None else f"  lr {lr:.2e}"
        line = f"step {step:>5}/{self.total}  loss {loss:.4f}{shown_lr}  {speed(rate)}"
        line += f"  {duration(left)} left"
        print(line + extra, file=self.stream, flush=True)


def speed(steps_per_second: float) -> str:
    """'  12.5 steps/s', or for steps slower than one a second '  3.07 s/step'."""
    if steps_per_second >= 1:
        return f"{steps_per_second:6.1f} steps/s"
    return f"{1 / steps_per_second:6.2f} s/step"


def duration(seconds: float) -> str:
    """' 42.0 s', '12 min 05 s' or '3 h 07 min'."""
    if seconds < 60:
        return f"{seconds:5.1f} s"
    minutes, whole_seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes:2d} min {whole_seconds:02d} s"
    hours, minutes = divmod(round(seconds / 60), 60)  # to the nearest minute
    return f"{hours} h {minutes:02d} min"


def check_run_config(cfg, name: Callable[[str], str] = str) -> None:
    """A training config's numbers, each named when it is wrong by name(key): the field
    itself, or the command line's flag for it (its flags are checked one by one as they are
    parsed; here what a run configured from Python may get wrong, and what two flags may
    get wrong together: --warmup against --steps, --min-lr against --lr)."""
    counts = (("steps", 1), ("batch_size", 1), ("eval_every", 1), ("context", 1), ("seed", 0))
    for key, least in counts:
        if not hasattr(cfg, key):  # context: a language model's run only
            continue
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            kind = "a positive" if least else "a non-negative"
            raise InputError(f"{name(key)} must be {kind} int, got {value!r}")
    for key in ("lr", "clip"):
        check_positive_finite(name(key), getattr(cfg, key))
    weight_decay = getattr(cfg, "weight_decay", 0.0)  # AdamW's runs only
    check_number_in(name("weight_decay"), weight_decay, 0)
    if cfg.lr * weight_decay >= 1:  # the schedule's lr is at most cfg.lr
        raise InputError(
            f"{name('weight_decay')} {weight_decay:g} with {name('lr')} {cfg.lr:g}: each step "
            f"multiplies the decayed weights by 1 - lr * weight_decay = "
            f"{1 - cfg.lr * weight_decay:.4g}, which zeroes or flips them; give lr * "
            "weight_decay below 1"
        )
    decayed = getattr(cfg, "weight_decay_on", "all")  # AdamW's runs only
    if decayed not in WEIGHT_DECAY_ON:
        raise InputError(
            f"{name('weight_decay_on')} must be one of {', '.join(WEIGHT_DECAY_ON)}, "
            f"got {decayed!r}"
        )
    dropout = getattr(cfg, "dropout", None)
    if dropout is not None and not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
        raise InputError(f"{name('dropout')} must be a number in [0, 1), got {dropout!r}")
    holdout = getattr(cfg, "holdout", 0.0)  # a language model's run only
    if not 0 <= holdout < 1:  # False for NaN too
        raise InputError(f"{name('holdout')} must be a fraction in [0, 1), got {holdout}")
    check_schedule(cfg, name)


def check_loss(step: int, loss: float) -> None:
    if not math.isfinite(loss):
        raise TrainingDiverged(f"step {step}: the loss is {loss}; stopped before updating")


def check_finite(step: int, grads: dict[str, np.ndarray]) -> None:
    """Stop on the first non-finite gradient, naming the step and the parameter."""
    for key, grad in grads.items():
        if not np.isfinite(grad).all():
            n_nan, n_inf = int(np.isnan(grad).sum()), int(np.isinf(grad).sum())
            raise TrainingDiverged(
                f"step {step}: the gradient of {key!r} is not finite "
                f"({n_nan} NaN, {n_inf} inf); stopped before updating"
            )


def guarded_loss_and_grads(model, step: int, batch: tuple, seed: int, part: int = 0):
    """One batch's loss and gradients; an overflow or a division by zero anywhere in them is
    TrainingDiverged, naming the step and the largest parameter (a value past float's range
    can hide in a finite loss: an infinite variance makes layernorm's output 0). A model
    with dropout draws this step's masks from training_rng(seed, step, part): part tells a
    step's micro-batches and ranks apart."""
    dropout = {"dropout_rng": training_rng(seed, step, part)} if model.uses_dropout() else {}
    try:
        # not invalid="raise": OpenBLAS's kernels can set the invalid flag spuriously (seen
        # here on small float32 matmuls); a real NaN reaches the loss or a gradient, where
        # check_finite reports it
        with np.errstate(over="raise", invalid="ignore", divide="raise"):
            loss, grads = model.loss_and_grads(*batch, **dropout)
    except FloatingPointError as error:
        params = model.params
        largest = max(params, key=lambda key: float(np.max(np.abs(params[key]))))
        size = float(np.max(np.abs(params[largest])))
        raise TrainingDiverged(
            f"step {step}: {error} in the forward or backward pass; the largest parameter is "
            f"{largest!r} (|max| {size:.3g}): the learning rate may be too large; "
            "stopped before updating"
        ) from None
    check_loss(step, loss)  # the gradients are checked by the update (guarded_update)
    return loss, grads


def step_gradient(state: TrainState, step: int, batch: tuple, parallel, seed: int = 0):
    """(loss, the gradient) of one optimizer step, the loss checked finite: directly (the
    grads dict, which the optimizer reads as it is), or (DataParallel) over ranks and
    micro-batches (one flat vector). seed: the run's, for dropout's masks."""
    model = state.model
    if parallel is None or parallel.plain:
        return guarded_loss_and_grads(model, step, batch, seed)
    loss, flat_grads = parallel.gradient(
        model, batch, lambda micro, part: guarded_loss_and_grads(model, step, micro, seed, part)
    )
    check_loss(step, loss)  # each micro-batch's was finite; their sum can overflow float32
    return loss, flat_grads


def guarded_update(state: TrainState, step: int, grads, clip: float) -> float:
    """The optimizer's step, clipping at clip; returns the norm before clipping. A NaN or
    inf gradient stops it before anything is updated, naming the parameter: the clipping
    norm finds it (error_if_nonfinite), so the guard costs no pass of its own (a separate
    np.isfinite per gradient took 5% of a copy-model step)."""
    try:
        return state.optimizer.step(
            state.model.flat, grads, max_grad_norm=clip, error_if_nonfinite=True
        )
    except NonFiniteGradients as error:
        named = grads if isinstance(grads, dict) else unflatten(grads, state.model.params)
        check_finite(step, named)  # raises, naming the parameter
        raise TrainingDiverged(f"step {step}: {error}; stopped before updating") from None
    except FloatingPointError as error:  # (under np.errstate(over="raise"), as the CLI runs)
        # finite gradients, but a step past the parameters' dtype: an lr of 1e39 overflows
        # float32 in the update itself, before any forward pass could see it
        raise TrainingDiverged(
            f"step {step}: {error} in the optimizer's update (lr {state.optimizer.lr:g}): the "
            "learning rate is too large for the parameters' dtype; stopped during the update"
        ) from None


def _train_step(state: TrainState, step: int, batch: tuple, cfg, parallel):
    """One optimizer step: (the loss, the gradient's norm before clipping). The gradients live
    only in here: held by the loop, a step's would still be alive while the next step makes
    its own (`train lm --init` of a 124M GPT-2: peak RSS 2765 -> 2275 MB)."""
    loss, grads = step_gradient(state, step, batch, parallel, cfg.seed)
    return loss, guarded_update(state, step, grads, cfg.clip)


def run_loop(
    state: TrainState,
    cfg,
    next_batch: Callable[[np.random.Generator], tuple],
    evaluate: Callable[[TrainState], str] | None,
    progress_stream: TextIO | None,
    checkpointing: Checkpointing | None,
    meta: Callable[[TrainState], dict],
    parallel=None,
) -> dict:
    """Steps state.step + 1 .. cfg.steps: batch, gradients, guard, clip, update, record.

    Saves a checkpoint every checkpointing.every steps; returns the run's timing. parallel
    (parallel.DataParallel): the gradient over ranks and micro-batches; only its root rank
    prints progress and writes checkpoints. Ctrl-C or SIGTERM (one process only) stops the
    run after the step in progress, saved if there is a checkpointing.out: the loop raises
    TrainingInterrupted (numpy_engine/stopping.py).
    """
    if parallel is not None:
        parallel.check_batch_size(cfg.batch_size)
    if parallel is not None and not parallel.is_root:
        progress_stream = checkpointing = None
    if checkpointing is not None:
        checkpointing.make_directory()
    if parallel is not None:
        parallel.group.broadcast(state.model.flat)  # rank 0's weights on every rank
    history, first_step, last_saved = state.history, state.step, None
    progress, start = Progress(cfg.steps, progress_stream, first_step), time.perf_counter()
    one_process = parallel is None or parallel.group.size == 1
    scheduled = is_scheduled(cfg)  # then each progress line shows the step's lr
    with StopRequests(enabled=one_process) as stop:
        while state.step < cfg.steps:
            step = state.step + 1
            lr = state.optimizer.lr = scheduled_lr(cfg, state.step)  # updates count from 0
            try:
                batch = next_batch(state.sampler)
                loss, grad_norm = _train_step(state, step, batch, cfg, parallel)
            except TrainingDiverged as error:
                if last_saved is None:
                    raise
                raise TrainingDiverged(
                    f"{error}; the checkpoint of step {last_saved} is intact"
                ) from None
            state.step = step
            history["step"].append(step)
            history["train_loss"].append(loss)
            history["grad_norm"].append(grad_norm)
            if scheduled:  # a run with a schedule keeps each step's lr (its picture draws it)
                history.setdefault("lr", []).append(lr)
            due = evaluate and (step % cfg.eval_every == 0 or step == cfg.steps)
            progress.update(step, loss, evaluate(state) if due else "", lr if scheduled else None)
            if checkpointing and checkpointing.every and step % checkpointing.every == 0:
                last_saved = _save(state, checkpointing, meta)
            if stop.signum is not None and step < cfg.steps:  # at the last step: finish
                _stop(state, cfg, checkpointing, meta, stop.signum, last_saved)
    seconds = time.perf_counter() - start
    return {
        "resumed_from_step": first_step,
        "seconds": round(seconds, 3),
        "steps_per_second": steps_per_second(cfg.steps - first_step, seconds),
    }


def steps_per_second(steps: int, seconds: float) -> float:
    """steps / seconds to four significant digits: 469.4, or a GPT-2 run's 0.4137 (to a tenth,
    as before, a run of 10 s or more a step read 0.0)."""
    return float(f"{steps / max(seconds, 1e-9):.4g}")


def _save(state: TrainState, checkpointing: Checkpointing, meta) -> int:
    """Write the run's checkpoint; returns the step it holds."""
    optimizer_state = state.optimizer.state_arrays()  # views: written at once
    save_checkpoint(checkpointing.out, state.model, optimizer_state, meta(state))
    return state.step


def _stop(state, cfg, checkpointing, meta, signum: int, last_saved) -> None:
    """The run asked to stop by a signal, between steps: save it (unless this step was just
    saved) and raise TrainingInterrupted."""
    saved_in = None
    if checkpointing is not None:
        if last_saved != state.step:
            _save(state, checkpointing, meta)
        saved_in = checkpointing.out
    raise TrainingInterrupted(signum, state.step, cfg.steps, saved_in)


FINAL_LOSS_STEPS = 10


def final_train_loss(history: dict) -> float:
    """The mean training loss of the last FINAL_LOSS_STEPS steps (one batch's loss is noisy)."""
    return float(np.mean(history["train_loss"][-FINAL_LOSS_STEPS:]))


def run_meta(task: str, cfg, state: TrainState, **extra) -> dict:
    return {
        "task": task,
        "train_config": asdict(cfg),
        "step": state.step,
        "sampler_state": state.sampler.bit_generator.state,
        "history": state.history,
        **extra,
    }
