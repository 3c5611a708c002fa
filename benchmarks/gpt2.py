"""GPT-2 at its real size: the engine against Hugging Face transformers, in the same run.

gpt2's sizes (124M parameters), float32, random weights shared by both, one thread:
- a training step, batch 4 x context 64: forward, backward, clipping at 1.0, AdamW;
  alternating after a warm-up; median ms per step and the median ratio of pairs;
- each side's peak memory over two steps, each in a fresh process (the engine's never
  imports torch);
- generation, batch 1, a 64-token prompt, 64 new tokens, greedy with each side's KV cache;
  after a short warm-up, the median of three alternating runs a side.

    numpy-engine bench --configs gpt2        (or python -m benchmarks.gpt2)
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys

import numpy as np

from benchmarks.workloads import (
    alternate,
    middle_half,
    numpy_blas,
    on_threads,
    paired_ratio,
    peak_rss_mb,
    processor_name,
    spread,
    steps_argument,
    timed,
)
from numpy_engine.dropout import training_rng
from numpy_engine.memory import keep_freed_memory
from numpy_engine.models import GPT2, GPT2Config
from numpy_engine.optim import AdamW

WORKLOAD = "gpt2"  # its name for `numpy-engine bench --configs`
BATCH, CONTEXT, LR = 4, 64, 1e-4
PROMPT, NEW_TOKENS = 64, 64
VOCAB = 50257  # gpt2's, engine_model()'s


def engine_model() -> GPT2:
    config = dataclasses.replace(GPT2Config.preset("gpt2"), eos_id=None)  # never stops early
    return GPT2(config, seed=0)


def batches(n: int, vocab_size: int = VOCAB) -> list[tuple[np.ndarray, np.ndarray]]:
    """n seeded batches of (ids, next ids), BATCH x CONTEXT each."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        ids = rng.integers(0, vocab_size, (BATCH, CONTEXT + 1))
        out.append((ids[:, :-1], ids[:, 1:]))
    return out


class EngineTrainer:
    def __init__(self, model: GPT2) -> None:
        self.model, self.optimizer = model, AdamW(model.params, lr=LR)
        self.steps = 0

    def step(self, batch) -> float:
        """A training step; a model with dropout draws its masks as `train` does."""
        self.steps += 1
        dropout = {"dropout_rng": training_rng(0, self.steps)} if self.model.uses_dropout() else {}
        loss, grads = self.model.loss_and_grads(*batch, **dropout)
        self.optimizer.step(self.model.flat, grads, max_grad_norm=1.0)
        return loss


class TorchTrainer:
    """transformers' GPT2LMHeadModel with the engine model's weights and dropout rates
    (crosscheck's GPT-2 twin, in eval mode: dropout off until .train())."""

    def __init__(self, model: GPT2) -> None:
        import torch

        from crosscheck.hf_twin import GPT2Twin

        self.torch = torch
        self.hf = GPT2Twin(model).hf
        self.optimizer = torch.optim.AdamW(self.hf.parameters(), lr=LR)

    def step(self, batch) -> float:
        torch = self.torch
        self.optimizer.zero_grad(set_to_none=True)
        idx, targets = (torch.from_numpy(x) for x in batch)
        logits = self.hf(idx).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.hf.parameters(), 1.0)
        self.optimizer.step()
        return loss.item()


def time_steps(steps: int, threads: int) -> dict:
    model = engine_model()
    engine, reference = EngineTrainer(model), TorchTrainer(model)
    data = batches(steps + 1, model.config.vocab_size)
    sides = (
        lambda i: engine.step(data[i % len(data)]),
        lambda i: reference.step(data[i % len(data)]),
    )
    engine_times, torch_times = alternate(sides, steps + 1, threads)  # the first pair warms up
    for (_, e_loss), (_, t_loss) in zip(engine_times, torch_times, strict=True):
        assert abs(e_loss - t_loss) <= 1e-3 * abs(t_loss), (e_loss, t_loss)  # the same step
    engine_s = [seconds for seconds, _ in engine_times[1:]]
    torch_s = [seconds for seconds, _ in torch_times[1:]]
    return {
        "engine_ms": 1e3 * statistics.median(engine_s),
        "torch_ms": 1e3 * statistics.median(torch_s),
        "ratio": paired_ratio(engine_s, torch_s),
        "ratio_middle_half": middle_half(engine_s, torch_s),
        "pairs": len(engine_s),
    }


GENERATION_REPEATS = 3  # alternating, after one short warm-up run of each side


