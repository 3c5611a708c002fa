"""The benchmark scripts run (tiny configurations; timing is never asserted)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench, workloads
from benchmarks import generate as generate_benchmark
from benchmarks.bench import CONFIGS, flops_per_step
from benchmarks.matmul_floor import gpt_step_matmuls
from benchmarks.workloads import middle_half, processor_name, spread
from crosscheck.cli import main as bench_command
from numpy_engine import GPTConfig, MiniGPT, Seq2SeqConfig, Seq2SeqTransformer
from numpy_engine.cli import main
from parity_tests.helpers import argument_helps, recorded_thread_settings, unexplained


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


def test_train_step_benchmark_one_step_smoke(tmp_path, capsys):
    """char-lm, with its memory probes and its matmul floor (copy, which has no floor, runs
    through `numpy-engine bench` in the test after the next)."""
    out = tmp_path / "bench.json"
    assert bench_command(["bench", "--configs", "char-lm", "--steps", "1", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    row = summary["configs"]["char-lm"]
    assert_one_step_row(row)
    assert row["engine_peak_mb"] > 0 and row["torch_peak_mb"] > 0
    assert row["numpy_matmul_ms"] > 0 and row["torch_matmul_ms"] > 0
    blas = summary["blas"]  # what the ratios depend on, named in the table's first line
    assert blas["numpy"].split()[0] in ("scipy-openblas", "openblas", "accelerate", "mkl")
    assert blas["torch"] != "unknown"
    assert summary["processor"] == processor_name()  # the other thing the ratios depend on
    assert [line.split()[0] for line in table_after("matmuls alone", capsys)] == ["char-lm"]


def assert_one_step_row(row: dict) -> None:
    """A config's row of a one-step bench: times, its FLOPs, its calls, a one-pair ratio."""
    assert row["engine_ms"] > 0 and row["torch_ms"] > 0 and row["flops_per_step"] > 0
    assert 100 < row["numpy_calls"] < 5000  # a small model's step: hundreds of calls
    assert row["ratio_middle_half"] == [row["ratio"], row["ratio"]]  # one pair: its own


def test_processor_name_reads_the_model_name_and_counts_the_cores(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n")
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert processor_name(str(cpuinfo)) == "AMD EPYC 9R14, 2 cores"
    monkeypatch.setattr("platform.processor", lambda: "")
    monkeypatch.setattr("platform.machine", lambda: "arm64")
    assert processor_name(str(tmp_path / "none")) == "arm64, 2 cores"  # no /proc: platform's
    cpuinfo.write_text("processor\t: 0\n")  # no model name (some ARM kernels)
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert processor_name(str(cpuinfo)) == "arm64"


def test_numpy_blas_says_when_the_environment_chose_openblas_kernel(monkeypatch):
    """OPENBLAS_CORETYPE overrides OpenBLAS's own choice of kernel (a Zen 5's environment set
    Haswell's, at half its products' speed): the bench's and where_time_goes's first lines
    say so, beside the kernel."""
    import threadpoolctl

    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [{"architecture": "Haswell"}])
    told = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512", "OTHER": "1"}
    named = workloads.numpy_blas(told)
    assert named.endswith(" (Haswell, as OPENBLAS_CORETYPE=Haswell and OPENBLAS_L2_SIZE=512 set)")
    assert workloads.numpy_blas({"OPENBLAS_L2_SIZE": "512"}).endswith(
        " (Haswell, as OPENBLAS_L2_SIZE=512 set)"
    )
    assert workloads.numpy_blas({}).endswith(" (Haswell)")  # OpenBLAS's own choice
    assert bench.blas_libraries()["numpy"] == workloads.numpy_blas()  # the bench's line
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [])  # no OpenBLAS: no kernel
    assert workloads.numpy_blas(told) == named.split(" (")[0]  # the library and its version


def table_after(heading: str, capsys) -> list[str]:
    out = capsys.readouterr().out
    assert "ratio" in out and heading in out and "BLAS: NumPy " in out.splitlines()[0]
    assert out.splitlines()[0].endswith(f"; {processor_name()}")  # what the ratios depend on
    return [line for line in out.split(heading, 1)[1].splitlines()[2:] if line.strip()]


@pytest.mark.parametrize("name", ["char-lm", "large"])
def test_matmul_floor_lists_every_flop_of_the_step(name):
    """The floor's products add up to exactly the FLOPs the benchmark reports per step."""
    workload = CONFIGS[name]
    config = GPTConfig(**workload.model)
    products = gpt_step_matmuls(config, workload.batch_size, workload.length)
    flops = sum(2 * math.prod(left) * right[-1] for left, right in products)
    assert flops == flops_per_step(workload, MiniGPT(config))


def alternated(threads: int, pairs: int, monkeypatch, seconds=lambda i: 0.04) -> tuple:
    """The calls workloads.alternate makes of two recording sides, the step on batch i
    'taking' seconds(i)."""
    from benchmarks import workloads

    monkeypatch.setattr(workloads, "timed", lambda fn, i: (seconds(i), fn(i)))
    calls = []
    sides = tuple(lambda i, name=name: calls.append(f"{name}{i}") or i for name in "et")
    return calls, workloads.alternate(sides, pairs, threads)


def turn_calls(first: int, last: int) -> list[str]:
    """A turn of each side, the engine's first, on batches first..last."""
    return [f"{side}{i}" for side in "et" for i in range(first, last + 1)]


def test_middle_half_is_the_quartiles_of_each_pairs_own_ratio():
    """Ratios 1..5: quartiles 2 and 4. Pairs (2 / 1, 2 / 4): ratios 2 and 0.5, quartiles
    0.875 and 1.625, where the medians' ratio would read 2 / 2.5 = 0.8 at both ends."""
    assert middle_half([1, 2, 3, 4, 5], [1] * 5) == (2.0, 4.0)
    assert middle_half([2, 2], [1, 4]) == (0.875, 1.625)
    assert spread(middle_half([2, 2], [1, 4])) == "0.88-1.62"


def bench_summary(**configs) -> dict:
    """A bench summary as run() makes it, with one row per config given as its overrides."""
    row = dict(engine_ms=3.22, torch_ms=4.0, ratio=0.8049, ratio_middle_half=(0.79, 0.82))
    row |= dict(flops_per_step=1e6, engine_gflops=0.31, engine_peak_fraction=0.01, numpy_calls=458)
    summary = dict(threads=1, matmul_peak_gflops=100.0, matmul_peak_readings=[90.0, 100.0])
    summary["processor"] = "x"
    summary["blas"] = {"numpy": "openblas", "torch": "mkl"}
    summary["configs"] = {name: row | overrides for name, overrides in configs.items()}
    return summary


