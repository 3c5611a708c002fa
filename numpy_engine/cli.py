"""The `numpy-engine` command line (also `python -m numpy_engine`)."""

from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numpy-engine",
        description="A transformer in pure NumPy with hand-written backward passes.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parity = commands.add_parser(
        "parity",
        help="compare every gradient with the PyTorch reference on one padded batch",
        description="Build the engine model and its PyTorch twin from one seed, run one padded "
        "batch through both, and print each tensor's difference. Exits 1 if any row fails. "
        "Needs the test extra (PyTorch).",
    )
    parity.add_argument(
        "--model", choices=["seq2seq", "gpt"], default="seq2seq",
        help="seq2seq: the copy-task encoder-decoder; gpt: the character MiniGPT "
        "(default: seq2seq)",
    )  # fmt: skip
    parity.add_argument(
        "--dtype", choices=["float32", "float64"], default="float64",
        help="float64: agree within 1e-10 relative; float32: no worse than 4x torch's own "
        "float32 error against a float64 run (default: float64)",
    )  # fmt: skip
    parity.add_argument("--seed", type=int, default=0, help="weights and batch seed (default: 0)")
    parity.set_defaults(run=run_parity)
    return parser


def run_parity(args: argparse.Namespace) -> int:
    try:
        from torch_reference.report import report
    except ImportError as error:
        print(f"numpy-engine parity needs PyTorch ({error}); install the test extra: "
              "pip install -e '.[test]'", file=sys.stderr)  # fmt: skip
        return 2
    lines, ok = report(args.model, args.dtype, args.seed)
    print("\n".join(lines))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # output piped into `head`: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
