"""The `train` command: its flags (one for each of a run's settings, RUN_FLAGS, with the
reference runs' defaults), a new run or a resumed one, on one process or as data-parallel
ranks, each refusal before any step, and the run saved and its result printed (registered
by cli.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TextIO

from numpy_engine.checks import InputError
from numpy_engine.cli_args import (
    dropout_rate,
    fraction,
    name_in,
    non_negative_float,
    non_negative_int,
    path_name,
    positive_float,
    positive_int,
    refuse_an_existing_checkpoint,
)
from numpy_engine.configs import NEW_MODEL_RUNS, REFERENCE_RUNS, WEIGHT_DECAY_ON, reference_run
from numpy_engine.schedule import SCHEDULES

# The train command's options that set a run's config field of the same name; their
# defaults are the reference runs' (configs.REFERENCE_RUNS), shown in --help from there,
# or, where the default means "off", in words (a third item).
RUN_FLAGS = {
    "steps": (positive_int, "optimizer steps"),
    "seed": (non_negative_int, "seeds the data split, the initial weights and the batches"),
    "lr": (positive_float, "learning rate, of Adam for copy/reverse and AdamW for char-lm/lm"),
    "batch_size": (positive_int, "sequences per step"),
    "weight_decay": (
        non_negative_float,
        "char-lm, lm: AdamW's decoupled weight decay: each step first takes p *= 1 - lr * this",
    ),
    "weight_decay_on": (
        name_in(WEIGHT_DECAY_ON),
        "char-lm, lm: which parameters --weight-decay shrinks: matrices (the weight matrices "
        "and embedding tables, not the biases nor layernorms' scales and shifts, as Hugging "
        "Face's Trainer and nanoGPT) or all (as torch.optim.AdamW given every parameter)",
    ),
    "clip": (positive_float, "clip the global gradient norm to this"),
    "eval_every": (
        positive_int,
        "evaluate on the held-out split every N steps (char-lm, lm: with --holdout)",
    ),
    "context": (
        positive_int,
        "char-lm, lm: tokens per training window (with --init, by default no more than the "
        "model's positions)",
    ),
    "holdout": (
        fraction,
        "char-lm, lm: hold out this fraction of the text's tokens, at its end (e.g. 0.1): "
        "never trained on, their mean loss shown every --eval-every steps and in the result",
        "default: none, every token is trained on",
    ),
    "schedule": (
        name_in(SCHEDULES),
        "the lr over the run, after --warmup: constant, or falling from --lr towards --min-lr "
        "in a line or a half cosine (as transformers' get_{linear,cosine}_schedule_with_warmup)",
    ),
    "warmup": (
        non_negative_int,
        "the first N updates' lr rises from 0 towards --lr: update k (from 0) takes lr k/N",
    ),
    "min_lr": (
        non_negative_float,
        "with --schedule linear or cosine: the lr they fall towards (reached one update past "
        "the last)",
        "default: 0",
    ),
    "dropout": (
        dropout_rate,
        "the rate of dropout in training steps, after the embeddings, on the attention "
        "weights and on each sublayer's output, as GPT-2 trains (evaluation and generation "
        "drop nothing)",
        "default: the model's own: 0 for a new model, an imported GPT-2's from its config.json",
    ),
    "init": (
        path_name,
        "lm: the checkpoint to fine-tune (e.g. written by import-hf); its tokenizer reads --text",
        "default: none, a new model",
    ),
}


def _defaults(name: str) -> str:
    """'default: 7', or per task where they differ: 'default: copy 800, reverse 1000, ...',
    with a new model's default beside its task's where that differs ('lm 100 (300 without
    --init)')."""
    values = {task: vars(cfg)[name] for task, cfg in REFERENCE_RUNS.items() if name in vars(cfg)}
    new_model = {
        task: f" ({vars(cfg)[name]} without --init)"
        for task, cfg in NEW_MODEL_RUNS.items()
        if vars(cfg)[name] != values[task]
    }
    if len(set(values.values())) == 1 and not new_model:
        return f"default: {next(iter(values.values()))}"
    return "default: " + ", ".join(
        f"{task} {value}{new_model.get(task, '')}" for task, value in values.items()
    )


