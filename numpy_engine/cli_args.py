"""What every `numpy-engine` command shares: argument types, the checkpoint argument, and the
one wrapper that turns errors into a message and an exit status (also for crosscheck/cli.py).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path

import numpy as np

from numpy_engine.checks import InputError
from numpy_engine.tasks import MAX_SEQUENCE_LENGTH, SEQUENCE_TASKS, SYMBOLS


def refuse_with_each_commands_usage(commands) -> None:
    """Make each command of `commands` (add_subparsers' result) its own default
    command_parser, which parse_command refuses unknown flags with."""
    for command in commands.choices.values():
        command.set_defaults(command_parser=command)


def parse_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parser's parsed arguments. A flag the command does not know is refused with that
    command's usage (`numpy-engine grads --checkpoint X` names grads and its flags), not the
    top-level one argparse would print; exit 2 either way."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _number(text: str, kind: type, what: str, within) -> int | float:
    """text read as kind (int or float) if within(value) holds, else the argument's one-line
    refusal, "must be {what}, got {text}": for text that is no number too (argparse's own
    refusal of a ValueError names the parsing function, "invalid positive_int value")."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not within(value):  # NaN fails every comparison
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, "a positive integer", lambda value: value >= 1)


def thread_count(text: str) -> int:
    """A benchmark's threads: more than the cores would time how they contend for them."""
    from numpy_engine.threads import usable_cores

    cores = usable_cores()
    what = f"an integer from 1 to the {cores} cores this process may use"
    return _number(text, int, what, lambda value: 1 <= value <= cores)


def non_negative_int(text: str) -> int:
    """A seed: NumPy's generators take any integer from 0 up."""
    return _number(text, int, "a non-negative integer", lambda value: value >= 0)


def positive_float(text: str) -> float:
    """A learning rate or a clipping norm: above 0 and finite ("1e400" reads as inf)."""
    return _number(text, float, "a positive finite number", lambda value: 0 < value < math.inf)


def non_negative_float(text: str) -> float:
    """A temperature: 0 (greedy) or above, finite."""
    return _number(text, float, "a finite number >= 0", lambda value: 0 <= value < math.inf)


def probability(text: str) -> float:
    """A share of probability mass, above 0 and at most 1 (top-p)."""
    return _number(text, float, "above 0 and at most 1", lambda value: 0 < value <= 1)


def dropout_rate(text: str) -> float:
    """A dropout rate: at least 0 and below 1 (at 1 nothing is kept)."""
    return _number(text, float, "at least 0 and below 1", lambda value: 0 <= value < 1)


def fraction(text: str) -> float:
    """A number strictly between 0 and 1 (a share of something: the text held out)."""
    return _number(text, float, "a fraction between 0 and 1", lambda value: 0 < value < 1)


def path_name(text: str) -> str:
    """A file's or directory's name, as given. An empty one (an unset shell variable, say) is
    refused: taken as it is, it named the current directory (--out "" trained and saved
    nothing) or nothing at all (--text "" trained on the built-in line)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a file or directory, got an empty name")
    return text


# what matplotlib writes, with Pillow (a dependency of its): pgf, raw and avif left out (they
# need LaTeX, are no picture, or a Pillow built with AVIF)
PICTURE_FORMATS = "png svg svgz pdf eps ps jpg jpeg tif tiff webp gif".split()


def picture_path(text: str) -> str:
    """A file to draw into, whose suffix names a format the pictures can be written in: checked
    before the work that ends in the picture (matplotlib's own refusal was a traceback)."""
    suffix = Path(text).suffix.lower().removeprefix(".")
    if suffix not in PICTURE_FORMATS:
        formats = ", ".join(f".{name}" for name in PICTURE_FORMATS)
        raise argparse.ArgumentTypeError(f"{text!r}: a picture's name ends in one of {formats}")
    return text


def new_file_path(text: str) -> str:
    """A file a command will write at its end (a benchmark's JSON): refused now if it could
    not be written there, not after minutes of work."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r}: the folder {str(path.parent)!r} does not exist"
        )
    return text


def name_in(names: tuple[str, ...]):
    """An argparse type: one of names, else a message listing them."""

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(names)}, got {text!r}")
        return text

    return parse


def int_in(low: int, high: int):
    """An argparse type: an integer from low to high, else a message naming the range."""

    def parse(text: str) -> int:
        return _number(text, int, f"an integer from {low} to {high}", lambda v: low <= v <= high)

    return parse


def refuse_to_overwrite(flag: str, value: str, paths: list[str], hint: str) -> None:
    """No command writes over what a user already has (a run, a checkpoint, a model
    directory, an exported file): refuse before any work is done, naming what is there."""
    there = [path for path in paths if os.path.exists(path)]
    if there:
        verb = "exists" if len(there) == 1 else "exist"
        raise InputError(f"{flag} {value}: {', '.join(there)} already {verb}; {hint}")


def refuse_a_file(flag: str, value: str) -> None:
    """flag names a directory to write into; an existing file there is the user's."""
    if os.path.isfile(value):
        raise InputError(f"{flag} {value} is a file, not a directory")


def refuse_an_existing_checkpoint(flag: str, out: str, hint: str = "") -> None:
    """out is where a checkpoint goes: a .npz path, or a directory that gets checkpoint.npz
    (a run's directory too); hint says what to do instead (default: give another flag)."""
    from numpy_engine.checkpoint import resolve

    if not out.endswith(".npz"):
        refuse_a_file(flag, out)
    refuse_to_overwrite(flag, out, [str(resolve(out))], hint or f"give another {flag}")


def add_checkpoint_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=path_name,
        metavar="PATH",
        help="a checkpoint.npz, or the --out DIR of a training run",
    )


