"""The other benchmark scripts (generate, optimizer_threads, dropout, linear_paths, ab) run on
tiny configurations, and every runnable script refuses a bad argument by name and explains
each of its own. Timing is never asserted."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench
from benchmarks import generate as generate_benchmark
from parity_tests.helpers import argument_helps, unexplained


def test_generation_benchmark_runs_and_all_paths_agree(capsys):
    summary = generate_benchmark.main(["--tokens", "6", "--context", "8", "--repeats", "1"])
    assert summary["same_tokens"] is True
    assert set(summary["paths"]) == {
        "engine, KV cache",
        "engine, no cache",
        "torch_reference, no cache",
    }
    assert "tokens/s" in capsys.readouterr().out


def test_generation_benchmark_decodes_a_batch_at_a_width(capsys):
    """--batch B prompts at --d-model C: tokens/s counts every row's tokens, and the three
    paths still agree (here through the transposed products of 2-64 rows: at width 128 the
    q, k, v and FFN weights have 49K-66K entries)."""
    argv = ["--tokens", "5", "--context", "8", "--repeats", "1", "--batch", "3", "--d-model", "128"]
    summary = generate_benchmark.main(argv)
    assert summary["same_tokens"] is True and (summary["batch"], summary["d_model"]) == (3, 128)
    for row in summary["paths"].values():
        assert row["tokens_per_second"] == pytest.approx(15 / row["seconds"], rel=1e-12)
    assert "5 tokens x batch 3" in capsys.readouterr().out


def test_optimizer_threads_times_each_side_in_turn_and_checks_the_engines_bits(monkeypatch):
    """1M entries (16 blocks, 8 a thread at two threads; a gradient norm of ~1, clipped):
    each side a step untimed then one timed a round, the engine on one thread then on two,
    torch on two; the engine's runs end on the same bits, and torch's AdamW after its
    clip_grad_norm_ on the engine's parameters to float32 rounding."""
    import torch

    from benchmarks import optimizer_threads
    from numpy_engine import threads

    engine_threads, torch_threads = [], []
    monkeypatch.setattr(
        optimizer_threads,
        "set_threads",
        lambda n: engine_threads.append(n) or threads.set_threads(n),
    )
    monkeypatch.setattr(torch, "set_num_threads", torch_threads.append)
    before = threads.threads()
    result = optimizer_threads.measure(1 << 20, 2, 3)
    assert threads.threads() == before and torch_threads == [2]
    assert engine_threads == [1, 2, 2] * 3
    names = ["engine, 1 thread", "engine, 2 threads", "torch, 2 threads"]
    assert list(result["seconds"]) == names and result["same bits"] is True
    assert all(len(times) == 3 and min(times) > 0 for times in result["seconds"].values())
    assert result["steps"]["engine"] == [6, 6] and result["torch"]["steps"] == 6
    ours, theirs = result["engine params"], result["torch"]["params"].numpy()
    assert np.abs(ours - theirs).max() <= 1e-7  # 3.7e-8 measured: float32 roundings of 0.1


def test_optimizer_threads_main_measures_what_its_flags_say_and_prints_the_report(
    monkeypatch, capsys
):
    from benchmarks import optimizer_threads

    asked = []
    seconds = {"engine, 1 thread": [0.4], "engine, 3 threads": [0.2], "torch, 3 threads": [0.8]}
    result = {"seconds": seconds, "same bits": True}
    monkeypatch.setattr(optimizer_threads, "measure", lambda *args: asked.append(args) or result)
    optimizer_threads.main(["--size", "1000", "--threads", "3", "--rounds", "5"])
    assert asked == [(1000, 3, 5)]
    assert capsys.readouterr().out == optimizer_threads.report(1000, 3, 5, result) + "\n"
    optimizer_threads.main([])
    assert asked[-1] == (optimizer_threads.GPT2_PARAMETERS, 2, 8)


