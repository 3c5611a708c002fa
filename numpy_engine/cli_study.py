"""The commands for looking inside and measuring: `attention`, `plot`, `grads`, `eval`
(registered by cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from numpy_engine.checks import InputError
from numpy_engine.cli_args import (
    add_checkpoint_argument,
    add_source_or_prompt,
    fraction,
    int_in,
    non_negative_int,
    path_name,
    picture_path,
    positive_int,
    source_ids,
)
from numpy_engine.gradcheck import TOLERANCE
from numpy_engine.models import KINDS
from numpy_engine.study import CHECKPOINT_LENGTH, EXAMPLE_ROWS

_TOLERANCE = f"{TOLERANCE:.0e}".replace("e-0", "e-")  # the grads verdict's: 1e-6, not 1e-06

MAX_ENTRIES = 64


def add_study_commands(commands) -> None:
    attention = commands.add_parser(
        "attention",
        help="draw the attention weights of every layer and head for one example",
        description="For a copy/reverse checkpoint and --source, draw the encoder "
        "self-attention, the decoder self-attention and the cross-attention of the greedy output; "
        "for a char-lm checkpoint and --prompt, MiniGPT's self-attention per layer and head. "
        "Needs the plot extra.",
    )
    add_checkpoint_argument(attention)
    add_source_or_prompt(
        attention, "drawn with the greedy output", "the text to look at, up to the model's context"
    )
    attention.add_argument(
        "--out",
        type=picture_path,
        default="attention.png",
        metavar="PNG",
        help="the picture to write (default: attention.png)",
    )
    attention.set_defaults(run=run_attention)

    plot = commands.add_parser(
        "plot",
        help="redraw loss.png from a training run's history.json",
        description="Draw training loss per step, held-out loss at evaluations and, for "
        "copy/reverse, exact match on a second axis. Needs the plot extra.",
    )
    plot.add_argument(
        "run_dir", type=path_name, metavar="DIR", help="the --out DIR of a training run"
    )
    plot.add_argument(
        "--out",
        type=picture_path,
        metavar="PNG",
        help="the picture to write (default: DIR/loss.png)",
    )
    plot.set_defaults(run=run_plot)

    grads = commands.add_parser(
        "grads",
        help="gradient norms per parameter, each next to a finite-difference estimate",
        description="Build the default model in float64 from --seed (or read a checkpoint's "
        "weights in float64), run one padded batch, and print each parameter's gradient norm; "
        "on a few sampled entries, the norm of the hand-written gradient, the norm of a central "
        f"finite-difference estimate, their relative error and a verdict: FAIL above {_TOLERANCE} "
        "(the command then names the parameters and exits 1), n/a where every sampled entry "
        "sat on a kink.",
    )
    which = grads.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        choices=list(KINDS),
        default="seq2seq",
        help="the model kind: seq2seq (the copy model), gpt (MiniGPT), ... (default: seq2seq)",
    )
    which.add_argument(
        "--checkpoint",
        type=path_name,
        metavar="PATH",
        help="instead, the model a checkpoint holds (a checkpoint.npz or a run directory), on a "
        f"batch of {EXAMPLE_ROWS} rows of at most {CHECKPOINT_LENGTH} positions; slow on a large "
        "model: each sampled entry costs about 4 of its forward passes (a 124M GPT-2: 5 min at "
        "--entries 1; --params narrows it)",
    )
    grads.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="the batch's seed, and the weights' without --checkpoint (default: 0)",
    )
    grads.add_argument(
        "--entries",
        type=int_in(1, MAX_ENTRIES),
        default=4,
        help=f"sampled entries per parameter for finite differences, 1..{MAX_ENTRIES} (each costs "
        "about 4 forward passes) (default: 4)",
    )
    grads.add_argument(
        "--params",
        default="*",
        metavar="PATTERN",
        help="only the parameters whose names match this shell-style pattern, quoted, e.g. "
        "'blocks.0.*' or '*attn*' (each row as in the whole table): on a large model, the "
        "layer you changed in minutes instead of the whole model (default: every parameter)",
    )
    grads.add_argument(
        "--plot", type=picture_path, metavar="PNG", help="also draw the gradient norms as bars"
    )
    grads.set_defaults(run=run_grads)
    add_eval_command(commands)


EVAL_BATCH_TOKENS = 4096  # eval's default batch: as many windows as hold this many tokens


def add_eval_command(commands) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="a language model's mean loss and perplexity on a text",
        description="Read --text with the checkpoint's tokenizer, cut it into windows of "
        "--context tokens in which every token but the first is predicted once, from the "
        "tokens before it in its window, and print (JSON) the mean next-token loss over them "
        "and its perplexity, exp(loss). A text held out of training measures what the model "
        "learned; the text it trained on, what it memorized.",
    )
    add_checkpoint_argument(evaluate)
    evaluate.add_argument(
        "--text", type=path_name, metavar="FILE", required=True, help="a UTF-8 text file"
    )
    evaluate.add_argument(
        "--context",
        type=positive_int,
        help="tokens a window holds, up to the model's positions (default: all of them)",
    )
    evaluate.add_argument(
        "--holdout",
        type=fraction,
        metavar="FRACTION",
        help="measure the text's last FRACTION of tokens alone: the part that train --holdout "
        "FRACTION kept out of training (with the run's --context, the loss it reported)",
    )
    evaluate.add_argument(
        "--batch-size",
        type=positive_int,
        help=f"windows a forward pass takes (default: as many as hold {EVAL_BATCH_TOKENS:,} "
        "tokens)",
    )
    evaluate.set_defaults(run=run_eval)


def run_attention(args: argparse.Namespace) -> int:
    from numpy_engine.checkpoint import load_checkpoint
    from numpy_engine.plots import plot_attention

    checkpoint = load_checkpoint(args.checkpoint, optimizer=False)
    model = checkpoint.model
    if model.continues_prompt:
        ids, labels = _prompt_ids(args, checkpoint)
    else:
        ids = source_ids(args.source, checkpoint)[0]
        labels = [str(i) for i in ids]
    print(f"wrote {plot_attention(model.attention_panels(ids, labels), args.out)}")
    return 0


def _prompt_ids(args: argparse.Namespace, checkpoint) -> tuple[np.ndarray, list[str]]:
    """The prompt's ids under the checkpoint's tokenizer, and each token's text as a label."""
    from numpy_engine.tasks import corpus_from_meta

    if args.prompt is None:
        raise InputError("this is a language-model checkpoint: give --prompt, not --source")
    corpus = corpus_from_meta(checkpoint.meta)
    ids = corpus.encode(args.prompt, what="--prompt")
    context = checkpoint.model.config.max_len
    if not 0 < len(ids) <= context:
        raise InputError(
            f"--prompt has {len(ids)} tokens; this model attends over 1 to "
            f"{context}, and the picture shows each of them"
        )
    return ids, [corpus.decode([i]) for i in ids]


