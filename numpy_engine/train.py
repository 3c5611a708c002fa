"""The training tasks (copy / reverse, a language model on text), and exact resume; the loop
they share is in loop.py, a run saved and its checkpoint checked before it resumes in
saved_runs.py, a language model's held-out evaluation and --keep-best in evaluation.py.

One seed drives a run: the data split and the model's initial weights come from it,
and the batch sampler draws from its own stream, default_rng([seed, 1]). A checkpoint
holds everything the loop reads (weights, optimizer moments, the sampler's state, the
step, the history), so a run resumed from step k continues bit for bit as if it had
never stopped.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import numpy as np

from numpy_engine.checkpoint import Checkpoint, load_checkpoint, resolve
from numpy_engine.checks import InputError
from numpy_engine.configs import REFERENCE_RUNS, CharTrainConfig, SequenceTrainConfig
from numpy_engine.dropout import every_site
from numpy_engine.evaluation import (
    BEST,
    best_result,
    heldout_result,
    language_model_evaluation,
)
from numpy_engine.generate import generate, greedy_decode
from numpy_engine.loop import (
    Checkpointing,
    TrainingDiverged,
    TrainRun,
    TrainState,
    check_run_config,
    empty_history,
    final_train_loss,
    run_loop,
    run_meta,
)
from numpy_engine.models import Seq2SeqConfig, Seq2SeqTransformer, model_class
from numpy_engine.parallel import DataParallel
from numpy_engine.saved_runs import (
    refuse_a_best_already_lost,
    resumable_config,
    resumed_state,
    save_run,
)
from numpy_engine.step_memory import check_step_fits
from numpy_engine.tasks import (
    DEFAULT_TEXT,
    EOS,
    PAD,
    CharCorpus,
    SequenceTask,
    Split,
    corpus_from_meta,
    every_target_once,
    random_windows,
    sequence_task,
    split_off_heldout,
)

__all__ = [  # the loop's names that callers know from here
    "Checkpointing",
    "TrainingDiverged",
    "TrainRun",
    "TrainState",
    "resume",
    "run_task",
    "save_run",
    "train_char_lm",
    "train_sequence_task",
]


# --------------------------------------------------------------- copy / reverse


def evaluate_sequence_task(model: Seq2SeqTransformer, split: Split) -> dict:
    """Teacher-forced loss, and greedy exact match over all 4 target positions (EOS, PAD too)."""
    generated = greedy_decode(model, split.source, max_new_tokens=split.target.shape[1])
    exact = (generated == split.target).all(axis=1)
    loss = model.loss(split.source, split.decoder_input, split.target)
    return {"heldout_loss": loss, "exact_match": float(exact.mean())}


def _examples(model: Seq2SeqTransformer, split: Split, n: int) -> list[dict]:
    """The first n sources of split, each with its target and the model's greedy decode."""
    generated = greedy_decode(model, split.source[:n], split.target.shape[1])
    return [
        {
            "source": _strip(split.source[i]),
            "expected": _strip(split.target[i]),
            "generated": _strip(generated[i]),
        }
        for i in range(n)
    ]


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
    parallel: DataParallel | None = None,
) -> TrainRun:
    """Train (or, given a state from a checkpoint, continue training) the copy/reverse model;
    parallel: over MPI ranks and/or in micro-batches (numpy_engine/parallel.py)."""
    check_run_config(cfg)
    if checkpointing is not None and checkpointing.keep_best:
        raise InputError(f"--keep-best is for a language model's run (char-lm, lm), not {cfg.task}")
    task = sequence_task(cfg.task, seed=cfg.seed)
    model = _sequence_model(cfg, model_config) if state is None else state.model
    S = task.train.source.shape[1]
    check_step_fits(f"batch_size={cfg.batch_size}", model, cfg, S, state, parallel)
    if state is None:
        state = _new_state(cfg, model)

    def next_batch(sampler):
        return task.train.take(sampler.integers(0, len(task.train), size=cfg.batch_size))

    def meta(state):
        return run_meta(cfg.task, cfg, state)

    evaluate = _sequence_evaluation(task.test)
    timing = run_loop(
        state, cfg, next_batch, evaluate, progress_stream, checkpointing, meta, parallel
    )
    result = _sequence_result(cfg, task, state, timing)
    return TrainRun(state.model, state.optimizer, result, state.history, meta(state))


def _sequence_model(cfg: SequenceTrainConfig, model_config: Seq2SeqConfig | None):
    """A new run's encoder-decoder (model_config, else the default), at cfg.dropout."""
    model = Seq2SeqTransformer(model_config or Seq2SeqConfig(), seed=cfg.seed)
    if cfg.dropout is not None:
        _set_dropout(model, cfg.dropout)
    return model


