"""Data-parallel training over MPI is exactly one process's training with the whole batch.

Every MPI run is a subprocess under `mpiexec -n 2` (mpich from the test extra)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.evaluation import heldout_loss
from numpy_engine.loop import empty_history
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.tasks import DEFAULT_TEXT, CharCorpus, every_target_once, split_off_heldout
from numpy_engine.train import SequenceTrainConfig, train_sequence_task
from parity_tests.mpi_runs import train

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"


def mpiexec(n: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [MPIEXEC, "-n", str(n), sys.executable, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def cli(*args: str) -> list[str]:
    return ["-m", "numpy_engine", *args]


class Rank(OneProcess):
    """Rank `rank` of a group of `size` that no collective is called on (share's rows)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size


@pytest.mark.parametrize("scenario", ["gpt", "copy"])
def test_two_ranks_train_what_one_process_trains_with_the_whole_batch(tmp_path, scenario):
    out = tmp_path / "two.npz"
    result = mpiexec(2, "-m", "parity_tests.mpi_runs", scenario, str(out))
    assert result.returncode == 0, result.stderr
    two = np.load(out)
    one, _ = train(scenario, None)
    error = np.linalg.norm(two["flat"] - one) / np.linalg.norm(one)
    assert int(two["ranks"]) == 2 and error <= 1e-12, error
    assert bool(two["same_on_every_rank"])  # bit for bit, after every step


@pytest.mark.parametrize("accumulate", [4, 3])
def test_accumulated_micro_batches_train_what_one_batch_trains(accumulate):
    """The same weights, and the same loss recorded at every step."""
    one_history, accumulated_history = empty_history(), empty_history()
    one, _ = train("gpt", None, one_history)
    accumulated, _ = train("gpt", DataParallel(OneProcess(), accumulate), accumulated_history)
    assert np.linalg.norm(accumulated - one) <= 1e-12 * np.linalg.norm(one)
    losses, expected = accumulated_history["train_loss"], one_history["train_loss"]
    assert len(losses) == len(expected) > 0
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= 1e-12 * max(expected)


def test_data_parallel_alone_takes_one_micro_batch_a_rank(tmp_path):
    """Without --accumulate, one rank trains the plain run's very bits."""
    run = tmp_path / "run"
    steps = ["--steps", "3", "--eval-every", "3", "--quiet", "--out", str(run)]
    result = mpiexec(1, *cli("train", "copy", "--data-parallel", *steps))
    assert result.returncode == 0, result.stderr
    plain = train_sequence_task(SequenceTrainConfig(steps=3, eval_every=3), progress_stream=None)
    assert np.array_equal(load_checkpoint(run).model.flat, plain.model.flat)


def test_a_nan_on_rank_1_stops_both_ranks_with_one_message():
    start = time.monotonic()
    result = mpiexec(2, "-m", "parity_tests.mpi_runs", "nan", timeout=60)
    assert result.returncode == 1, result.stderr
    # one line: rank 1 says it; rank 0 stops quietly (no traceback, no "None")
    said = "numpy-engine train: stopped: step 3: the loss is nan; stopped before updating"
    assert result.stderr.splitlines() == [said], result.stderr
    assert time.monotonic() - start < 30


def test_ranks_on_one_machine_are_refused_together_when_their_steps_do_not_fit():
    """Two ranks on this machine, a step counted at 1 GiB each: rank 1 reads 1.5 GiB free,
    rank 0 reads 100. Both refuse, on the least reading, and rank 0 says it once."""
    result = mpiexec(2, "-m", "parity_tests.mpi_runs", "short-of-memory", timeout=60)
    assert result.returncode == 2, result.stderr
    said = (
        "numpy-engine train: error: batch_size=32 with context=32 (1,024 tokens a step on each "
        "of 2 ranks on this machine) would need about 2.0 GiB for one training step; 1.5 GiB "
        "are available"
    )
    assert result.stderr.count(said) == 1 and "(on rank" not in result.stderr, result.stderr


def test_ranks_read_their_free_memory_only_once_every_rank_holds_its_model(tmp_path):
    """Rank 1 builds its model a second late; until then rank 0 reads 100 GiB free, after it
    1.5. The ranks read after a barrier, so rank 0 sees what rank 1's model took, and both
    refuse a step counted at 1 GiB a rank."""
    marker = tmp_path / "rank-1-built-its-model"
    result = mpiexec(2, "-m", "parity_tests.mpi_runs", "late-model", str(marker), timeout=60)
    assert result.returncode == 2, result.stderr
    said = "would need about 2.0 GiB for one training step; 1.5 GiB are available"
    assert marker.exists() and result.stderr.count(said) == 1, result.stderr


def test_an_error_on_rank_0_alone_ends_every_rank(tmp_path):
    """Rank 0's checkpoint write fails while rank 1 waits in the next step's Allreduce:
    MPI_Abort ends both, with rank 0's one message; the first checkpoint is intact."""
    start = time.monotonic()
    result = mpiexec(2, "-m", "parity_tests.mpi_runs", "disk-full", str(tmp_path), timeout=60)
    assert result.returncode != 0
    assert result.stderr.count("No space left on device") == 1, result.stderr
    assert time.monotonic() - start < 30
    assert load_checkpoint(tmp_path).meta["step"] == 5


def test_resume_under_mpi_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    """... its held-out evaluations too, each rank taking its share of the windows; the
    uninterrupted run keeps its best held-out weights (--keep-best), written by rank 0. With
    dropout: each rank's masks are keyed by the step and its rank, not drawn from a state."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    args = ["train", "char-lm", "--data-parallel", "--quiet", "--batch-size", "8"]
    args += ["--dropout", "0.1"]
    args += ["--holdout", "0.2", "--eval-every", "10"]
    runner = [MPIEXEC, "-n", "2", sys.executable, *cli(*args, "--steps", "400")]
    runner += ["--out", str(killed), "--checkpoint-every", "10"]
    process = subprocess.Popen(runner, cwd=ROOT, start_new_session=True)
    checkpoint = killed / "checkpoint.npz"
    deadline = time.monotonic() + 60
    while not checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # every rank, mid-run
    process.wait()
    saved = load_checkpoint(killed).meta["step"]
    assert 10 <= saved < 400
    steps = str(saved + 10)
    resumed = mpiexec(
        2, *cli("train", "--resume", str(killed), "--steps", steps, "--data-parallel", "--quiet")
    )
    assert resumed.returncode == 0, resumed.stderr
    result = mpiexec(2, *cli(*args, "--steps", steps, "--out", str(whole), "--keep-best"))
    assert result.returncode == 0, result.stderr
    a, b = load_checkpoint(killed).model.flat, load_checkpoint(whole).model.flat
    assert np.array_equal(a, b)
    assert json.loads((killed / "result.json").read_text())["steps"] == int(steps)
    evaluations = [
        json.loads((run / "history.json").read_text())["eval"] for run in (killed, whole)
    ]
    assert evaluations[0] == evaluations[1] and evaluations[0][-1]["step"] == int(steps)
    best = min(evaluations[1], key=lambda e: e["heldout_loss"])  # kept by --keep-best
    assert load_checkpoint(whole / "best").meta["step"] == best["step"]
    # the two ranks' shares add up to every held-out window: one process's loss, to rounding
    heldout_ids = split_off_heldout(CharCorpus(DEFAULT_TEXT).ids, 0.2, 32)[1]
    windows = every_target_once(heldout_ids, 32, -100)
    alone = heldout_loss(load_checkpoint(whole).model, windows, 8)
    assert abs(evaluations[1][-1]["heldout_loss"] - alone) <= 1e-6 * alone


def test_ctrl_c_under_mpi_ends_every_rank_with_one_line(tmp_path):
    """mpiexec passes Ctrl-C (SIGINT) to every rank. A rank that left on its own would leave
    the others waiting for it in the step's sum: rank 0 (or, if it is inside that sum, rank
    1) says it, and MPI_Abort ends them all; the last checkpoint is intact."""
    out = tmp_path / "run"
    args = ["train", "char-lm", "--data-parallel", "--quiet", "--steps", "100000"]
    runner = [MPIEXEC, "-n", "2", sys.executable, *cli(*args, "--out", str(out))]
    runner += ["--checkpoint-every", "10"]
    process = subprocess.Popen(
        runner, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (out / "checkpoint.npz").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.count("numpy-engine train: interrupted") == 1, stderr
    assert load_checkpoint(out).meta["step"] >= 10


def test_a_run_resumes_on_a_different_number_of_ranks(tmp_path):
    run = tmp_path / "run"
    started = mpiexec(
        2, *cli("train", "copy", "--data-parallel", "--steps", "20", "--out", str(run))
    )
    assert started.returncode == 0, started.stderr
    # rank 0 alone prints: each progress line and the result once
    assert started.stderr.count("step    20/20  loss") == 1, started.stderr
    assert started.stdout.count('"heldout_loss"') == 1, started.stdout
    alone = subprocess.run(
        [sys.executable, *cli("train", "--resume", str(run), "--steps", "30", "--quiet")],
        capture_output=True,
        text=True,
    )
    assert alone.returncode == 0, alone.stderr
    assert load_checkpoint(run).meta["step"] == 30


def test_ranks_without_data_parallel_are_refused_with_one_line(tmp_path):
    result = mpiexec(2, *cli("train", "copy", "--steps", "5", "--out", str(tmp_path / "x")))
    assert result.returncode != 0
    assert result.stderr.count("2 ranks were launched without --data-parallel") == 1
    assert not (tmp_path / "x").exists()


def test_data_parallel_without_the_mpi_extra_names_it(monkeypatch):
    from numpy_engine.parallel import process_group

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # `import mpi4py` now fails
    with pytest.raises(InputError, match=r"needs the mpi extra: pip install -e '\.\[mpi\]'"):
        process_group(True)


def test_micro_batch_rows_is_the_largest_micro_batch_any_rank_takes():
    """What a held-out evaluation takes at a time: share's largest part, on any rank."""
    for batch_size in range(1, 24):
        for ranks in (1, 2, 3):
            for accumulate in (1, 2, 3, 5):
                parts = [
                    len(micro[0])
                    for rank in range(ranks)
                    for micro in DataParallel(Rank(rank, ranks), accumulate).share(
                        (np.arange(batch_size),)
                    )
                ]
                rows = DataParallel(Rank(0, ranks), accumulate).micro_batch_rows(batch_size)
                assert rows == max(parts), (batch_size, ranks, accumulate)


