"""Checkpoints: exact round trips, and clear refusals of anything else."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine import checkpoint
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.optim import AdamW
from numpy_engine.train import resume


@pytest.fixture
def saved(tmp_path):
    model = ne.MiniGPT(ne.GPTConfig(n_layers=2, max_len=16), seed=3)
    optimizer = AdamW(model.params, lr=0.01)
    idx = np.random.default_rng(0).integers(0, 13, (2, 16))
    optimizer.step(model.flat, model.flat_grads(model.loss_and_grads(idx, np.roll(idx, -1, 1))[1]))
    path = save_checkpoint(tmp_path, model, optimizer.state_dict(), {"task": "char-lm", "step": 1})
    return path, model, optimizer


def test_round_trip_is_exact(saved):
    path, model, optimizer = saved
    assert path.name == "checkpoint.npz"
    loaded = load_checkpoint(path.parent)  # a directory means the checkpoint inside it
    assert loaded.model.config == model.config and loaded.meta == {"task": "char-lm", "step": 1}
    for key, value in model.params.items():
        assert loaded.model.params[key].dtype == value.dtype
        np.testing.assert_array_equal(loaded.model.params[key], value)
    restored = AdamW(loaded.model.params, lr=0.01)
    restored.load_state_dict(loaded.optimizer_state)
    assert restored.step_count == 1
    np.testing.assert_array_equal(
        restored.state["exp_avg"]["head.weight"], optimizer.state["exp_avg"]["head.weight"]
    )


def test_seq2seq_round_trip(tmp_path):
    model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(n_decoder_layers=2, dtype="float64"), seed=1)
    loaded = load_checkpoint(save_checkpoint(tmp_path / "a.npz", model))
    assert type(loaded.model) is ne.Seq2SeqTransformer and loaded.optimizer_state == {}
    assert all(np.array_equal(loaded.model.params[k], v) for k, v in model.params.items())


def rewrite(path, **changes):
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays.update(changes)
    arrays = {key: value for key, value in arrays.items() if value is not None}
    np.savez(path, **arrays)


def test_the_optimizers_state_is_read_only_when_asked_for(saved):
    """load_checkpoint(optimizer=False) reads the weights and not the optimizer's moments: a
    pickle in a moment's entry is refused only when they are read."""
    path, model, _ = saved
    rewrite(path, **{"optim/exp_avg.head.bias": np.array([{"run": "code"}], dtype=object)})
    loaded = load_checkpoint(path, optimizer=False)
    assert loaded.optimizer_state is None and loaded.meta == {"task": "char-lm", "step": 1}
    assert np.array_equal(loaded.model.flat, model.flat)
    with pytest.raises(ValueError, match="refused, it holds pickled objects"):
        load_checkpoint(path)


def test_only_resuming_reads_a_runs_optimizer_state(tmp_path, capsys):
    """generate, attention, export-hf, export and train --init take a checkpoint's weights,
    not its optimizer's moments: a fine-tuned 124M GPT-2's are 950 MB (generate's peak RSS
    1587 -> 614 MB; train lm --init's 3245 -> 2274, which had held them all its run). A
    pickle in a moment's entry shows it: only resuming, which reads them, refuses it."""
    from crosscheck.interchange import export_checkpoint
    from numpy_engine.cli import main

    run = tmp_path / "run"
    assert main(["train", "lm", "--steps", "1", "--quiet", "--out", str(run)]) == 0
    with np.load(run / "checkpoint.npz") as archive:
        moment = next(key for key in archive.files if key.startswith("optim/exp_avg."))
    rewrite(run / "checkpoint.npz", **{moment: np.array([{"run": "code"}], dtype=object)})
    for command in (
        ["generate", "--checkpoint", str(run), "--prompt", "to", "--max-new-tokens", "2"],
        ["attention", "--checkpoint", str(run), "--prompt", "to", "--out", str(tmp_path / "a.png")],
        ["export-hf", "--checkpoint", str(run), "--to", str(tmp_path / "hf")],
        ["train", "lm", "--init", str(run), "--steps", "1", "--quiet"],
    ):
        assert main(command) == 0, command
    assert export_checkpoint(run, tmp_path / "weights.pt").is_file()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--steps", "2", "--quiet"]) == 2
    assert "refused, it holds pickled objects" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["param/head.bias", "optim/exp_avg.head.bias", "kind"])
def test_refuses_pickled_objects(saved, entry):
    path = saved[0]
    rewrite(path, **{entry: np.array([{"run": "code"}], dtype=object)})
    said = f"^checkpoint {re.escape(str(path))}: refused, it holds pickled objects"
    with pytest.raises(ValueError, match=said):
        load_checkpoint(path.parent)  # the run directory: the message names the file


