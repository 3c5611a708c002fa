"""Where a training step's time goes: the engine's by part, torch's by part, and a floor.

For one workload (benchmarks/workloads.py, or gpt2), on one thread (`--threads N`: NumPy's
BLAS and torch on N threads; NumPy's elementwise passes stay on one core):

- **engine**: the step alone, then again with each layer function timed (its own time,
  without the layer functions it calls; the timing adds ~1 us a call): linear, attention
  (scores, mask, softmax, weights @ v), heads (split, merged buffers, stacking q/k/v), layernorm,
  activation, embedding and positions, loss (readout + cross-entropy), flat gradient,
  optimizer (clipping + update); "between layers" is the instrumented step minus all of
  them: the blocks' and models' Python.
- **torch**: torch_reference's step alone, then its forward and backward under
  torch.profiler, each op's own time summed by kind (matmul, attention, layernorm, ...;
  "between ops" is Python with no op running, "autograd" the engine's bookkeeping), and
  clipping and the optimizer timed without the profiler (which slows small ops).
- **floor**, measured here: the step's matrix products alone (the shapes the engine's step
  multiplies, recorded by benchmarks/call_count.py, each timed on its own, best of 5), one
  in-place pass over each product's output, one pass over each of the optimizer's four
  vectors (parameters, gradients, two moments), and the step's NumPy calls at the cost of
  the cheapest NumPy call. Neither engine can be faster than the products and the passes;
  the engine, making its calls, not faster than the sum. Its calls that broadcast (a bias
  added to every row, a row's mean taken from each entry) are timed alone, as the step
  makes them and with every operand spread to the whole shape first: NumPy runs a
  broadcast one short row at a time, and the difference is what that costs, the most a
  layout of the arrays without such broadcasts could save on them. The same products are
  then timed where the step makes them, one by one in a step on call_count's counted
  arrays, the 2-D ones (linear layers, head, embedding) apart from the batched ones
  (attention's): there their operands are wherever the step left them, in cache or not,
  and laid out as the step has them (views, transposed operands, `out=`), where alone they
  are fresh contiguous arrays, in cache after the first of five runs. The difference is
  the step's, not an overhead (docs/performance.md, section 4, splits it on the Zen 5).
- **the bar** (one thread only): the speed issue's bar for the workload (BARS: engine /
  torch step) set against the two steps alone, each split in two parts, its products and
  the rest. The engine's products are those timed where the step makes them; torch's, its
  profile's matmul. torch_reference's attention multiplies inside its fused
  `scaled_dot_product_attention`, whose time its profile counts as attention, so for its
  workloads the engine's attention products count in the engine's rest too, and only its
  2-D ones against torch's matmul; transformers' eager attention multiplies with matmul,
  so for gpt2 all of them do. Where the step is over the bar, it prints what the bar asks
  of each part with the other as it is: the products in the step at what multiple of
  their time alone, or the rest shorter by what share. The bench's ratio is of steps
  taken in alternation, where the engine's reads higher than alone (docs/performance.md,
  section 1, "Noise"): a step within the bar here may not be in the bench.

    python -m benchmarks.where_time_goes copy char-lm large gpt2
    python -m benchmarks.where_time_goes large --threads 2

gpt2 (benchmarks/gpt2.py's workload) is timed against transformers' GPT2LMHeadModel.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import numpy as np

from benchmarks import gpt2, workloads
from benchmarks.call_count import Counted, calls_per_step
from benchmarks.matmul_floor import best_seconds
from benchmarks.step_parts import engine_parts, engine_side, torch_parts
from numpy_engine.cli_args import thread_count

IN_STEP_RUNS = 3  # counted steps whose products are timed; the floor reports their median


KINDS = ("2-D", "batched")  # products of matrices; of stacks of them (attention's)


def floor(name: str) -> dict:
    """The measured floor of one engine step, ms, and what it is made of."""
    model, optimizer, batches, step = engine_side(name, 2)
    step(model, optimizer, batches[0])
    calls, products = calls_per_step(model, optimizer, batches[1], step)
    broadcasts = list(Counted.broadcasts)
    rng = np.random.default_rng(0)
    alone = dict.fromkeys(KINDS, 0.0)
    pass_s = 0.0
    for left, right, dtype in products:  # matrix products, and sums done as products
        a, b = rng.standard_normal(left).astype(dtype), rng.standard_normal(right).astype(dtype)
        kind = _product_kind(left, right)
        if kind is None:  # a sum as a product with ones: one pass
            matrix = a if a.size >= b.size else b
            pass_s += best_seconds(lambda m=matrix: np.multiply(m, 1.0, out=m))
            continue
        out = a @ b
        alone[kind] += best_seconds(lambda a=a, b=b, out=out: np.matmul(a, b, out=out))
        pass_s += best_seconds(lambda out=out: np.multiply(out, 1.0, out=out))
    vector = np.ones(model.flat.size, model.flat.dtype)
    optimizer_s = 4 * best_seconds(lambda: np.multiply(vector, 1.0, out=vector))
    one = np.ones(1, np.float32)
    call_s = best_seconds(lambda: np.multiply(one, 1.0, out=one), repeats=1000)
    n_calls = sum(calls.values())
    return {
        "products": sum(_product_kind(left, right) is not None for left, right, _ in products),
        "matmul": 1e3 * sum(alone.values()),
        "matmul_by_kind": {kind: 1e3 * seconds for kind, seconds in alone.items()},
        "in_step_by_kind": _products_in_step(model, optimizer, batches[1], step),
        "passes": 1e3 * pass_s,
        "optimizer": 1e3 * optimizer_s,
        "calls": n_calls,
        "call_us": 1e6 * call_s,
        "calls_ms": 1e3 * n_calls * call_s,
        "broadcasts": len(broadcasts),
        **_broadcasts_ms(broadcasts),
    }


def _broadcasts_ms(broadcasts: list) -> dict[str, float]:
    """ms of the step's broadcasting calls (call_count.Counted.broadcasts), each timed alone
    as the step makes it, and again with each operand spread to the whole shape first:
    what spreading an operand over short rows costs NumPy, beyond the arithmetic."""
    spread = whole = 0.0
    for ufunc, operands in broadcasts:
        arrays = [np.ones(shape, dtype) for shape, dtype in operands]
        whole_shape = np.broadcast_shapes(*(array.shape for array in arrays))
        wholes = [np.ones(whole_shape, dtype) for _, dtype in operands]
        out = ufunc(*wholes)
        repeats = 200 if out.size < 1 << 16 else 5  # calls of microseconds: the best of more
        spread += best_seconds(functools.partial(ufunc, *arrays, out=out), repeats)
        whole += best_seconds(functools.partial(ufunc, *wholes, out=out), repeats)
    return {"broadcasts_ms": 1e3 * spread, "broadcasts_whole_ms": 1e3 * whole}


def _products_in_step(model, optimizer, batch, step) -> dict[str, float]:
    """ms of the step's products of each kind where the step makes them: each product timed
    by itself in a counted step (call_count.Counted.product_seconds), the median of
    IN_STEP_RUNS steps. The caller has made a counted step before (floor, for the shapes):
    the memory a counted step takes is then touched before the first timed one."""
    runs = {kind: [] for kind in KINDS}
    for _ in range(IN_STEP_RUNS):
        _, products = calls_per_step(model, optimizer, batch, step)
        totals = dict.fromkeys(KINDS, 0.0)
        for (left, right, _), seconds in zip(products, Counted.product_seconds, strict=True):
            kind = _product_kind(left, right)
            if kind is not None:
                totals[kind] += seconds
        for kind, seconds in totals.items():
            runs[kind].append(seconds)
    return {kind: 1e3 * statistics.median(seconds) for kind, seconds in runs.items()}


def _product_kind(left: tuple, right: tuple) -> str | None:
    """A product's kind from its operands' shapes: "2-D" for matrices, "batched" for stacks
    of them, None for a sum done as a product with a vector of ones."""
    if len(left) < 2 or len(right) < 2:
        return None
    return "2-D" if len(left) == len(right) == 2 else "batched"


def _by_size(parts: dict) -> list[tuple[str, float]]:
    return sorted(parts.items(), key=lambda kv: -kv[1])


# the engine's step over torch's, one thread: the speed issue's bars (issue 14); long's and
# the seq2seq workloads' are the project's own (ahead of torch), the issue set none
BARS = {
    "copy": 0.30,
    "char-lm": 0.80,
    "large": 1.00,
    "long": 1.00,
    "long-seq2seq": 1.00,
    "wide-seq2seq": 1.00,
    gpt2.WORKLOAD: 1.00,
}


def bar_accounting(name: str, bar: float, engine: dict, reference: dict, low: dict) -> dict:
    """Each step alone (ms) split into its products and the rest, and what bar (the
    engine's step over torch's) asks of each part with the other as it is."""
    kinds = KINDS if name == gpt2.WORKLOAD else ("2-D",)  # the module docstring says why
    in_step = sum(low["in_step_by_kind"][kind] for kind in kinds)
    alone = sum(low["matmul_by_kind"][kind] for kind in kinds)
    rest = engine["step"] - in_step
    bar_step = bar * reference["step"]
    return {
        "kinds": kinds,
        "bar_step": bar_step,
        "products": in_step,
        "products_alone": alone,
        "rest": rest,
        "torch_matmul": reference["parts"]["matmul"],
        "met": engine["step"] <= bar_step,
        "products_asked": bar_step - rest,  # with the rest as it is; 0 or under: none would do
        "rest_asked": bar_step - in_step,  # with the products as they are
    }


def _bar_lines(name: str, bar: float, engine: dict, reference: dict, low: dict) -> list[str]:
    a = bar_accounting(name, bar, engine, reference, low)
    kinds = "all its" if len(a["kinds"]) > 1 else "its 2-D"
    torch_rest = reference["step"] - a["torch_matmul"]
    split = (
        f"  the bar, {bar:.2f} of torch's step: {a['bar_step']:.2f} ms; {kinds} products "
        f"{a['products']:.2f} ms in the step ({a['products_alone']:.2f} alone) and the rest "
        f"{a['rest']:.2f}, against torch's matmul {a['torch_matmul']:.2f} and rest "
        f"{torch_rest:.2f} (each step alone)"
    )
    if a["met"]:
        return [f"{split}: the engine's {engine['step']:.2f} ms is within it"]
    asked_products, asked_rest = a["products_asked"], a["rest_asked"]
    of_products = (
        f"with the rest as it is, the products would have to take {asked_products:.2f} ms, "
        f"{asked_products / a['products_alone']:.2f}x their time alone"
        if asked_products > 0
        else f"the rest alone, {a['rest']:.2f} ms, leaves the products no time"
    )
    of_rest = (  # over the bar, asked_rest < a["rest"]: a share between 0 and 1
        f"with the products as they are, the rest would have to take {asked_rest:.2f} ms, "
        f"{1 - asked_rest / a['rest']:.0%} less"
        if asked_rest > 0
        else f"the products alone, {a['products']:.2f} ms, leave the rest no time"
    )
    over = engine["step"] - a["bar_step"]
    return [split, f"    over it by {over:.2f} ms: {of_products}; {of_rest}"]


def report(name: str, steps: int, bar: float | None = None) -> str:
    """The workload's lines; with bar (the engine's step over torch's), what it asks."""
    engine, reference, low = engine_parts(name, steps), torch_parts(name, steps), floor(name)
    lines = [
        f"{name}: engine {engine['step']:.2f} ms a step, torch {reference['step']:.2f} ms "
        f"(each alone, median of {steps})",
        f"  engine, by part (own time, ms, of {engine['instrumented']:.2f} instrumented): "
        + ", ".join(f"{part} {ms:.2f}" for part, ms in _by_size(engine["parts"])),
        "  torch, by part (own time, ms; forward and backward profiled): "
        + ", ".join(f"{part} {ms:.2f}" for part, ms in _by_size(reference["parts"])),
        f"  floor: {low['products']} products alone {low['matmul']:.2f} ms + one pass over "
        f"each output {low['passes']:.2f} + the optimizer's four vectors once "
        f"{low['optimizer']:.2f} = {low['matmul'] + low['passes'] + low['optimizer']:.2f} ms; "
        f"{low['calls']} NumPy calls at {low['call_us']:.2f} us (the cheapest call) "
        f"{low['calls_ms']:.2f} ms more",
        f"  {low['broadcasts']} of the calls spread an operand over rows (a bias, a row's "
        f"mean): {low['broadcasts_ms']:.2f} ms alone, {low['broadcasts_whole_ms']:.2f} ms "
        "with each operand at the whole shape",
        "  the same products where the step makes them (each timed in a counted step, the "
        f"median of {IN_STEP_RUNS} steps): "
        + ", ".join(
            f"{kind} {in_step:.2f} ms against {low['matmul_by_kind'][kind]:.2f} alone"
            for kind, in_step in low["in_step_by_kind"].items()
        ),
    ]
    if bar is not None:
        lines += _bar_lines(name, bar, engine, reference, low)
    return "\n".join(lines)