def test_a_batch_too_small_for_its_ranks_or_micro_batches_is_refused_and_no_other():
    """check_batch_size refuses exactly where share would leave a rank without rows, or
    make fewer micro-batches than asked on every rank."""
    refused = 0
    for batch_size in range(1, 13):
        for ranks in (1, 2, 3, 4):
            for accumulate in range(1, 8):
                parts = [
                    len(DataParallel(Rank(rank, ranks), accumulate).share((np.arange(batch_size),)))
                    for rank in range(ranks)
                ]
                wrong = min(parts) == 0 or max(parts) < accumulate
                try:
                    DataParallel(Rank(0, ranks), accumulate).check_batch_size(batch_size)
                except InputError:
                    refused += 1
                    assert wrong, (batch_size, ranks, accumulate)
                else:
                    assert not wrong, (batch_size, ranks, accumulate)
    assert refused > 50


def test_the_refusals_of_a_batch_too_small_name_the_numbers():
    with pytest.raises(
        InputError, match=r"^3 ranks share a batch of batch_size=2: 1 of them would have no rows$"
    ):
        DataParallel(Rank(0, 3)).check_batch_size(2)
    expected = r"^accumulate=33 is more micro-batches than a batch of batch_size=32 rows makes: "
    with pytest.raises(InputError, match=expected + "at most 32, of one row each$"):
        DataParallel(OneProcess(), 33).check_batch_size(32)
    expected = r"^accumulate=9 .* than a rank's share \(batch_size=30 rows over 4 ranks\) makes"
    with pytest.raises(InputError, match=expected + ": at most 8, of one row each$"):
        DataParallel(Rank(1, 4), 9).check_batch_size(30)
    with pytest.raises(
        InputError, match=r"share \(batch_size=4 rows over 2 ranks\) makes: at most 2"
    ):
        DataParallel(Rank(0, 2), 3).check_batch_size(4)


