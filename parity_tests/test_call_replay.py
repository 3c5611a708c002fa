"""benchmarks/calls_alone.py and the recording it replays (benchmarks/call_count.py): the
replay makes the step's counted calls again, on the recorded arrays, and the script times
each run after a torch step. Timing is never asserted: known times stand in for it."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import calls_alone, workloads
from benchmarks.call_count import (
    Counted,
    bound_arrays,
    calls_per_step,
    replay,
    restore,
    snapshot,
)
from parity_tests.helpers import recorded_thread_settings


def test_a_replay_makes_each_recorded_call_again_on_the_recorded_arrays():
    """Each outermost call is on the tape once, a loop over an array included (its last index
    raises IndexError, as in the recording); a replay writes in place into the recorded arrays
    (b += a again), bound_arrays finds each array a call reads or writes, an argument's or a
    keyword's, and restore puts their values back."""
    a = np.arange(6.0).reshape(2, 3).view(Counted)
    Counted.calls.clear()
    Counted.tape = []
    try:
        b = a * 2.0  # multiply: a new array, not kept by the replay
        b += a  # add, in place: b = 3a
        rows = tuple(a)  # index 0, 1, then 2 raises: three calls
        joined = np.empty(6).view(Counted)  # not a call
        np.concatenate(rows, out=joined)  # concatenate, joined only a keyword's value
        tape = Counted.tape
    finally:
        Counted.tape = None
    assert len(tape) == sum(Counted.calls.values()) == 6
    arrays = bound_arrays(tape)
    for array in (a, b, joined):
        assert any(np.shares_memory(x, array) for x in arrays)
    saved = snapshot(arrays)
    assert not any(np.shares_memory(x, y) for x, y in zip(arrays, saved, strict=True))
    joined[...] = 0.0
    replay(tape)
    np.testing.assert_array_equal(b, 4 * np.arange(6.0).reshape(2, 3))  # 3a + a
    np.testing.assert_array_equal(joined, np.arange(6.0))  # written again
    restore(arrays, saved)
    np.testing.assert_array_equal(b, 3 * np.arange(6.0).reshape(2, 3))


def test_the_recorded_copy_step_is_the_calls_the_bench_counts():
    """recorded_calls records one engine step's calls, from where calls_per_step starts
    counting (not the parameter views it makes first), and records nothing after;
    calls_per_step gives the model its own parameters back."""
    tape = calls_alone.recorded_calls("copy")
    model, optimizer, batches = workloads.build(workloads.WORKLOADS["copy"], 2)
    workloads.engine_step(model, optimizer, batches[0])
    flat, params = model.flat, model.params
    calls, _ = calls_per_step(model, optimizer, batches[1], workloads.engine_step)
    assert model.flat is flat and model.params is params
    assert len(tape) == sum(calls.values()) > 500  # copy's 542 today
    assert Counted.tape is None
    replay(tape)  # every call runs again


def test_a_step_counts_the_same_calls_whatever_the_engines_threads(monkeypatch):
    """char-lm's optimizer on three threads (a block a thread): the count is one thread's, and
    the engine's threads are put back after."""
    from numpy_engine import clipping, threads

    monkeypatch.setattr(clipping, "THREAD_BLOCKS", 1)
    model, optimizer, batches = workloads.build(workloads.WORKLOADS["char-lm"], 2)
    workloads.engine_step(model, optimizer, batches[0])
    before = threads.threads()
    counts = []
    try:
        for n in (1, 3):
            threads.set_threads(n)
            calls, _ = calls_per_step(model, optimizer, batches[1], workloads.engine_step)
            counts.append(sum(calls.values()))
            assert threads.threads() == n
    finally:
        threads.set_threads(before)
    assert counts[0] == counts[1] > 800  # char-lm's 826 today


