"""Hypothesis profiles, and a summary of the worst error seen per check.

Every profile a plain `python -m pytest` can load is derandomized: the same examples
on every run and machine, so the suite fails only for a defect, never for a new draw.
  default (no variable)  derandomized, 15 examples per test
  ci (CI=true)           derandomized, 60 examples per test
  explore                random, 500 examples, saved in .hypothesis/: hunts for new cases
                         on purpose (HYPOTHESIS_PROFILE=explore); pin what it finds as @example
"""

from __future__ import annotations

import json
import os

# One BLAS thread per process: xdist runs one worker a core, and the CLI tests' subprocesses
# inherit these. Two threads in each of two workers would fight over two cores.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import Phase, settings  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

threadpool_limits(1)  # numpy may have started its BLAS before this file was read
torch.set_num_threads(1)

from parity_tests.helpers import COUNTS, WORST_ERRORS, keep_worst  # noqa: E402

settings.register_profile(
    "default", max_examples=15, derandomize=True, database=None, deadline=None, print_blob=True
)
settings.register_profile(
    "ci", max_examples=60, derandomize=True, database=None, deadline=None, print_blob=True
)
settings.register_profile("explore", max_examples=500, deadline=None, print_blob=True)
# For `python -m mutation`: the default's examples, but a failing test stops at its first
# failure instead of shrinking it (shrinking a mutant's failure ran past the time limit)
settings.register_profile(
    "mutation",
    max_examples=15,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default")
)


@pytest.fixture
def on_threads():
    """threads.set_threads for the test, put back after it."""
    from numpy_engine import threads

    before = threads.threads()
    yield threads.set_threads
    threads.set_threads(before)


@pytest.fixture
def blas_on_two_threads():
    """NumPy's OpenBLAS on two threads for the test (this file sets one), put back after it.
    Yields blas_threads.openblas(): NumPy's wheels carry OpenBLAS, so it must be found."""
    from numpy_engine import blas_threads

    blas = blas_threads.openblas()
    assert blas is not None, "NumPy's OpenBLAS was not found in /proc/self/maps"
    before = blas.get_threads()
    blas.set_threads(2)
    yield blas
    blas.set_threads(before)


@pytest.fixture
def only_the_engines_threads(monkeypatch):
    """threads.in_chunks_alone as in a process where no thread but the engine's runs: other
    tests in this worker may have left theirs (test_blas_threads.py tests the real check)."""
    from numpy_engine import threads

    monkeypatch.setattr(threads, "_only_the_engines_threads", lambda: True)


@pytest.fixture(scope="session")
def trained_copy(tmp_path_factory):
    """A run directory of the copy model trained 20 steps (`train copy --steps 20 --out`):
    weights no seed's initialisation gives, and a run's meta and optimizer state. Shared by
    every test that asks for it, so a test reads it and writes nothing into it."""
    from numpy_engine.cli import main

    run = tmp_path_factory.mktemp("trained") / "copy"
    assert main(["train", "copy", "--steps", "20", "--out", str(run), "--quiet"]) == 0
    return run


@pytest.fixture(scope="session")
def untrained_copy(tmp_path_factory):
    """A copy checkpoint of one step (`train copy --steps 1 --out`): its greedy output does not
    stop at EOS early. Shared as trained_copy is: a test reads it and writes nothing into it."""
    from numpy_engine.cli import main

    out = tmp_path_factory.mktemp("untrained")
    assert main(["train", "copy", "--steps", "1", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """A random 2-layer transformers GPT-2 and its BPE tokenizer as save_pretrained writes them
    (hf_cases.save_random_gpt2). Shared: a test copies it to change it, and writes nothing
    into it."""
    from parity_tests.hf_cases import save_random_gpt2

    return save_random_gpt2(tmp_path_factory.mktemp("hf"))


# Under pytest-xdist each worker records its own errors; the workers hand them to the
# controller, which prints one summary.


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["worst_errors"] = json.dumps(WORST_ERRORS)
        workeroutput["counts"] = json.dumps(COUNTS)


def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    for name, value in json.loads(output.get("worst_errors", "{}")).items():
        keep_worst(WORST_ERRORS, name, value)
    for event, count in json.loads(output.get("counts", "{}")).items():
        COUNTS[event] = COUNTS.get(event, 0) + count


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if WORST_ERRORS:
        terminalreporter.section("worst relative error seen per check")
        for name, error in sorted(WORST_ERRORS.items()):
            terminalreporter.write_line(f"{name:<40} {error:.2e}")
    for event, count in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{event}: {count}")