def test_an_entry_cut_short_is_not_called_a_pickle(saved):
    """A weight's .npy member cut short: np.load's ValueError, which is not about pickles,
    reads as an unreadable file, with numpy's words."""
    import zipfile

    path = saved[0]
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data[:-5] if name == "param/head.bias.npy" else data)
    said = f"^checkpoint {re.escape(str(path))}: not a readable .npz file \\(EOF: reading array"
    with pytest.raises(ValueError, match=said):
        load_checkpoint(path)


def test_refuses_an_entry_that_is_no_part_of_a_checkpoint(saved):
    """Not read, and not passed over either: a file with more in it than a checkpoint holds
    is not one this engine wrote."""
    path = saved[0]
    rewrite(path, evil=np.array([{"run": "code"}], dtype=object))
    said = f"^checkpoint {re.escape(str(path))}: an entry 'evil' that is no part of one$"
    with pytest.raises(ValueError, match=said):
        load_checkpoint(path)


def test_refuses_a_model_too_large_for_memory(saved):
    path = saved[0]
    config = {"vocab_size": 13, "d_model": 2**40, "n_heads": 1}  # (13, 2**40) embedding: 104 TiB
    rewrite(path, config=np.array(json.dumps(config)))
    said = f"^checkpoint {re.escape(str(path))}: its model does not fit in memory \\(GPTConfig"
    with pytest.raises(ValueError, match=said):
        load_checkpoint(path)


def test_refuses_a_truncated_file(saved):
    path = saved[0]
    path.write_bytes(path.read_bytes()[:1000])
    said = f"^checkpoint {re.escape(str(path))}: not a readable .npz file"
    with pytest.raises(ValueError, match=said):
        load_checkpoint(path.parent)  # the run directory: the message names the file


def test_refuses_a_wrong_version_and_mismatched_params(saved):
    path = saved[0]
    rewrite(path, format_version=np.array(99))
    with pytest.raises(ValueError, match=f"^checkpoint {re.escape(str(path))}: format version 99"):
        load_checkpoint(path)
    rewrite(path, format_version=np.array(1), meta=None)
    with pytest.raises(ValueError, match="missing 'meta'"):
        load_checkpoint(path)
    rewrite(path, meta=np.array(json.dumps({"step": 1})))
    rewrite(path, format_version=np.array(1), **{"param/head.bias": np.zeros(5, np.float32)})
    mismatch = f"^checkpoint {re.escape(str(path))}: does not match its config: params"
    with pytest.raises(ValueError, match=mismatch + r"\['head.bias'\]"):
        load_checkpoint(path)
    rewrite(path, **{"param/head.bias": None})
    with pytest.raises(ValueError, match=mismatch + r": missing keys \['head.bias'\]"):
        load_checkpoint(path)
    rewrite(path, config=np.array(json.dumps({"d_model": 30, "n_heads": 4})))
    with pytest.raises(ValueError, match="unreadable config"):
        load_checkpoint(path)


@pytest.mark.parametrize("meta", [[1], "copy", 3])
def test_a_meta_that_is_not_an_object_is_refused_by_name(saved, meta, capsys):
    """Read by its keys (info, generate, --resume): a list was an AttributeError in each.
    train --init reads the header alone first (checkpoint.read_header): named there too."""
    from numpy_engine.cli import main

    path = saved[0]
    rewrite(path, meta=np.array(json.dumps(meta)))
    said = f"checkpoint {path}: its meta is a JSON {type(meta).__name__}, not an object"
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        load_checkpoint(path)
    assert main(["train", "lm", "--init", str(path.parent), "--steps", "1", "--quiet"]) == 2
    assert capsys.readouterr().err == f"numpy-engine train: error: {said}\n"


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "an empty file"),
        (b"step,loss\n1,2.5\n", r"not an .npz file \(it starts with b'step,los'\)"),
        (b"\x89PNG\r\n\x1a\n" + bytes(32), "not an .npz file"),
        (b"\x80\x04\x95" + bytes(16), "refused, it holds pickled objects"),
        ("npy", "a single .npy array, not an .npz checkpoint"),
    ],
    ids=["empty", "text", "picture", "pickle", "npy"],
)
def test_refuses_a_file_that_is_not_an_npz(tmp_path, content, message):
    """np.load would read these as a pickle (refused as "pickled" whatever they hold) or
    return a bare array; each is named for what it is."""
    path = tmp_path / "checkpoint.npz"
    if content == "npy":
        with open(path, "wb") as file:
            np.save(file, np.arange(3.0))
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^checkpoint {re.escape(str(path))}: {message}"):
        load_checkpoint(tmp_path)


def test_a_file_given_as_a_run_directory_is_named(tmp_path):
    path = tmp_path / "weights.npy"
    np.save(path, np.arange(3.0))
    with pytest.raises(ValueError, match="weights.npy: a file, not a run directory"):
        load_checkpoint(path)