def test_dropout_benchmark_steps_each_side_from_the_same_weights_and_drops_on_two():
    """The four sides' two first steps on batches 0 and 1: the engine and torch without
    dropout take the same losses (to float32 rounding: the same weights, update and batch);
    with it, each takes another, and the engine's are those its training_rng(0, i + 1)
    masks and a step of its workload's optimizer give."""
    import torch

    from benchmarks import dropout
    from numpy_engine.dropout import every_site, training_rng

    torch.manual_seed(0)  # the twin's dropout draws from torch's generator
    sides = dropout._sides("copy", 0.3, 2)
    loss = {side: [float(step(i)) for i in (0, 1)] for side, step in sides.items()}
    for i in (0, 1):  # dropout moved these losses by 4e-4 to 2e-2 of them over 20 seeds
        assert abs(loss["engine"][i] - loss["torch"][i]) <= 1e-5 * loss["torch"][i]
        assert abs(loss["engine, dropout"][i] - loss["engine"][i]) > 1e-4 * loss["engine"][i]
        assert abs(loss["torch, dropout"][i] - loss["torch"][i]) > 1e-4 * loss["torch"][i]
    plain, _, batches, _ = dropout.build(dropout.WORKLOADS["copy"], 2)
    rates = every_site(0.3)
    dropping = type(plain).with_params(replace(plain.config, **rates), plain.params)
    optimizer = dropout.WORKLOADS["copy"].optimizer(dropping.params, lr=1e-3)
    first, grads = dropping.loss_and_grads(*batches[0], training_rng(0, 1))
    optimizer.step(dropping.flat, grads, max_grad_norm=1.0)
    second, _ = dropping.loss_and_grads(*batches[1], training_rng(0, 2))
    assert [first, second] == loss["engine, dropout"]


def test_dropout_benchmark_of_gpt2_trains_transformers_in_both_modes(monkeypatch):
    """At gpt2's size the torch sides are transformers' model, in eval mode and in training
    mode; the engine's trainers draw their masks as `train` does. (A small GPT-2 here.)"""
    import torch

    from benchmarks import dropout, gpt2
    from numpy_engine.dropout import every_site, training_rng
    from numpy_engine.models import GPT2, GPT2Config
    from numpy_engine.optim import AdamW

    config = GPT2Config(vocab_size=50, max_len=64)
    monkeypatch.setattr(gpt2, "engine_model", lambda: GPT2(config, seed=0))
    torch.manual_seed(0)  # transformers' dropout draws from torch's generator
    sides = dropout._sides("gpt2", 0.2, 2)
    loss = {side: [float(step(i)) for i in (0, 1)] for side, step in sides.items()}
    for i in (0, 1):  # the second step after each side's own update
        # at GPT-2's initial scale dropout moves the loss ~1e-4 of it, float32 rounding ~1e-7
        assert abs(loss["engine"][i] - loss["torch"][i]) <= 1e-6 * loss["torch"][i]
        assert abs(loss["engine, dropout"][i] - loss["engine"][i]) > 2e-5 * loss["engine"][i]
        assert abs(loss["torch, dropout"][i] - loss["torch"][i]) > 2e-5 * loss["torch"][i]
    rates = every_site(0.2)
    model = GPT2(replace(config, **rates), seed=0)
    optimizer, data = AdamW(model.params, lr=gpt2.LR), gpt2.batches(2, 50)
    expected = []
    for step, batch in enumerate(data, start=1):  # masks keyed by each step, as `train`'s
        step_loss, grads = model.loss_and_grads(*batch, training_rng(0, step))
        expected.append(step_loss)
        optimizer.step(model.flat, grads, max_grad_norm=1.0)
    assert loss["engine, dropout"] == expected


def test_dropout_benchmark_times_every_side_on_one_thread(monkeypatch):
    import torch

    from benchmarks import dropout
    from numpy_engine.threads import threads

    seen = []

    def timed(step, i):  # each step's threads, and a step of 2 ms
        seen.append((torch.get_num_threads(), threads()))
        return 0.002, step(i)

    monkeypatch.setattr(dropout, "timed", timed)
    kept = []  # malloc told to keep freed pages, before any side is built
    monkeypatch.setattr(dropout, "keep_freed_memory", lambda: kept.append(len(seen)))
    torch.set_num_threads(2)
    times = dropout.measure("copy", 0.1, 2)
    assert times == {side: [2.0, 2.0] for side in dropout.SIDES}
    assert seen == [(1, 1)] * 4 * (2 + dropout.UNTIMED_ROUNDS)
    assert kept == [0]


def test_dropout_benchmark_main_measures_what_its_flags_say_and_reports_the_ratios(
    monkeypatch, capsys
):
    from benchmarks import dropout

    asked = []
    times = {"engine": [1.0], "engine, dropout": [1.5], "torch": [2.0], "torch, dropout": [4.0]}
    monkeypatch.setattr(dropout, "measure", lambda *args: asked.append(args) or times)
    dropout.main(["--config", "copy", "--rate", "0.2", "--rounds", "7"])
    assert asked == [("copy", 0.2, 7)]
    out = capsys.readouterr().out
    assert out == dropout.report("copy", 0.2, times) + "\n"
    assert out.splitlines()[0] == "copy, dropout 0.2, one thread, 1 steps a side (ms):"
    assert out.splitlines()[-2:] == [
        "  dropout adds: engine 1.500x, torch 2.000x",
        "  engine / torch: with dropout 0.375, without 0.500",
    ]
    dropout.main([])
    assert asked[-1] == ("char-lm", 0.1, 40)