def add_train_command(commands) -> None:
    train = commands.add_parser(
        "train",
        help="train a model on a task and print a JSON result",
        description="Train with hand-written gradients. Progress lines go to stderr; the final "
        "JSON result (losses, exact match, examples) goes to stdout.",
    )
    train.add_argument(
        "task",
        nargs="?",
        choices=list(REFERENCE_RUNS),
        help="copy / reverse: the encoder-decoder on 1-3 symbol sequences; "
        "char-lm: MiniGPT on a character corpus; lm: fine-tune a checkpoint (--init) on "
        "--text with its own tokenizer, or without --init train a small GPT-2 from scratch on "
        "the text's characters, at char-lm's learning rate and steps (the tasks of "
        "configs.REFERENCE_RUNS)",
    )
    for name, (kind, text, *in_words) in RUN_FLAGS.items():
        default = in_words[0] if in_words else _defaults(name)
        train.add_argument(_flag(name), type=kind, help=f"{text} ({default})")
    train.add_argument(
        "--text",
        type=path_name,
        metavar="FILE",
        help="char-lm, lm: a UTF-8 text file to train on (default: a built-in line of Hamlet)",
    )
    train.add_argument(
        "--out",
        type=path_name,
        metavar="DIR",
        help="keep result.json, history.json and checkpoint.npz in DIR; Ctrl-C (or SIGTERM) "
        "stops the run after the step in progress and saves its checkpoint there, for --resume "
        "(one process: under mpiexec, Ctrl-C ends every rank at once)",
    )
    train.add_argument(
        "--checkpoint-every",
        type=positive_int,
        metavar="N",
        help="with --out: also save checkpoint.npz every N steps, for --resume",
    )
    train.add_argument(
        "--keep-best",
        action="store_true",
        help="char-lm, lm, with --out and --holdout: also keep DIR/best/checkpoint.npz, the "
        "weights (and tokenizer) at the evaluation of the lowest held-out loss so far, for "
        "generate and eval",
    )
    train.add_argument(
        "--resume",
        type=path_name,
        metavar="DIR",
        help="continue the run whose checkpoint is in DIR (no TASK), bit for bit as if it had "
        "not stopped; with --steps N, train it on to step N (unless its lr decays over its "
        "steps: --schedule linear or cosine). Its other settings are the checkpoint's: a flag "
        "that differs from them is refused. It saves into DIR (an --out elsewhere is refused)",
    )
    train.add_argument(
        "--plot",
        action="store_true",
        help="with --out: also draw DIR/loss.png (needs the plot extra)",
    )
    train.add_argument("--quiet", action="store_true", help="no progress lines")
    train.add_argument(
        "--data-parallel",
        action="store_true",
        help="under mpiexec -n N: each of the N ranks computes the gradient of its share of "
        "every batch, one Allreduce sums them (exactly one process's training with the whole "
        "batch); rank 0 prints and writes. Needs the mpi extra",
    )
    train.add_argument(
        "--accumulate",
        type=positive_int,
        metavar="K",
        help="cut each batch (each rank's share) into K micro-batches whose gradients are "
        "summed before one update: the same training, less memory (default: 1)",
    )
    train.set_defaults(run=run_train)


# ----------------------------------------------------------------------- the run


def run_train(args: argparse.Namespace) -> int:
    from numpy_engine.parallel import DataParallel, process_group, run_as_rank

    group = process_group(args.data_parallel)  # refuses ranks without --data-parallel
    if not args.data_parallel and args.accumulate is None:
        return _run_train(args, None)
    parallel = DataParallel(group, args.accumulate or 1)
    if group.size > 1:
        _share_the_cores(group.size)
    return run_as_rank(parallel, lambda: _run_train(args, parallel), "train")


