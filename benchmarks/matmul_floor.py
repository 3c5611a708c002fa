"""The matmul floor: one MiniGPT training step's matrix products alone, in NumPy and in PyTorch.

Every product of the forward and the backward, with the step's shapes and contiguous
operands, timed on its own (best of a few runs). Neither engine can take less than its
own floor; the engine's step time minus NumPy's floor is what everything else costs
(elementwise passes, reductions, Python), and NumPy's floor over PyTorch's is the part
of the ratio that only a faster BLAS could change.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from benchmarks.workloads import SETTLE_SECONDS


def gpt_step_matmuls(config, batch_size: int, context: int) -> list[tuple[tuple, tuple]]:
    """(left shape, right shape) of every matmul in one training step of a MiniGPT."""
    C, F, V, H = config.d_model, config.d_ff, config.vocab_size, config.n_heads
    N, T, hs = batch_size * context, context, config.d_model // config.n_heads
    linears = [(C, 3 * C), (C, C), (C, F), (F, C)] * config.n_layers + [(C, V)]  # (in, out)
    products = []
    for fan_in, fan_out in linears:
        products += [((N, fan_in), (fan_in, fan_out))]  # forward: y = x @ W.T
        products += [((N, fan_out), (fan_out, fan_in)), ((fan_out, N), (N, fan_in))]  # dx, dW
    heads = (batch_size, H)
    scores = ((*heads, T, hs), (*heads, hs, T))  # q @ k^T, and dweights = dy @ v^T
    mix = ((*heads, T, T), (*heads, T, hs))  # weights @ v, dv, dq and dk
    products += [scores, scores, mix, mix, mix, mix] * config.n_layers
    return products


def best_seconds(fn, repeats: int = 5) -> float:
    """The fastest of `repeats` timed calls, after one untimed warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_floor_ms(products: list[tuple[tuple, tuple]]) -> dict[str, float]:
    """Milliseconds for all the products in float32: {"numpy": ..., "torch": ...}. Each
    library's products are timed together, after SETTLE_SECONDS of its own products: with
    more than one thread, the other library's idle threads would still be spinning on the
    cores (workloads.alternate; interleaved, torch's char-lm products read 20-75 ms on two
    threads against 4.0-4.2 timed this way)."""
    rng = np.random.default_rng(0)
    operands = {"numpy": [], "torch": []}
    for left, right in products:
        a = rng.standard_normal(left, dtype=np.float32)
        b = rng.standard_normal(right, dtype=np.float32)
        operands["numpy"].append((a, b))
        operands["torch"].append((torch.tensor(a), torch.tensor(b)))
    totals = {}
    for name, pairs in operands.items():
        settle(lambda: [a @ b for a, b in pairs])  # noqa: B023
        totals[name] = sum(best_seconds(lambda: a @ b) for a, b in pairs)  # noqa: B023
    return {name: 1e3 * seconds for name, seconds in totals.items()}


def settle(fn) -> None:
    """Call fn until SETTLE_SECONDS have passed (at least once)."""
    end = time.perf_counter() + SETTLE_SECONDS
    fn()
    while time.perf_counter() < end:
        fn()