def known_step_times(monkeypatch, calls: list, seconds: dict) -> None:
    """workloads.timed replaced: a step runs, and its side's k-th step 'takes' seconds[side][k],
    the side read from the (side, batch) that the step appended to calls."""
    from benchmarks import workloads

    def timed(fn, i):
        result = fn(i)
        side = calls[-1][0]
        return seconds[side][sum(name == side for name, _ in calls) - 1], result

    monkeypatch.setattr(workloads, "timed", timed)


def test_bench_times_each_side_after_the_warm_up_from_its_own_steps(monkeypatch):
    """One thread: the engine and torch take batch i in turn, a new batch each pair, the
    warm-up pairs untimed; medians in ms, the ratio the median of the pairs' ratios, GFLOP/s
    from the medians. Each step 'takes' a known time (workloads.timed replaced)."""
    calls, real = [], {"engine": bench.engine_step, "torch": bench.torch_step}
    optimizers, batch_types = {}, {}
    for side in real:

        def step(model, optimizer, batch, side=side):
            calls.append((side, np.asarray(batch[0]).astype(np.int64).tobytes()))
            optimizers[side], batch_types[side] = optimizer, type(batch[0]).__module__
            return real[side](model, optimizer, batch)

        monkeypatch.setattr(bench, f"{side}_step", step)
    seconds = {"engine": [9, 9, 0.004, 0.002, 0.003], "torch": [9, 9, 0.010, 0.010, 0.004]}
    known_step_times(monkeypatch, calls, seconds)
    result = bench.time_config(CONFIGS["copy"], 3, 2, 1)
    assert [side for side, _ in calls] == ["engine", "torch"] * 5
    batches = [batch for _, batch in calls]
    assert batches[::2] == batches[1::2] and len(set(batches)) == 5
    assert batch_types == {"engine": "numpy", "torch": "torch"}  # each side's own arrays
    engine_optimizer, torch_optimizer = optimizers["engine"], optimizers["torch"]
    assert type(torch_optimizer).__name__ == type(engine_optimizer).__name__ == "Adam"
    assert torch_optimizer.param_groups[0]["lr"] == engine_optimizer.lr
    assert result["engine_ms"] == pytest.approx(3.0) and result["torch_ms"] == pytest.approx(10.0)
    assert result["ratio"] == pytest.approx(0.4)  # pairs 0.4, 0.2 and 0.75
    assert result["ratio_middle_half"] == pytest.approx((0.3, 0.575))
    flops = result["flops_per_step"]
    assert flops == flops_per_step(CONFIGS["copy"], Seq2SeqTransformer(Seq2SeqConfig()))
    assert result["engine_gflops"] == pytest.approx(flops / 3e6)
    assert result["torch_gflops"] == pytest.approx(flops / 10e6)


def test_on_threads_sets_the_blas_and_the_engines_threads_and_puts_them_back():
    from threadpoolctl import threadpool_info

    from numpy_engine import threads

    before = threads.threads()
    with workloads.on_threads(before + 1):
        assert threads.threads() == before + 1
        blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        assert blas and set(blas) == {before + 1}
    assert threads.threads() == before


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


def test_bench_run_gives_each_config_its_steps_threads_and_memory_probes(monkeypatch):
    """bench.run with its measurements replaced by recorders: large times a fifth of the
    steps (at least 3), the warm-up at most the steps; every measurement on the threads
    asked for; memory probed over 2 steps for large, 5 for the others; the matmul floor
    for the configs that have one."""
    import contextlib

    asked = []
    monkeypatch.setattr(bench, "keep_freed_memory", lambda: asked.append("keep_freed_memory"))
    monkeypatch.setattr(bench.torch, "set_num_threads", lambda n: asked.append(("torch", n)))

    @contextlib.contextmanager
    def on_threads(n):
        asked.append(("threads", n))
        yield

    def time_config(cfg, steps, warmup, threads):
        asked.append((cfg.name, steps, warmup, threads))
        return {"engine_gflops": 10.0}

    def peak_memory_mb(name, engine, steps, threads):
        asked.append((name, engine, steps, threads))
        return 1.5

    monkeypatch.setattr(bench.workloads, "on_threads", on_threads)
    monkeypatch.setattr(bench, "time_config", time_config)
    monkeypatch.setattr(bench, "peak_memory_mb", peak_memory_mb)
    readings = iter([40.0, 50.0, 45.0] * 3)  # before copy, after it, after large; each run
    monkeypatch.setattr(bench, "matmul_peak_gflops", lambda: next(readings))
    monkeypatch.setattr(bench, "numpy_calls", lambda cfg: 7)
    monkeypatch.setattr(bench, "matmul_floor", lambda cfg: {"floor": cfg.name})
    for steps, large_steps in ((40, 8), (15, 3), (10, 3)):
        asked.clear()
        summary = bench.run(["copy", "large"], steps, warmup=5, threads=2, memory=True)
        assert asked == [
            "keep_freed_memory",
            ("torch", 2),
            ("threads", 2),
            ("copy", steps, 5, 2),
            ("large", large_steps, min(5, large_steps), 2),
            ("copy", "engine", 5, 2),
            ("copy", "torch", 5, 2),
            ("large", "engine", 2, 2),
            ("large", "torch", 2, 2),
        ]
        assert summary["threads"] == 2 and summary["matmul_peak_gflops"] == 50.0  # the best
        assert summary["matmul_peak_readings"] == [40.0, 50.0, 45.0]
        copy, large = summary["configs"]["copy"], summary["configs"]["large"]
        assert copy["steps_timed"] == steps and large["steps_timed"] == large_steps
        for row in (copy, large):
            assert row["engine_peak_fraction"] == 0.2 and row["numpy_calls"] == 7
            assert row["engine_peak_mb"] == row["torch_peak_mb"] == 1.5
        assert "floor" not in copy and large["floor"] == "large"


def test_bench_table_prints_each_ratio_to_three_decimals():
    """The bars sit at two decimals (0.80, 0.30): a ratio of 0.8049 must not read 0.80."""
    cells = bench.table(bench_summary(copy={})).splitlines()[2].split()
    assert cells[1:5] == ["3.22", "4.00", "0.805", "0.79-0.82"]


def test_bench_table_says_the_peak_is_the_best_of_its_readings():
    first = bench.table(bench_summary(copy={})).splitlines()[0]
    assert first == (
        "float32, 1 thread(s); np.matmul peak 100.0 GFLOP/s (1024x1024, the best of 2 "
        "readings, 90.0-100.0); BLAS: NumPy openblas, torch mkl; x"
    )


