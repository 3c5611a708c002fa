"""The benchmark scripts run (a tiny configuration; timing is never asserted)."""

from __future__ import annotations

from benchmarks import generate as generate_benchmark


def test_generation_benchmark_runs_and_all_paths_agree(capsys):
    summary = generate_benchmark.main(["--tokens", "6", "--context", "8", "--repeats", "1"])
    assert summary["same_tokens"] is True
    assert set(summary["paths"]) == {"engine, KV cache", "engine, no cache",
                                     "torch_reference, no cache"}  # fmt: skip
    assert "tokens/s" in capsys.readouterr().out
