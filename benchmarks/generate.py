"""Tokens per second when MiniGPT generates: KV cache, no cache, and torch_reference (no cache).

    python -m benchmarks.generate                  # 256 tokens, context 128, one BLAS thread
    python -m benchmarks.generate --tokens 32 --context 16 --repeats 1     # a quick look
    python -m benchmarks.generate --tokens 100 --batch 8 --d-model 256     # batched decoding

All three generate greedily from the same weights and must produce the same tokens.
MiniGPT's positions are learned and absolute: once the text outgrows the context, the
window slides, every position shifts, and the cache is rebuilt each step, so past the
context the cached path costs what the simple one does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

import numpy_engine as ne
from benchmarks.workloads import on_threads
from crosscheck.convert import tensor, torch_model_for
from numpy_engine.cli_args import new_file_path, positive_int, thread_count
from numpy_engine.generate import generate


def torch_generate(module, prompt: np.ndarray, new_tokens: int, context: int) -> np.ndarray:
    ids = tensor(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = module(ids[:, -context:])
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids.numpy()


def best_of(repeats: int, run) -> tuple[float, np.ndarray]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    count = positive_int
    parser.add_argument(
        "--tokens", type=count, default=256, help="tokens to generate (default 256)"
    )
    parser.add_argument("--context", type=count, default=128, help="MiniGPT max_len (default 128)")
    parser.add_argument(
        "--repeats", type=count, default=3, help="runs per path; median (default 3)"
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="BLAS / torch threads, at most the cores this process may use (default 1)",
    )
    parser.add_argument(
        "--batch", type=count, default=1, help="prompts decoded together (default 1)"
    )
    parser.add_argument(
        "--d-model",
        type=count,
        default=64,
        help="MiniGPT width, 4 heads, FFN 4x (default 64; 256 is the large config's width)",
    )
    parser.add_argument(
        "--json", type=new_file_path, metavar="FILE", help="also write the results here"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    width = dict(d_model=args.d_model, d_ff=4 * args.d_model)
    model = ne.MiniGPT(ne.GPTConfig(vocab_size=13, max_len=args.context, **width), seed=0)
    module = torch_model_for(model)
    prompt = np.arange(args.batch)[:, None] % 13  # (batch, 1): a different first token a row
    with on_threads(args.threads):
        paths = {
            "engine, KV cache": lambda: generate(model, prompt, args.tokens),
            "engine, no cache": lambda: generate(model, prompt, args.tokens, use_cache=False),
            "torch_reference, no cache": lambda: torch_generate(
                module, prompt, args.tokens, args.context
            ),
        }
        results = {name: best_of(args.repeats, run) for name, run in paths.items()}
    outputs = [out for _, out in results.values()]
    same = all(np.array_equal(outputs[0], out) for out in outputs[1:])
    rows = {
        name: {"seconds": sec, "tokens_per_second": args.batch * args.tokens / sec}
        for name, (sec, _) in results.items()
    }
    base = rows["engine, no cache"]["tokens_per_second"]
    print(
        f"MiniGPT (d_model {args.d_model}, 3 layers, context {args.context}), {args.tokens} "
        f"tokens x batch {args.batch}, {args.threads} thread(s); same tokens on all paths: {same}"
    )
    print(f"{'path':<28} {'tokens/s':>10} {'vs no cache':>12}")
    for name, row in rows.items():
        speed = row["tokens_per_second"]
        print(f"{name:<28} {speed:>10.1f} {speed / base:>11.2f}x")
    summary = {
        "tokens": args.tokens,
        "batch": args.batch,
        "d_model": args.d_model,
        "context": args.context,
        "threads": args.threads,
        "same_tokens": same,
        "paths": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
