"""Nothing lost: a run killed with SIGKILL resumes bit for bit; divergence stops cleanly;
damaged files are refused; weights move to PyTorch and back."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import numpy_engine as ne
from crosscheck.convert import tensor
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.loop import empty_history, step_gradient
from numpy_engine.optim import Adam
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.train import (
    Checkpointing,
    SequenceTrainConfig,
    TrainingDiverged,
    TrainState,
    save_run,
    train_sequence_task,
)
from torch_reference.models import Seq2SeqTransformer as TorchSeq2Seq

SINGLE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TRAIN = ["train", "copy", "--steps", "600", "--eval-every", "200", "--quiet"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "numpy_engine", *args]


def saved_step(out) -> int:
    try:
        return load_checkpoint(out).meta["step"]
    except ValueError:  # not written yet
        return 0


def test_a_killed_run_resumes_bit_for_bit(tmp_path):
    env = os.environ | SINGLE_THREAD
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    subprocess.run(cli(*TRAIN, "--out", str(whole)), env=env, check=True, capture_output=True)
    run = subprocess.Popen(
        cli(*TRAIN, "--out", str(broken), "--checkpoint-every", "40"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while saved_step(broken) < 120 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL  # killed, not finished
    killed_at = saved_step(broken)
    assert 120 <= killed_at < 600
    resumed = subprocess.run(
        cli("train", "--resume", str(broken), "--quiet"), env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_checkpoint(whole), load_checkpoint(broken)
    assert b.meta["step"] == a.meta["step"] == 600
    for key, value in a.model.params.items():
        assert np.array_equal(value, b.model.params[key]), key  # bit for bit
    for key, value in a.optimizer_state.items():
        assert np.array_equal(value, b.optimizer_state[key]), key
    assert a.meta["history"] == b.meta["history"]


class ExplodingSeq2Seq(ne.Seq2SeqTransformer):
    """Returns a gradient of embed.weight with one NaN and two infinities on the 7th call."""

    calls = 0

    def loss_and_grads(self, *batch):
        loss, grads = super().loss_and_grads(*batch)
        type(self).calls += 1
        if type(self).calls == 7:
            grads["embed.weight"][3, 1] = np.nan
            grads["embed.weight"][4, :2] = np.inf, -np.inf
        return loss, grads


@pytest.mark.parametrize("accumulate", [None, 2])  # the grads dict; a flat sum of two
def test_a_non_finite_gradient_stops_training_and_keeps_the_last_checkpoint(tmp_path, accumulate):
    ExplodingSeq2Seq.calls = 0
    model = ExplodingSeq2Seq(ne.Seq2SeqConfig(), seed=7)
    history = empty_history()
    state = TrainState(model, Adam(model.params), np.random.default_rng(1), 0, history)
    cfg = SequenceTrainConfig(steps=20, eval_every=5)
    parallel = accumulate and DataParallel(OneProcess(), accumulate)
    # a step reads one batch, or (accumulate=2) two micro-batches summed into a flat vector:
    # the 7th call is in step 7, or in step 4
    step, saved = (7, 5) if accumulate is None else (4, 2)
    with pytest.raises(
        TrainingDiverged,
        match=f"step {step}: the gradient of 'embed.weight' is not "
        f"finite \\(1 NaN, 2 inf\\).*checkpoint of step {saved} is intact",
    ):
        checkpointing = Checkpointing(tmp_path, saved)
        train_sequence_task(cfg, None, None, checkpointing, state, parallel)
    kept = load_checkpoint(tmp_path)
    assert kept.meta["step"] == saved
    assert all(np.isfinite(value).all() for value in kept.model.params.values())


class NaNLossSeq2Seq(ne.Seq2SeqTransformer):
    """Returns a NaN loss, with finite gradients, on the 3rd call."""

    calls = 0

    def loss_and_grads(self, *batch):
        loss, grads = super().loss_and_grads(*batch)
        type(self).calls += 1
        return (math.nan if type(self).calls == 3 else loss), grads


def test_a_non_finite_loss_stops_training_even_when_the_gradients_are_finite():
    """The loss is checked on its own: the update would take finite gradients as they are."""
    NaNLossSeq2Seq.calls = 0
    model = NaNLossSeq2Seq(ne.Seq2SeqConfig(), seed=7)
    history = empty_history()
    state = TrainState(model, Adam(model.params), np.random.default_rng(1), 0, history)
    stopped = "^step 3: the loss is nan; stopped before updating$"
    with pytest.raises(TrainingDiverged, match=stopped):
        train_sequence_task(SequenceTrainConfig(steps=5), None, None, None, state)
    assert state.step == 2 and history["step"] == [1, 2] and state.optimizer.step_count == 2


class HugeLossMiniGPT(ne.MiniGPT):
    """Returns a loss of 3e38, finite in float32, with its gradients."""

    def loss_and_grads(self, *batch, **dropout):
        return 3e38, super().loss_and_grads(*batch, **dropout)[1]


def test_micro_batches_losses_summed_past_float32_stop_the_step():
    """Each micro-batch's loss is checked finite, but the step sums them, times their target
    counts, in the reduced float32 vector: past its range the step's loss is inf, and the
    step stops before updating (NumPy's overflow warning silenced, as by default it only
    warns; the command line raises it)."""
    config = ne.GPTConfig(n_layers=1, dtype="float32")
    model = HugeLossMiniGPT(config, seed=0)
    batch = ne.MiniGPT.example_batch(config, np.random.default_rng(0), 4, 6)
    state = TrainState(model, Adam(model.params), np.random.default_rng(0), 0, empty_history())
    with (
        np.errstate(over="ignore"),
        pytest.raises(TrainingDiverged, match="^step 1: the loss is inf"),
    ):
        step_gradient(state, 1, batch, DataParallel(OneProcess(), 2))


def test_an_update_past_the_parameters_dtype_stops_naming_the_learning_rate(capsys):
    """An lr of 1e39, past float32's range, overflows in the update itself, before a forward
    pass could see it: the stop names the step, the update and the lr, not only "numerical
    error: overflow encountered in cast" as before."""
    from numpy_engine.cli import main

    assert main(["train", "copy", "--steps", "3", "--lr", "1e39", "--quiet"]) == 1
    assert re.fullmatch(
        r"numpy-engine train: stopped: step 1: overflow encountered in \w+ in the optimizer's "
        r"update \(lr 1e\+39\): the learning rate is too large for the parameters' dtype; "
        r"stopped during the update\n",
        capsys.readouterr().err,
    )


