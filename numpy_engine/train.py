"""Training loops and evaluation for the copy/reverse tasks and the character model.

One seed drives a run: the data split and the model's initial weights come from it,
and the batch sampler draws from its own stream, default_rng([seed, 1]).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from numpy_engine.checkpoint import save_checkpoint
from numpy_engine.generate import generate, greedy_decode
from numpy_engine.models import GPTConfig, MiniGPT, Seq2SeqConfig, Seq2SeqTransformer
from numpy_engine.optim import Adam, AdamW, Optimizer, clip_grad_norm
from numpy_engine.tasks import DEFAULT_TEXT, EOS, PAD, CharCorpus, Split, sequence_task


@dataclass(frozen=True)
class SequenceTrainConfig:
    task: str = "copy"  # or "reverse"
    steps: int = 800
    seed: int = 7
    lr: float = 1e-3
    batch_size: int = 32
    clip: float = 1.0
    eval_every: int = 100


@dataclass(frozen=True)
class CharTrainConfig:
    steps: int = 300
    seed: int = 7
    lr: float = 3e-3
    batch_size: int = 32
    context: int = 32
    clip: float = 1.0
    weight_decay: float = 0.01
    eval_every: int = 50
    prompt: str | None = None  # the sample's prompt; None: the text's first 3 characters


@dataclass
class TrainRun:
    model: Seq2SeqTransformer | MiniGPT
    optimizer: Optimizer
    result: dict  # the final JSON summary
    history: dict = field(default_factory=dict)  # loss per step, evaluations
    meta: dict = field(default_factory=dict)  # what a checkpoint needs to be used again


class Progress:
    """One line every tenth of the run and at each evaluation: step, loss, speed, time left."""

    def __init__(self, total_steps: int, stream: TextIO | None = sys.stderr) -> None:
        self.total, self.stream = total_steps, stream
        self.every = max(total_steps // 10, 1)
        self.start = time.perf_counter()

    def update(self, step: int, loss: float, extra: str = "") -> None:
        due = step % self.every == 0 or step in (1, self.total) or extra
        if self.stream is None or not due:
            return
        elapsed = time.perf_counter() - self.start
        rate = step / elapsed if elapsed > 0 else float("inf")
        left = (self.total - step) / rate
        line = (
            f"step {step:>5}/{self.total}  loss {loss:.4f}  {rate:6.1f} steps/s  {left:5.1f} s left"
        )
        print(line + extra, file=self.stream, flush=True)


def _check_run_config(cfg) -> None:
    for name in ("steps", "batch_size", "eval_every"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not cfg.lr > 0 or not cfg.clip > 0:
        raise ValueError(f"lr and clip must be positive, got lr={cfg.lr}, clip={cfg.clip}")


def _step(model, optimizer, batch: tuple, clip: float) -> tuple[float, float]:
    """One training step: loss and gradients, global-norm clipping, the optimizer's update."""
    loss, grads = model.loss_and_grads(*batch)
    grads, grad_norm = clip_grad_norm(grads, clip)
    optimizer.step(model.params, grads)
    return loss, grad_norm


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
    cfg: SequenceTrainConfig = SequenceTrainConfig(),
    model_config: Seq2SeqConfig | None = None,
    progress_stream: TextIO | None = sys.stderr,
) -> TrainRun:
    _check_run_config(cfg)
    task = sequence_task(cfg.task, seed=cfg.seed)
    model = Seq2SeqTransformer(model_config or Seq2SeqConfig(), seed=cfg.seed)
    optimizer = Adam(model.params, lr=cfg.lr)
    sampler = np.random.default_rng([cfg.seed, 1])
    history = {"step": [], "train_loss": [], "grad_norm": [], "eval": []}
    progress, start = Progress(cfg.steps, progress_stream), time.perf_counter()
    for step in range(1, cfg.steps + 1):
        rows = sampler.integers(0, len(task.train), size=cfg.batch_size)  # with replacement
        loss, grad_norm = _step(model, optimizer, task.train.take(rows), cfg.clip)
        history["step"].append(step)
        history["train_loss"].append(loss)
        history["grad_norm"].append(grad_norm)
        extra = ""
        if step % cfg.eval_every == 0 or step == cfg.steps:
            evaluation = evaluate_sequence_task(model, task.test)
            history["eval"].append({"step": step, **evaluation})
            extra = (f"  held-out loss {evaluation['heldout_loss']:.4f}"
                     f"  exact match {evaluation['exact_match']:.3f}")  # fmt: skip
        progress.update(step, loss, extra)
    seconds = time.perf_counter() - start
    final = history["eval"][-1]
    generated = greedy_decode(model, task.test.source[:3], max_new_tokens=task.test.target.shape[1])
    examples = [
        {"source": _strip(task.test.source[i]), "expected": _strip(task.test.target[i]),
         "generated": _strip(generated[i])}
        for i in range(3)
    ]  # fmt: skip
    result = {
        "task": cfg.task, "seed": cfg.seed, "steps": cfg.steps,
        "train_size": len(task.train), "test_size": len(task.test),
        "initial_train_loss": history["train_loss"][0],
        "final_train_loss": history["train_loss"][-1],
        "heldout_loss": final["heldout_loss"], "exact_match": final["exact_match"],
        "seconds": round(seconds, 3), "steps_per_second": round(cfg.steps / seconds, 1),
        "examples": examples,
    }  # fmt: skip
    meta = {"task": cfg.task, "train_config": asdict(cfg), "step": cfg.steps}
    return TrainRun(model, optimizer, result, history, meta)


