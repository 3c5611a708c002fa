"""Ctrl-C and SIGTERM stop a training run between two steps, saved, and it resumes bit for
bit; a second signal stops at once; what ignores the signals, or cannot handle them, is
left as it was."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from numpy_engine import loop
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli_args import run_command
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.stopping import ACKNOWLEDGED, StopRequests, TrainingInterrupted
from numpy_engine.train import Checkpointing, SequenceTrainConfig, resume, train_sequence_task

CFG = SequenceTrainConfig(steps=12, eval_every=6)


@pytest.fixture(autouse=True)
def pythons_own_ctrl_c():
    """Each test starts as Python does from a terminal: SIGINT raises KeyboardInterrupt. A
    process that a shell starts in the background without job control inherits SIGINT
    ignored instead, which training leaves alone (test_an_ignored_signal_stays_ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def signalled_at(monkeypatch, step: int, *signums: int) -> None:
    """Send this process each of signums at the end of the update of step `step`."""
    update = loop.guarded_update

    def update_then_signal(state, at, grads, clip):
        norm = update(state, at, grads, clip)
        if at == step:
            for signum in signums:
                os.kill(os.getpid(), signum)
        return norm

    monkeypatch.setattr(loop, "guarded_update", update_then_signal)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_after_its_step_saved_and_it_resumes_bit_for_bit(
    monkeypatch, tmp_path, capfd, signum
):
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    with threadpool_limits(1):  # the same bits in both runs
        whole = train_sequence_task(CFG, None, None)
        signalled_at(monkeypatch, 7, signum)  # past eval_every
        with pytest.raises(TrainingInterrupted) as stopped:
            train_sequence_task(CFG, None, None, Checkpointing(tmp_path, None))
        monkeypatch.undo()
        assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == handlers
        assert (stopped.value.step, stopped.value.status) == (7, 128 + signum)
        assert stopped.value.saved_in == tmp_path
        how = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else "SIGTERM"
        assert str(stopped.value).startswith(f"stopped by {how} after step 7 of 12; saved in ")
        assert load_checkpoint(tmp_path).meta["step"] == 7
        assert capfd.readouterr().err == ACKNOWLEDGED  # at once, from the handler
        resumed = resume(tmp_path, None)
    for key, value in whole.model.params.items():
        assert np.array_equal(value, resumed.model.params[key]), key
    ours, theirs = whole.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert all(np.array_equal(ours[key], theirs[key]) for key in ours)
    assert whole.history == resumed.history


def test_a_signal_on_a_checkpoint_step_saves_once_and_without_out_nothing(monkeypatch, tmp_path):
    saves = []
    monkeypatch.setattr(loop, "save_checkpoint", lambda *args: saves.append(args[3]["step"]))
    signalled_at(monkeypatch, 4, signal.SIGINT)
    with pytest.raises(TrainingInterrupted, match="after step 4 of 12; saved in"):
        train_sequence_task(CFG, None, None, Checkpointing(tmp_path, 2))
    assert saves == [2, 4]  # step 4's own save, not a second one
    with pytest.raises(TrainingInterrupted, match=r"step 4 of 12; nothing saved \(give --out"):
        train_sequence_task(CFG, None, None, None)
    assert saves == [2, 4]


def test_a_second_signal_stops_at_once_and_the_last_checkpoint_stays(monkeypatch, tmp_path):
    signalled_at(monkeypatch, 5, signal.SIGINT, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as stopped:
        train_sequence_task(CFG, None, None, Checkpointing(tmp_path, 2))
    assert type(stopped.value) is KeyboardInterrupt  # not saved at step 5: stopped inside it
    assert load_checkpoint(tmp_path).meta["step"] == 4
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_in_the_last_step_lets_the_run_finish(monkeypatch):
    signalled_at(monkeypatch, CFG.steps, signal.SIGTERM)
    run = train_sequence_task(CFG, None, None)
    assert run.history["step"][-1] == CFG.steps and "exact_match" in run.result


def test_an_ignored_signal_stays_ignored(monkeypatch):
    """A run started with & from a script ignores SIGINT: Ctrl-C there must not stop it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        signalled_at(monkeypatch, 3, signal.SIGINT)
        run = train_sequence_task(CFG, None, None)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert run.history["step"][-1] == CFG.steps


class TwoRanks(OneProcess):
    """Rank 0 of two whose peer holds the same sums (each Allreduce doubles them)."""

    size = 2

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        buffer *= 2


def test_a_rank_of_a_data_parallel_run_keeps_pythons_ctrl_c(monkeypatch):
    """Ranks would stop after different steps and wait for one another in the next sum: a
    rank's Ctrl-C stays a KeyboardInterrupt at once (run_as_rank then ends every rank)."""
    signalled_at(monkeypatch, 3, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as stopped:
        train_sequence_task(CFG, None, None, None, None, DataParallel(TwoRanks(), 1))
    assert type(stopped.value) is KeyboardInterrupt


def test_a_handler_set_outside_python_is_left_alone(monkeypatch):
    """signal.getsignal says None for a handler C code set: it cannot be put back, so it
    is not replaced."""
    getsignal = signal.getsignal
    monkeypatch.setattr(
        signal, "getsignal", lambda s: None if s == signal.SIGTERM else getsignal(s)
    )
    before = getsignal(signal.SIGTERM)
    with StopRequests() as stop:
        assert getsignal(signal.SIGTERM) is before
        assert getsignal(signal.SIGINT) == stop._note


def test_a_run_outside_the_main_thread_trains_without_handlers():
    """Python sets signal handlers only from the main thread: elsewhere nothing is set."""
    runs = []
    worker = threading.Thread(target=lambda: runs.append(train_sequence_task(CFG, None, None)))
    worker.start()
    worker.join()
    assert len(runs) == 1 and runs[0].history["step"][-1] == CFG.steps


def test_ctrl_c_outside_training_is_one_line_and_status_130(capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    status = run_command(argparse.Namespace(command="generate", run=interrupted))
    assert status == 130
    assert capsys.readouterr().err == "numpy-engine generate: interrupted\n"


def test_ctrl_c_in_a_command_handed_to_crosscheck_is_said_there_once(monkeypatch, capsys):
    """Ctrl-C at a terminal reaches `numpy-engine bench` and the `python -m crosscheck` it
    runs: crosscheck's run_command says so; the engine's side adds no traceback, no line."""
    from numpy_engine import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.subprocess, "run", interrupted)
    assert cli.main(["bench", "--steps", "3"]) == 130
    assert capsys.readouterr() == ("", "")


def test_sigterm_on_the_command_line_saves_the_run_and_exits_143(tmp_path):
    out = tmp_path / "run"
    run = subprocess.Popen(
        [sys.executable, "-m", "numpy_engine", "train", "copy", "--steps", "100000"]
        + ["--out", str(out), "--checkpoint-every", "20", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    checkpoint, deadline = out / "checkpoint.npz", time.monotonic() + 60  # fail, not hang
    try:
        while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 143 and stdout == ""
    step = load_checkpoint(out).meta["step"]
    assert stderr == ACKNOWLEDGED + (
        f"numpy-engine train: stopped by SIGTERM after step {step} of 100000; saved in {out}: "
        f"continue with `numpy-engine train --resume {out}`\n"
    )
    assert 20 <= step < 100000