# timed steps: large ~1 s a step, long and long-seq2seq ~0.15 s, wide-seq2seq ~0.6 s, gpt2
# ~3 s; the rest 50
STEPS = {"large": 4, "long": 10, "long-seq2seq": 10, "wide-seq2seq": 4, gpt2.WORKLOAD: 3}


def main(argv: list[str] | None = None) -> None:
    default = list(workloads.WORKLOADS)  # copy, char-lm, large, long, the two seq2seq
    known = [*default, gpt2.WORKLOAD]
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.where_time_goes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "configs",
        nargs="*",
        metavar="CONFIG",
        help=f"workloads to report, of {', '.join(known)} (default: {' '.join(default)})",
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="BLAS and torch threads, at most the cores this process may use (default: 1, "
        "the speed issue's bars)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.configs if name not in known]
    if unknown:  # not choices=: Python 3.11 checks an empty list against them
        parser.error(f"unknown configs {unknown}; known: {', '.join(known)}")

    import torch

    from numpy_engine.memory import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    with workloads.on_threads(args.threads):
        # the parts' sizes depend on the processor and the BLAS kernel as much as on the code
        threads = "one thread" if args.threads == 1 else f"{args.threads} threads"
        print(
            f"{threads}; NumPy's BLAS {workloads.numpy_blas()}; {workloads.processor_name()}",
            flush=True,
        )
        for name in args.configs or default:
            bar = BARS.get(name) if args.threads == 1 else None  # the bars are one thread's
            print(report(name, steps=STEPS.get(name, 50), bar=bar), flush=True)


if __name__ == "__main__":
    main()