def _share_the_cores(ranks: int) -> None:
    """Give each rank's BLAS and elementwise blocks (threads.py) cores / ranks threads: ranks
    on one machine each starting a thread per core would oversubscribe it (measured: train
    char-lm on 2 ranks, 11.6 steps/s against 62.6 with one thread each). threadpoolctl comes
    with the mpi extra."""
    from threadpoolctl import threadpool_limits

    from numpy_engine.threads import set_threads

    share = max(1, (os.cpu_count() or 1) // ranks)
    threadpool_limits(share)
    set_threads(share)


def _run_train(args: argparse.Namespace, parallel) -> int:
    from numpy_engine import train
    from numpy_engine.memory import keep_freed_memory

    root = parallel is None or parallel.is_root  # the one rank that prints and writes
    stream = None if args.quiet or not root else sys.stderr
    _refuse_before_training(args)
    given = {name: getattr(args, name) for name in RUN_FLAGS if getattr(args, name) is not None}
    # A checkpoint read before malloc keeps freed memory goes back to the system once the model
    # and the optimizer hold their copies, instead of staying in the heap: a resumed GPT-2
    # run's peak 2688 -> 2274 MB (a fresh run's 2275)
    checkpoint = _checkpoint_to_resume(args, given) if args.resume else None
    keep_freed_memory()  # each step reuses the last one's pages (numpy_engine/memory.py)
    if args.resume:
        steps = given.get("steps")
        run = train.resume(
            args.resume, stream, args.checkpoint_every, steps, parallel, checkpoint, args.keep_best
        )
        out = args.resume
    else:
        run, out = _train_new(args, given, stream, parallel), args.out
    if root:
        _keep_and_print(run, out, args.plot)
    return 0


def _refuse_before_training(args: argparse.Namespace) -> None:
    """Before any training: --plot without matplotlib, a flag that writes into --out without
    one, and a TASK given with --resume or neither given, each refused by a line."""
    if args.plot:
        from numpy_engine.plots import check_matplotlib

        check_matplotlib()  # fail before training, not after
        if not (args.out or args.resume):
            raise InputError("--plot needs --out DIR (where loss.png goes)")
    if args.checkpoint_every and not (args.out or args.resume):
        raise InputError("--checkpoint-every needs --out DIR (where the checkpoints go)")
    if args.keep_best and not (args.out or args.resume):
        raise InputError("--keep-best needs --out DIR (where DIR/best goes)")
    if args.resume and args.task:
        raise InputError("--resume continues a saved run: give no TASK with it")
    if args.resume and args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise InputError(  # it was ignored: the run went on in --resume's directory
            f"--out {args.out} conflicts with --resume {args.resume}: a resumed run saves "
            f"into the directory it continues; to continue a copy of the run, copy "
            f"{args.resume} to {args.out} and give --resume {args.out}"
        )
    if not (args.resume or args.task):
        raise InputError(f"give a TASK ({', '.join(REFERENCE_RUNS)}) or --resume DIR")


def _keep_and_print(run, out: str | None, plot: bool) -> None:
    """The run saved in out (if given), its loss picture drawn there with --plot, and its
    result printed (with where they went)."""
    from numpy_engine import train

    if out:
        train.save_run(run, out)
        run.result["out"] = str(out)
        if plot:
            from numpy_engine.plots import plot_history

            run.result["plot"] = str(plot_history(run.history, Path(out) / "loss.png"))
    print_result(run.result)


def print_result(result: dict, stream: TextIO | None = None) -> None:
    """The JSON result on stdout, its text (a sample, a prompt) as it is where the stream
    can show it, escaped ("\\u00e9") where it cannot (a terminal that is not UTF-8)."""
    stream = stream or sys.stdout
    text = json.dumps(result, indent=2, ensure_ascii=False)
    try:
        text.encode(stream.encoding or "ascii")
    except UnicodeEncodeError:
        text = json.dumps(result, indent=2)
    print(text, file=stream)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _checkpoint_to_resume(args: argparse.Namespace, given: dict):
    """The checkpoint in --resume DIR, loaded once (a GPT-2 run's is ~1.5 GB with its
    optimizer state), after refusing a flag that would change one of its run's settings:
    a resumed run keeps them."""
    from numpy_engine.checkpoint import load_checkpoint

    if args.text:
        raise InputError(
            "--text conflicts with --resume: the run trains on the text it was saved with"
        )
    checkpoint = load_checkpoint(args.resume)
    meta = checkpoint.meta
    if not {"task", "train_config"} <= meta.keys():
        return checkpoint  # holds no training run: train.resume says so, and what to do
    from numpy_engine.saved_runs import saved_config

    saved = dataclasses.asdict(saved_config(args.resume, meta))  # with settings added since
    what_may_change = "only --steps may change"
    if saved["schedule"] != "constant":
        what_may_change = "its lr decays over its steps, so not even --steps may change"
    for name, value in given.items():
        if name != "steps" and name in saved and value != saved[name]:
            raise InputError(
                f"{_flag(name)} {value} conflicts with the checkpoint's {name}={saved[name]}: "
                f"a resumed run keeps the settings it was started with ({what_may_change})"
            )
        if name not in saved:
            raise InputError(f"{_flag(name)} does not apply to the run in {args.resume}")
    return checkpoint


def _instead_of_training_over(out: str) -> str:
    """What to do with the checkpoint already in --out: resume the run it holds, or, where it
    holds weights alone (an import, a run's best), train into another directory."""
    from numpy_engine.checkpoint import read_header, resolve
    from numpy_engine.saved_runs import RUN_STATE_KEYS

    try:
        _, _, meta = read_header(resolve(out))
    except InputError:  # none there (nothing to refuse), or a damaged one
        return "give another --out"
    if RUN_STATE_KEYS <= meta.keys():
        return f"continue it with --resume {out}, or give another --out"
    return "it holds weights, not a run to resume: give another --out"


def _positions(init: str, otherwise: int) -> int:
    """The positions of the model in the checkpoint init (its header alone is read)."""
    from numpy_engine.checkpoint import read_header

    _, config, _ = read_header(init)
    return getattr(config, "max_len", otherwise)


def _train_new(args: argparse.Namespace, given: dict, stream, parallel):
    from numpy_engine import train
    from numpy_engine.loop import check_run_config
    from numpy_engine.tasks import read_text

    reference = reference_run(args.task, new_model="init" not in given)
    for name in given.keys() - {f.name for f in dataclasses.fields(reference)}:
        raise InputError(f"{_flag(name)} does not apply to {args.task}")
    if "init" in given and "context" not in given:  # lm's 64 against a char-lm run's 32, say
        given["context"] = min(reference.context, _positions(given["init"], reference.context))
    if "eval_every" in given and hasattr(reference, "holdout") and "holdout" not in given:
        raise InputError(
            f"--eval-every needs --holdout FRACTION for {args.task}: a language model is "
            "evaluated on a held-out part of its text, and holds none out unless asked"
        )
    if args.out:
        refuse_an_existing_checkpoint("--out", args.out, _instead_of_training_over(args.out))
    cfg = dataclasses.replace(reference, **given)
    check_run_config(cfg, name=_flag)  # what two flags get wrong together, named as flags
    checkpointing = None  # with --out: every --checkpoint-every steps, and when stopped
    if args.out:
        checkpointing = train.Checkpointing(Path(args.out), args.checkpoint_every, args.keep_best)
    text = read_text(args.text) if args.text else None
    return train.run_task(cfg, text, stream, checkpointing, parallel=parallel)
