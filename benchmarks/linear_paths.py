"""The three ways layers.linear_forward multiplies x (N, in) by a weight stored (out, in),
timed against each other on this machine, with the one the engine takes for each case:

- row dots, np.vecdot(W, x[:, None, :]): timed against the path below that would be taken
  otherwise, at most FEW_ROWS rows against a weight of LARGE_WEIGHT_ENTRIES or more (GPT-2's
  decoding): the faster of the two on the first calls is kept ("timed", layers.FEW_ROW_PATHS);
- transposed, W @ x.T on blocks of TRANSPOSED_OUTPUTS outputs, each copied into its columns
  of the (N, out) result: 2 to SOME_ROWS rows against a weight of MID_WEIGHT_ENTRIES or more
  (batched decoding, prompts, small batches);
- product, x @ W.T: everything else (training's many rows, small weights, one row).

Each case twice: with the weight in cache (one weight, called again and again, as a small
model's decoding reads it) and in memory (a cycle of copies larger than this machine's L3,
as GPT-2's decoding reads its weights). One thread, float32, microseconds a call, best of a
few runs. "taken / fastest" over 1.2 is marked: the rule's constants in layers.py were set
from these numbers on one machine, and this script checks them on another.

    python -m benchmarks.linear_paths
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from benchmarks.matmul_floor import best_seconds
from numpy_engine import layers

PATHS = {
    "row dots": layers._row_dots,
    "transposed": layers._transposed_product,
    "product": layers._product,
}
SHAPES = [(192, 64), (256, 64), (384, 128), (768, 256), (1024, 256), (2304, 768), (768, 3072)]
ROWS = [1, 2, 3, 4, 8, 16, 32, 48, 64]
COLD_BYTES = 96 << 20  # the weights cycled through "in memory": more than an L3 of 32 MiB
CALL_ENTRIES = 2 << 20  # rows x weight entries a timed call covers, at least (a few ms)
MARK = 1.2  # taken / fastest past this is marked


def taken(rows: int, weight_shape: tuple) -> str:
    """The path linear_forward takes (its own rule, layers._few_rows and _some_rows)."""
    if layers._few_rows(rows, weight_shape):
        return "timed"
    return "transposed" if layers._some_rows(rows, weight_shape) else "product"


def taken_us(result: dict, place: str) -> float:
    """Microseconds a call of the path taken; a timed one keeps the faster of its two."""
    times = result[place]
    if result["taken"] != "timed":
        return times[result["taken"]]
    chooser = layers.FEW_ROW_PATHS[result["rows"]]
    return min(times[name] for name, path in PATHS.items() if path in chooser.paths)


def time_paths(weight_shape: tuple, rows: int, in_cache: bool, cold_bytes: int, rng) -> dict:
    """Microseconds a call of each path, the weight in cache or cycled from memory."""
    entries = math.prod(weight_shape)
    copies = 1 if in_cache else max(1, cold_bytes // (4 * entries))
    weights = [rng.standard_normal(weight_shape, dtype=np.float32) for _ in range(copies)]
    cycle = weights * max(1, CALL_ENTRIES // (rows * entries * copies))
    x = rng.standard_normal((rows, weight_shape[1]), dtype=np.float32)
    return {
        name: 1e6 * best_seconds(lambda path=path: [path(x, w) for w in cycle]) / len(cycle)
        for name, path in PATHS.items()
    }


def measure(shapes=SHAPES, rows_list=ROWS, cold_bytes: int = COLD_BYTES) -> list[dict]:
    rng = np.random.default_rng(0)
    results = []
    for shape in shapes:
        for rows in rows_list:
            result = {"weight": shape, "rows": rows, "taken": taken(rows, shape)}
            for place, in_cache in (("cache", True), ("memory", False)):
                result[place] = time_paths(shape, rows, in_cache, cold_bytes, rng)
            results.append(result)
    return results


def table(results: list[dict]) -> str:
    names = list(PATHS)
    head = " ".join(f"{name:>10}" for name in names)
    lines = [
        f"microseconds a call, one thread, float32; taken / fastest past {MARK} marked *",
        f"{'weight':<12} {'rows':>4}  in cache: {head}  in memory: {head}  {'taken':>10}  "
        "taken / fastest (cache, memory)",
    ]
    for r in results:
        ratios = [taken_us(r, place) / min(r[place].values()) for place in ("cache", "memory")]
        marks = " ".join(f"{ratio:5.2f}{'*' if ratio > MARK else ' '}" for ratio in ratios)
        cache = " ".join(f"{r['cache'][name]:>10.1f}" for name in names)
        memory = " ".join(f"{r['memory'][name]:>10.1f}" for name in names)
        weight = f"{r['weight'][0]}x{r['weight'][1]}"
        lines.append(
            f"{weight:<12} {r['rows']:>4}            {cache}              {memory}  "
            f"{r['taken']:>10}  {marks}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.linear_paths",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    from benchmarks.workloads import on_threads

    with on_threads(1):
        print(table(measure()))


if __name__ == "__main__":
    main()