def test_divergence_on_the_command_line_exits_1_with_one_line(tmp_path):
    result = subprocess.run(
        cli(
            "train",
            "copy",
            "--steps",
            "20",
            "--lr",
            "1e30",
            "--quiet",
            "--out",
            str(tmp_path),
            "--checkpoint-every",
            "1",
        ),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("numpy-engine train: stopped: step ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert load_checkpoint(tmp_path).meta["step"] >= 1


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    cfg = SequenceTrainConfig(steps=30, eval_every=30)
    save_run(train_sequence_task(cfg, progress_stream=None), out)
    return out


def test_resume_refuses_an_out_elsewhere_and_takes_its_own_directory(trained, tmp_path, capsys):
    """--out OTHER beside --resume RUN was ignored: the run went on in RUN, over the
    checkpoint the user may have meant to keep, and OTHER was never written."""
    from numpy_engine.cli import main

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = (run / "checkpoint.npz").read_bytes()
    resumed = ["train", "--resume", str(run), "--steps", "32", "--quiet", "--out"]
    assert main([*resumed, str(tmp_path / "other")]) == 2
    assert capsys.readouterr().err == (
        f"numpy-engine train: error: --out {tmp_path / 'other'} conflicts with --resume {run}: "
        "a resumed run saves into the directory it continues; to continue a copy of the run, "
        f"copy {run} to {tmp_path / 'other'} and give --resume {tmp_path / 'other'}\n"
    )
    assert (run / "checkpoint.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert main([*resumed, f"{run}/../run/"]) == 0  # the same directory, named another way
    assert load_checkpoint(run).meta["step"] == 32


def test_a_damaged_checkpoint_is_refused_by_name(trained, tmp_path):
    data = (trained / "checkpoint.npz").read_bytes()
    rng = np.random.default_rng(0)
    damaged = bytearray(data)
    for position in rng.integers(100, len(data) - 100, size=20):
        damaged[position] ^= 0xFF
    (tmp_path / "damaged.npz").write_bytes(bytes(damaged))
    # which refusal depends on where the flipped bytes land: here one lands in an entry's name
    refused = "damaged.npz: (corrupted|not a readable|does not match|an entry .* no part of one)"
    with pytest.raises(ValueError, match=refused):
        load_checkpoint(tmp_path / "damaged.npz")
    (tmp_path / "short.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="short.npz: not a readable .npz file"):
        load_checkpoint(tmp_path / "short.npz")


def test_export_loads_into_torch_reference_weights_only_and_strict(trained, tmp_path, capsys):
    """In-process: `numpy-engine export` and `import` hand their arguments to crosscheck's
    main (test_parity_report and test_bench run that hand-over end to end)."""
    from crosscheck.cli import main as crosscheck_main

    pt = tmp_path / "model.pt"
    assert crosscheck_main(["export", "--checkpoint", str(trained), "--to", str(pt)]) == 0
    assert capsys.readouterr().out == f"wrote {pt} and {pt}.json\n"
    described = json.loads(pt.with_name("model.pt.json").read_text())
    saved = load_checkpoint(trained)
    assert described["kind"] == saved.model.kind and described["meta"] == {
        key: saved.meta[key] for key in ("task", "vocabulary") if key in saved.meta
    }
    assert described["meta"]["task"] == "copy"  # the task, not the run's history or state
    state_dict = torch.load(pt, weights_only=True)
    module = TorchSeq2Seq()
    module.load_state_dict(state_dict, strict=True)
    engine = load_checkpoint(trained).model
    source, decoder_input = np.array([[4, 5, 6]]), np.array([[1, 4, 5, 6]])
    ours, _ = engine.forward(source, decoder_input)
    theirs = module(tensor(source), tensor(decoder_input)).detach().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)  # float32, two engines

    back = tmp_path / "back"
    assert crosscheck_main(["import", str(pt), "--out", str(back)]) == 0
    assert capsys.readouterr().out == f"wrote {back / 'checkpoint.npz'}\n"
    reloaded = load_checkpoint(back).model
    assert all(np.array_equal(reloaded.params[k], v) for k, v in engine.params.items())
    assert_written_over_nothing(trained, pt, back, capsys)


def assert_written_over_nothing(trained, pt, back, capsys) -> None:
    """export and import again to the same places, or into a file: exit 2, naming what is
    there, every file as it was."""
    from crosscheck.cli import main as crosscheck_main

    npz = back / "checkpoint.npz"
    a_file = back / "notes.txt"
    a_file.write_text("mine")
    kept = {
        path: path.read_bytes() for path in (pt, pt.with_name("model.pt.json"), *back.iterdir())
    }
    for again, there in (
        (["export", "--checkpoint", str(trained), "--to", str(pt)], f"--to {pt}: {pt}, "),
        (["import", str(pt), "--out", str(back)], f"--out {back}: {npz} already exists;"),
        (["import", str(pt), "--out", str(npz)], f"--out {npz}: {npz} already exists;"),
        (["import", str(pt), "--out", str(a_file)], f"--out {a_file} is a file, not a"),
    ):
        capsys.readouterr()
        assert crosscheck_main(again) == 2, again
        assert there in capsys.readouterr().err
    assert {path: path.read_bytes() for path in kept} == kept


def test_import_refuses_anything_but_weights(trained, tmp_path, capsys):
    """A pickle that names a class (code to run on loading) is refused, not loaded."""
    from crosscheck.cli import main as crosscheck_main

    pt = tmp_path / "model.pt"
    assert crosscheck_main(["export", "--checkpoint", str(trained), "--to", str(pt)]) == 0
    evil = tmp_path / "evil.pt"
    torch.save({"weights": torch.zeros(1), "payload": ExplodingSeq2Seq}, evil)
    capsys.readouterr()
    args = ["import", str(evil), "--out", str(tmp_path / "x"), "--config", str(pt) + ".json"]
    assert crosscheck_main(args) == 2
    err = capsys.readouterr().err
    assert "refused: it is not a weights-only file" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("text.pt", b"hi\n", "refused: it is not a weights-only file"),
        ("picture.pt", b"\x89PNG\r\n\x1a\n" + bytes(40), "refused: it is not a weights-only file"),
        ("truncated.pt", "truncated", "refused: it is not a weights-only file"),
        ("listed.pt", "a list description", "model description (a JSON list, not an object)"),
    ],
)
def test_import_names_a_damaged_file_whatever_its_bytes(
    trained, tmp_path, capsys, name, content, words
):
    """torch's weights-only unpickler raises what the bytes lead it to (a KeyError on "hi"):
    each such file is refused in one line, exit 2, nothing written."""
    from crosscheck.cli import main as crosscheck_main

    pt = tmp_path / "model.pt"
    assert crosscheck_main(["export", "--checkpoint", str(trained), "--to", str(pt)]) == 0
    description = pt.with_name("model.pt.json")
    path = tmp_path / name
    if content == "truncated":
        path.write_bytes(pt.read_bytes()[:300])
    elif content == "a list description":
        path.write_bytes(pt.read_bytes())
        description = tmp_path / "listed.json"
        description.write_text("[1, 2]")
    else:
        path.write_bytes(content)
    capsys.readouterr()
    args = ["import", str(path), "--out", str(tmp_path / "x"), "--config", str(description)]
    assert crosscheck_main(args) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


SPOILED_DESCRIPTIONS = {  # what is wrong: (the description from export's, what import says)
    "a list": (lambda d: [d], "(a JSON list, not an object)"),
    "no kind": (lambda d: {"config": d["config"]}, '(no "kind" that names a model kind)'),
    "a listed kind": (lambda d: d | {"kind": [d["kind"]]}, '(no "kind" that names a model'),
    "a listed config": (lambda d: d | {"config": [1]}, '(no "config" object)'),
    "a listed meta": (lambda d: d | {"meta": [1]}, '("meta" is not a JSON object)'),
}


def test_import_names_what_a_model_description_lacks(trained, tmp_path, capsys):
    """Each was the bare KeyError "('config')", "unhashable type: 'list'", or (a listed meta)
    a checkpoint written that info, generate and --resume then failed on."""
    from crosscheck.cli import main as crosscheck_main

    pt = tmp_path / "model.pt"
    assert crosscheck_main(["export", "--checkpoint", str(trained), "--to", str(pt)]) == 0
    exported = json.loads(pt.with_name("model.pt.json").read_text())
    description = tmp_path / "description.json"
    for wrong, (spoil, said) in SPOILED_DESCRIPTIONS.items():
        description.write_text(json.dumps(spoil(exported)))
        capsys.readouterr()
        args = ["import", str(pt), "--out", str(tmp_path / "x"), "--config", str(description)]
        assert crosscheck_main(args) == 2, wrong
        err = capsys.readouterr().err
        assert f"{description}: cannot read the model description {said}" in err, (wrong, err)
        assert not (tmp_path / "x").exists(), wrong
    description.write_text(json.dumps({k: exported[k] for k in ("kind", "config")}))
    assert crosscheck_main(args) == 0  # without a meta: none
    assert load_checkpoint(tmp_path / "x").meta == {}


def test_export_makes_the_folder_it_writes_into_and_names_a_place_it_cannot(
    trained, tmp_path, capsys
):
    from crosscheck.cli import main as crosscheck_main

    pt = tmp_path / "new" / "folders" / "model.pt"
    assert crosscheck_main(["export", "--checkpoint", str(trained), "--to", str(pt)]) == 0
    assert pt.exists() and pt.with_name("model.pt.json").exists()
    capsys.readouterr()
    under_a_file = pt / "again.pt"  # pt is a file: no folder can be made there
    assert crosscheck_main(["export", "--checkpoint", str(trained), "--to", str(under_a_file)]) == 2
    err = capsys.readouterr().err
    assert f"--to {under_a_file}: cannot write it" in err and len(err.splitlines()) == 1, err


def test_a_resumed_sequence_run_checks_the_memory_of_its_own_model(tmp_path, monkeypatch):
    """A copy run of a wider model than the default, resumed: the step's memory is counted
    for the model the checkpoint holds, not for a new model of the default config."""
    from numpy_engine import train

    cfg = SequenceTrainConfig(steps=2, eval_every=2)
    wide = ne.Seq2SeqConfig(d_model=48, n_heads=4, d_ff=96)
    save_run(train_sequence_task(cfg, wide, progress_stream=None), tmp_path)
    counted = []
    monkeypatch.setattr(train, "check_step_fits", lambda what, model, *rest: counted.append(model))
    resumed = train.resume(tmp_path, None, steps=4)
    assert len(counted) == 1 and counted[0] is resumed.model
    assert resumed.model.config.d_model == 48 and resumed.history["step"][-1] == 4