def time_generation() -> dict:
    """Median tokens/s of each side over GENERATION_REPEATS alternating runs, and whether the
    tokens match. (One run a side was at the mercy of the machine's drift: four runs of the
    engine's same 64 tokens read 21.1-23.1 tokens/s here, the first 22.3.)"""
    import torch

    from numpy_engine.generate import generate

    model = engine_model()
    reference = TorchTrainer(model).hf.eval()
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, (1, PROMPT))

    def ours(new_tokens: int) -> np.ndarray:
        return generate(model, prompt, new_tokens)

    def theirs(new_tokens: int) -> np.ndarray:
        with torch.no_grad():
            return reference.generate(
                torch.from_numpy(prompt),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            ).numpy()

    ours(4), theirs(4)  # warm-up
    seconds: dict = {ours: [], theirs: []}
    tokens = {}
    for _ in range(GENERATION_REPEATS):
        for side in (ours, theirs):
            elapsed, tokens[side] = timed(side, NEW_TOKENS)
            seconds[side].append(elapsed)
    return {
        "engine_tokens_per_s": NEW_TOKENS / statistics.median(seconds[ours]),
        "torch_tokens_per_s": NEW_TOKENS / statistics.median(seconds[theirs]),
        "same_tokens": bool(np.array_equal(tokens[ours], tokens[theirs])),
        "decoding_path": decoding_path(),
    }


def decoding_path() -> str | None:
    """How the engine's decoding multiplies its one row by the large weights in this process:
    "row dots" or "products", whichever was timed the faster (layers.FEW_ROW_PATHS); None
    before the choice (no weight large enough, or too few calls yet)."""
    from numpy_engine import layers

    names = {layers._row_dots: "row dots", layers._product: "products"}
    return names.get(layers.FEW_ROW_PATHS[1].chosen)


def memory_probe(side: str) -> None:
    """Print the peak RSS (MiB) of two training steps of one side, in this fresh process;
    torch's under glibc's own malloc settings, as bench.torch_memory_probe."""
    if side == "engine":
        keep_freed_memory()
    model = engine_model()
    trainer = EngineTrainer(model) if side == "engine" else TorchTrainer(model)
    if side == "torch":
        del model  # the process keeps only torch's copy of the weights
    for batch in batches(2):
        trainer.step(batch)
    print(peak_rss_mb())


def peak_memory_mb(side: str, threads: int) -> float:
    env = os.environ | {v: str(threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    code = f"from benchmarks.gpt2 import memory_probe; memory_probe({side!r})"
    if side == "torch":
        code = f"import torch; torch.set_num_threads({threads}); {code}"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return float(out.stdout.strip().splitlines()[-1])


def run(steps: int, threads: int, memory: bool) -> dict:
    """Every GPT-2 measurement, as one dict (benchmarks/bench.py prints it with the others)."""
    import torch

    keep_freed_memory()
    torch.set_num_threads(threads)
    with on_threads(threads):
        result = time_steps(steps, threads) | time_generation()
    result["processor"] = processor_name()
    result["blas"] = numpy_blas()  # the ratio depends on OpenBLAS's kernel (docs/performance.md)
    if memory:
        result["engine_peak_mb"] = peak_memory_mb("engine", threads)
        result["torch_peak_mb"] = peak_memory_mb("torch", threads)
    return result


def table(r: dict) -> str:
    memory = ""
    if "engine_peak_mb" in r:
        memory = (
            f"; peak memory engine {r['engine_peak_mb']:.0f} MB, torch {r['torch_peak_mb']:.0f} MB"
        )
    same = "the same tokens" if r["same_tokens"] else "DIFFERENT tokens"
    path = f" (by {r['decoding_path']}, timed the faster)" if r.get("decoding_path") else ""
    return (
        f"gpt2 (124M, float32, batch {BATCH} x {CONTEXT}; NumPy's BLAS {r['blas']}; "
        f"{r['processor']}): engine "
        f"{r['engine_ms']:.0f} ms, transformers {r['torch_ms']:.0f} ms a training step, "
        f"ratio {r['ratio']:.3f} (the middle half of its {r['pairs']} pairs "
        f"{spread(r['ratio_middle_half'])}){memory}\n"
        f"gpt2 generation ({PROMPT}-token prompt, {NEW_TOKENS} new, greedy, KV cache): engine "
        f"{r['engine_tokens_per_s']:.1f} tokens/s{path}, transformers "
        f"{r['torch_tokens_per_s']:.1f} tokens/s, {same}"
    )


def main(argv: list[str] | None = None) -> None:
    steps = steps_argument(argv, "python -m benchmarks.gpt2", __doc__, 20, "timed training steps")
    print(table(run(steps=steps, threads=1, memory=True)))


if __name__ == "__main__":
    main()
