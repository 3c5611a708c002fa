"""The `numpy-engine` command line (also `python -m numpy_engine`).

    numpy-engine train copy|reverse|char-lm [--steps --seed --lr --batch-size --out DIR ...]
    numpy-engine generate --checkpoint DIR (--source 4 7 9 | --prompt "to ") [--temperature ...]
    numpy-engine parity | export | import | bench ...   (run by torch_reference/cli.py)

Progress goes to stderr, results (JSON, generated text) to stdout. A mistake in the
input exits with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from numpy_engine.cli_study import add_study_commands

TORCH_COMMANDS = {
    "parity": "compare every gradient with the PyTorch reference on one padded batch",
    "export": "write a checkpoint's weights as a PyTorch state_dict (.pt)",
    "import": "turn a PyTorch state_dict (.pt) into an engine checkpoint",
    "bench": "time training steps against the PyTorch reference",
}
TASK_DEFAULTS = {  # the reference runs
    "copy": {"steps": 800, "lr": 1e-3},
    "reverse": {"steps": 1000, "lr": 1e-3},
    "char-lm": {"steps": 300, "lr": 3e-3},
}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_train_command(commands) -> None:
    train = commands.add_parser(
        "train", help="train a model on a task and print a JSON result",
        description="Train with hand-written gradients. Progress lines go to stderr; the final "
        "JSON result (losses, exact match, examples) goes to stdout.",
    )  # fmt: skip
    train.add_argument("task", nargs="?", choices=list(TASK_DEFAULTS),
                       help="copy / reverse: the encoder-decoder on 1-3 symbol sequences; "
                       "char-lm: MiniGPT on a character corpus")  # fmt: skip
    train.add_argument(
        "--steps",
        type=positive_int,
        help="optimizer steps (default: copy 800, reverse 1000, char-lm 300)",
    )
    train.add_argument(
        "--seed",
        type=int,
        default=7,
        help="seeds the data split, the initial weights and the batches (default: 7)",
    )
    train.add_argument(
        "--lr",
        type=positive_float,
        help="learning rate (default: 1e-3 Adam for copy/reverse, 3e-3 AdamW for char-lm)",
    )
    train.add_argument("--batch-size", type=positive_int, default=32, help="default: 32")
    train.add_argument(
        "--clip",
        type=positive_float,
        default=1.0,
        help="clip the global gradient norm to this (default: 1.0)",
    )
    train.add_argument(
        "--eval-every",
        type=positive_int,
        default=100,
        help="copy/reverse: evaluate on the held-out split every N steps (default: 100)",
    )
    train.add_argument(
        "--context",
        type=positive_int,
        default=32,
        help="char-lm: characters per training window (default: 32)",
    )
    train.add_argument(
        "--text",
        metavar="FILE",
        help="char-lm: a UTF-8 text file to train on (default: a built-in line of Hamlet)",
    )
    train.add_argument(
        "--out", metavar="DIR", help="keep result.json, history.json and checkpoint.npz in DIR"
    )
    train.add_argument(
        "--checkpoint-every",
        type=positive_int,
        metavar="N",
        help="with --out: also save checkpoint.npz every N steps, for --resume",
    )
    train.add_argument("--resume", metavar="DIR",
                       help="continue the run whose checkpoint is in DIR (no TASK); bit for bit "
                       "as if it had not stopped")  # fmt: skip
    train.add_argument(
        "--plot",
        action="store_true",
        help="with --out: also draw DIR/loss.png (needs the plot extra)",
    )
    train.add_argument("--quiet", action="store_true", help="no progress lines")
    train.set_defaults(run=run_train)


def add_generate_command(commands) -> None:
    gen = commands.add_parser(
        "generate", help="generate from a trained checkpoint",
        description="Greedy decoding from a copy/reverse checkpoint (--source), or greedy / "
        "sampled text from a char-lm checkpoint (--prompt).",
    )  # fmt: skip
    gen.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="a checkpoint.npz, or the --out DIR of a training run",
    )
    what = gen.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--source",
        type=int,
        nargs="+",
        metavar="ID",
        help="copy/reverse: the source symbols, ids 4..11 (e.g. --source 4 7 9)",
    )
    what.add_argument("--prompt", help='char-lm: the text to continue (e.g. --prompt "to ")')
    gen.add_argument(
        "--max-new-tokens",
        type=positive_int,
        help="tokens to generate (default: 4 for copy/reverse, EOS included; 80 for char-lm)",
    )
    gen.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="char-lm: 0 is greedy; above 0 samples from softmax(logits / T) (default: 0)",
    )
    gen.add_argument("--top-k", type=positive_int, help="char-lm: sample among the k likeliest")
    gen.add_argument(
        "--top-p",
        type=positive_float,
        help="char-lm: sample among the likeliest whose mass reaches p (0 < p <= 1)",
    )
    gen.add_argument("--seed", type=int, default=0, help="char-lm: the sampler's seed (default: 0)")
    gen.add_argument("--no-cache", action="store_true",
                     help="rerun the whole prefix at every step instead of using the KV cache "
                     "(same output, slower; for comparison)")  # fmt: skip
    gen.set_defaults(run=run_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numpy-engine",
        description="A transformer in pure NumPy with hand-written backward passes.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_train_command(commands)
    add_generate_command(commands)
    add_study_commands(commands)
    for name, summary in TORCH_COMMANDS.items():  # listed in --help; run by torch_reference
        commands.add_parser(name, help=f"{summary} (needs the test extra)", add_help=False)
    return parser


# -------------------------------------------------------------------------- commands


def run_train(args: argparse.Namespace) -> int:
    from numpy_engine import train

    stream = None if args.quiet else sys.stderr
    if args.plot:
        from numpy_engine.plots import check_matplotlib

        check_matplotlib()  # fail before training, not after
        if not (args.out or args.resume):
            raise ValueError("--plot needs --out DIR (where loss.png goes)")
    if args.checkpoint_every and not (args.out or args.resume):
        raise ValueError("--checkpoint-every needs --out DIR (where the checkpoints go)")
    if args.resume:
        if args.task:
            raise ValueError("--resume continues a saved run: give no TASK with it")
        run = train.resume(args.resume, stream, args.checkpoint_every)
        out = args.resume
    else:
        if not args.task:
            raise ValueError("give a TASK (copy, reverse or char-lm) or --resume DIR")
        run, out = _train_new(args, stream), args.out
    if out:
        train.save_run(run, out)
        run.result["out"] = str(out)
        if args.plot:
            from numpy_engine.plots import plot_history

            run.result["plot"] = str(plot_history(run.history, Path(out) / "loss.png"))
    print(json.dumps(run.result, indent=2))
    return 0


def _train_new(args: argparse.Namespace, stream):
    from numpy_engine import train
    from numpy_engine.tasks import read_text

    steps = args.steps or TASK_DEFAULTS[args.task]["steps"]
    lr = args.lr or TASK_DEFAULTS[args.task]["lr"]
    checkpointing = None
    if args.checkpoint_every:
        checkpointing = train.Checkpointing(Path(args.out), args.checkpoint_every)
    if args.task == "char-lm":
        text = read_text(args.text) if args.text else None
        cfg = train.CharTrainConfig(steps=steps, seed=args.seed, lr=lr, batch_size=args.batch_size,
                                    context=args.context, clip=args.clip)  # fmt: skip
        return train.train_char_lm(cfg, text, stream, checkpointing)
    if args.text:
        raise ValueError("--text is for char-lm only")
    cfg = train.SequenceTrainConfig(task=args.task, steps=steps, seed=args.seed, lr=lr,
                                    batch_size=args.batch_size, clip=args.clip,
                                    eval_every=args.eval_every)  # fmt: skip
    return train.train_sequence_task(cfg, None, stream, checkpointing)


def run_generate(args: argparse.Namespace) -> int:
    from numpy_engine.checkpoint import load_checkpoint
    from numpy_engine.generate import generate, greedy_decode
    from numpy_engine.tasks import CharCorpus

    checkpoint = load_checkpoint(args.checkpoint)
    meta, model = checkpoint.meta, checkpoint.model
    if meta.get("task") == "char-lm":
        if args.prompt is None:
            raise ValueError("this is a char-lm checkpoint: give --prompt, not --source")
        corpus = CharCorpus(meta["vocabulary"])
        ids = corpus.encode(args.prompt)
        if len(ids) == 0:
            raise ValueError("--prompt is empty")
        out = generate(model, ids, args.max_new_tokens or 80, args.temperature, args.top_k,
                       args.top_p, seed=args.seed, use_cache=not args.no_cache)  # fmt: skip
        print(corpus.decode(out[0]))
        return 0
    if args.source is None:
        raise ValueError("this is a copy/reverse checkpoint: give --source, not --prompt")
    vocab = model.config.vocab_size
    if any(not 0 < i < vocab for i in args.source):
        raise ValueError(f"--source ids must be in 1..{vocab - 1}, got {args.source}")
    source = np.array([args.source])
    generated = greedy_decode(model, source, args.max_new_tokens or 4, use_cache=not args.no_cache)
    print(" ".join(str(int(i)) for i in generated[0]))
    return 0


def forward_to_torch_reference(argv: list[str]) -> int:
    """Run a PyTorch-backed command as its own program, `python -m torch_reference`.

    The engine never imports torch, not even lazily: parity, export, import and bench
    live in torch_reference/cli.py, and this process only hands the arguments over.
    """
    if importlib.util.find_spec("torch") is None:
        print(f"numpy-engine {argv[0]}: error: this command needs PyTorch; install the test "
              "extra: pip install -e '.[test]'", file=sys.stderr)  # fmt: skip
        return 2
    return subprocess.run([sys.executable, "-m", "torch_reference", *argv]).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TORCH_COMMANDS:
        return forward_to_torch_reference(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # output piped into `head`: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, OSError) as error:  # the user's input: a message, no traceback
        print(f"numpy-engine {args.command}: error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # training diverged: the last checkpoint is intact
        print(f"numpy-engine {args.command}: stopped: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
