"""Training-step speed of the engine against torch_reference, measured in the same run.

For each configuration both models start from the same weights and see the same
batches; full training steps (forward, backward, clipping, optimizer) alternate
between the two after a warm-up: step by step on one thread, in turns of a few steps on
more (workloads.alternate says why). Reported: median milliseconds per step, the ratio
engine / torch (the median over pairs of consecutive steps) and the middle half of the
pairs' ratios (first to third quartile: how much the pairs disagree), model FLOPs per step,
achieved GFLOP/s and that as a fraction of this machine's float32 matmul peak (a large
np.matmul, timed before the first configuration and after each: the best reading), the peak
resident memory of each engine, each
measured in a separate process, the engine's NumPy calls per step (benchmarks/call_count.py),
and for MiniGPT the step's matmuls alone in each library.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

import numpy as np
import torch

from benchmarks import gpt2, workloads
from benchmarks.call_count import calls_per_step
from benchmarks.matmul_floor import best_seconds, gpt_step_matmuls, matmul_floor_ms
from benchmarks.workloads import WORKLOADS as CONFIGS
from benchmarks.workloads import (
    Workload,
    alternate,
    engine_step,
    middle_half,
    numpy_blas,
    paired_ratio,
    peak_rss_mb,
    processor_name,
    spread,
)
from crosscheck.convert import tensor, torch_model_for
from numpy_engine.memory import keep_freed_memory
from numpy_engine.models import GPTConfig


def build(cfg: Workload, n_batches: int):
    """The engine's workload plus the matching torch optimizer class."""
    model, optimizer, batches = workloads.build(cfg, n_batches)
    return model, optimizer, batches, getattr(torch.optim, cfg.optimizer.__name__)


def flops_per_step(cfg: Workload, model) -> float:
    """Matmul FLOPs of one training step: 3x the forward's (backward is two matmuls per one)."""
    return 3.0 * model.forward_flops(model.config, cfg.batch_size, cfg.length)


def matmul_peak_gflops(n: int = 1024, repeats: int = 10) -> float:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    return 2 * n**3 / best_seconds(lambda: np.matmul(a, a), repeats) / 1e9


def blas_libraries() -> dict[str, str]:
    """The BLAS each library multiplies with, which the ratios depend on more than on most
    changes of code (docs/performance.md, section 2): NumPy's as workloads.numpy_blas names
    it, torch's as its build reports it."""
    built = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return {"numpy": numpy_blas(), "torch": built.group(1) if built else "unknown"}