def _sequence_evaluation(test: Split):
    """run_loop's evaluate for copy/reverse: the held-out loss and exact match, kept in the
    history."""

    def evaluate(state: TrainState) -> str:
        evaluation = evaluate_sequence_task(state.model, test)
        state.history["eval"].append({"step": state.step, **evaluation})
        loss, exact = evaluation["heldout_loss"], evaluation["exact_match"]
        return f"  held-out loss {loss:.4f}  exact match {exact:.3f}"

    return evaluate


def _sequence_result(
    cfg: SequenceTrainConfig, task: SequenceTask, state: TrainState, timing: dict
) -> dict:
    """The run's result: its settings and data, its losses, the last evaluation, its speed,
    and three held-out examples decoded."""
    final = state.history["eval"][-1]
    return {
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
        "examples": _examples(state.model, task.test, 3),
    }


# ------------------------------------------------------------------- char LM


def train_char_lm(
    cfg: CharTrainConfig = REFERENCE_RUNS["char-lm"],
    text: str | None = None,
    progress_stream: TextIO | None = sys.stderr,
    checkpointing: Checkpointing | None = None,
    state: TrainState | None = None,
    codec: dict | None = None,
    parallel: DataParallel | None = None,
) -> TrainRun:
    """Train a model that continues a prompt on text: from scratch (cfg.model, MiniGPT by
    default, over the text's characters), from the checkpoint in cfg.init (its weights and
    its tokenizer: fine-tuning), or on from state (resume; codec: the meta that holds its
    tokenizer or vocabulary)."""
    check_run_config(cfg)
    text_name = "the built-in text" if text is None else "--text"  # as an error calls it
    text = DEFAULT_TEXT if text is None else text
    model, corpus = _language_model_and_corpus(cfg, text, text_name, state, codec)
    what = f"batch_size={cfg.batch_size} with context={cfg.context}"
    check_step_fits(what, model, cfg, cfg.context, state, parallel)
    train_ids, heldout = _split_text(cfg, corpus, model)
    if state is None:
        state = _new_state(cfg, model, evaluations=heldout is not None)

    def next_batch(sampler):
        return random_windows(train_ids, sampler, cfg.batch_size, cfg.context)

    def meta(state):
        return run_meta(cfg.task, cfg, state, **corpus.codec(), text=text)

    evaluate = language_model_evaluation(cfg, heldout, checkpointing, corpus.codec(), parallel)
    timing = run_loop(
        state, cfg, next_batch, evaluate, progress_stream, checkpointing, meta, parallel
    )
    result = {
        "task": cfg.task,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "corpus_characters": len(text),
        "corpus_tokens": len(corpus.ids),
        "vocab_size": state.model.config.vocab_size,  # what the model predicts over
        "tokenizer_vocab_size": corpus.vocab_size,  # may be fewer (a padded checkpoint's)
        "initial_train_loss": state.history["train_loss"][0],
        "final_train_loss": final_train_loss(state.history),
        **heldout_result(state, heldout),
        **best_result(state, checkpointing),
        **timing,
        **_greedy_sample(state.model, corpus, text[:3] if cfg.prompt is None else cfg.prompt),
    }
    return TrainRun(state.model, state.optimizer, result, state.history, meta(state))


def _language_model_and_corpus(cfg: CharTrainConfig, text, text_name, state, codec) -> tuple:
    """(the model, the text read by its tokenizer): the model of state (resume), or the
    weights and tokenizer of the checkpoint cfg.init (fine-tuning), or a new model over the
    text's characters; a new run's model at cfg.dropout, and long enough for cfg.context."""
    model = None if state is None else state.model
    if state is None and cfg.init is not None:
        start = load_checkpoint(cfg.init, optimizer=False)  # its weights: a new run's own moments
        _continuing_text(type(start.model))
        model, codec = start.model, start.meta
    corpus = corpus_from_meta(codec, text, text_name) if codec else CharCorpus(text, what=text_name)
    model = model or _new_language_model(cfg, corpus.vocab_size)
    if state is None and cfg.dropout is not None:  # a resumed model's config holds its rates
        _set_dropout(model, cfg.dropout)
    if cfg.context > model.config.max_len:
        most = model.config.max_len
        raise InputError(
            f"context={cfg.context} is longer than the model's {most} positions (its max_len): "
            f"give --context {most} or less"
        )
    return model, corpus