def test_bench_table_prints_memory_and_floors_where_they_were_measured():
    """Peak memory where it was measured (else "-"), and the matmul floor's table only for
    the configs that have one, each row under its own name."""
    memory = dict(engine_peak_mb=39.4, torch_peak_mb=313.0)
    floor = dict(numpy_matmul_ms=1.5, torch_matmul_ms=2.0)
    summary = bench_summary(copy=memory, tiny={}, **{"char-lm": floor, "large": floor})
    lines = bench.table(summary).splitlines()
    assert lines[2].split()[-3:] == ["39", "313", "458"]  # copy: engine MB, torch MB, calls
    assert lines[3].split()[-3:] == ["-", "-", "458"]  # tiny: no memory measured
    floors = [line.split() for line in lines[lines.index("") + 3 :]]
    row = ["1.50", "2.00", "0.75", "1.72", "2.00"]  # products alone, their ratio, the rests
    assert floors == [["char-lm", *row], ["large", *row]]
    assert len(bench.table(bench_summary(copy=memory)).splitlines()) == 3  # no floor: no table


def test_gpt2_benchmark_line_prints_the_ratio_with_its_pairs_middle_half():
    """Three decimals, as the bench's table: the GPT-2 issue's bar is 0.80."""
    from benchmarks import gpt2

    result = dict(engine_ms=1764.2, torch_ms=1866.0, ratio=0.8049, ratio_middle_half=(0.9, 0.98))
    result |= dict(pairs=20, engine_tokens_per_s=25.8, torch_tokens_per_s=23.8, same_tokens=True)
    result |= dict(processor="AMD EPYC, 2 cores", blas="openblas (SkylakeX)")  # as run() has
    first_line = gpt2.table(result).splitlines()[0]
    assert first_line.startswith(
        "gpt2 (124M, float32, batch 4 x 64; NumPy's BLAS openblas (SkylakeX); AMD EPYC, 2 cores): "
    )
    assert first_line.endswith(
        "engine 1764 ms, transformers 1866 ms a training step, ratio 0.805 "
        "(the middle half of its 20 pairs 0.90-0.98)"
    )
    measured = result | dict(engine_peak_mb=2207.4, torch_peak_mb=3004.0)
    with_memory = gpt2.table(measured).splitlines()[0]
    assert with_memory == first_line + "; peak memory engine 2207 MB, torch 3004 MB"
    assert (
        gpt2.table(result)
        .splitlines()[1]
        .endswith("engine 25.8 tokens/s, transformers 23.8 tokens/s, the same tokens")
    )
    for path in ("row dots", "products"):  # how decoding multiplied its row, where timed
        generation = gpt2.table(result | {"decoding_path": path}).splitlines()[1]
        assert generation.endswith(
            f"engine 25.8 tokens/s (by {path}, timed the faster), transformers 23.8 tokens/s, "
            "the same tokens"
        )


def small_gpt2_benchmark(monkeypatch):
    """benchmarks.gpt2 with a GPT-2 of 64 tokens, 8 wide and one layer deep: its steps and
    decoding take milliseconds, where the 124M model's take seconds."""
    from benchmarks import gpt2
    from numpy_engine.models import GPT2, GPT2Config

    config = GPT2Config(vocab_size=64, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=128)
    monkeypatch.setattr(gpt2, "engine_model", lambda: GPT2(config, seed=0))
    return gpt2


def recorded_gpt2_steps(monkeypatch, seconds: dict, engine_loss_shift: float = 0.0) -> list:
    """small_gpt2_benchmark whose trainers record (side, batch) for each step they take, the
    engine's loss shifted by engine_loss_shift; the k-th step of a side 'takes'
    seconds[side][k] (workloads.timed replaced)."""

    gpt2 = small_gpt2_benchmark(monkeypatch)
    calls = []
    for side, trainer in (("engine", gpt2.EngineTrainer), ("torch", gpt2.TorchTrainer)):
        shift = engine_loss_shift if side == "engine" else 0.0

        def step(self, batch, side=side, real=trainer.step, shift=shift):
            calls.append((side, int(batch[0].sum())))
            return real(self, batch) + shift

        monkeypatch.setattr(trainer, "step", step)

    known_step_times(monkeypatch, calls, seconds)
    return calls


def test_gpt2_benchmark_times_the_pairs_it_is_asked_for_after_one_to_warm_up(monkeypatch):
    """One thread: engine and transformers take each batch in turn, a new batch each pair,
    the first pair untimed; medians in ms, the ratio the median of the pairs' ratios."""
    seconds = {"engine": [9.0, 0.004, 0.002, 0.003], "torch": [9.0, 0.010, 0.010, 0.004]}
    calls = recorded_gpt2_steps(monkeypatch, seconds)
    result = small_gpt2_benchmark(monkeypatch).time_steps(3, 1)
    batches = [batch for _, batch in calls[::2]]
    assert calls == [(side, batch) for batch in batches for side in ("engine", "torch")]
    assert len(set(batches)) == 4
    assert result["pairs"] == 3
    assert result["engine_ms"] == pytest.approx(3.0) and result["torch_ms"] == pytest.approx(10.0)
    assert result["ratio"] == pytest.approx(0.4)  # pairs 0.4, 0.2 and 0.75
    assert result["ratio_middle_half"] == pytest.approx((0.3, 0.575))


def test_gpt2_benchmark_refuses_to_time_steps_whose_losses_differ(monkeypatch):
    """The two sides must take the same step: losses more than 1e-3 apart are not that."""
    seconds = {side: [0.01] * 3 for side in ("engine", "torch")}
    recorded_gpt2_steps(monkeypatch, seconds, engine_loss_shift=1.0)  # 5.2 against 4.2
    with pytest.raises(AssertionError):
        small_gpt2_benchmark(monkeypatch).time_steps(2, 1)


def test_gpt2_benchmark_generates_the_same_greedy_tokens_on_both_sides(monkeypatch):
    """From one 64-token prompt of batch 1, 64 new tokens a run after a 4-token warm-up;
    tokens/s from the median run."""
    import numpy_engine.generate
    from numpy_engine import layers
    from numpy_engine.faster import FasterOfTwo

    gpt2 = small_gpt2_benchmark(monkeypatch)
    asked, real_generate = [], numpy_engine.generate.generate

    def generate(model, prompt, new_tokens):
        asked.append((prompt.shape, new_tokens))
        return real_generate(model, prompt, new_tokens)

    monkeypatch.setattr(numpy_engine.generate, "generate", generate)
    runs = {"ours": iter([0.5, 0.25, 1.0]), "theirs": iter([2.0, 4.0, 1.0])}
    monkeypatch.setattr(gpt2, "timed", lambda side, n: (next(runs[side.__name__]), side(n)))
    one_row = FasterOfTwo(*layers.FEW_ROW_PATHS[1].paths)  # untimed, whatever ran before
    monkeypatch.setitem(layers.FEW_ROW_PATHS, 1, one_row)
    result = gpt2.time_generation()
    assert asked == [((1, 64), 4)] + [((1, 64), 64)] * 3
    assert result["same_tokens"] is True
    assert result["engine_tokens_per_s"] == 128.0 and result["torch_tokens_per_s"] == 32.0
    assert result["decoding_path"] is None  # its weights are too small for the timed paths


