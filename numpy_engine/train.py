"""Training loops, evaluation, checkpoints along the way, and exact resume.

One seed drives a run: the data split and the model's initial weights come from it,
and the batch sampler draws from its own stream, default_rng([seed, 1]). A checkpoint
holds everything the loop reads (weights, optimizer moments, the sampler's state, the
step, the history), so a run resumed from step k continues bit for bit as if it had
never stopped.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, TextIO

import numpy as np

from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.configs import REFERENCE_RUNS, CharTrainConfig, SequenceTrainConfig
from numpy_engine.generate import generate, greedy_decode
from numpy_engine.memory import check_fits
from numpy_engine.models import Model, Seq2SeqConfig, Seq2SeqTransformer, model_class
from numpy_engine.optim import Optimizer
from numpy_engine.tasks import DEFAULT_TEXT, EOS, PAD, CharCorpus, Split, sequence_task


@dataclass
class TrainState:
    """Everything the loop reads and writes; a checkpoint saves all of it."""

    model: Model
    optimizer: Optimizer
    sampler: np.random.Generator
    step: int = 0
    history: dict = field(default_factory=dict)


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
    every: int  # steps between checkpoints


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: training stops before the update that would spread it."""


class Progress:
    """One line every tenth of the run and at each evaluation: step, loss, speed, time left."""

    def __init__(self, total_steps: int, stream: TextIO | None, first_step: int = 0) -> None:
        self.total, self.stream, self.first = total_steps, stream, first_step
        self.every = max(total_steps // 10, 1)
        self.start = time.perf_counter()

    def update(self, step: int, loss: float, extra: str = "") -> None:
        due = step % self.every == 0 or step in (self.first + 1, self.total) or extra
        if self.stream is None or not due:
            return
        elapsed = time.perf_counter() - self.start
        rate = (step - self.first) / elapsed if elapsed > 0 else float("inf")
        left = (self.total - step) / rate
        line = (
            f"step {step:>5}/{self.total}  loss {loss:.4f}  {rate:6.1f} steps/s  {left:5.1f} s left"
        )
        print(line + extra, file=self.stream, flush=True)


def _check_run_config(cfg) -> None:
    for name in ("steps", "batch_size", "eval_every"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a positive int, got {value!r}")
    if not cfg.lr > 0 or not cfg.clip > 0:
        raise InputError(f"lr and clip must be positive, got lr={cfg.lr}, clip={cfg.clip}")


def check_finite(step: int, loss: float, grads: dict[str, np.ndarray]) -> None:
    """Stop on the first non-finite value, naming the step and the parameter."""
    if not math.isfinite(loss):
        raise TrainingDiverged(f"step {step}: the loss is {loss}; stopped before updating")
    for key, grad in grads.items():
        if not np.isfinite(grad).all():
            n_nan, n_inf = int(np.isnan(grad).sum()), int(np.isinf(grad).sum())
            raise TrainingDiverged(
                f"step {step}: the gradient of {key!r} is not finite "
                f"({n_nan} NaN, {n_inf} inf); stopped before updating"
            )


def _loss_and_grads(state: TrainState, step: int, next_batch: Callable) -> tuple:
    """One batch's loss and gradients; an overflow or a division by zero anywhere in them is
    TrainingDiverged, naming the step and the largest parameter (a value past float's range
    can hide in a finite loss: an infinite variance makes layernorm's output 0)."""
    try:
        # not invalid="raise": OpenBLAS's kernels can set the invalid flag spuriously (seen
        # here on small float32 matmuls); a real NaN reaches the loss or a gradient, where
        # check_finite reports it
        with np.errstate(over="raise", invalid="ignore", divide="raise"):
            return state.model.loss_and_grads(*next_batch(state.sampler))
    except FloatingPointError as error:
        params = state.model.params
        largest = max(params, key=lambda key: float(np.max(np.abs(params[key]))))
        size = float(np.max(np.abs(params[largest])))
        raise TrainingDiverged(
            f"step {step}: {error} in the forward or backward pass; the largest parameter is "
            f"{largest!r} (|max| {size:.3g}): the learning rate may be too large; "
            "stopped before updating"
        ) from None


def _loop(
    state: TrainState,
    cfg,
    next_batch: Callable[[np.random.Generator], tuple],
    evaluate: Callable[[TrainState], str] | None,
    progress_stream: TextIO | None,
    checkpointing: Checkpointing | None,
    meta: Callable[[TrainState], dict],
) -> dict:
    """Steps state.step + 1 .. cfg.steps: batch, gradients, guard, clip, update, record.

    Saves a checkpoint every checkpointing.every steps; returns the run's timing.
    """
    history, first_step, last_saved = state.history, state.step, None
    progress, start = Progress(cfg.steps, progress_stream, first_step), time.perf_counter()
    while state.step < cfg.steps:
        step = state.step + 1
        try:
            loss, grads = _loss_and_grads(state, step, next_batch)
            check_finite(step, loss, grads)
        except TrainingDiverged as error:
            if last_saved is None:
                raise
            raise TrainingDiverged(
                f"{error}; the checkpoint of step {last_saved} is intact"
            ) from None
        flat_grads = state.model.flat_grads(grads)
        grad_norm = state.optimizer.step(state.model.flat, flat_grads, max_grad_norm=cfg.clip)
        state.step = step
        history["step"].append(step)
        history["train_loss"].append(loss)
        history["grad_norm"].append(grad_norm)
        due = step % cfg.eval_every == 0 or step == cfg.steps
        progress.update(step, loss, evaluate(state) if evaluate and due else "")
        if checkpointing and step % checkpointing.every == 0:
            optimizer_state = state.optimizer.state_dict()
            save_checkpoint(checkpointing.out, state.model, optimizer_state, meta(state))
            last_saved = step
    seconds = time.perf_counter() - start
    speed = (cfg.steps - first_step) / max(seconds, 1e-9)
    return {
        "resumed_from_step": first_step,
        "seconds": round(seconds, 3),
        "steps_per_second": round(speed, 1),
    }


def check_step_fits(what: str, kind: type[Model], config, batch_size: int, length: int) -> None:
    """Refuse, up front, a step whose activations cannot fit in memory (the kind's generous
    estimate, Model.step_values)."""
    values = kind.step_values(config, batch_size, length)
    tokens = f"{batch_size * length:,} tokens a step"
    check_fits(f"{what} ({tokens})", values * np.dtype(config.dtype).itemsize)


FINAL_LOSS_STEPS = 10


def final_train_loss(history: dict) -> float:
    """The mean training loss of the last FINAL_LOSS_STEPS steps (one batch's loss is noisy)."""
    return float(np.mean(history["train_loss"][-FINAL_LOSS_STEPS:]))


def _meta(task: str, cfg, state: TrainState, **extra) -> dict:
    return {
        "task": task,
        "train_config": asdict(cfg),
        "step": state.step,
        "sampler_state": state.sampler.bit_generator.state,
        "history": state.history,
        **extra,
    }


# --------------------------------------------------------------- copy / reverse


def evaluate_sequence_task(model: Seq2SeqTransformer, split: Split) -> dict:
    """Teacher-forced loss, and greedy exact match over all 4 target positions (EOS, PAD too)."""
    generated = greedy_decode(model, split.source, max_new_tokens=split.target.shape[1])
    exact = (generated == split.target).all(axis=1)
    loss = model.loss(split.source, split.decoder_input, split.target)
    return {"heldout_loss": loss, "exact_match": float(exact.mean())}


def _strip(ids: np.ndarray) -> list[int]:
    """Ids up to and including EOS, without padding."""
    ids = [int(i) for i in ids if i != PAD]
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def train_sequence_task(
    cfg: SequenceTrainConfig = REFERENCE_RUNS["copy"],
    model_config: Seq2SeqConfig | None = None,
    progress_stream: TextIO | None = sys.stderr,
    checkpointing: Checkpointing | None = None,
    state: TrainState | None = None,
) -> TrainRun:
    """Train (or, given a state from a checkpoint, continue training) the copy/reverse model."""
    _check_run_config(cfg)
    task = sequence_task(cfg.task, seed=cfg.seed)
    model_cfg = state.model.config if state else model_config or Seq2SeqConfig()
    S = task.train.source.shape[1]
    check_step_fits(
        f"batch_size={cfg.batch_size}", Seq2SeqTransformer, model_cfg, cfg.batch_size, S
    )
    if state is None:
        model = Seq2SeqTransformer(model_cfg, seed=cfg.seed)
        history = {"step": [], "train_loss": [], "grad_norm": [], "eval": []}
        sampler = np.random.default_rng([cfg.seed, 1])
        state = TrainState(model, cfg.optimizer(model.params), sampler, 0, history)

    def next_batch(sampler):
        return task.train.take(sampler.integers(0, len(task.train), size=cfg.batch_size))

    def evaluate(state):
        evaluation = evaluate_sequence_task(state.model, task.test)
        state.history["eval"].append({"step": state.step, **evaluation})
        loss, exact = evaluation["heldout_loss"], evaluation["exact_match"]
        return f"  held-out loss {loss:.4f}  exact match {exact:.3f}"

    def meta(state):
        return _meta(cfg.task, cfg, state)

    timing = _loop(state, cfg, next_batch, evaluate, progress_stream, checkpointing, meta)
    final = state.history["eval"][-1]
    generated = greedy_decode(state.model, task.test.source[:3], task.test.target.shape[1])
    examples = [
        {
            "source": _strip(task.test.source[i]),
            "expected": _strip(task.test.target[i]),
            "generated": _strip(generated[i]),
        }
        for i in range(3)
    ]
    result = {
        "task": cfg.task,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "train_size": len(task.train),
        "test_size": len(task.test),
        "initial_train_loss": state.history["train_loss"][0],
        "final_train_loss": final_train_loss(state.history),
        "heldout_loss": final["heldout_loss"],
        "exact_match": final["exact_match"],
        **timing,
        "examples": examples,
    }
    return TrainRun(state.model, state.optimizer, result, state.history, meta(state))


# ------------------------------------------------------------------- char LM


def train_char_lm(
    cfg: CharTrainConfig = REFERENCE_RUNS["char-lm"],
    text: str | None = None,
    progress_stream: TextIO | None = sys.stderr,
    checkpointing: Checkpointing | None = None,
    state: TrainState | None = None,
) -> TrainRun:
    """Train (or continue training) a model that continues a prompt (cfg.model, MiniGPT by
    default) on a character corpus."""
    _check_run_config(cfg)
    kind = model_class(cfg.model)
    if not kind.continues_prompt:
        raise InputError(f"a {cfg.model} model reads a source: it cannot learn to continue text")
    text = DEFAULT_TEXT if text is None else text
    corpus = CharCorpus(text)
    config = (
        state.model.config if state else kind.config_class(corpus.vocab_size, max_len=cfg.context)
    )
    what = f"batch_size={cfg.batch_size} with context={cfg.context}"
    check_step_fits(what, kind, config, cfg.batch_size, cfg.context)
    if state is None:
        model = kind(config, seed=cfg.seed)
        history = {"step": [], "train_loss": [], "grad_norm": []}
        sampler = np.random.default_rng([cfg.seed, 1])
        state = TrainState(model, cfg.optimizer(model.params), sampler, 0, history)

    def next_batch(sampler):
        return corpus.batch(sampler, cfg.batch_size, cfg.context)

    def meta(state):
        return _meta(cfg.task, cfg, state, vocabulary="".join(corpus.chars), text=text)

    timing = _loop(state, cfg, next_batch, None, progress_stream, checkpointing, meta)
    prompt = text[:3] if cfg.prompt is None else cfg.prompt  # "to " for the default text
    sample = corpus.decode(generate(state.model, corpus.encode(prompt), max_new_tokens=60)[0])
    result = {
        "task": cfg.task,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "corpus_characters": len(corpus.ids),
        "vocab_size": corpus.vocab_size,
        "initial_train_loss": state.history["train_loss"][0],
        "final_train_loss": final_train_loss(state.history),
        **timing,
        "prompt": prompt,
        "greedy_sample": sample,
    }
    return TrainRun(state.model, state.optimizer, result, state.history, meta(state))


# ------------------------------------------------------------------- files, resume


def save_run(run: TrainRun, out_dir: str | Path) -> Path:
    """result.json, history.json and checkpoint.npz (weights, optimizer state, meta) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(out, run.model, run.optimizer.state_dict(), run.meta)
    (out / "history.json").write_text(json.dumps(run.history) + "\n")
    (out / "result.json").write_text(json.dumps(run.result, indent=2) + "\n")
    return out


def resume(
    out_dir: str | Path,
    progress_stream: TextIO | None = sys.stderr,
    checkpoint_every: int | None = None,
    steps: int | None = None,
) -> TrainRun:
    """Continue the run whose checkpoint is in out_dir, to its configured number of steps, or
    to `steps` (more than it has done): the same parameters, bit for bit, as a run asked for
    that many steps from the start (the learning rate has no schedule that steps would set)."""
    checkpoint = load_checkpoint(out_dir)
    meta = checkpoint.meta
    missing = {"task", "train_config", "step", "sampler_state", "history"} - meta.keys()
    if missing:
        raise InputError(
            f"checkpoint in {out_dir} cannot be resumed: its meta lacks {sorted(missing)}"
        )
    cfg = _train_config(out_dir, meta)
    cfg = replace(cfg, steps=steps or cfg.steps)
    if meta["step"] >= cfg.steps:
        raise InputError(
            f"the run in {out_dir} has done {meta['step']} steps of {cfg.steps}: nothing to "
            f"resume; give --steps N with N > {meta['step']} to train it further"
        )
    sampler = np.random.default_rng()
    sampler.bit_generator.state = meta["sampler_state"]
    model = checkpoint.model
    checkpointing = Checkpointing(Path(out_dir), checkpoint_every) if checkpoint_every else None
    optimizer = cfg.optimizer(model.params)
    optimizer.load_state_dict(checkpoint.optimizer_state)
    state = TrainState(model, optimizer, sampler, meta["step"], meta["history"])
    return run_task(cfg, meta.get("text"), progress_stream, checkpointing, state)


def _train_config(out_dir, meta: dict):
    """The run's config: the class of its task's reference run, with the saved settings."""
    if meta["task"] not in REFERENCE_RUNS:
        raise InputError(
            f"checkpoint in {out_dir} is of task {meta['task']!r}, which is not known here "
            f"(known: {', '.join(REFERENCE_RUNS)})"
        )
    return type(REFERENCE_RUNS[meta["task"]])(**meta["train_config"])


def run_task(
    cfg: SequenceTrainConfig | CharTrainConfig,
    text: str | None = None,
    progress_stream: TextIO | None = sys.stderr,
    checkpointing: Checkpointing | None = None,
    state: TrainState | None = None,
) -> TrainRun:
    """Train (or continue) the run cfg describes: a sequence task, or a language model on
    text (DEFAULT_TEXT when None)."""
    if isinstance(cfg, CharTrainConfig):
        return train_char_lm(cfg, text, progress_stream, checkpointing, state)
    if text is not None:
        raise InputError(f"--text is for language-model tasks (char-lm), not {cfg.task}")
    return train_sequence_task(cfg, None, progress_stream, checkpointing, state)