def test_calls_alone_times_each_run_after_a_torch_step(monkeypatch):
    """Each round: the tape's arrays put back, an untimed torch step, then the replay, torch,
    the engine step, torch, each timed, then a replay and the replay after it, an engine
    step and the step after it, each second one timed; the steps on the round's batch of
    four. Medians in ms, the rounds' median ratios, each run against the torch step after
    it, and the median of the rounds' back-to-back step less replay. Each run 'takes' a
    known time (workloads.timed replaced)."""
    import torch

    from benchmarks import bench

    order, seen = [], {}

    def restore(arrays, saved):  # the tape's arrays, with copies of their values
        order.append("restore")
        seen["restored"] = arrays
        assert len(arrays) == len(saved) > 400
        for array, values in zip(arrays, saved, strict=True):
            assert np.array_equal(array, values) and not np.shares_memory(array, values)

    def replay(tape):
        order.append("replay")
        seen.setdefault("tapes", []).append(tape)

    def torch_step(module, optimizer, batch):
        order.append(("torch", batch[0].numpy().tobytes()))
        seen["torch lr"] = optimizer.param_groups[0]["lr"]
        assert isinstance(module, torch.nn.Module) and isinstance(batch[0], torch.Tensor)

    real_engine_step = workloads.engine_step

    def engine_step(model, optimizer, batch):  # also the recorded step's, before the rounds
        order.append(("engine", np.asarray(batch[0]).tobytes()))
        seen["engine lr"] = optimizer.lr
        assert isinstance(batch[0], np.ndarray)  # the engine's own arrays, not torch's
        return real_engine_step(model, optimizer, batch)

    monkeypatch.setattr(calls_alone, "restore", restore)
    monkeypatch.setattr(calls_alone, "replay", replay)
    monkeypatch.setattr(bench, "torch_step", torch_step)
    monkeypatch.setattr(workloads, "engine_step", engine_step)
    seconds = {  # each round: after a torch step, then back to back
        "replay": iter([2, 1, 3, 2, 4, 2, 3, 3, 3, 1]),
        "engine": iter([4, 8, 5, 9, 4, 7, 6, 9, 6, 8]),
    }
    torch_seconds = iter([5, 10, 5, 8, 5, 20, 5, 10, 5, 10])  # after replay, after step

    def kind(entry):
        return entry if isinstance(entry, str) else entry[0]

    timed_after = []  # each timed run's kind, and the kind of the run before it

    def timed(fn, i):
        before = len(order)
        fn(i)
        assert len(order) == before + 1  # one run, timed
        key = kind(order[-1])
        timed_after.append((key, kind(order[-2])))
        return next(torch_seconds if key == "torch" else seconds[key]), None

    monkeypatch.setattr(workloads, "timed", timed)
    times = calls_alone.measure("copy", rounds=5)
    order = order[2:]  # the recorded step's two engine steps
    kinds = [kind(entry) for entry in order]
    round_kinds = ["restore", "torch", "replay", "torch", "engine", "torch"]
    assert kinds == (round_kinds + ["replay", "replay", "engine", "engine"]) * 5
    after_torch = [("replay", "torch"), ("torch", "replay"), ("engine", "torch")]
    back_to_back = [("replay", "replay"), ("engine", "engine")]  # the second of each timed
    assert timed_after == (after_torch + [("torch", "engine")] + back_to_back) * 5
    torch_batches = [entry[1] for entry in order if entry[0] == "torch"]
    engine_batches = [entry[1] for entry in order if entry[0] == "engine"]
    assert engine_batches[::3] == engine_batches[1::3] == engine_batches[2::3]
    assert torch_batches[::3] == torch_batches[1::3] == torch_batches[2::3]
    assert torch_batches[::3] == engine_batches[::3]
    assert len(set(engine_batches)) == 4 and engine_batches[12] == engine_batches[0]
    tape = seen["tapes"][0]
    assert len(tape) == times["calls"] > 400 and all(callable(call) for call in tape)
    assert len(seen["tapes"]) == 15 and all(each is tape for each in seen["tapes"])
    tape_arrays = bound_arrays(tape)
    assert all(np.shares_memory(x, y) for x, y in zip(seen["restored"], tape_arrays, strict=True))
    assert seen["torch lr"] == seen["engine lr"] == 1e-3
    assert times["replay"] == [2, 3, 4, 3, 3] and times["engine step"] == [4, 5, 4, 6, 6]
    assert times["torch after replay"] == [5, 5, 5, 5, 5]
    assert times["torch after step"] == [10, 8, 20, 10, 10]
    assert times["replay after replay"] == [1, 2, 2, 3, 1]
    assert times["step after step"] == [8, 9, 7, 9, 8]
    row = calls_alone.summary(times)
    assert row["calls"] == times["calls"]
    assert (row["replay_ms"], row["step_ms"], row["torch_ms"]) == (3000, 5000, 10000)
    assert row["replay_of_step"] == pytest.approx(0.5)  # 0.5, 0.6, 1.0, 0.5, 0.5
    assert row["step_of_torch"] == pytest.approx(0.6)  # 0.4, 0.625, 0.2, 0.6, 0.6
    assert row["replay_of_torch"] == pytest.approx(0.6)  # 0.4, 0.6, 0.8, 0.6, 0.6
    assert (row["warm_replay_ms"], row["warm_step_ms"]) == (2000, 8000)
    assert row["python_ms"] == 7000  # the rounds' step less replay: 7, 7, 5, 6, 7