def torch_step(module, optimizer, batch) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = module.loss(*batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def time_config(cfg: Workload, steps: int, warmup: int, threads: int) -> dict:
    model, optimizer, batches, torch_optimizer_class = build(cfg, steps + warmup)
    module = torch_model_for(model)
    torch_optimizer = torch_optimizer_class(module.parameters(), lr=1e-3)
    torch_batches = [tuple(tensor(x) for x in batch) for batch in batches]
    n = len(batches)
    sides = (
        lambda i: engine_step(model, optimizer, batches[i % n]),
        lambda i: torch_step(module, torch_optimizer, torch_batches[i % n]),
    )
    engine_times, torch_times = alternate(sides, steps + warmup, threads)
    engine_ms = [1e3 * seconds for seconds, _ in engine_times[warmup:]]
    torch_ms = [1e3 * seconds for seconds, _ in torch_times[warmup:]]
    engine, reference = statistics.median(engine_ms), statistics.median(torch_ms)
    ratio = paired_ratio(engine_ms, torch_ms)  # each engine step against the next torch one
    flops = flops_per_step(cfg, model)
    return {
        "engine_ms": engine,
        "torch_ms": reference,
        "ratio": ratio,
        "ratio_middle_half": middle_half(engine_ms, torch_ms),
        "flops_per_step": flops,
        "engine_gflops": flops / engine / 1e6,
        "torch_gflops": flops / reference / 1e6,
    }


def numpy_calls(cfg: Workload) -> int:
    """NumPy calls in one engine training step, on a model of its own (not timed)."""
    model, optimizer, batches = workloads.build(cfg, 2)
    engine_step(model, optimizer, batches[0])  # the first step allocates the optimizer state
    calls, _ = calls_per_step(model, optimizer, batches[1], engine_step)
    return sum(calls.values())


def peak_memory_mb(config: str, engine: str, steps: int, threads: int) -> float:
    """Peak RSS of a fresh process that builds one engine's model and trains `steps` steps."""
    if engine == "engine":  # a process that never imports torch
        probe = "from benchmarks.workloads import engine_memory_probe as probe"
        call = f"probe({config!r}, {steps})"
    else:
        probe = "from benchmarks.bench import torch_memory_probe as probe"
        call = f"probe({config!r}, {steps}, {threads})"
    code = f"{probe}; {call}"
    env = os.environ | {name: str(threads) for name in BLAS_THREAD_VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return float(out.stdout.strip().splitlines()[-1])


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def torch_memory_probe(config: str, steps: int, threads: int) -> None:
    """Print torch's peak RSS in MiB, in a fresh process. Under glibc's own malloc settings:
    numpy_engine.memory.keep_freed_memory is the engine's choice, and raised torch's peaks
    (large 718 -> 738 MB, GPT-2 2958 -> 3226, the sixty-sixth session)."""
    torch.set_num_threads(threads)
    with workloads.on_threads(threads):
        model, _, batches, torch_optimizer_class = build(CONFIGS[config], steps)
        module = torch_model_for(model)
        del model  # the process keeps only torch's copy of the weights
        torch_optimizer = torch_optimizer_class(module.parameters(), lr=1e-3)
        for batch in batches:
            torch_step(module, torch_optimizer, tuple(tensor(x) for x in batch))
    print(peak_rss_mb())


def matmul_floor(cfg: Workload) -> dict:
    """The step's matmuls alone in each library (benchmarks/matmul_floor.py)."""
    products = gpt_step_matmuls(GPTConfig(**cfg.model), cfg.batch_size, cfg.length)
    floor = matmul_floor_ms(products)
    return {"numpy_matmul_ms": floor["numpy"], "torch_matmul_ms": floor["torch"]}


SLOW = ("large", "wide-seq2seq")  # ~1 s and ~0.6 s a step: a fifth of the steps are timed


def run(configs: list[str], steps: int, warmup: int, threads: int, memory: bool) -> dict:
    keep_freed_memory()  # process-wide: the same allocator settings for both engines
    torch.set_num_threads(threads)
    with workloads.on_threads(threads):
        # the peak is read between the configs too: in a slow minute one reading fell to 58.4
        # GFLOP/s where others read 84, and large's step then read 88.7% of "the peak"
        peak_readings = [matmul_peak_gflops()]
        results = {}
        for name in configs:
            cfg = CONFIGS[name]
            n = max(3, steps // 5) if name in SLOW else steps
            results[name] = time_config(cfg, n, min(warmup, n), threads)
            results[name]["steps_timed"] = n
            results[name]["numpy_calls"] = numpy_calls(cfg)
            if cfg.matmul_floor:
                results[name] |= matmul_floor(cfg)
            peak_readings.append(matmul_peak_gflops())
    peak = max(peak_readings)
    for row in results.values():
        row["engine_peak_fraction"] = row["engine_gflops"] / peak
    if memory:
        for name in configs:
            mem_steps = 2 if name in SLOW else 5
            results[name]["engine_peak_mb"] = peak_memory_mb(name, "engine", mem_steps, threads)
            results[name]["torch_peak_mb"] = peak_memory_mb(name, "torch", mem_steps, threads)
    return {
        "threads": threads,
        "matmul_peak_gflops": peak,
        "matmul_peak_readings": peak_readings,
        "blas": blas_libraries(),
        "processor": processor_name(),
        "configs": results,
    }


def _readings(summary: dict) -> str:
    """The peak's readings, before the first config and after each, as the table says them."""
    readings = summary["matmul_peak_readings"]
    return f"the best of {len(readings)} readings, {min(readings):.1f}-{max(readings):.1f}"


def table(summary: dict) -> str:
    width = max([8, *map(len, summary["configs"])])  # the config column: its longest name
    lines = [
        f"float32, {summary['threads']} thread(s); np.matmul peak "
        f"{summary['matmul_peak_gflops']:.1f} GFLOP/s (1024x1024, {_readings(summary)}); "
        f"BLAS: NumPy {summary['blas']['numpy']}, torch {summary['blas']['torch']}; "
        f"{summary['processor']}",
        f"{'config':<{width}} {'engine ms':>10} {'torch ms':>9} {'ratio':>6} {'middle half':>12} "
        f"{'MFLOP/step':>11} "
        f"{'GFLOP/s':>8} {'of peak':>8} {'engine MB':>10} {'torch MB':>9} {'np calls':>9}",
    ]
    for name, r in summary["configs"].items():
        mem = (
            f"{r['engine_peak_mb']:>10.0f} {r['torch_peak_mb']:>9.0f}"
            if "engine_peak_mb" in r
            else f"{'-':>10} {'-':>9}"
        )
        lines.append(
            f"{name:<{width}} {r['engine_ms']:>10.2f} {r['torch_ms']:>9.2f} {r['ratio']:>6.3f} "
            f"{spread(r['ratio_middle_half']):>12} {r['flops_per_step'] / 1e6:>11.1f} "
            f"{r['engine_gflops']:>8.2f} "
            f"{r['engine_peak_fraction']:>8.1%} {mem} {r['numpy_calls']:>9}"
        )
    floors = {name: r for name, r in summary["configs"].items() if "numpy_matmul_ms" in r}
    if floors:
        lines += [
            "",
            "the same step's matmuls alone, and what the rest of each step costs:",
            f"{'config':<{width}} {'numpy mm ms':>12} {'torch mm ms':>12} {'mm ratio':>9} "
            f"{'engine rest ms':>15} {'torch rest ms':>14}",
        ]
    for name, r in floors.items():
        lines.append(
            f"{name:<{width}} {r['numpy_matmul_ms']:>12.2f} {r['torch_matmul_ms']:>12.2f} "
            f"{r['numpy_matmul_ms'] / r['torch_matmul_ms']:>9.2f} "
            f"{r['engine_ms'] - r['numpy_matmul_ms']:>15.2f} "
            f"{r['torch_ms'] - r['torch_matmul_ms']:>14.2f}"
        )
    return "\n".join(lines)


def main(configs: list[str], steps: int, warmup: int, threads: int, memory: bool) -> dict:
    small = [name for name in configs if name in CONFIGS]
    summary = run(small, steps, warmup, threads, memory) if small else {"configs": {}}
    if small:
        print(table(summary))
    if gpt2.WORKLOAD in configs:  # against transformers, not torch_reference
        summary[gpt2.WORKLOAD] = gpt2.run(max(3, steps // 2), threads, memory)  # ~6 s a pair
        print(gpt2.table(summary[gpt2.WORKLOAD]))
    return summary
