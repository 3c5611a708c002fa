"""The benchmark scripts run (tiny configurations; timing is never asserted)."""

from __future__ import annotations

from benchmarks import generate as generate_benchmark
from benchmarks import train_step
from numpy_engine.cli import main


def test_generation_benchmark_runs_and_all_paths_agree(capsys):
    summary = generate_benchmark.main(["--tokens", "6", "--context", "8", "--repeats", "1"])
    assert summary["same_tokens"] is True
    assert set(summary["paths"]) == {"engine, KV cache", "engine, no cache",
                                     "torch_reference, no cache"}  # fmt: skip
    assert "tokens/s" in capsys.readouterr().out


def test_train_step_benchmark_one_step_smoke(capsys):
    args = train_step.parse(["--configs", "copy", "char-lm", "--steps", "1", "--warmup", "1"])
    summary = train_step.main(args.configs, args.steps, args.warmup, args.threads, True, None)
    for name in ("copy", "char-lm"):
        row = summary["configs"][name]
        assert row["engine_ms"] > 0 and row["torch_ms"] > 0 and row["flops_per_step"] > 0
        assert row["engine_peak_mb"] > 0 and row["torch_peak_mb"] > 0
    assert "ratio" in capsys.readouterr().out


def test_bench_command_runs_through_numpy_engine(tmp_path, capfd):
    out = tmp_path / "bench.json"
    assert (
        main(["bench", "--configs", "copy", "--steps", "1", "--no-memory", "--json", str(out)]) == 0
    )
    assert out.exists() and "copy" in capfd.readouterr().out  # printed by the child process