def test_optimizer_threads_reports_each_median_and_their_ratios():
    from benchmarks import optimizer_threads

    seconds = {"engine, 1 thread": [0.4, 0.5, 0.3], "engine, 2 threads": [0.2, 0.3, 0.1]}
    seconds["torch, 2 threads"] = [0.8, 0.8, 0.9]
    report = optimizer_threads.report(1000, 2, 3, {"seconds": seconds, "same bits": True})
    assert report.splitlines() == [
        "AdamW with clipping, 1,000 float32 parameters, median of 3 rounds:",
        "  engine, 1 thread         400.0 ms",
        "  engine, 2 threads        200.0 ms",
        "  torch, 2 threads         800.0 ms",
        "  engine 2 threads / engine 1 thread: 0.500",
        "  engine 2 threads / torch 2 threads: 0.250",
        "  the engine's two runs ended on the same bits: True",
    ]


def test_linear_paths_times_each_path_and_names_the_one_linear_forward_takes(monkeypatch):
    from benchmarks import linear_paths as lp

    monkeypatch.setattr(lp, "CALL_ENTRIES", 1)  # one call a timing: the sizes, not the times
    results = lp.measure(shapes=[(8, 4), (2048, 256)], rows_list=[1, 3, 9], cold_bytes=1 << 16)
    assert [(r["weight"], r["rows"], r["taken"]) for r in results] == [
        ((8, 4), 1, "product"),
        ((8, 4), 3, "product"),
        ((8, 4), 9, "product"),
        ((2048, 256), 1, "timed"),  # 2**19 entries
        ((2048, 256), 3, "timed"),
        ((2048, 256), 9, "transposed"),
    ]
    times = [t for r in results for place in ("cache", "memory") for t in r[place].values()]
    assert len(times) == 36 and min(times) > 0
    assert len(lp.table(results).splitlines()) == 2 + len(results)
    slow = {"row dots": 2.0, "transposed": 4.0, "product": 2.6}
    fake = {"weight": (4, 4), "rows": 2, "taken": "product", "cache": slow, "memory": slow}
    assert lp.table([fake]).splitlines()[-1].endswith("product   1.30*  1.30*")
    fake["taken"] = "row dots"
    assert lp.table([fake]).splitlines()[-1].endswith("row dots   1.00   1.00 ")
    fake["taken"] = "timed"  # of 2 rows: row dots against the transposed product
    assert lp.table([fake]).splitlines()[-1].endswith("timed   1.00   1.00 ")
    fake["rows"], fake["cache"] = 1, {"row dots": 3.0, "transposed": 2.0, "product": 2.6}
    assert lp.table([fake]).splitlines()[-1].endswith("timed   1.30*  1.00 ")  # 1 row: product


def test_linear_paths_cycles_its_weights_and_times_a_call_of_each(monkeypatch):
    """In memory: as many copies of the weight as cold_bytes holds; either way the cycle
    repeats them to cover CALL_ENTRIES rows x entries; a call's time is the cycle's / its
    length. Paths that record their operands stand in for the products, a fixed clock for
    the timing."""
    from benchmarks import linear_paths as lp

    seen = []
    record = lambda x, w: seen.append((x.shape, id(w)))  # noqa: E731
    monkeypatch.setattr(lp, "PATHS", {"row dots": record, "product": record})
    monkeypatch.setattr(lp, "best_seconds", lambda fn: (fn(), 0.003)[1])
    monkeypatch.setattr(lp, "CALL_ENTRIES", 7000)
    (result,) = lp.measure(shapes=[(10, 20)], rows_list=[3], cold_bytes=4000)
    in_cache, in_memory = seen[:11], seen[22:32]  # each cycle's first path
    assert len(seen) == 2 * 11 + 2 * 10  # 7000 // (3 x 200) = 11 calls; 2 x 5 copies
    assert {shape for shape, _ in seen} == {(3, 20)}
    assert len({w for _, w in in_cache}) == 1 and len({w for _, w in in_memory}) == 5
    assert result["cache"] == {"row dots": 1e6 * 0.003 / 11, "product": 1e6 * 0.003 / 11}
    assert result["memory"] == {"row dots": 300.0, "product": 300.0}
    seen.clear()  # a weight larger than cold_bytes, calls longer than CALL_ENTRIES: one of each
    monkeypatch.setattr(lp, "CALL_ENTRIES", 1)
    lp.measure(shapes=[(10, 20)], rows_list=[3], cold_bytes=100)
    assert len(seen) == 4 and len({w for _, w in seen[2:]}) == 1