def test_gpt2_benchmark_names_the_decoding_path_its_process_chose(monkeypatch):
    """The name of whichever path layers.FEW_ROW_PATHS' one-row entry chose; None before."""
    from benchmarks import gpt2
    from numpy_engine import layers
    from numpy_engine.faster import FasterOfTwo

    chooser = FasterOfTwo(layers._row_dots, layers._product)
    monkeypatch.setitem(layers.FEW_ROW_PATHS, 1, chooser)
    assert gpt2.decoding_path() is None
    for path, name in ((layers._row_dots, "row dots"), (layers._product, "products")):
        chooser.chosen = path
        assert gpt2.decoding_path() == name


def test_gpt2_benchmark_run_measures_on_the_threads_asked_for(monkeypatch):
    """gpt2.run with its measurements replaced by recorders: freed memory kept, torch and
    BLAS on the threads asked for while steps and generation are timed, each side's peak
    memory probed only when asked."""
    import contextlib

    import torch

    from benchmarks import gpt2

    asked = []

    @contextlib.contextmanager
    def on_threads(n):
        asked.append(("threads", n))
        yield
        asked.append(("threads done", n))

    def time_steps(steps, threads):
        asked.append(("steps", steps, threads))
        return {"ratio": 0.8}

    def time_generation():
        asked.append("generation")
        return {"same_tokens": True}

    def peak_memory_mb(side, threads):
        asked.append((side, threads))
        return {"engine": 2207.0, "torch": 3004.0}[side]

    monkeypatch.setattr(gpt2, "keep_freed_memory", lambda: asked.append("keep_freed_memory"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: asked.append(("torch", n)))
    monkeypatch.setattr(gpt2, "on_threads", on_threads)
    monkeypatch.setattr(gpt2, "time_steps", time_steps)
    monkeypatch.setattr(gpt2, "time_generation", time_generation)
    monkeypatch.setattr(gpt2, "peak_memory_mb", peak_memory_mb)
    monkeypatch.setattr(gpt2, "processor_name", lambda: "Some CPU, 2 cores")
    monkeypatch.setattr(gpt2, "numpy_blas", lambda: "openblas (Haswell)")
    timed = ["keep_freed_memory", ("torch", 2), ("threads", 2), ("steps", 20, 2), "generation"]
    timed.append(("threads done", 2))
    result = gpt2.run(20, 2, memory=False)
    assert asked == timed
    machine = {"processor": "Some CPU, 2 cores", "blas": "openblas (Haswell)"}
    assert result == {"ratio": 0.8, "same_tokens": True, **machine}
    asked.clear()
    result = gpt2.run(20, 2, memory=True)
    assert asked == [*timed, ("engine", 2), ("torch", 2)]
    assert result["engine_peak_mb"] == 2207.0 and result["torch_peak_mb"] == 3004.0


def test_gpt2_memory_probe_runs_each_side_in_a_fresh_process_on_its_threads(monkeypatch):
    """Each side's peak memory comes from a process of its own, BLAS and OpenMP on the
    threads asked for (and torch's own), the engine's never importing torch; the last line
    it prints is the peak."""
    import subprocess
    import sys

    from benchmarks import gpt2

    runs = []

    def run(argv, **kwargs):
        runs.append((argv, kwargs))
        printed = "a log line\nanother\n2207.5\n"
        return subprocess.CompletedProcess(argv, 0, stdout=printed, stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    assert gpt2.peak_memory_mb("engine", 2) == 2207.5
    assert gpt2.peak_memory_mb("torch", 3) == 2207.5
    probe = "from benchmarks.gpt2 import memory_probe; memory_probe({!r})"
    assert [argv for argv, _ in runs] == [
        [sys.executable, "-c", probe.format("engine")],
        [sys.executable, "-c", "import torch; torch.set_num_threads(3); " + probe.format("torch")],
    ]
    for (_, kwargs), threads in zip(runs, ("2", "3"), strict=True):
        assert kwargs["env"]["OPENBLAS_NUM_THREADS"] == kwargs["env"]["OMP_NUM_THREADS"] == threads
        assert kwargs["check"] is True and kwargs["capture_output"] and kwargs["text"]


def test_alternate_on_one_thread_takes_one_step_each_in_turn(monkeypatch):
    calls, (engine, torch_) = alternated(1, 3, monkeypatch)
    assert calls == ["e0", "t0", "e1", "t1", "e2", "t2"]
    assert engine == torch_ == [(0.04, 0), (0.04, 1), (0.04, 2)]


def test_alternate_on_more_threads_settles_before_each_turn(monkeypatch):
    """A probe step each sizes the settling (0.1 s / 0.04 s: 3 untimed steps a turn); turns
    of 5 timed steps, the last one shorter; both sides take the same batches."""
    calls, (engine, torch_) = alternated(2, 7, monkeypatch)
    assert calls == ["e0", "t0"] + turn_calls(1, 8) + turn_calls(9, 13)
    timed_batches = [4, 5, 6, 7, 8, 12, 13]  # after 3 settling steps in each turn
    assert engine == torch_ == [(0.04, i) for i in timed_batches]


def test_alternate_settles_for_the_fastest_step_seen_so_far(monkeypatch):
    """A 50 ms probe: 2 settling steps in the first turn; its 25 ms steps: 4 in the next."""
    calls, (engine, torch_) = alternated(2, 7, monkeypatch, lambda i: 0.05 if i == 0 else 0.025)
    assert calls == ["e0", "t0"] + turn_calls(1, 7) + turn_calls(8, 13)
    assert [i for _, i in engine] == [i for _, i in torch_] == [3, 4, 5, 6, 7, 12, 13]


def test_matmul_floor_times_each_librarys_products_together_after_settling(monkeypatch):
    """Not interleaved: on two threads torch's products right after NumPy's ran 5-18x slow."""
    from benchmarks import matmul_floor

    log = []
    monkeypatch.setattr(matmul_floor, "settle", lambda fn: log.append(("settle", library(fn()[0]))))
    monkeypatch.setattr(matmul_floor, "best_seconds", lambda fn: log.append(library(fn())) or 0.25)
    products = [((2, 3), (3, 4)), ((4, 2), (2, 5))]
    assert matmul_floor.matmul_floor_ms(products) == {"numpy": 500.0, "torch": 500.0}
    assert log == [("settle", "numpy"), "numpy", "numpy", ("settle", "torch"), "torch", "torch"]


def test_settle_calls_until_its_time_has_passed(monkeypatch):
    """SETTLE_SECONDS is 0.1: read at 0.0, the clock then reads 0.05 (go on), 0.1 (stop)."""
    from benchmarks import matmul_floor

    readings = iter([0.0, 0.05, 0.1, 0.15])
    clock = types.SimpleNamespace(perf_counter=lambda: next(readings))  # matmul_floor's alone
    monkeypatch.setattr(matmul_floor, "time", clock)
    calls = []
    matmul_floor.settle(lambda: calls.append(1))
    assert len(calls) == 2


def library(product) -> str:
    return type(product).__module__.split(".")[0]


def test_bench_command_runs_through_numpy_engine(tmp_path, capfd):
    out = tmp_path / "bench.json"
    assert (
        main(["bench", "--configs", "copy", "--steps", "1", "--no-memory", "--json", str(out)]) == 0
    )
    printed = capfd.readouterr().out  # by the child process
    row = next(line.split() for line in printed.splitlines() if line.startswith("copy "))
    assert row[8:10] == ["-", "-"]  # --no-memory: no memory probe ran
    assert "matmuls alone" not in printed  # copy has no matmul floor
    assert_one_step_row(json.loads(out.read_text())["configs"]["copy"])


def test_bench_refuses_a_json_path_it_could_not_write_before_it_runs(tmp_path, capsys):
    for path, said in [
        (tmp_path, f"argument --json: {str(tmp_path)!r} is a directory, not a file"),
        (tmp_path / "no" / "b.json", f"the folder {str(tmp_path / 'no')!r} does not exist"),
    ]:
        with pytest.raises(SystemExit) as stop:  # argparse, before any step is timed
            bench_command(["bench", "--configs", "copy", "--json", str(path)])
        assert stop.value.code == 2 and said in capsys.readouterr().err


def test_bench_data_parallel_writes_its_json_too(tmp_path, monkeypatch, capsys):
    """--json was ignored with --data-parallel. The measurement (MPI ranks, DDP) is replaced
    here: what is checked is that its results reach the file as printed."""
    from benchmarks import parallel

    results = {"char-lm": {"engine_1": 10.0, "engine_2": 18.0, "torch_ddp_2": 16.0, "steps": 4}}
    asked = []
    monkeypatch.setattr(parallel, "run", lambda *args: asked.append(args) or results)
    out = tmp_path / "parallel.json"
    args = ["bench", "--data-parallel", "--configs", "copy", "char-lm", "--steps", "7"]
    assert bench_command([*args, "--json", str(out)]) == 0
    assert asked == [(["char-lm"], 7)]  # copy has no data-parallel workload
    assert json.loads(out.read_text()) == results
    assert "char-lm" in capsys.readouterr().out
    assert bench_command(args) == 0 and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    assert bench_command(["bench", "--data-parallel", "--configs", "copy"]) == 2
    assert "--data-parallel measures char-lm and large" in capsys.readouterr().err


@pytest.mark.parametrize("argv, pairs", [([], 20), (["--steps", "7"], 3), (["--steps", "9"], 4)])
def test_bench_times_gpt2_for_half_the_steps(argv, pairs, monkeypatch, capsys):
    """gpt2's pairs vary by 10-20%: the default (40 steps) times 20 of them, at least 3. The
    measurement is replaced here; what is checked is the count it is asked for."""
    from benchmarks import gpt2

    result = dict(engine_ms=2400.0, torch_ms=3000.0, ratio=0.8, ratio_middle_half=(0.7, 0.9))
    result |= dict(engine_tokens_per_s=38.0, torch_tokens_per_s=24.0, same_tokens=True)
    asked = []
    monkeypatch.setattr(
        gpt2,
        "run",
        lambda *args: (
            asked.append(args) or result | {"pairs": args[0], "processor": "x", "blas": "y"}
        ),
    )
    assert bench_command(["bench", "--configs", "gpt2", "--no-memory", *argv]) == 0
    assert asked == [(pairs, 1, False)]
    assert f"of its {pairs} pairs 0.70-0.90" in capsys.readouterr().out


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


def test_call_count_counts_each_call_from_the_callers_side_once():
    """Operators, in-place operators, reductions, matmul, NumPy functions and indexing each
    count once; np.where's inner calls do not; views and attributes do not. `.mean()`, a
    method NumPy writes in Python, counts as the two ufunc calls it makes."""
    import numpy as np

    from benchmarks.call_count import Counted

    a = np.arange(6.0).reshape(2, 3).view(Counted)
    Counted.calls.clear()
    Counted.products.clear()
    Counted.product_seconds.clear()
    b = a * 2.0  # multiply
    b += a  # add
    c = np.exp(b) @ a.T  # exp, matmul
    _ = c.sum(), a.mean(axis=0)  # add.reduce, mean
    d = np.where(a > 1, a, 0.0)  # greater, where
    d[0, 1] = a[1, 2]  # index, index write
    _ = a.reshape(3, 2), a.T, a.shape  # views and attributes: not calls
    assert type(d) is Counted and type(c) is Counted
    assert Counted.products == [((2, 3), (3, 2), np.float64)]  # the product, and its time
    assert len(Counted.product_seconds) == 1 and 0 < Counted.product_seconds[0] < 1
    assert dict(Counted.calls) == {
        "multiply.__call__": 1,
        "add.__call__": 1,
        "exp.__call__": 1,
        "matmul.__call__": 1,
        "add.reduce": 2,  # .sum() and .mean()'s
        "divide.__call__": 1,  # .mean()'s
        "greater.__call__": 1,
        "where": 1,
        "index": 1,
        "index write": 1,
    }


def test_call_count_records_the_calls_that_spread_an_operand_over_rows():
    """A binary ufunc call with an array operand of more than one number and less than the
    whole shape is a broadcast, recorded with its operands' shapes and dtypes; a scalar, an
    array of one number, equal shapes, a product and a vecdot (a gufunc: its rows are its
    core axes, not spread) are not."""
    import numpy as np

    from benchmarks.call_count import Counted

    f64 = np.dtype(np.float64)
    a = np.ones((2, 3)).view(Counted)
    row, one = np.ones(3).view(Counted), np.ones((1, 1)).view(Counted)
    Counted.broadcasts.clear()
    _ = a * 2.0, a + a, a * one, a @ a.T, np.exp(a), np.vecdot(a, row)  # none of them
    a += row  # a row over both rows, in place
    _ = a - a.sum(axis=1, keepdims=True)  # a column over its row (the sum is a reduction)
    _ = np.where(a > row, a, 0.0)  # the compare is the outermost call; where is not binary
    assert Counted.broadcasts == [
        (np.add, (((2, 3), f64), ((3,), f64))),
        (np.subtract, (((2, 3), f64), ((2, 1), f64))),
        (np.greater, (((2, 3), f64), ((3,), f64))),
    ]


def test_a_counted_step_counts_the_calls_on_arrays_it_makes_and_on_the_moments():
    """An array the engine makes in the step (heads_buffer's np.empty, split into heads: an
    index a part) and the optimizer's moments (Adam's sqrt is of its second moment alone)
    are Counted for the step; after it the optimizer holds plain arrays of the same memory,
    the engine's modules see NumPy itself, and a cached vector made during the step is
    plain (a cache keeps it for the steps after)."""
    import numpy as np

    from benchmarks import workloads
    from benchmarks.call_count import Counted, _holds_arrays, _views, calls_per_step
    from numpy_engine import attention, reductions
    from numpy_engine.attention import KeysValues

    model, optimizer, batches = workloads.build(workloads.WORKLOADS["copy"], 2)
    workloads.engine_step(model, optimizer, batches[0])
    second = optimizer.flat_state["exp_avg_sq"]

    def made(model, optimizer, batch):
        reductions._filled.cache_clear()  # made again inside the step, for the cache
        merged = attention.heads_buffer((2, 3), 8, 2, 3, np.float32)[0]  # np.empty's
        merged.fill(1.0)  # not a counted call; a sum of empty memory could overflow
        reductions.sum_last(merged)

    def update(model, optimizer, batch):
        grads = {key: np.full(value.shape, 0.5, value.dtype) for key, value in model.params.items()}
        optimizer.step(model.flat, grads)

    calls, _ = calls_per_step(model, optimizer, batches[1], made)
    assert dict(calls) == {"index": 4, "dot": 1}  # three parts and tuple()'s end; sum_last
    calls, _ = calls_per_step(model, optimizer, batches[1], update)
    # sqrt(v) and m / (sqrt(v) + eps) read the moments alone, m *= b1 and v *= b2 write them
    assert calls["sqrt.__call__"] == calls["divide.__call__"] == 1
    assert calls["multiply.__call__"] >= 2
    assert type(optimizer.flat_state["exp_avg_sq"]) is np.ndarray
    assert np.shares_memory(optimizer.flat_state["exp_avg_sq"], second)
    assert type(optimizer.scratch) is np.ndarray and type(optimizer.gathered) is np.ndarray
    assert all(type(v) is np.ndarray for s in optimizer.state.values() for v in s.values())
    assert attention.np is np and reductions.np is np
    assert type(reductions._filled(24, np.dtype(np.float32))) is np.ndarray  # the cached one
    assert not isinstance(model.flat, Counted)
    # an optimizer's arrays in nested dicts, lists and named tuples are found and viewed too
    held = {"moments": [KeysValues(np.zeros(2), np.ones(2)), (np.ones(3), 0.9)], "lr": 0.1}
    viewed = _views(held, Counted)
    assert type(viewed["moments"][0]) is KeysValues and viewed["lr"] == 0.1
    assert [type(a) for a in (*viewed["moments"][0], viewed["moments"][1][0])] == [Counted] * 3
    assert _holds_arrays(held) and not _holds_arrays({"betas": (0.9, 0.999)})


def test_where_time_goes_parts_and_floor_of_a_copy_step():
    """Every layer function of the copy model's step is timed under its part (and put back
    after), the parts and "between layers" make up the instrumented step, and the floor finds
    the step's 56 matrix products (3 per linear layer, 6 per attention, and the one-hot
    product of each embedding gradient, source and target) and its calls."""
    from benchmarks import where_time_goes as W
    from numpy_engine import attention, layers, optim

    originals = (layers.linear_forward, attention.linear_forward, optim.Optimizer.step)
    engine = W.engine_parts("copy", steps=2)
    assert (layers.linear_forward, attention.linear_forward, optim.Optimizer.step) == originals
    assert layers.ACTIVATIONS["gelu"] == (layers.gelu_forward, layers.gelu_backward)  # put back
    for part in ("linear", "attention", "layernorm", "activation", "embedding", "loss"):
        assert engine["parts"][part] > 0, part
    assert abs(sum(engine["parts"].values()) - engine["instrumented"]) < 1e-9
    low = W.floor("copy")
    assert low["products"] == 56
    # 88 broadcasts: each layernorm's 8 (the mean and rstd forward and back, its weight and
    # bias, the weight's again in the backward: 7 layernorms), 12 biases, the softmax's row
    # max, its backward's row sum and the keys' mean (3 attentions), the zero-sum
    # gradients' 3, the loss's 3, the embeddings' 2 one-hots, the positions' 2 and the
    # decoder's mask
    assert low["broadcasts"] == 88
    assert 0 < low["broadcasts_ms"] < 10 and 0 < low["broadcasts_whole_ms"] < 10
    assert low["calls"] > 100 and 0 < low["matmul"] < 10 and 0 < low["passes"] < 10
    # copy's 38 two-dimensional products and 18 of attention's, alone and where the step
    # makes them
    assert set(low["matmul_by_kind"]) == set(low["in_step_by_kind"]) == {"2-D", "batched"}
    assert abs(sum(low["matmul_by_kind"].values()) - low["matmul"]) < 1e-12
    for kind in ("2-D", "batched"):
        assert 0 < low["matmul_by_kind"][kind] < 10 and 0 < low["in_step_by_kind"][kind] < 10
    assert W._product_kind((3, 4), (4, 5)) == "2-D"
    assert W._product_kind((2, 3, 4), (2, 4, 5)) == "batched"
    assert W._product_kind((3, 4), (2, 4, 5)) == W._product_kind((2, 3, 4), (4, 5)) == "batched"
    assert W._product_kind((3, 4), (4,)) is None and W._product_kind((4,), (4, 5)) is None
    assert W._torch_part("aten::addmm") == "matmul"
    assert W._torch_part("aten::native_layer_norm_backward") == "layernorm"
    assert W._torch_part("aten::copy_") == "other ops"
    assert W._torch_part("autograd::engine::evaluate_function: MmBackward0") == "autograd"


def test_where_time_goes_floor_adds_up_what_it_times(monkeypatch):
    """With every timing 1 ms, the floor's sums count what it timed: the step's two 2-D
    products and one batched product, alone and where the step makes them (each counted
    step's products timed by call_count's clock); one pass over each product's output and
    over the matrix of each sum done as a product with ones; the optimizer's four vectors;
    the step's six calls at the cheapest call's price."""
    import itertools

    import numpy as np

    from benchmarks import call_count
    from benchmarks import where_time_goes as W

    class Model:
        flat = np.zeros(6)
        params = {"w": flat.reshape(2, 3)}

    def step(model, optimizer, batch):
        a, b, c, d, ones = batch
        _ = a @ b, np.matmul(a, b), c @ d  # 2-D twice, batched once
        _ = a @ ones, ones @ b  # sums as products with ones: no matrix products
        np.exp(a)  # a call, not a product
        _ = a - ones  # a call that broadcasts

    arrays = (np.ones((3, 4)), np.ones((4, 5)), np.ones((2, 3, 4)), np.ones((2, 4, 5)), np.ones(4))
    monkeypatch.setattr(W, "_engine_side", lambda name, n: (Model(), None, [arrays] * n, step))
    monkeypatch.setattr(W, "best_seconds", lambda fn, repeats=5: (fn(), 1e-3)[1])
    clock = itertools.count(1.0, 1e-3)  # each timed product starts and ends 1 ms apart
    monkeypatch.setattr(call_count, "perf_counter", lambda: next(clock))
    low = W.floor("fake")
    assert low["products"] == 3 and low["calls"] == 7 and low["broadcasts"] == 1
    assert low["matmul_by_kind"] == pytest.approx({"2-D": 2.0, "batched": 1.0}, abs=1e-9)
    assert low["in_step_by_kind"] == pytest.approx({"2-D": 2.0, "batched": 1.0}, abs=1e-9)
    assert low["matmul"] == pytest.approx(3.0) and low["passes"] == pytest.approx(5.0)
    assert low["optimizer"] == pytest.approx(4.0) and low["call_us"] == pytest.approx(1e3)
    assert low["calls_ms"] == pytest.approx(7.0)
    assert low["broadcasts_ms"] == low["broadcasts_whole_ms"] == pytest.approx(1.0)


def test_where_time_goes_times_each_broadcast_as_made_and_with_whole_operands(monkeypatch):
    """Each recorded broadcast is timed twice into an output of the whole shape: on arrays
    of its operands' shapes and dtypes, then on arrays of the whole shape; the best of 200
    calls, or of 5 past 64K entries."""
    import numpy as np

    from benchmarks import where_time_goes as W

    timed = []
    monkeypatch.setattr(
        W, "best_seconds", lambda fn, repeats=5: timed.append((fn, repeats)) or 1e-3
    )
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    recorded = [
        (np.multiply, (((4, 3), f32), ((4, 1), f32))),
        (np.add, (((256, 256), f32), ((256,), f32))),
        (np.less, (((3,), f32), ((2, 1), f32))),
        (np.equal, (((6, 1), i64), ((5,), i64))),  # a one-hot's compare
    ]
    got = W._broadcasts_ms(recorded)
    assert got == pytest.approx({"broadcasts_ms": 4.0, "broadcasts_whole_ms": 4.0})
    shapes = [tuple(x.shape for x in fn.args) for fn, _ in timed]
    assert shapes == [
        ((4, 3), (4, 1)),
        ((4, 3), (4, 3)),
        ((256, 256), (256,)),
        ((256, 256), (256, 256)),
        ((3,), (2, 1)),
        ((2, 3), (2, 3)),
        ((6, 1), (5,)),
        ((6, 5), (6, 5)),
    ]
    assert [repeats for _, repeats in timed] == [200, 200, 5, 5, 200, 200, 200, 200]
    dtypes = [tuple(x.dtype for x in fn.args) for fn, _ in timed]
    assert dtypes == [
        tuple(dtype for _, dtype in operands) for _, operands in recorded for _ in "ab"
    ]
    outs = [(fn.keywords["out"].shape, fn.keywords["out"].dtype) for fn, _ in timed]
    assert (
        outs[::2]
        == outs[1::2]
        == [((4, 3), f32), ((256, 256), f32), ((2, 3), np.dtype(bool)), ((6, 5), np.dtype(bool))]
    )
    assert [fn.func for fn, _ in timed[::2]] == [np.multiply, np.add, np.less, np.equal]


def test_where_time_goes_report_prints_the_floor_and_the_broadcasts(monkeypatch):
    """The report's lines: each engine's step and parts, the floor's sum, the broadcasts'
    two times and the products where the step makes them."""
    from benchmarks import where_time_goes as W

    asked = []
    engine = {"step": 1.0, "instrumented": 1.1, "parts": {"linear": 0.5, "loss": 0.25}}
    monkeypatch.setattr(W, "engine_parts", lambda n, s: asked.append(("engine", n, s)) or engine)
    reference = {"step": 3.0, "parts": {"matmul": 1.0}}
    monkeypatch.setattr(W, "torch_parts", lambda n, s: asked.append(("torch", n, s)) or reference)
    low = {
        "products": 5,
        "matmul": 0.2,
        "passes": 0.1,
        "optimizer": 0.05,
        "calls": 40,
        "call_us": 0.9,
        "calls_ms": 0.036,
        "broadcasts": 7,
        "broadcasts_ms": 0.02,
        "broadcasts_whole_ms": 0.008,
        "matmul_by_kind": {"2-D": 0.15, "batched": 0.05},
        "in_step_by_kind": {"2-D": 0.18, "batched": 0.07},
    }
    monkeypatch.setattr(W, "floor", lambda n: asked.append(("floor", n)) or low)
    lines = W.report("copy", 5).splitlines()
    assert asked == [("engine", "copy", 5), ("torch", "copy", 5), ("floor", "copy")]
    assert lines[:3] == [
        "copy: engine 1.00 ms a step, torch 3.00 ms (each alone, median of 5)",
        "  engine, by part (own time, ms, of 1.10 instrumented): linear 0.50, loss 0.25",
        "  torch, by part (own time, ms; forward and backward profiled): matmul 1.00",
    ]
    assert lines[3] == (
        "  floor: 5 products alone 0.20 ms + one pass over each output 0.10 + the optimizer's "
        "four vectors once 0.05 = 0.35 ms; 40 NumPy calls at 0.90 us (the cheapest call) "
        "0.04 ms more"
    )
    assert lines[4] == (
        "  7 of the calls spread an operand over rows (a bias, a row's mean): 0.02 ms alone, "
        "0.01 ms with each operand at the whole shape"
    )
    assert lines[5].endswith("2-D 0.18 ms against 0.15 alone, batched 0.07 ms against 0.05 alone")
    assert len(lines) == 6  # no bar given: no bar's lines
    with_bar = W.report("copy", 5, bar=0.25).splitlines()
    assert with_bar[:6] == lines
    assert with_bar[6:] == W._bar_lines("copy", 0.25, engine, reference, low)
    assert len(with_bar) == 8  # 1.00 ms over a 0.75 ms bar: the split and what it asks


# The forty-third session's Intel profiles (docs/performance.md, section 4), in ms: each step
# alone, torch's matmul, the products in the step and alone by kind. Its table was worked out
# by hand; bar_accounting must give the same.
INTEL_CHAR_LM = (
    {"step": 14.31},
    {"step": 16.18, "parts": {"matmul": 7.25, "attention": 1.96}},
    {
        "in_step_by_kind": {"2-D": 7.51, "batched": 1.22},
        "matmul_by_kind": {"2-D": 6.24, "batched": 0.59},
    },
)
INTEL_GPT2 = (
    {"step": 1817.73},
    {"step": 2118.85, "parts": {"matmul": 1145.45}},
    {
        "in_step_by_kind": {"2-D": 1283.94, "batched": 23.47},
        "matmul_by_kind": {"2-D": 1168.43, "batched": 10.40},
    },
)


def test_where_time_goes_bar_accounting_splits_each_step_as_the_intel_table_did():
    """torch_reference's workloads set the engine's 2-D products against torch's matmul
    (attention's batched ones are in each side's rest); gpt2 sets all of them (transformers'
    attention multiplies with matmul)."""
    from benchmarks import where_time_goes as W

    a = W.bar_accounting("char-lm", 0.80, *INTEL_CHAR_LM)
    assert a["kinds"] == ("2-D",) and not a["met"]
    assert a["bar_step"] == pytest.approx(12.944)  # 0.80 x 16.18
    assert (a["products"], a["products_alone"]) == (7.51, 6.24)
    assert a["rest"] == pytest.approx(6.80)  # 14.31 - 7.51
    assert a["torch_matmul"] == 7.25
    assert a["products_asked"] == pytest.approx(6.144)  # the table's 6.14 ms, 0.98x alone
    assert a["rest_asked"] == pytest.approx(5.434)  # the table's 5.43 ms, a fifth less
    g = W.bar_accounting("gpt2", 0.80, *INTEL_GPT2)
    assert g["kinds"] == ("2-D", "batched")
    assert g["products"] == pytest.approx(1307.41) and g["rest"] == pytest.approx(510.32)
    assert g["products_alone"] == pytest.approx(1178.83)
    assert g["products_asked"] == pytest.approx(1184.76)  # the table's, 1.005x alone
    assert g["rest_asked"] == pytest.approx(387.67)
    assert W.bar_accounting("gpt2", 1.00, *INTEL_GPT2)["met"]
    engine, reference, low = INTEL_GPT2
    exactly = W.bar_accounting("gpt2", engine["step"] / reference["step"], *INTEL_GPT2)
    assert exactly["met"]  # a step at the bar is within it


def test_where_time_goes_bar_lines_say_what_the_bar_asks_of_each_part():
    from benchmarks import where_time_goes as W

    split = (
        "  the bar, 0.80 of torch's step: 12.94 ms; its 2-D products 7.51 ms in the step "
        "(6.24 alone) and the rest 6.80, against torch's matmul 7.25 and rest 8.93 "
        "(each step alone)"
    )
    assert W._bar_lines("char-lm", 0.80, *INTEL_CHAR_LM) == [
        split,
        "    over it by 1.37 ms: with the rest as it is, the products would have to take "
        "6.14 ms, 0.98x their time alone; with the products as they are, the rest would have "
        "to take 5.43 ms, 20% less",
    ]
    assert W._bar_lines("gpt2", 1.00, *INTEL_GPT2) == [
        "  the bar, 1.00 of torch's step: 2118.85 ms; all its products 1307.41 ms in the step "
        "(1178.83 alone) and the rest 510.32, against torch's matmul 1145.45 and rest 973.40 "
        "(each step alone): the engine's 1817.73 ms is within it"
    ]
    # a bar under the products alone (7.51 ms) but over the rest (6.80): 0.44 x 16.18 = 7.12
    assert W._bar_lines("char-lm", 0.44, *INTEL_CHAR_LM)[1] == (
        "    over it by 7.19 ms: with the rest as it is, the products would have to take "
        "0.32 ms, 0.05x their time alone; the products alone, 7.51 ms, leave the rest no time"
    )
    # copy's rest (1.08 ms) is the larger part: a bar of 0.37 ms is under it alone
    copy = (
        {"step": 1.25},
        {"step": 3.68, "parts": {"matmul": 0.30}},
        {"in_step_by_kind": {"2-D": 0.17}, "matmul_by_kind": {"2-D": 0.11}},
    )
    assert W._bar_lines("copy", 0.10, *copy)[1] == (
        "    over it by 0.88 ms: the rest alone, 1.08 ms, leaves the products no time; with the "
        "products as they are, the rest would have to take 0.20 ms, 82% less"
    )
    # under both parts alone
    assert W._bar_lines("char-lm", 0.30, *INTEL_CHAR_LM)[1] == (
        "    over it by 9.46 ms: the rest alone, 6.80 ms, leaves the products no time; the "
        "products alone, 7.51 ms, leave the rest no time"
    )
    # a part that takes exactly the bar's time (1.0 ms: exact in binary) leaves the other none
    for products, named in ((2.0, "the rest alone, 1.00"), (1.0, "the products alone, 1.00")):
        exact = (
            {"step": 3.0},
            {"step": 4.0, "parts": {"matmul": 1.0}},
            {"in_step_by_kind": {"2-D": products}, "matmul_by_kind": {"2-D": 0.5}},
        )
        over = W._bar_lines("copy", 0.25, *exact)[1]
        assert over.startswith("    over it by 2.00 ms: the rest alone, ")
        assert named in over and "would have to take" not in over


def test_where_time_goes_names_the_blas_and_processor_before_its_reports(monkeypatch, capsys):
    import torch

    from benchmarks import where_time_goes as W
    from benchmarks import workloads

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the worker's stays as it is
    monkeypatch.setattr(
        W, "report", lambda name, steps, bar: f"report of {name}, {steps} steps, bar {bar}"
    )
    monkeypatch.setattr(workloads, "processor_name", lambda: "Some CPU, 2 cores")
    monkeypatch.setattr(workloads, "numpy_blas", lambda: "openblas (SkylakeX)")
    W.main(["copy", "large", "char-lm", "gpt2"])
    assert capsys.readouterr().out.splitlines() == [
        "one thread; NumPy's BLAS openblas (SkylakeX); Some CPU, 2 cores",
        "report of copy, 50 steps, bar 0.3",  # the speed issue's bars
        "report of large, 4 steps, bar 1.0",
        "report of char-lm, 50 steps, bar 0.8",
        "report of gpt2, 3 steps, bar 1.0",
    ]


def test_where_time_goes_sets_the_threads_it_is_given(monkeypatch, capsys):
    """--threads N: BLAS and torch take N threads while the reports run, and the first line
    says how many; freed memory is kept for the next step, as in the bench and in training."""
    from benchmarks import where_time_goes as W
    from benchmarks import workloads

    asked = recorded_thread_settings(monkeypatch)
    monkeypatch.setattr(W, "report", lambda name, steps, bar: f"report of {name}, bar {bar}")
    monkeypatch.setattr(workloads, "processor_name", lambda: "Some CPU, 2 cores")
    monkeypatch.setattr(workloads, "numpy_blas", lambda: "openblas (Haswell)")
    W.main(["char-lm", "--threads", "2"])
    assert capsys.readouterr().out.splitlines() == [
        "2 threads; NumPy's BLAS openblas (Haswell); Some CPU, 2 cores",
        "report of char-lm, bar None",  # the bars are one thread's
    ]
    assert asked == {"torch": [2], "blas": [2], "memory kept": [True]}


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
            "argument --threads: must be a positive integer, got 0",
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