def _greedy_sample(model, corpus, prompt: str) -> dict:
    """The prompt ("to " for the default text) and the model's greedy continuation of it."""
    sample = corpus.decode(generate(model, corpus.encode(prompt), max_new_tokens=60)[0])
    return {"prompt": prompt, "greedy_sample": sample}


def _split_text(cfg: CharTrainConfig, corpus, model) -> tuple:
    """(the ids to train on, the held-out windows or None): cfg.holdout's split of the text."""
    if not cfg.holdout:
        return corpus.ids, None
    train_ids, heldout_ids = split_off_heldout(corpus.ids, cfg.holdout, cfg.context)
    return train_ids, every_target_once(heldout_ids, cfg.context, model.ignore_index())


def _new_state(cfg, model, evaluations: bool = True) -> TrainState:
    """A new run's state: step 0, a fresh optimizer, the batch sampler seeded from cfg.seed."""
    sampler = np.random.default_rng([cfg.seed, 1])
    return TrainState(model, cfg.optimizer(model.params), sampler, 0, empty_history(evaluations))


def _new_language_model(cfg: CharTrainConfig, vocab_size: int):
    kind = _continuing_text(model_class(cfg.model))
    return kind(kind.config_class(vocab_size, max_len=cfg.context), seed=cfg.seed)


def _set_dropout(model, rate: float) -> None:
    """Every dropout site of the model's training steps at rate (its config's *_dropout)."""
    rates = every_site(rate)
    if not all(hasattr(model.config, name) for name in rates):
        raise InputError(f"a {model.kind} model has no dropout to set")
    model.config = replace(model.config, **rates)


def _continuing_text(kind: type) -> type:
    if not kind.continues_prompt:
        raise InputError(f"a {kind.kind} model reads a source: it cannot learn to continue text")
    return kind


# ----------------------------------------------------------------------- resume


def resume(
    out_dir: str | Path,
    progress_stream: TextIO | None = sys.stderr,
    checkpoint_every: int | None = None,
    steps: int | None = None,
    parallel: DataParallel | None = None,
    checkpoint: Checkpoint | None = None,
    keep_best: bool = False,
) -> TrainRun:
    """Continue the run whose checkpoint is in out_dir, to its configured number of steps, or
    to `steps` (more than it has done): the same parameters, bit for bit, as a run asked for
    that many steps from the start. A run whose lr decays (a linear or cosine schedule)
    decays over its steps: it takes no other number of them.
    checkpoint: out_dir's, when the caller has loaded it already (else it is loaded here);
    its optimizer_state is emptied as it is read into the optimizer, each array going once
    copied: kept, it would hold a second copy of the moments for the whole run (1 GB on
    GPT-2), and whole until the last copy, it made the resumed run's peak (2472 MB, 2274 now).
    keep_best: as Checkpointing's (a setting of where the run writes, not of its training);
    a run that kept its best (out_dir/BEST exists) keeps it on without being asked, so that
    best/ cannot go stale while later evaluations beat it."""
    checkpoint = load_checkpoint(out_dir) if checkpoint is None else checkpoint
    cfg = resumable_config(out_dir, checkpoint, steps)
    meta = checkpoint.meta
    if isinstance(cfg, CharTrainConfig):  # a sequence task's run refuses keep_best
        keep_best = keep_best or resolve(Path(out_dir) / BEST).exists()
        if keep_best:
            refuse_a_best_already_lost(Path(out_dir), meta["history"])
    checkpointing = Checkpointing(Path(out_dir), checkpoint_every, keep_best)  # saved when stopped
    state = resumed_state(cfg, checkpoint)
    return run_task(cfg, meta.get("text"), progress_stream, checkpointing, state, meta, parallel)


def run_task(
    cfg: SequenceTrainConfig | CharTrainConfig,
    text: str | None = None,
    progress_stream: TextIO | None = sys.stderr,
    checkpointing: Checkpointing | None = None,
    state: TrainState | None = None,
    codec: dict | None = None,
    parallel: DataParallel | None = None,
) -> TrainRun:
    """Train (or continue) the run cfg describes: a sequence task, or a language model on
    text (DEFAULT_TEXT when None; codec: see train_char_lm)."""
    if isinstance(cfg, CharTrainConfig):
        return train_char_lm(cfg, text, progress_stream, checkpointing, state, codec, parallel)
    if text is not None:
        raise InputError(f"--text is for language-model tasks (char-lm), not {cfg.task}")
    return train_sequence_task(cfg, None, progress_stream, checkpointing, state, parallel)
