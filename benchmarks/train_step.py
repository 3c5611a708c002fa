"""Training-step speed and memory: the engine against torch_reference, in the same run.

    python -m benchmarks.train_step                      # all configs, one BLAS thread
    python -m benchmarks.train_step --configs copy --steps 50 --no-memory
    numpy-engine bench                                   # the same, installed

The work is in torch_reference/bench.py (so that `numpy-engine bench` has it too).
"""

from __future__ import annotations

import argparse

from torch_reference.bench import CONFIGS, main


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                        help="which configurations (default: all)")  # fmt: skip
    parser.add_argument(
        "--steps",
        type=int,
        default=40,
        help="timed steps per config; large times a fifth of it (default 40)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS / torch threads (default 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    main(args.configs, args.steps, args.warmup, args.threads, not args.no_memory, args.json)