def test_add_scaled_sums_n_times_each_gradient_and_refuses_one_that_does_not_fit():
    from numpy_engine.parallel import add_scaled

    rng = np.random.default_rng(0)
    grads = {"fc.weight": rng.standard_normal((3, 4)), "fc.bias": rng.standard_normal(3)}
    summed = {key: rng.standard_normal(g.shape) for key, g in grads.items()}
    expected = {key: summed[key] + 7 * g for key, g in grads.items()}
    scratch = np.empty(12)
    add_scaled(summed, grads, 7, scratch)
    assert all(np.array_equal(summed[key], expected[key]) for key in grads)
    with pytest.raises(InputError, match="exactly the model's parameter keys, in order"):
        add_scaled(summed, dict(reversed(grads.items())), 1, scratch)
    broadcastable = {"fc.weight": np.ones((1, 4)), "fc.bias": np.ones(3)}  # += would broadcast
    with pytest.raises(InputError, match=r"grads\['fc.weight'\] must have shape \(3, 4\)"):
        add_scaled(summed, broadcastable, 1, scratch)
    assert all(np.array_equal(summed[key], expected[key]) for key in grads)  # nothing added


def test_micro_batches_give_the_whole_batchs_mean_loss_and_gradient_reusing_one_buffer():
    """Micro-batches of 2, 1 and 1 rows, one of them with a single counted target: each is
    weighted by its count of targets. The reduced vector is made once per model (its size
    and dtype) and reused."""
    config = ne.GPTConfig(n_layers=1, dtype="float64")
    model = ne.MiniGPT(config, seed=0)
    idx, targets = ne.MiniGPT.example_batch(config, np.random.default_rng(0), 4, 6)
    targets[2, 1:] = -100  # the third row: one counted target
    targets[3, 3:] = -100
    whole_loss, whole_grads = model.loss_and_grads(idx, targets)
    parallel = DataParallel(OneProcess(), 3)
    assert not parallel.plain and DataParallel(OneProcess(), 1).plain

    parts = []

    def step(micro, part):
        parts.append(part)
        return model.loss_and_grads(*micro)

    loss, grads = parallel.gradient(model, (idx, targets), step)
    assert parts == [0, 1, 2]  # each micro-batch its own part: its own dropout masks
    expected = model.flat_grads(whole_grads)
    assert abs(loss - whole_loss) <= 1e-14 * whole_loss
    assert np.linalg.norm(grads - expected) <= 1e-14 * np.linalg.norm(expected)
    again = parallel.gradient(model, (idx, targets), step)[1]
    assert np.shares_memory(again, grads)  # the same buffer, not a new one a step
    one = np.full_like(targets, -100)
    one[2, 0] = targets[2, 0]  # a batch of one counted target: its loss, not an error
    one_loss = parallel.gradient(model, (idx, one), step)[0]
    assert abs(one_loss - model.loss_and_grads(idx, one)[0]) <= 1e-14 * one_loss
    other = ne.MiniGPT(ne.GPTConfig(n_layers=2, dtype="float32"), seed=0)
    other_grads = parallel.gradient(other, (idx, targets), lambda m, _: other.loss_and_grads(*m))[1]
    assert other_grads.shape == other.flat.shape and other_grads.dtype == np.float32
    assert not np.shares_memory(other_grads, grads)


