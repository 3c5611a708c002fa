"""The benchmark workloads, torch-free: a model, its optimizer, seeded batches, one step.

benchmarks/bench.py times these against PyTorch; a memory probe runs them in a
process that never imports torch, so its peak memory is the engine's own.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from numpy_engine.cli_args import positive_int
from numpy_engine.memory import keep_freed_memory
from numpy_engine.models import model_class
from numpy_engine.optim import Adam, AdamW
from numpy_engine.threads import set_threads, threads


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # a registered model kind (numpy_engine/models)
    model: dict  # config overrides
    batch_size: int
    length: int  # positions (a seq2seq model's source length)
    optimizer: type  # the engine's; torch.optim's class of the same name is its twin
    matmul_floor: bool = False  # also time the step's matmuls alone (a decoder-only GPT)


WORKLOADS = {
    "copy": Workload("copy", "seq2seq", {}, 32, 3, Adam),
    "char-lm": Workload("char-lm", "gpt", {}, 32, 32, AdamW, matmul_floor=True),
    "large": Workload(
        "large",
        "gpt",
        dict(vocab_size=65, d_model=256, n_heads=8, d_ff=1024, n_layers=4, max_len=128),
        32,
        128,
        AdamW,
        matmul_floor=True,
    ),
    # char-lm's model over 1024 positions, GPT-2's context (`train char-lm --context 1024`),
    # batch 2: causal attention's (T, T) scores outgrow the rest of the step. No matmul floor:
    # the floor's products are those of every score, where a causal engine may skip the
    # hidden ones
    "long": Workload("long", "gpt", dict(max_len=1024), 2, 1024, AdamW),
    # the encoder-decoder at char-lm's widths over 1000 positions, batch 2: three attentions a
    # step under padding masks (the decoder's causal too), whose (T, T) scores outgrow the
    # rest. Not copy's model: its 8-wide heads already ran ahead of torch there (0.884)
    "long-seq2seq": Workload("long-seq2seq", "seq2seq", dict(d_model=64, d_ff=256), 2, 1000, Adam),
    # the same over heads as wide as GPT-2's (256 channels in 4 heads of 64, d_ff 1024): the
    # products weigh more than the (T, T) passes there
    "wide-seq2seq": Workload(
        "wide-seq2seq", "seq2seq", dict(d_model=256, n_heads=4, d_ff=1024), 2, 1000, Adam
    ),
}


def build(workload: Workload, n_batches: int):
    """The float32 engine model, its optimizer, and n_batches seeded example batches."""
    rng = np.random.default_rng(0)
    kind = model_class(workload.kind)
    model = kind(kind.config_class(**workload.model), seed=0)
    B, length = workload.batch_size, workload.length
    batches = [kind.example_batch(model.config, rng, B, length) for _ in range(n_batches)]
    return model, workload.optimizer(model.params, lr=1e-3), batches


@contextlib.contextmanager
def on_threads(n: int):
    """NumPy's BLAS and the engine's elementwise blocks (numpy_engine/threads.py) on n threads
    for the block's time; torch's threads are the caller's to set (torch.set_num_threads)."""
    from threadpoolctl import threadpool_limits

    before = threads()
    set_threads(n)
    try:
        with threadpool_limits(n):
            yield
    finally:
        set_threads(before)


