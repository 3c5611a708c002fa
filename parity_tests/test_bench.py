"""`numpy-engine bench` (benchmarks/bench.py) and what it stands on: the alternating turns,
the processor and BLAS it names (workloads.py), and the matmul floor (matmul_floor.py). Tiny
configurations; timing is never asserted: known times stand in for it."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

from benchmarks import bench, workloads
from benchmarks.bench import CONFIGS, flops_per_step
from benchmarks.matmul_floor import gpt_step_matmuls
from benchmarks.workloads import middle_half, processor_name, spread
from crosscheck.cli import main as bench_command
from numpy_engine import GPTConfig, MiniGPT, Seq2SeqConfig, Seq2SeqTransformer
from numpy_engine.cli import main
from parity_tests.helpers import known_step_times


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


def test_bench_run_gives_each_config_its_steps_threads_and_memory_probes(monkeypatch):
    """bench.run with its measurements replaced by recorders: large and wide-seq2seq time a
    fifth of the steps (at least 3), the warm-up at most the steps; every measurement on the
    threads asked for; memory probed over 2 steps for those two, 5 for the others; the matmul
    floor for the configs that have one."""
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
    readings = iter([40.0, 50.0, 45.0, 42.0] * 3)  # before copy, after each config; each run
    monkeypatch.setattr(bench, "matmul_peak_gflops", lambda: next(readings))
    monkeypatch.setattr(bench, "numpy_calls", lambda cfg: 7)
    monkeypatch.setattr(bench, "matmul_floor", lambda cfg: {"floor": cfg.name})
    for steps, large_steps in ((40, 8), (15, 3), (10, 3)):
        asked.clear()
        configs = ["copy", "large", "wide-seq2seq"]
        summary = bench.run(configs, steps, warmup=5, threads=2, memory=True)
        assert asked == [
            "keep_freed_memory",
            ("torch", 2),
            ("threads", 2),
            ("copy", steps, 5, 2),
            ("large", large_steps, min(5, large_steps), 2),
            ("wide-seq2seq", large_steps, min(5, large_steps), 2),
            ("copy", "engine", 5, 2),
            ("copy", "torch", 5, 2),
            ("large", "engine", 2, 2),
            ("large", "torch", 2, 2),
            ("wide-seq2seq", "engine", 2, 2),
            ("wide-seq2seq", "torch", 2, 2),
        ]
        assert summary["threads"] == 2 and summary["matmul_peak_gflops"] == 50.0  # the best
        assert summary["matmul_peak_readings"] == [40.0, 50.0, 45.0, 42.0]
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


def test_bench_table_columns_line_up_under_a_long_config_name():
    """long-seq2seq is longer than the column's 8 characters: every row's engine ms ends
    where the header's does."""
    lines = bench.table(bench_summary(copy={}, **{"long-seq2seq": {}})).splitlines()[1:]
    assert lines[2].startswith("long-seq2seq ") and lines[1].startswith("copy         ")
    ends = [
        line.index("engine ms") + 9 if i == 0 else line.index("3.22") + 4
        for i, line in enumerate(lines)
    ]
    assert ends == [ends[0]] * 3


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


def test_bench_takes_threads_up_to_the_processs_cores(monkeypatch, capsys):
    """--threads 99 on two cores ran, and printed copy's ratio 0.016 (torch's step 102 ms)
    at 337% of the matmul peak: threads contending for cores, not the libraries."""
    from numpy_engine import threads

    asked = []
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(bench, "main", lambda *args: asked.append(args[3]) or {})
    for count in ("1", "4"):
        assert bench_command(["bench", "--configs", "copy", "--threads", count]) == 0
    assert asked == [1, 4]
    with pytest.raises(SystemExit) as stop:  # argparse, before any step is timed
        bench_command(["bench", "--configs", "copy", "--threads", "5"])
    said = "argument --threads: must be an integer from 1 to the 4 cores this process may use"
    assert stop.value.code == 2 and f"{said}, got 5" in capsys.readouterr().err
    assert asked == [1, 4]


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