def test_ab_loads_the_earlier_commit_side_by_side(tmp_path):
    """benchmarks/ab.py: the revision's packages come out renamed, with no import left that
    would load the working tree's code instead; a run prints both sides; a bad revision is
    refused naming it."""
    import re
    import subprocess
    import sys

    from benchmarks import ab

    ab.export_old("HEAD", tmp_path)
    tracked = subprocess.run(
        ["git", "-C", str(ab.ROOT), "ls-files", "numpy_engine/*.py", "numpy_engine/**/*.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    exported = sorted(tmp_path.glob("numpy_engine_old/**/*.py"))
    assert len(exported) == len(set(tracked)) > 20
    for path in exported:
        assert not re.search(r"\bnumpy_engine\b", path.read_text()), path

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "benchmarks.ab", *args],
            cwd=ab.ROOT,
            capture_output=True,
            text=True,
            check=False,
        )

    done = run("HEAD", "--configs", "copy", "--steps", "3")
    assert done.returncode == 0, done.stderr
    line = next(row for row in done.stdout.splitlines() if row.startswith("copy"))
    ratio, first, third = re.search(
        r"new/old (\S+) \(middle half of the pairs (\S+)-(\S+)\)", line
    ).groups()
    assert 0 < float(first) <= float(ratio) <= float(third)
    refused = run("no-such-revision", "--steps", "1")
    assert refused.returncode == 1 and "no-such-revision" in refused.stderr


@pytest.mark.parametrize(
    "module, argv, named",
    [
        ("where_time_goes", ["copy", "tiny"], "unknown configs ['tiny']"),
        (
            "where_time_goes",
            ["--threads", "0"],
            "argument --threads: must be an integer from 1 to the ",  # this process's cores
        ),
        (  # more threads than cores time how they contend for them
            "generate",
            ["--threads", "100000"],
            "cores this process may use, got 100000",
        ),
        (
            "ab",
            ["HEAD", "--threads", "0"],
            "argument --threads: must be an integer from 1 to the ",  # this process's cores
        ),
        ("parallel", ["0"], "argument steps: must be a positive integer, got 0"),
        ("gpt2", ["four"], "argument steps: must be a positive integer, got 'four'"),
        ("generate", ["--tokens", "-3"], "argument --tokens: must be a positive integer, got -3"),
        ("generate", ["--json", "/"], "argument --json: '/' is a directory, not a file"),
        ("linear_paths", ["64"], "unrecognized arguments: 64"),
        (
            "optimizer_threads",
            ["--threads", "0"],
            "argument --threads: must be a positive integer, got 0",
        ),
        (
            "optimizer_threads",
            ["--size", "x"],
            "argument --size: must be a positive integer, got 'x'",
        ),
        ("dropout", ["--rate", "1"], "argument --rate: must be at least 0 and below 1, got 1"),
        ("dropout", ["--config", "tiny"], "argument --config: invalid choice: 'tiny'"),
    ],
)
def test_benchmark_scripts_refuse_a_bad_argument_by_name(module, argv, named, capsys):
    """Each runnable benchmark script parses its arguments: a bad one exits 2 naming it before
    anything is built (where_time_goes read any word as a workload, and --help too)."""
    import importlib

    script = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def _parses_its_argv(path: Path) -> bool:
    """Whether a benchmark file runs as python -m benchmarks.NAME and parses its argv."""
    text = path.read_text()
    return "\ndef main(argv" in text and '__name__ == "__main__"' in text


SCRIPTS = sorted(
    path.stem for path in Path(bench.__file__).parent.glob("*.py") if _parses_its_argv(path)
)


@pytest.mark.parametrize("module", SCRIPTS)
def test_each_benchmark_scripts_arguments_say_what_they_are(module, monkeypatch):
    """Every argument of a benchmark script has a help that says what it is, not only its
    default. The script's parser is caught where it parses, before anything is built."""
    parsers = []

    def caught(parser, args=None, namespace=None):
        parsers.append(parser)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    with pytest.raises(SystemExit):
        importlib.import_module(f"benchmarks.{module}").main([])
    assert len(parsers) == 1, module  # one parser, reached
    assert unexplained(argument_helps(parsers[0])) == {}


def test_the_benchmark_scripts_are_found():
    assert {"ab", "calls_alone", "dropout", "optimizer_threads", "where_time_goes"} <= set(SCRIPTS)