def test_a_batch_whose_every_target_is_ignored_is_refused_by_name():
    """Every micro-batch is skipped (none has a counted target), so the step has no loss to
    take the mean of: refused by name, before any micro-batch's step is taken."""
    config = ne.GPTConfig(n_layers=1, dtype="float64")
    model = ne.MiniGPT(config, seed=0)
    idx, targets = ne.MiniGPT.example_batch(config, np.random.default_rng(0), 4, 6)
    ignored, parts = np.full_like(targets, -100), []
    with pytest.raises(InputError, match="every target of the global batch is ignored"):
        DataParallel(OneProcess(), 2).gradient(model, (idx, ignored), lambda _, p: parts.append(p))
    assert parts == []


def test_peer_stopped_carries_its_message_and_status():
    from numpy_engine.parallel import PeerStopped

    error = PeerStopped("another rank stopped this step", status=3)
    assert str(error) == "another rank stopped this step" and error.status == 3


def test_a_failure_on_rank_1_alone_is_said_by_rank_1_and_ends_every_rank():
    result = mpiexec(2, "-m", "parity_tests.mpi_runs", "rank-1-alone", timeout=60)
    assert result.returncode == 1, result.stderr  # a bug's status: no kind of failure known
    said = 'numpy-engine train: RuntimeError("rank 1\'s own failure") (on rank 1 alone)'
    assert result.stderr.count(said) == 1, result.stderr