# ------------------------------------------------------------------- char LM


def train_char_lm(
    cfg: CharTrainConfig = CharTrainConfig(),
    text: str | None = None,
    progress_stream: TextIO | None = sys.stderr,
) -> TrainRun:
    _check_run_config(cfg)
    text = DEFAULT_TEXT if text is None else text
    corpus = CharCorpus(text)
    model = MiniGPT(GPTConfig(vocab_size=corpus.vocab_size, max_len=cfg.context), seed=cfg.seed)
    optimizer = AdamW(model.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler = np.random.default_rng([cfg.seed, 1])
    history = {"step": [], "train_loss": [], "grad_norm": []}
    progress, start = Progress(cfg.steps, progress_stream), time.perf_counter()
    for step in range(1, cfg.steps + 1):
        batch = corpus.batch(sampler, cfg.batch_size, cfg.context)
        loss, grad_norm = _step(model, optimizer, batch, cfg.clip)
        history["step"].append(step)
        history["train_loss"].append(loss)
        history["grad_norm"].append(grad_norm)
        progress.update(step, loss)
    seconds = time.perf_counter() - start
    prompt = text[:3] if cfg.prompt is None else cfg.prompt  # "to " for the default text
    prompt_ids = corpus.encode(prompt)
    sample = corpus.decode(generate(model, prompt_ids, max_new_tokens=60)[0])
    result = {
        "task": "char-lm", "seed": cfg.seed, "steps": cfg.steps,
        "corpus_characters": len(corpus.ids), "vocab_size": corpus.vocab_size,
        "initial_train_loss": history["train_loss"][0],
        "final_train_loss": float(np.mean(history["train_loss"][-10:])),  # mean of the last 10
        "seconds": round(seconds, 3), "steps_per_second": round(cfg.steps / seconds, 1),
        "prompt": prompt, "greedy_sample": sample,
    }  # fmt: skip
    meta = {"task": "char-lm", "train_config": asdict(cfg), "step": cfg.steps,
            "vocabulary": "".join(corpus.chars)}  # fmt: skip
    return TrainRun(model, optimizer, result, history, meta)


def save_run(run: TrainRun, out_dir: str | Path) -> Path:
    """result.json, history.json and checkpoint.npz (weights, optimizer state, meta) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(run.result, indent=2) + "\n")
    (out / "history.json").write_text(json.dumps(run.history) + "\n")
    save_checkpoint(out, run.model, run.optimizer.state_dict(), run.meta)
    return out
