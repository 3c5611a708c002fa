"""The PyTorch-backed commands of `numpy-engine`: parity, export, import, bench.

`numpy-engine parity ...` hands its arguments to `python -m crosscheck parity ...`,
so the engine's own process never imports torch. Run directly, this is the same program.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from numpy_engine.checks import InputError
from numpy_engine.cli_args import (
    add_checkpoint_argument,
    new_file_path,
    non_negative_int,
    parse_command,
    path_name,
    positive_int,
    refuse_an_existing_checkpoint,
    refuse_to_overwrite,
    refuse_with_each_commands_usage,
    run_command,
    thread_count,
)
from numpy_engine.models import KINDS
from numpy_engine.study import CHECKPOINT_LENGTH, EXAMPLE_ROWS


def add_parity_command(commands) -> None:
    parity = commands.add_parser(
        "parity",
        help="compare every gradient with the PyTorch reference on one padded batch",
        description="Build the engine model and its PyTorch twin from one seed (or give both a "
        "checkpoint's weights), run one padded batch through both, and print each tensor's "
        "difference. Exits 1 if any row fails. Needs the test extra (PyTorch).",
    )
    which = parity.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        choices=list(KINDS),
        default="seq2seq",
        help="seq2seq: the copy-task encoder-decoder; gpt: the character MiniGPT; gpt2: a small "
        "GPT-2, against transformers (default: seq2seq)",
    )
    which.add_argument(
        "--checkpoint",
        type=path_name,
        metavar="PATH",
        help="instead, the model a checkpoint holds (a checkpoint.npz or a run directory, e.g. "
        f"an imported GPT-2): its weights in both libraries, on a batch of {EXAMPLE_ROWS} rows "
        f"of at most {CHECKPOINT_LENGTH} positions",
    )
    parity.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        default="float64",
        help="float64: agree within 1e-10 relative; float32: within the rounding bound of "
        "crosscheck/compare.py, against a float64 run on the same weights (default: float64)",
    )
    parity.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="the batch's seed, and the weights' without --checkpoint (default: 0)",
    )
    parity.set_defaults(run=run_parity)


def add_interchange_commands(commands) -> None:
    export = commands.add_parser(
        "export",
        help="write a checkpoint's weights as a PyTorch state_dict (.pt)",
        description="Write model.pt, a state_dict that torch_reference loads with "
        "torch.load(path, weights_only=True) and load_state_dict(strict=True), and model.pt.json "
        "with the model's kind and config. Needs PyTorch (the test extra).",
    )
    add_checkpoint_argument(export)
    export.add_argument(
        "--to", required=True, type=path_name, metavar="FILE", help="the .pt file to write"
    )
    export.set_defaults(run=run_export)
    imp = commands.add_parser(
        "import",
        help="turn a PyTorch state_dict (.pt) into an engine checkpoint",
        description="Load a state_dict with torch's weights-only loader (anything else is "
        "refused) and write DIR/checkpoint.npz. Needs PyTorch (the test extra).",
    )
    imp.add_argument("state_dict", type=path_name, metavar="FILE", help="the .pt file")
    imp.add_argument(
        "--out", required=True, type=path_name, metavar="DIR", help="where checkpoint.npz goes"
    )
    imp.add_argument(
        "--config",
        type=path_name,
        metavar="JSON",
        help="the model description (default: FILE.json, as export writes it)",
    )
    imp.set_defaults(run=run_import)


def add_bench_command(commands) -> None:
    bench = commands.add_parser(
        "bench",
        help="time training steps against the PyTorch reference (needs the test extra)",
        description="Train the engine and torch_reference side by side on the same weights and "
        "batches, alternating, and print ms per step, the ratio, GFLOP/s against this machine's "
        "matmul peak, each engine's peak memory, and the engine's NumPy calls per step, under a "
        "line naming the processor and each library's BLAS (the ratios depend on both). Configs: "
        "copy, char-lm, large, long (char-lm's model over 1024 positions), long-seq2seq (the "
        "encoder-decoder at char-lm's widths over 1000 positions), wide-seq2seq (the same over "
        "heads of 64, as GPT-2's); and gpt2, the 124M model against Hugging Face transformers "
        "(training step, memory, generation).",
    )
    bench.add_argument(
        "--configs",
        nargs="+",
        choices=["copy", "char-lm", "large", "long", "long-seq2seq", "wide-seq2seq", "gpt2"],
        default=["copy", "char-lm", "large", "long", "long-seq2seq", "wide-seq2seq"],
        help="the workloads to time (default: copy char-lm large long long-seq2seq "
        "wide-seq2seq; gpt2, the 124M model against transformers, takes about three minutes "
        "more)",
    )
    bench.add_argument(
        "--steps",
        type=positive_int,
        default=40,
        help="timed steps per config (default: 40); large and wide-seq2seq time a fifth, gpt2 "
        "half (its pairs disagree by 10-20 percent: fewer than 20 do not measure a few percent)",
    )
    bench.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="BLAS and torch threads, at most the cores this process may use (default: 1)",
    )
    bench.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    bench.add_argument(
        "--data-parallel",
        action="store_true",
        help="instead, for char-lm and large: steps/s of the engine on 1 and 2 MPI ranks and "
        "of PyTorch DDP on 2 processes (needs the mpi extra)",
    )
    bench.add_argument(
        "--json", type=new_file_path, metavar="FILE", help="also write the results as JSON"
    )
    bench.set_defaults(run=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from benchmarks.bench import main as bench_main

    if args.data_parallel:
        from benchmarks import parallel

        configs = [name for name in args.configs if name in parallel.CONFIGS]
        if not configs:
            raise InputError(f"--data-parallel measures {' and '.join(parallel.CONFIGS)}")
        results = parallel.run(configs, args.steps)
        print(parallel.table(results))
    else:
        results = bench_main(args.configs, args.steps, 3, args.threads, not args.no_memory)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from crosscheck.interchange import export_checkpoint

    files = [args.to, f"{args.to}.json"]  # the state dict and its description
    refuse_to_overwrite("--to", args.to, files, "give another --to")
    written = export_checkpoint(args.checkpoint, args.to)
    print(f"wrote {written} and {written}.json")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from crosscheck.interchange import import_state_dict

    refuse_an_existing_checkpoint("--out", args.out)
    written = import_state_dict(args.state_dict, args.out, args.config)
    print(f"wrote {written}")
    return 0


def run_parity(args: argparse.Namespace) -> int:
    from crosscheck.report import report

    lines, ok = report(args.model, args.dtype, args.seed, args.checkpoint)
    print("\n".join(lines))
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numpy-engine", description="The commands that compare the engine with PyTorch."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_parity_command(commands)
    add_interchange_commands(commands)
    add_bench_command(commands)
    refuse_with_each_commands_usage(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(parse_command(build_parser(), argv))


if __name__ == "__main__":
    sys.exit(main())