def test_an_error_every_rank_meets_is_said_once_by_rank_0(tmp_path):
    """A missing checkpoint: every rank fails alike; rank 0 says it and ends them all, the
    others wait out a grace instead of saying it too."""
    missing = tmp_path / "missing"
    result = mpiexec(2, *cli("train", "--resume", str(missing), "--data-parallel"))
    assert result.returncode == 2, result.stderr
    said = f"numpy-engine train: error: checkpoint {missing}/checkpoint.npz: no such file"
    assert result.stderr.count(said) == 1 and "(on rank" not in result.stderr, result.stderr


def test_stderr_is_read_by_mpiexec_before_the_abort(monkeypatch, capfd):
    """MPI_Abort ends the run at once, and what mpiexec's proxy had not read from the rank's
    stderr pipe is lost (CI lost rank 0's message once): the rank waits for the read first."""
    from numpy_engine import parallel as parallel_module

    calls = []  # the waits and aborts, in order

    class Ended(Exception):
        pass

    class TwoRanks(parallel_module.OneProcess):
        rank, size = 0, 2

        def abort(self, code: int) -> None:
            calls.append(("abort", code))
            raise Ended  # instead of ending this process

    def wait_until_read(fd: int, seconds: float) -> None:
        calls.append(("wait", fd, seconds))

    def body() -> int:
        raise InputError("checkpoint x: no such file")

    monkeypatch.setattr(parallel_module, "wait_until_read", wait_until_read)
    with pytest.raises(Ended):
        parallel_module.run_as_rank(parallel_module.DataParallel(TwoRanks()), body, "train")
    assert calls == [("wait", sys.stderr.fileno(), 5.0), ("abort", 2)]
    assert capfd.readouterr().err == "numpy-engine train: error: checkpoint x: no such file\n"


def test_waiting_for_a_pipe_to_be_read(tmp_path, monkeypatch):
    from numpy_engine.parallel import unread_bytes, wait_until_read

    read_end, write_end = os.pipe()
    os.write(write_end, b"rank 0's message\n")
    assert unread_bytes(write_end) == 17
    wait_until_read(write_end, 0.05)  # nobody reads: the wait gives up
    assert unread_bytes(write_end) == 17
    threading.Timer(0.05, os.read, (read_end, 16)).start()
    threading.Timer(0.5, os.read, (read_end, 1)).start()  # the last byte, long after
    start = time.monotonic()
    wait_until_read(write_end, 60.0)
    assert unread_bytes(write_end) == 0
    assert time.monotonic() - start < 30  # it returned when the message was read
    os.close(read_end)
    os.close(write_end)
    monkeypatch.setattr("numpy_engine.parallel.unread_bytes", lambda fd: 1 / 0)
    with open(tmp_path / "log", "w") as file:  # not a pipe: nothing to wait for
        wait_until_read(file.fileno(), 30.0)