def add_source_or_prompt(parser: argparse.ArgumentParser, source_use: str, prompt_use: str) -> None:
    """What the model reads: --source ids for a copy/reverse checkpoint, or a language model's
    --prompt (char-lm, lm)."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--source",
        type=int,
        nargs="+",
        metavar="ID",
        help=f"copy/reverse: the source symbols, ids {SYMBOLS[0]}..{SYMBOLS[-1]}, 1 to "
        f"{MAX_SEQUENCE_LENGTH} of them as in training (e.g. --source 4 7 9); {source_use}",
    )
    what.add_argument("--prompt", help=f"char-lm, lm: {prompt_use}")


def run_command(args: argparse.Namespace) -> int:
    """args.run(args), with each kind of failure as one line on stderr and its exit status:
    2 for the user's input (InputError) or a file, 1 for a run that stopped (divergence,
    memory, numerics), 128 + the signal for Ctrl-C (130) or a training run's SIGTERM (143).
    Anything else is a bug in the engine, and surfaces as a traceback."""
    try:
        # an overflow or a division by zero is an error with a message, never a raw warning;
        # invalid operations are silent (OpenBLAS can flag them spuriously) and a real NaN is
        # caught where it matters (training's check_finite)
        with np.errstate(over="raise", invalid="ignore", divide="raise"):
            return args.run(args)
    except BrokenPipeError:  # output piped into `head`: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt as stop:  # Ctrl-C: one line, not a traceback
        status = getattr(stop, "status", 128 + signal.SIGINT)  # TrainingInterrupted's own
        print(f"numpy-engine {args.command}: {str(stop) or 'interrupted'}", file=sys.stderr)
        return status
    except Exception as error:
        message, status = failure(args.command, error)
        if status is None:
            raise  # an engine bug: its traceback
        if message:
            print(message, file=sys.stderr)
        return status


def failure(command: str, error: BaseException) -> tuple[str | None, int | None]:
    """(the one line to print, the exit status) for an expected kind of failure; (None,
    None) for anything else, a bug."""
    from numpy_engine.parallel import PeerStopped
    from numpy_engine.train import TrainingDiverged

    if isinstance(error, PeerStopped):  # another rank failed and said why
        return None, error.status
    if isinstance(error, InputError | OSError):  # the user's input or files
        return f"numpy-engine {command}: error: {error}", 2
    if isinstance(error, TrainingDiverged):  # the last checkpoint is intact
        return f"numpy-engine {command}: stopped: {error}", 1
    if isinstance(error, MemoryError | FloatingPointError):
        kind = "out of memory" if isinstance(error, MemoryError) else "numerical error"
        return f"numpy-engine {command}: stopped: {kind}: {error}", 1
    return None, None


def id_ranges(ids: list[int]) -> str:
    """Sorted ids as runs: [0, 1, 2, 4, 6, 7] -> '0..2, 4, 6..7'."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1][-1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def source_ids(source: list[int] | None, checkpoint) -> np.ndarray:
    """--source as a (1, S) batch for a copy/reverse checkpoint: symbols only, the model adds
    PAD, BOS and EOS itself; a copy or reverse run's model knows the task's symbols (4..11,
    not the unused 3), and a source longer than its training sequences gets a note."""
    if source is None:
        raise InputError("this is a copy/reverse checkpoint: give --source, not --prompt")
    cfg, task = checkpoint.model.config, checkpoint.meta.get("task")
    specials = (cfg.pad_id, cfg.bos_id, cfg.eos_id)
    trained_on_task = task in SEQUENCE_TASKS
    symbols = SYMBOLS if trained_on_task else sorted(set(range(cfg.vocab_size)) - set(specials))
    outside = [i for i in source if i not in symbols]
    if outside:
        whose = f"the {task} task's " if trained_on_task else ""
        raise InputError(
            f"--source ids must be {whose}symbols {id_ranges(symbols)}, got {outside} "
            f"({', '.join(map(str, specials))} are PAD, BOS and EOS; the model adds them itself)"
        )
    if trained_on_task and len(source) > MAX_SEQUENCE_LENGTH:
        print(
            f"note: this {task} model learned sources of 1 to {MAX_SEQUENCE_LENGTH} symbols; "
            f"on {len(source)} it shows how far that generalizes",
            file=sys.stderr,
        )
    return np.array([source])
