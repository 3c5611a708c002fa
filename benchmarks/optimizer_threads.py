"""The optimizer's step on the engine's threads (numpy_engine/threads.py) against one thread
and against torch's AdamW on as many, over a vector of GPT-2's size.

AdamW with clipping at 1.0, float32, random gradients of 1e-3: the engine on one thread,
the engine on N, and torch.optim.AdamW (its default, foreach) after
torch.nn.utils.clip_grad_norm_ on N threads, in turns, each timed step after an untimed
one of its own (a library's idle threads spin for a while after its last call and would
take the other's cores) and 64 MB streamed through the caches (a training step's optimizer
finds its vectors in memory). BLAS is not used. Prints each median in ms, the ratios, and
whether the engine's two runs ended on the same bits (they must: threads.py).

    python -m benchmarks.optimizer_threads                  # 2 threads, GPT-2's 124M, 8 rounds
    python -m benchmarks.optimizer_threads --threads 4 --rounds 12
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from benchmarks.workloads import on_threads, timed
from numpy_engine.cli_args import positive_int
from numpy_engine.optim import AdamW
from numpy_engine.threads import set_threads

GPT2_PARAMETERS = 124_439_808
FLUSH_BYTES = 64 << 20


def measure(size: int, threads: int, rounds: int) -> dict:
    """Seconds of each side's step, each round in turn, whether the engine's two parameter
    vectors ended equal, and what each side did (its steps, torch's and the engine's
    parameters: the same updates to float32 rounding)."""
    import torch

    rng = np.random.default_rng(0)
    start = 0.02 * rng.standard_normal(size, dtype=np.float32)  # float32 (NEP 50)
    grad = 1e-3 * rng.standard_normal(size, dtype=np.float32)
    one, many = start.copy(), start.copy()
    optimizers = {"one": AdamW({"w": one}, lr=1e-4), "many": AdamW({"w": many}, lr=1e-4)}
    tensor = torch.tensor(start, requires_grad=True)
    tensor.grad = torch.tensor(grad)
    torch_adamw = torch.optim.AdamW([tensor], lr=1e-4)
    flush = np.ones(FLUSH_BYTES // 4, np.float32)

    def torch_step() -> None:
        torch.nn.utils.clip_grad_norm_([tensor], 1.0)
        torch_adamw.step()

    sides = {
        "engine, 1 thread": (1, lambda: optimizers["one"].step(one, grad, max_grad_norm=1.0)),
        f"engine, {threads} threads": (
            threads,
            lambda: optimizers["many"].step(many, grad, max_grad_norm=1.0),
        ),
        f"torch, {threads} threads": (threads, torch_step),
    }
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    torch.set_num_threads(threads)
    with on_threads(threads):
        for _ in range(rounds):
            for name, (n, step) in sides.items():
                set_threads(n)
                step()  # untimed: the other side's idle threads have gone back to sleep
                flush.sum()  # the caches hold other data, as after a backward
                seconds[name].append(timed(step)[0])
    return {
        "seconds": seconds,
        "same bits": bool(np.array_equal(one, many)),
        "steps": {"engine": [o.step_count for o in optimizers.values()]},
        "torch": {"steps": int(torch_adamw.state[tensor]["step"]), "params": tensor.detach()},
        "engine params": one,
    }


def report(size: int, threads: int, rounds: int, result: dict) -> str:
    ms = {name: 1e3 * statistics.median(times) for name, times in result["seconds"].items()}
    one, many, torch_ms = ms.values()
    lines = [
        f"AdamW with clipping, {size:,} float32 parameters, median of {rounds} rounds:",
        *(f"  {name:<20} {value:9.1f} ms" for name, value in ms.items()),
        f"  engine {threads} threads / engine 1 thread: {many / one:.3f}",
        f"  engine {threads} threads / torch {threads} threads: {many / torch_ms:.3f}",
        f"  the engine's two runs ended on the same bits: {result['same bits']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.optimizer_threads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=2,
        help="threads for the engine's second run and for torch (default: 2)",
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=8, help="timed steps of each side (default: 8)"
    )
    parser.add_argument(
        "--size",
        type=positive_int,
        default=GPT2_PARAMETERS,
        help=f"parameters in the vector updated (default: GPT-2's, {GPT2_PARAMETERS:,})",
    )
    args = parser.parse_args(argv)
    result = measure(args.size, args.threads, args.rounds)
    print(report(args.size, args.threads, args.rounds, result))


if __name__ == "__main__":
    main()