def run_plot(args: argparse.Namespace) -> int:
    from numpy_engine.plots import plot_history
    from numpy_engine.saved_runs import history_problem

    run_dir = Path(args.run_dir)
    history_file = run_dir / "history.json"
    if not history_file.is_file():
        raise InputError(f"{run_dir}: {_no_history(run_dir)}")
    try:
        history = json.loads(history_file.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"{history_file}: cannot read the history ({error})") from None
    problem = history_problem(history)
    if problem:
        raise InputError(f"{history_file}: not a run's history: {problem}")
    out = args.out or run_dir / "loss.png"
    print(f"wrote {plot_history(history, out)}")
    return 0


def _no_history(run_dir: Path) -> str:
    """Why run_dir has no history to plot (its history.json is not a file)."""
    if not run_dir.exists():
        return "no such directory"
    if not run_dir.is_dir():
        return "a file, not a run directory"
    return "no history.json; plot redraws the losses of a run that train --out kept"


def run_grads(args: argparse.Namespace) -> int:
    from numpy_engine.study import gradient_study

    if args.plot:
        from numpy_engine.plots import check_matplotlib

        check_matplotlib()  # fail before the work, not after
    loss, rows = gradient_study(args.model, args.seed, args.entries, args.checkpoint, args.params)
    what = args.model if args.checkpoint is None else args.checkpoint
    chosen = "" if args.params == "*" else f"; the parameters matching {args.params!r}"
    print(f"{what}, seed {args.seed}: loss {loss:.6f} on one padded batch (float64){chosen}")
    # columns as wide as their longest entry, so GPT-2's long names and shapes stay aligned
    name_width = max(len("parameter"), *(len(r["name"]) for r in rows))
    shape_width = max(len("shape"), *(len(str(r["shape"])) for r in rows))
    header = (
        f"{'parameter':<{name_width}} {'shape':<{shape_width}} {'|grad|':>10}"
        f"   {'sampled entries: |grad|':>23} {'|finite diff|':>13} {'rel. error':>10}  verdict"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        sampled = f"{r['sampled_norm']:>23.6e} {r['fd_norm']:>13.6e} {r['rel_error']:>10.1e}"
        name, shape = f"{r['name']:<{name_width}}", f"{str(r['shape']):<{shape_width}}"
        print(f"{name} {shape} {r['grad_norm']:>10.3e}   {sampled}  {r['verdict']:>7}")
    print(_grads_summary(rows))
    if args.plot:
        from numpy_engine.plots import plot_grad_norms

        norms = {r["name"]: r["grad_norm"] for r in rows}
        title = f"{what}: gradient norm per parameter, one batch, seed {args.seed}"
        print(f"wrote {plot_grad_norms(norms, args.plot, title)}")
    return 1 if any(r["verdict"] == "FAIL" for r in rows) else 0


def _grads_summary(rows: list[dict]) -> str:
    """What the rel. error column measures, and which parameters failed (grads exits 1)."""
    failed = [r["name"] for r in rows if r["verdict"] == "FAIL"]
    unjudged = [r["name"] for r in rows if r["verdict"] == "n/a"]
    lines = [
        "rel. error: |grad - finite diff| on the sampled entries over the larger of their norms",
        "and a floor set by the finite difference's own rounding (a key bias's true gradient is",
        f"0); a correct backward reads below {_TOLERANCE}.",
    ]
    if unjudged:
        lines.append(f"n/a: every sampled entry of {', '.join(unjudged)} sat on a kink")
    if failed:
        lines.append(f"FAIL: {len(failed)} of {len(rows)} parameters: {', '.join(failed)}")
    else:
        lines.append(f"every judged parameter passed ({len(rows) - len(unjudged)} of {len(rows)})")
    return "\n".join(lines)


class EvalProgress:
    """A line on stream whenever loop.PROGRESS_SECONDS have gone by since the last (or the
    start): a 124M GPT-2 measures ~350 tokens a second here, a long text takes minutes."""

    def __init__(self, stream) -> None:
        self.stream, self.start = stream, time.perf_counter()
        self.last_line = self.start

    def __call__(self, measured: int, windows: int) -> None:
        from numpy_engine.loop import PROGRESS_SECONDS, duration

        now = time.perf_counter()
        if now - self.last_line < PROGRESS_SECONDS or measured == windows:
            return
        self.last_line, elapsed = now, now - self.start
        left = elapsed * (windows - measured) / measured
        line = f"eval: {measured:,} of {windows:,} windows  {duration(left)} left"
        print(line, file=self.stream, flush=True)


def run_eval(args: argparse.Namespace) -> int:
    import math

    from numpy_engine.checkpoint import load_checkpoint
    from numpy_engine.evaluation import heldout_loss
    from numpy_engine.tasks import every_target_once, read_text

    text = read_text(args.text)  # before a checkpoint that may take seconds to read
    checkpoint = load_checkpoint(args.checkpoint, optimizer=False)
    ids, context = _tokens_to_measure(args, text, checkpoint)
    model = checkpoint.model
    windows = every_target_once(ids, context, model.ignore_index())
    batch_size = args.batch_size or max(1, EVAL_BATCH_TOKENS // context)
    loss = heldout_loss(model, windows, batch_size, done=EvalProgress(sys.stderr))
    result = {"checkpoint": str(args.checkpoint), "text": args.text, "tokens": len(ids)}
    if args.holdout:
        result["holdout"] = args.holdout
    result |= {"targets": len(ids) - 1, "context": context, "loss": loss}
    print(json.dumps(result | {"perplexity": math.exp(loss)}, indent=2))
    return 0


def _tokens_to_measure(args: argparse.Namespace, text: str, checkpoint) -> tuple:
    """(the ids eval measures, the window length): text under the checkpoint's tokenizer,
    its held-out part with --holdout; each refused by name where it cannot be measured."""
    from numpy_engine.tasks import corpus_from_meta, split_off_heldout

    model = checkpoint.model
    if not model.continues_prompt:
        raise InputError(
            f"{args.checkpoint} holds a {model.kind} model, which reads a source: eval "
            "measures a language model on a text"
        )
    ids = corpus_from_meta(checkpoint.meta, text, "--text").ids
    if len(ids) < 2:
        raise InputError(f"--text is {len(ids)} token long: eval needs 2 or more (one to predict)")
    positions = model.config.max_len
    context = args.context or positions
    if context > positions:
        raise InputError(f"--context {context}: this model has {positions} positions")
    if args.holdout:  # the tokens training held out, split as it split them
        ids = split_off_heldout(ids, args.holdout, context)[1]
    return ids, context
