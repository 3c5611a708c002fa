"""What dropout costs a training step: the engine's against torch's, in one run.

One workload of benchmarks/workloads.py (copy, char-lm, large, ...), or gpt2 (benchmarks/gpt2.py:
the real size, batch 4 x 64, against transformers' GPT2LMHeadModel in eval and in training
mode), float32, one thread. Four
sides take their steps in turns, each on the same batches: the engine without dropout and
with every rate at P, and the torch_reference twin without and with (in training mode: its
nn.Dropout modules, and the attention's weights dropped by F.dropout, written out as the
twin's attention is when it drops; torch's fused scaled_dot_product_attention with
dropout_p ran at the same speed here). Each step is a whole training step: loss, gradients,
clipping and the optimizer. Prints each side's median in ms, what dropout adds to each
(with / without), and engine / torch with dropout and without.

    python -m benchmarks.dropout                          # char-lm, P = 0.1, 40 rounds
    python -m benchmarks.dropout --config copy --rate 0.2 --rounds 60
    python -m benchmarks.dropout --config gpt2 --rounds 4    # ~2 s a step, 6 GB
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from benchmarks import gpt2
from benchmarks.bench import build, torch_step
from benchmarks.workloads import WORKLOADS, on_threads, timed
from crosscheck.convert import tensor, torch_model_for
from numpy_engine.cli_args import dropout_rate, positive_int
from numpy_engine.dropout import every_site, training_rng
from numpy_engine.memory import keep_freed_memory

SIDES = ("engine", "engine, dropout", "torch", "torch, dropout")
UNTIMED_ROUNDS = 3  # first steps: allocations, the BLAS's first calls


def measure(name: str, rate: float, rounds: int) -> dict[str, list[float]]:
    """Each side's step times in ms, `rounds` of them, the sides in turns on one thread."""
    keep_freed_memory()  # as bench.run: a step after another side's reuses freed pages
    steps = _sides(name, rate, rounds + UNTIMED_ROUNDS)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    torch.set_num_threads(1)
    with on_threads(1):
        for i in range(rounds + UNTIMED_ROUNDS):
            for side, step in steps.items():
                seconds, _ = timed(step, i)
                if i >= UNTIMED_ROUNDS:
                    times[side].append(1e3 * seconds)
    return times


def _sides(name: str, rate: float, n_batches: int) -> dict:
    """side name -> step(i): a training step on batch i, from the same initial weights."""
    if name == gpt2.WORKLOAD:
        return _gpt2_sides(rate, n_batches)
    plain, optimizer, batches, torch_optimizer_class = build(WORKLOADS[name], n_batches)
    rates = every_site(rate)
    dropping = type(plain).with_params(dataclasses.replace(plain.config, **rates), plain.params)
    dropping_optimizer = WORKLOADS[name].optimizer(dropping.params, lr=1e-3)
    twins = {"torch": torch_model_for(plain).train(), "torch, dropout": torch_model_for(dropping)}
    twins["torch, dropout"].train()  # made in eval mode: its dropout off
    torch_batches = [tuple(tensor(x) for x in batch) for batch in batches]

    def engine(model, model_optimizer, i: int, **dropout) -> float:
        loss, grads = model.loss_and_grads(*batches[i], **dropout)
        model_optimizer.step(model.flat, grads, max_grad_norm=1.0)
        return loss

    def twin_step(side: str):
        twin_optimizer = torch_optimizer_class(twins[side].parameters(), lr=1e-3)
        return lambda i: torch_step(twins[side], twin_optimizer, torch_batches[i])

    return {
        "engine": lambda i: engine(plain, optimizer, i),
        "engine, dropout": lambda i: engine(
            dropping, dropping_optimizer, i, dropout_rng=training_rng(0, i + 1)
        ),
        "torch": twin_step("torch"),
        "torch, dropout": twin_step("torch, dropout"),
    }


def _gpt2_sides(rate: float, n_batches: int) -> dict:
    """GPT-2 at its real size (benchmarks/gpt2.py's trainers): the engine's steps, and
    transformers' GPT2LMHeadModel's in eval mode and in training mode (its dropout on)."""
    plain = gpt2.engine_model()
    rates = every_site(rate)
    dropping = type(plain).with_params(dataclasses.replace(plain.config, **rates), plain.params)
    trainers = {
        "engine": gpt2.EngineTrainer(plain),
        "engine, dropout": gpt2.EngineTrainer(dropping),
    }
    trainers["torch"] = gpt2.TorchTrainer(plain)
    trainers["torch, dropout"] = gpt2.TorchTrainer(dropping)
    trainers["torch, dropout"].hf.train()
    data = gpt2.batches(n_batches, plain.config.vocab_size)
    return {side: _on_batches(trainer, data) for side, trainer in trainers.items()}


def _on_batches(trainer, data: list):
    return lambda i: trainer.step(data[i])


def report(name: str, rate: float, times: dict[str, list[float]]) -> str:
    median = {side: statistics.median(ms) for side, ms in times.items()}
    lines = [f"{name}, dropout {rate}, one thread, {len(times['engine'])} steps a side (ms):"]
    lines += [f"  {side:16} {median[side]:9.2f}" for side in SIDES]
    lines.append(
        f"  dropout adds: engine {median['engine, dropout'] / median['engine']:.3f}x, "
        f"torch {median['torch, dropout'] / median['torch']:.3f}x"
    )
    lines.append(
        f"  engine / torch: with dropout {median['engine, dropout'] / median['torch, dropout']:.3f}"
        f", without {median['engine'] / median['torch']:.3f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dropout",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--config",
        choices=[*WORKLOADS, gpt2.WORKLOAD],
        default="char-lm",
        help="the workload: one of benchmarks/workloads.py (copy, char-lm, large, long, "
        "long-seq2seq, wide-seq2seq), or gpt2, the 124M model against transformers (~6 GB) "
        "(default: char-lm)",
    )
    parser.add_argument(
        "--rate", type=dropout_rate, default=0.1, help="every site's rate (default: 0.1)"
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=40, help="timed steps a side (default: 40)"
    )
    args = parser.parse_args(argv)
    print(report(args.config, args.rate, measure(args.config, args.rate, args.rounds)))


if __name__ == "__main__":
    main()