def timed(fn, *args) -> tuple[float, object]:
    """(seconds fn(*args) took, its result): the one stopwatch of the benchmarks."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


SETTLE_SECONDS = 0.1  # of untimed steps a side takes before its timed turn (threads > 1)
STEPS_PER_TURN = 5  # timed steps a side takes in a row (threads > 1)


def alternate(sides: tuple[Callable, Callable], pairs: int, threads: int) -> tuple[list, list]:
    """Time `pairs` steps of each of two sides, the sides taking turns. side(i) takes that
    side's step on the run's i-th batch; both sides take the same steps on the same batches.
    Returns each side's [(seconds, result), ...].

    One thread: one step each in turn, so that each pair of steps shares the machine's
    drift. More threads: after its last call a library's idle BLAS threads keep spinning
    for a while and take cores from the other library's threads. Measured at two threads:
    torch's char-lm step took 33.7 ms right after engine steps and 14.9 ms after its own,
    the engine's 22.8 and 17.3; a 2-thread product of one library straight after one of
    the other took ~4 ms against ~0.5, and 0.7-0.9 after 25 ms of anything else. So each
    side takes turns of STEPS_PER_TURN timed steps, after untimed steps that last at least
    SETTLE_SECONDS: as many as SETTLE_SECONDS holds of the fastest step seen so far (an
    untimed probe step of each side first)."""
    if threads == 1:
        return _take_turns(sides, pairs, turn=1, start=0, fastest=None)
    probe = [timed(side, 0)[0] for side in sides]
    return _take_turns(sides, pairs, STEPS_PER_TURN, start=1, fastest=min(probe))


def _take_turns(
    sides, pairs: int, turn: int, start: int, fastest: float | None
) -> tuple[list, list]:
    """alternate's loop: turns of `turn` timed steps from the run's batch `start` on, each
    side's turn after ceil(SETTLE_SECONDS / fastest) untimed steps (none if fastest is None)."""
    times: tuple[list, list] = ([], [])
    i = start
    while len(times[0]) < pairs:
        k = min(turn, pairs - len(times[0]))
        settle = 0 if fastest is None else math.ceil(SETTLE_SECONDS / fastest)
        for side, out in zip(sides, times, strict=True):
            for j in range(settle):
                side(i + j)
            out.extend(timed(side, i + settle + j) for j in range(k))
            if fastest is not None:
                fastest = min(fastest, *(seconds for seconds, _ in out[-k:]))
        i += settle + k
    return times


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of numerators[i] / denominators[i], each pair timed back to back: this
    machine's speed drifts, a pair shares the drift, so the pairs' ratios move less than
    the ratio of the two medians."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def middle_half(numerators: list[float], denominators: list[float]) -> tuple[float, float]:
    """(first, third) quartile of the pairs' ratios: how much the pairs disagree. Printed
    beside their median because a few pairs mislead: runs of 4 GPT-2 pairs of nearly the
    same code read 0.79 to 1.04 (docs/performance-log.md, section 2). One pair: its ratio twice."""
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    if len(ratios) == 1:
        return ratios[0], ratios[0]
    first, _, third = statistics.quantiles(ratios, n=4, method="inclusive")
    return first, third


def spread(quartiles: tuple[float, float]) -> str:
    """middle_half as the benchmarks print it: "first-third"."""
    return f"{quartiles[0]:.2f}-{quartiles[1]:.2f}"


def steps_argument(argv, prog: str, description: str, default: int, what: str) -> int:
    """The one optional positional argument of a benchmark script, a positive count of
    steps; --help prints description, a bad count exits 2 naming it."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "steps", nargs="?", type=positive_int, default=default, help=f"{what} (default: {default})"
    )
    return parser.parse_args(argv).steps


def engine_step(model, optimizer, batch) -> float:
    loss, grads = model.loss_and_grads(*batch)
    optimizer.step(model.flat, grads, max_grad_norm=1.0)
    return loss


def engine_memory_probe(name: str, steps: int) -> None:
    """Print the peak RSS in MiB of building and training the workload, torch never imported.

    Run in a fresh process; its BLAS threads are set by the caller's environment
    (OPENBLAS_NUM_THREADS and friends), read when NumPy loads.
    """
    keep_freed_memory()  # as the benchmark's timing process does
    model, optimizer, batches = build(WORKLOADS[name], steps)
    for batch in batches:
        engine_step(model, optimizer, batch)
    print(peak_rss_mb())


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: VmHWM, which starts afresh at exec
    (ru_maxrss does not: a child forked from a big parent would report the parent's)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB -> MiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# read by OpenBLAS as NumPy loads it: the kernel, and the cache size it blocks products for
OPENBLAS_SETTINGS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def numpy_blas(environ=os.environ) -> str:
    """NumPy's BLAS, with the kernel OpenBLAS chose for this processor or was told to take:
    OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) choose for it, and some machines set them in
    their environment (a Zen 5's products ran at half speed so: docs/performance.md)."""
    from threadpoolctl import threadpool_info

    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    name = f"{blas['name']} {blas['version']}"
    kernels = {info.get("architecture") for info in threadpool_info()} - {None}  # OpenBLAS's
    if not kernels:
        return name
    told = [f"{setting}={environ[setting]}" for setting in OPENBLAS_SETTINGS if setting in environ]
    told_text = f", as {' and '.join(told)} set" if told else ""
    return f"{name} ({', '.join(sorted(kernels))}{told_text})"


def processor_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This machine's processor and core count, e.g. "AMD EPYC, 2 cores": the ratios depend on
    the processor as much as on the BLAS (docs/performance.md, section 2). The model name is
    Linux's (cpuinfo); elsewhere, or if it has none, what platform reports."""
    name = None
    try:
        with open(cpuinfo) as info:
            for line in info:
                if line.startswith("model name") and ":" in line:
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "an unknown processor"
    cores = os.cpu_count()  # None where it cannot be told
    return f"{name}, {cores} cores" if cores else name
