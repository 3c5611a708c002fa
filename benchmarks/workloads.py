"""The benchmark workloads, torch-free: a model, its optimizer, seeded batches, one step.

benchmarks/bench.py times these against PyTorch; a memory probe runs them in a
process that never imports torch, so its peak memory is the engine's own.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import numpy as np

import numpy_engine as ne
from numpy_engine.memory import keep_freed_memory
from numpy_engine.optim import Adam, AdamW
from numpy_engine.tasks import sequence_task


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "seq2seq" or "gpt"
    model: dict  # config overrides
    batch_size: int
    context: int  # GPT only


WORKLOADS = {
    "copy": Workload("copy", "seq2seq", {}, 32, 0),
    "char-lm": Workload("char-lm", "gpt", {}, 32, 32),
    "large": Workload(
        "large",
        "gpt",
        dict(vocab_size=65, d_model=256, n_heads=8, d_ff=1024, n_layers=4, max_len=128),
        32,
        128,
    ),
}


def build(workload: Workload, n_batches: int):
    """The float32 engine model, its optimizer (Adam for copy, AdamW for GPT), and batches."""
    rng = np.random.default_rng(0)
    if workload.kind == "seq2seq":
        model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(**workload.model), seed=0)
        train = sequence_task("copy", seed=7).train
        B = workload.batch_size
        batches = [train.take(rng.integers(0, len(train), B)) for _ in range(n_batches)]
        return model, Adam(model.params, lr=1e-3), batches
    model = ne.MiniGPT(ne.GPTConfig(**workload.model), seed=0)
    V, B, T = model.config.vocab_size, workload.batch_size, workload.context
    batches = [(rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))) for _ in range(n_batches)]
    return model, AdamW(model.params, lr=1e-3), batches


def engine_step(model, optimizer, batch) -> float:
    loss, grads = model.loss_and_grads(*batch)
    optimizer.step(model.params, grads, max_grad_norm=1.0)  # clips on the optimizer's flat copy
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
