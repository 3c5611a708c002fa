"""A/B of one change: the engine at an earlier commit against the working tree, in one process.

    python -m benchmarks.ab HEAD~1                          # copy and char-lm, 400 pairs
    python -m benchmarks.ab a19a5c1 --configs large --steps 20
    python -m benchmarks.ab HEAD~1 --configs gpt2 --steps 10
    python -m benchmarks.ab HEAD~1 --configs long-seq2seq --steps 20 --threads 2

The earlier commit's `numpy_engine/` and `benchmarks/` come out of git (`git archive`) into
a temporary directory, renamed `numpy_engine_old` and `benchmarks_old` (their imports
rewritten to match), so both engines load side by side. Each config's workload is built
by each (the same seeded weights and batches), then training steps alternate old and new
(the order flipping each pair) after 5 warm-up pairs. It prints each side's median ms a
step and the median of the pairs' new / old ratios, with their middle half (first to third
quartile): two steps taken back to back share the machine's drift, so the ratio resolves
changes of about half a percent, where separate processes do not. One thread, or `--threads
N`: NumPy's BLAS (threadpoolctl) and both engines' own threads (numpy_engine/threads.py);
engine only, no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from numpy_engine.cli_args import thread_count

PACKAGES = ("numpy_engine", "benchmarks")
GPT2 = "gpt2"  # not in workloads.WORKLOADS: its model and batches come from benchmarks/gpt2.py
ROOT = Path(__file__).resolve().parent.parent  # the repository


def export_old(revision: str, into: Path) -> None:
    """REV's packages into `into`, as numpy_engine_old and benchmarks_old."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision, *PACKAGES],
        capture_output=True,
        check=False,
    )
    if archive.returncode:
        raise SystemExit(f"git archive {revision}: {archive.stderr.decode().strip()}")
    tar_path = into / "old.tar"
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into / "src", filter="data")
    renamed = re.compile(r"\b(" + "|".join(PACKAGES) + r")\b")
    for package in PACKAGES:
        for source in (into / "src" / package).rglob("*.py"):
            target = into / f"{package}_old" / source.relative_to(into / "src" / package)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(renamed.sub(r"\1_old", source.read_text()))


def side(benchmarks, name: str) -> tuple:
    """(workloads module, model, optimizer, 4 batches, []) of one side: a workload of
    benchmarks/workloads.py, or gpt2 (benchmarks/gpt2.py's model, AdamW and batches)."""
    workloads = benchmarks.workloads
    if name != GPT2:
        return (workloads, *workloads.build(workloads.WORKLOADS[name], 4), [])
    trainer = benchmarks.gpt2.EngineTrainer(benchmarks.gpt2.engine_model())
    return (workloads, trainer.model, trainer.optimizer, benchmarks.gpt2.batches(4), [])


def alternate(old, new, name: str, pairs: int) -> tuple[float, float, float, tuple]:
    """(old median ms, new median ms, median new / old, the middle half of the pairs' new / old)
    over pairs of alternating steps; old and new are the two sides' `benchmarks` packages."""
    sides = [side(old, name), side(new, name)]
    stopwatch = new.workloads  # one clock and one ratio for both sides
    for i in range(pairs + 5):
        for workloads, model, optimizer, batches, times in sides if i % 2 else sides[::-1]:
            seconds, _ = stopwatch.timed(workloads.engine_step, model, optimizer, batches[i % 4])
            if i >= 5:  # warm-up pairs
                times.append(seconds)
    old_times, new_times = sides[0][4], sides[1][4]
    return (
        1e3 * statistics.median(old_times),
        1e3 * statistics.median(new_times),
        stopwatch.paired_ratio(new_times, old_times),
        stopwatch.middle_half(new_times, old_times),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("revision", help="the commit to compare against (e.g. HEAD~1)")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["copy", "char-lm"],
        help="workloads of benchmarks/workloads.py: copy, char-lm, large, long, long-seq2seq, "
        "wide-seq2seq; or gpt2, the 124M model of benchmarks/gpt2.py (two models in memory, ~5 "
        "GB) (default: copy char-lm)",
    )
    parser.add_argument(
        "--steps", type=int, default=400, help="timed pairs of steps per config (default: 400)"
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="NumPy's BLAS and the engines' threads, at most the cores this process may use "
        "(default: 1)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    with tempfile.TemporaryDirectory() as tmp:
        export_old(args.revision, Path(tmp))
        sys.path.insert(0, tmp)
        import benchmarks_old.gpt2  # type: ignore[import-not-found]
        import benchmarks_old.workloads  # type: ignore[import-not-found]

        import benchmarks.gpt2
        import benchmarks.workloads
        from numpy_engine.memory import keep_freed_memory

        keep_freed_memory()
        known = [*benchmarks.workloads.WORKLOADS, GPT2]
        unknown = set(args.configs) - set(known)
        if unknown:
            parser.error(f"unknown configs {sorted(unknown)}; known: {sorted(known)}")
        threads = "one thread" if args.threads == 1 else f"{args.threads} threads"
        print(f"{args.revision} (old) against the working tree (new), {threads}")
        with on_threads(args.threads):
            for name in args.configs:
                old_ms, new_ms, ratio, (first, third) = alternate(
                    benchmarks_old, benchmarks, name, args.steps
                )
                print(
                    f"{name:8s} old {old_ms:9.3f} ms  new {new_ms:9.3f} ms  new/old "
                    f"{ratio:.4f} (middle half of the pairs {first:.4f}-{third:.4f})"
                )


@contextlib.contextmanager
def on_threads(n: int):
    """workloads.on_threads(n), NumPy's BLAS and this engine's own threads, and the old
    engine's threads too, for the block's time (an engine older than
    numpy_engine/threads.py has none of its own)."""
    from benchmarks.workloads import on_threads as blas_and_engine_on_threads

    try:
        import numpy_engine_old.threads as old  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        old = None
    before = old.threads() if old else None
    if old:
        old.set_threads(n)
    try:
        with blas_and_engine_on_threads(n):
            yield
    finally:
        if old:
            old.set_threads(before)


if __name__ == "__main__":
    main()