def test_a_hugging_face_directory_given_as_a_run_says_to_import_it(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=f"import-hf {re.escape(str(tmp_path))} --out RUN$"):
        load_checkpoint(tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_checkpoint(tmp_path / "nope.npz")


def test_saving_leaves_no_temporary_files(saved):
    path = saved[0]
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.npz"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # a shared artifact, not mkstemp's 0o600


def test_a_save_is_on_disk_before_it_replaces_the_old_checkpoint(saved, monkeypatch):
    """The whole new file is flushed and fsynced, then renamed over the old one: a crash
    leaves one checkpoint or the other, never a part of one."""
    path, model, _ = saved
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append(("fsync", os.fstat(fd).st_size))  # what the disk holds of the file
        fsync(fd)

    def recording_replace(source, target):
        events.append(("replace", Path(source).stat().st_size))
        replace(source, target)

    monkeypatch.setattr(checkpoint.os, "fsync", recording_fsync)
    monkeypatch.setattr(checkpoint.os, "replace", recording_replace)
    save_checkpoint(path, model, None, {"step": 2})
    size = path.stat().st_size
    assert events == [("fsync", size), ("replace", size)]


def test_a_save_that_fails_keeps_the_old_checkpoint_and_no_temporary_file(saved, monkeypatch):
    path, model, _ = saved
    before = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.np, "savez", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, model, None, {"step": 2})
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.npz"]


# Written by the engine at commit f12de4e (a 20-step copy run, d_model 8): later changes to
# the model contract must keep loading the checkpoints users already have.
OLD_CHECKPOINT = Path(__file__).parent / "fixtures" / "copy-f12de4e"


def test_a_checkpoint_written_by_an_earlier_engine_loads_decodes_and_resumes(tmp_path):
    from numpy_engine.generate import greedy_decode
    from numpy_engine.train import resume

    checkpoint = load_checkpoint(OLD_CHECKPOINT)
    assert checkpoint.meta["step"] == 20 and checkpoint.model.config.d_model == 8
    generated = greedy_decode(checkpoint.model, np.array([[4, 7]]), max_new_tokens=3)
    assert generated.shape == (1, 3) and ((generated >= 0) & (generated < 12)).all()
    run = tmp_path / "run"
    shutil.copytree(OLD_CHECKPOINT, run)
    resumed = resume(run, progress_stream=None, checkpoint_every=2, steps=25)
    assert resumed.history["step"][-5:] == [21, 22, 23, 24, 25]
    assert np.isfinite(resumed.history["train_loss"]).all()
    assert load_checkpoint(run).meta["step"] == 24  # saved at 22 and 24 on the way


def test_a_run_saved_before_a_setting_existed_has_its_default(tmp_path, capsys):
    """The old run's config has no schedule: it trained at a constant lr, which a resume
    may say again; another schedule conflicts with it, and is named so."""
    from numpy_engine.cli import main

    run = tmp_path / "run"
    shutil.copytree(OLD_CHECKPOINT, run)
    assert "schedule" not in load_checkpoint(run).meta["train_config"]
    resume = ["train", "--resume", str(run), "--steps", "21", "--quiet"]
    assert main([*resume, "--schedule", "cosine"]) == 2
    assert "--schedule cosine conflicts with the checkpoint's schedule=constant" in (
        capsys.readouterr().err
    )
    assert main([*resume, "--schedule", "constant", "--warmup", "0"]) == 0
    assert load_checkpoint(run).meta["step"] == 21


@pytest.mark.parametrize("flags", [[], ["--lr", "0.001"]])
def test_a_run_of_a_task_this_engine_does_not_know_is_refused_by_name(tmp_path, capsys, flags):
    from numpy_engine.cli import main

    old = load_checkpoint(OLD_CHECKPOINT)
    meta = old.meta | {"task": "translate"}
    save_checkpoint(tmp_path / "run", old.model, old.optimizer_state, meta)
    assert main(["train", "--resume", str(tmp_path / "run"), "--steps", "21", *flags]) == 2
    known = "which is not known here (known: copy, reverse, char-lm, lm)"
    refused = f"checkpoint in {tmp_path / 'run'} is of task 'translate', {known}"
    assert refused in capsys.readouterr().err
    with pytest.raises(InputError) as library_call:  # the command line checks before it
        resume(tmp_path / "run", progress_stream=None)
    assert refused in str(library_call.value)


def test_a_run_whose_meta_lacks_its_task_is_refused_by_what_it_lacks(tmp_path, capsys):
    from numpy_engine.cli import main

    old = load_checkpoint(OLD_CHECKPOINT)
    meta = {key: value for key, value in old.meta.items() if key != "task"}
    save_checkpoint(tmp_path / "run", old.model, old.optimizer_state, meta)
    assert main(["train", "--resume", str(tmp_path / "run"), "--steps", "21", "--lr", "0.1"]) == 2
    assert "cannot be resumed: it holds no training run's state (its meta lacks ['task'])" in (
        capsys.readouterr().err
    )
