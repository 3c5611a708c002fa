"""A language model's held-out evaluation during a training run, and --keep-best.

The held-out part of the text (train.py splits it off) is measured every --eval-every
steps as the mean next-token loss over every one of its targets (heldout_loss, which the
`eval` command measures a text with too). With --keep-best, an evaluation whose loss is
below every earlier one of the run writes the model's weights and tokenizer to the run's
BEST directory, for generate and eval.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from numpy_engine.checkpoint import save_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.loop import Checkpointing, TrainState
from numpy_engine.parallel import DataParallel, OneProcess


def language_model_evaluation(cfg, heldout, checkpointing, codec: dict, parallel):
    """run_loop's evaluate: _heldout_evaluation's, and with --keep-best, which needs a
    held-out part, the best weights kept in the run's BEST directory as it goes."""
    evaluate = _heldout_evaluation(heldout, cfg.batch_size, parallel)
    if checkpointing is None or not checkpointing.keep_best:
        return evaluate
    if evaluate is None:
        raise InputError(
            "--keep-best keeps the weights of the lowest held-out loss: the run needs a "
            "held-out part (--holdout FRACTION)"
        )
    root = parallel is None or parallel.is_root  # the one rank that writes
    return _keeping_the_best(evaluate, checkpointing.out / BEST, codec, root)


def _heldout_evaluation(heldout: tuple | None, batch_size: int, parallel: DataParallel | None):
    """run_loop's evaluate for a language model: the held-out loss, kept in the history; None
    without a holdout (no evaluation). Data-parallel, the ranks share the windows."""
    if heldout is None:
        return None
    # as many windows at a time as a step's forward takes (micro-batches save memory)
    rows = batch_size if parallel is None else parallel.micro_batch_rows(batch_size)
    group = None if parallel is None else parallel.group

    def evaluate(state: TrainState) -> str:
        start = time.perf_counter()
        loss = heldout_loss(state.model, heldout, rows, group)
        state.history["eval"].append({"step": state.step, "heldout_loss": loss})
        # its size and its cost on the progress line: a large held-out part takes a while
        seconds, tokens = time.perf_counter() - start, state.model.count_targets(heldout[1])
        return f"  held-out loss {loss:.4f} ({tokens} tokens, {seconds:.1f} s)"

    return evaluate


BEST = "best"  # the directory in a run's --out where --keep-best writes


def best_evaluation(evaluations: list[dict]) -> dict | None:
    """The evaluation of the lowest held-out loss, the first of equal ones: the one
    --keep-best kept. A NaN loss is never the best (it compares false both ways: kept, it
    would stand as the best and no later loss would beat it); None if every loss is NaN."""
    numbers = [e for e in evaluations if not np.isnan(e["heldout_loss"])]
    return min(numbers, key=lambda e: e["heldout_loss"]) if numbers else None


def _keeping_the_best(evaluate, out: Path, codec: dict, writes: bool):
    """evaluate, then, at an evaluation whose held-out loss is below every earlier one of the
    run's (a resumed run's too: they are in its history; never a NaN), the model's weights
    and tokenizer written to out (writes: this process is the one that writes). generate and
    eval read that checkpoint; it holds no optimizer state, so it resumes no run."""

    def evaluate_and_keep(state: TrainState) -> str:
        line = evaluate(state)
        best = best_evaluation(state.history["eval"])
        if best is not state.history["eval"][-1]:  # a NaN, or not below every earlier one
            return line
        last = best["heldout_loss"]
        if writes:
            meta = {"step": state.step, "heldout_loss": last, **codec}
            save_checkpoint(out, state.model, None, meta)
        return f"{line}  best so far: kept in {out}"

    return evaluate_and_keep


def heldout_loss(
    model, windows: tuple, batch_size: int, group: OneProcess | None = None, done=None
) -> float:
    """The mean next-token loss over every target of windows (every_target_once's idx and
    targets), batch_size windows at a time: each batch's mean weighed by its targets. With a
    data-parallel run's group, each rank takes its share of the windows and one Allreduce
    adds up every rank's sums. done(windows measured, windows): called after each batch."""
    idx, targets = windows
    group = group or OneProcess()
    share = np.array_split(np.arange(len(idx)), group.size)[group.rank]  # this rank's windows
    sums = np.zeros(2)  # [sum over batches of mean loss x targets, targets]
    for start in range(0, len(share), batch_size):
        rows = share[start : start + batch_size]
        n = model.count_targets(targets[rows])
        sums += (model.loss(idx[rows], targets[rows]) * n, n)
        if done is not None:
            done(start + len(rows), len(share))
    group.allreduce_sum(sums)
    return float(sums[0] / sums[1])


def heldout_result(state: TrainState, heldout: tuple | None) -> dict:
    """The result's held-out fields: its targets and the last evaluation's loss; {} if none."""
    if heldout is None:
        return {}
    last = state.history["eval"][-1]["heldout_loss"]
    return {"heldout_targets": state.model.count_targets(heldout[1]), "heldout_loss": last}


def best_result(state: TrainState, checkpointing: Checkpointing | None) -> dict:
    """With --keep-best: {"best": its step, held-out loss and checkpoint}; else {}."""
    if checkpointing is None or not checkpointing.keep_best:
        return {}
    best = best_evaluation(state.history["eval"])
    if best is None:  # every held-out loss was NaN: nothing was kept
        return {"best": None}
    return {"best": {**best, "checkpoint": str(checkpointing.out / BEST)}}
