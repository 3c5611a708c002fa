"""The `numpy-engine` command line (also `python -m numpy_engine`).

    numpy-engine train copy|reverse|char-lm [--steps --seed --lr --batch-size --out DIR ...]
    numpy-engine generate --checkpoint DIR (--source 4 7 9 | --prompt "to ") [--temperature ...]
    numpy-engine import-hf DIR --out RUN | export-hf --checkpoint RUN --to DIR   (GPT-2)
    numpy-engine parity | export | import | bench ...   (run by crosscheck/cli.py)

Progress goes to stderr, results (JSON, generated text) to stdout. A mistake in the
input exits with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import signal
import subprocess
import sys

import numpy as np

from numpy_engine import __version__
from numpy_engine.cli_args import parse_command, refuse_with_each_commands_usage, run_command
from numpy_engine.cli_generate import add_generate_command
from numpy_engine.cli_hf import add_hf_commands
from numpy_engine.cli_info import add_info_command
from numpy_engine.cli_study import add_study_commands
from numpy_engine.cli_train import add_train_command

TORCH_COMMANDS = {
    "parity": "compare every gradient with the PyTorch reference on one padded batch",
    "export": "write a checkpoint's weights as a PyTorch state_dict (.pt)",
    "import": "turn a PyTorch state_dict (.pt) into an engine checkpoint",
    "bench": "time training steps against the PyTorch reference",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numpy-engine",
        description="A transformer in pure NumPy with hand-written backward passes.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_train_command(commands)
    add_generate_command(commands)
    add_info_command(commands)
    add_study_commands(commands)
    add_hf_commands(commands)
    for name, summary in TORCH_COMMANDS.items():  # listed in --help; run by crosscheck
        commands.add_parser(name, help=f"{summary} (needs the test extra)", add_help=False)
    refuse_with_each_commands_usage(commands)
    return parser


def version_line() -> str:
    """What `numpy-engine --version` prints: this package's version, and the NumPy and Python
    it runs on (what a bug report needs)."""
    return (
        f"numpy-engine {__version__} (NumPy {np.__version__}, Python {platform.python_version()})"
    )


def forward_to_crosscheck(argv: list[str]) -> int:
    """Run a PyTorch-backed command as its own program, `python -m crosscheck`.

    The engine never imports torch, not even lazily: parity, export, import and bench
    live in crosscheck/cli.py, and this process only hands the arguments over.
    """
    if importlib.util.find_spec("torch") is None:
        print(
            f"numpy-engine {argv[0]}: error: this command needs PyTorch; install the test "
            "extra: pip install -e '.[test]'",
            file=sys.stderr,
        )
        return 2
    try:
        return subprocess.run([sys.executable, "-m", "crosscheck", *argv]).returncode
    except KeyboardInterrupt:  # Ctrl-C reached the command too, which says so (run_command)
        return 128 + signal.SIGINT


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TORCH_COMMANDS:
        return forward_to_crosscheck(argv)
    return run_command(parse_command(build_parser(), argv))


if __name__ == "__main__":
    sys.exit(main())