def test_calls_alone_report_and_arguments(monkeypatch, capsys):
    row = dict(calls=458, replay_ms=1.6504, step_ms=2.0401, torch_ms=4.9302)
    row |= dict(replay_of_step=0.8091, step_of_torch=0.4151, replay_of_torch=0.3349)
    row |= dict(warm_replay_ms=0.6884, warm_step_ms=0.8981, python_ms=0.2046)
    monkeypatch.setattr(workloads, "processor_name", lambda: "Some CPU, 2 cores")
    assert calls_alone.report("copy", 400, row).splitlines() == [
        "copy, one thread, each run right after a torch step (400 rounds; Some CPU, 2 cores):",
        "  engine step 2.040 ms; its 458 NumPy calls back to back 1.650 ms (0.809 of the step);"
        " torch step 4.930 ms",
        "  against the torch step after each: the engine step 0.415, its calls alone 0.335",
        "  back to back, each right after one of its kind: the engine step 0.898 ms, its calls"
        " 0.688 ms; the Python between the calls 0.205 ms",
    ]
    for argv in (["--rounds", "0"], ["gpt2"]):
        with pytest.raises(SystemExit) as stop:
            calls_alone.main(argv)
        assert stop.value.code == 2
    assert "--rounds" in capsys.readouterr().err


def test_calls_alone_runs_on_one_thread_and_prints_its_report(monkeypatch, capsys):
    """main: BLAS and torch on one thread while it measures, freed memory kept (as in the
    bench), the config and rounds asked for; it prints the report and returns its row."""
    asked = recorded_thread_settings(monkeypatch)
    asked["measured"] = []

    def measure(name, rounds):
        asked["measured"].append((name, rounds, asked["blas"][-1:]))
        return "times"

    monkeypatch.setattr(calls_alone, "measure", measure)
    monkeypatch.setattr(calls_alone, "summary", lambda times: {"row of": times})
    monkeypatch.setattr(calls_alone, "report", lambda *args: f"report {args}")
    assert calls_alone.main(["char-lm", "--rounds", "7"]) == {"row of": "times"}
    assert calls_alone.main([]) == {"row of": "times"}
    assert capsys.readouterr().out.splitlines() == [
        "report ('char-lm', 7, {'row of': 'times'})",
        "report ('copy', 400, {'row of': 'times'})",
    ]
    assert asked == {
        "torch": [1, 1],
        "blas": [1, 1],
        "memory kept": [True, True],
        "measured": [("char-lm", 7, [1]), ("copy", 400, [1])],
    }
