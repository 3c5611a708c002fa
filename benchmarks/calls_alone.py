"""A small model's step against its own NumPy calls made back to back, with no Python between.

A small model's training step is its NumPy calls and the Python between them: the layer
functions, the model's wiring, the optimizer's loop. How much is each? The script records
the step's outermost NumPy calls in order (benchmarks/call_count.py, the calls the bench's
"np calls" column counts), each with its arguments bound, and makes them again back to back
(call_count.replay). Whatever the engine's Python became, a step making these calls would
take at least that long: the floor of this layout of the step, measured.

It times them as the bench times the step: one thread, each run right after a torch step of
the same workload (the bench's pairs find the caches so). Each round: the replayed calls'
arrays put back as the recording left them (an in-place call changes them), an untimed torch
step, then the replay and the torch step after it, then the engine step and the torch step
after it. It prints each median and the rounds' median ratios: replay / step, and each
against the torch step after it, as the bench's ratio.

Then, in the same round, each again back to back, as a training run takes its steps: an
untimed replay, then the replay timed; an untimed engine step, then the step timed, on the
round's batch. Their difference is the Python between the calls, with code and data in
cache; the steps' difference after a torch step and back to back is what the bench's
alternation costs the engine (more than emptying the caches' data costs it: the processor's
state for the engine's code, docs/performance.md, section 4).

The replayed calls read the recorded step's arrays, not the ones they have just written.
On copy's arrays, a few hundred numbers each, the step's arrays stay in cache either way;
past what the caches hold the replay reads from memory what the step found in cache
(char-lm's replay took 1.07 of its step), and is no floor.

    python -m benchmarks.calls_alone               # copy, 400 rounds (~15 s)
    python -m benchmarks.calls_alone copy --rounds 1000
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks import workloads
from benchmarks.call_count import bound_arrays, recorded_step, replay, restore, snapshot
from numpy_engine.cli_args import positive_int

BATCHES = 4  # the steps' batches, taken in turn


def recorded_calls(name: str) -> list:
    """The calls of one engine step of workload `name`, on a model and optimizer of their own
    (a replay writes into the optimizer's moments), after a first step has made its state."""
    model, optimizer, (batch,) = workloads.build(workloads.WORKLOADS[name], 1)
    workloads.engine_step(model, optimizer, batch)
    return recorded_step(model, optimizer, batch, workloads.engine_step)


def measure(name: str, rounds: int) -> dict:
    """Seconds of each round's replay, engine step and the torch step after each, then of a
    replay and an engine step each right after an untimed one of its kind; the steps take
    the workload's BATCHES batches in turn, a round's all on its batch."""
    from benchmarks import bench
    from crosscheck.convert import tensor, torch_model_for

    tape = recorded_calls(name)
    arrays = bound_arrays(tape)
    saved = snapshot(arrays)
    workload = workloads.WORKLOADS[name]
    model, optimizer, batches, torch_optimizer_class = bench.build(workload, BATCHES)
    module = torch_model_for(model)
    torch_optimizer = torch_optimizer_class(module.parameters(), lr=1e-3)
    torch_batches = [tuple(tensor(x) for x in batch) for batch in batches]

    def torch_step(i: int):
        return bench.torch_step(module, torch_optimizer, torch_batches[i % BATCHES])

    def engine_step(i: int):
        return workloads.engine_step(model, optimizer, batches[i % BATCHES])

    times: dict[str, list] = {
        "replay": [],
        "torch after replay": [],
        "engine step": [],
        "torch after step": [],
        "replay after replay": [],
        "step after step": [],
    }
    for i in range(rounds):
        restore(arrays, saved)
        torch_step(i)
        for key, run in (
            ("replay", lambda i: replay(tape)),
            ("torch after replay", torch_step),
            ("engine step", engine_step),
            ("torch after step", torch_step),
        ):
            times[key].append(workloads.timed(run, i)[0])
        for key, run in (
            ("replay after replay", lambda i: replay(tape)),
            ("step after step", engine_step),
        ):
            run(i)  # untimed: the timed run follows one of its own kind
            times[key].append(workloads.timed(run, i)[0])
    return {"calls": len(tape), **times}


def summary(times: dict) -> dict:
    """Median ms of each, and the rounds' median ratios; back to back, the median of the
    rounds' step less replay (the Python between the calls)."""
    replay_s, step_s, torch_s = times["replay"], times["engine step"], times["torch after step"]
    warm_replay_s, warm_step_s = times["replay after replay"], times["step after step"]
    python_s = [step - calls for step, calls in zip(warm_step_s, warm_replay_s, strict=True)]
    return {
        "calls": times["calls"],
        "replay_ms": 1e3 * statistics.median(replay_s),
        "step_ms": 1e3 * statistics.median(step_s),
        "torch_ms": 1e3 * statistics.median(torch_s),
        "replay_of_step": workloads.paired_ratio(replay_s, step_s),
        "step_of_torch": workloads.paired_ratio(step_s, torch_s),
        "replay_of_torch": workloads.paired_ratio(replay_s, times["torch after replay"]),
        "warm_replay_ms": 1e3 * statistics.median(warm_replay_s),
        "warm_step_ms": 1e3 * statistics.median(warm_step_s),
        "python_ms": 1e3 * statistics.median(python_s),
    }


def report(name: str, rounds: int, row: dict) -> str:
    return (
        f"{name}, one thread, each run right after a torch step ({rounds} rounds; "
        f"{workloads.processor_name()}):\n"
        f"  engine step {row['step_ms']:.3f} ms; its {row['calls']} NumPy calls back to back "
        f"{row['replay_ms']:.3f} ms ({row['replay_of_step']:.3f} of the step); "
        f"torch step {row['torch_ms']:.3f} ms\n"
        f"  against the torch step after each: the engine step {row['step_of_torch']:.3f}, "
        f"its calls alone {row['replay_of_torch']:.3f}\n"
        f"  back to back, each right after one of its kind: the engine step "
        f"{row['warm_step_ms']:.3f} ms, its calls {row['warm_replay_ms']:.3f} ms; the Python "
        f"between the calls {row['python_ms']:.3f} ms"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.calls_alone",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "config",
        nargs="?",
        default="copy",
        choices=list(workloads.WORKLOADS),
        help="the workload (default: copy, the call-bound one)",
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=400, help="timed rounds (default: 400)"
    )
    args = parser.parse_args(argv)

    import torch

    from numpy_engine.memory import keep_freed_memory

    keep_freed_memory()  # as the bench does
    torch.set_num_threads(1)
    with workloads.on_threads(1):
        row = summary(measure(args.config, args.rounds))
    print(report(args.config, args.rounds, row))
    return row


if __name__ == "__main__":
    main()
