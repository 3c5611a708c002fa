"""`numpy-engine info`: a checkpoint's model, text, run and optimizer state, line by line,
read from its header and its arrays' .npy headers without reading an array."""

from __future__ import annotations

import json
import zipfile

import numpy as np

from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.cli import main
from numpy_engine.models import GPT2, GPT2Config, GPTConfig, MiniGPT
from parity_tests.helpers import info_lines


def test_a_training_runs_checkpoint(capsys, trained_copy):
    checkpoint = load_checkpoint(trained_copy)
    count = sum(p.size for p in checkpoint.model.params.values())
    lines = info_lines(capsys, trained_copy)
    assert list(lines) == ["file", "model", "config", "text", "run", "optimizer"]
    megabytes = (trained_copy / "checkpoint.npz").stat().st_size / 1e6
    assert lines["file"] == f"{trained_copy / 'checkpoint.npz'} ({megabytes:.1f} MB)"
    assert (
        lines["model"]
        == f"seq2seq (Seq2SeqTransformer), float32, {count:,} parameters in 49 arrays"
    )
    assert lines["config"].startswith("vocab_size=12 d_model=32 n_heads=4 d_ff=64 ")
    assert "dtype" not in lines["config"]
    assert lines["text"] == "sequences of symbol ids (generate --source)"
    history = checkpoint.meta["history"]
    evaluation = history["eval"][-1]
    assert lines["run"] == (
        "copy from scratch, step 20 of 20; seed 7, lr 0.001, batch 32; last training loss "
        f"{history['train_loss'][-1]:.4f}; at step 20: heldout_loss "
        f"{evaluation['heldout_loss']:.4g}, exact_match {evaluation['exact_match']:.4g}"
    )
    states = len(checkpoint.optimizer_state)
    assert (
        lines["optimizer"]
        == f"state saved ({states} arrays): train --resume {trained_copy} continues the run"
    )


def test_a_language_model_with_its_schedule_and_start(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be " * 40)
    run = tmp_path / "lm"
    args = ["train", "lm", "--text", str(text), "--steps", "3", "--schedule", "cosine"]
    kept = ["--holdout", "0.2", "--eval-every", "1", "--keep-best"]
    assert main([*args, "--warmup", "1", *kept, "--out", str(run), "--quiet"]) == 0
    lines = info_lines(capsys, run)
    assert lines["model"].startswith("gpt2 (GPT2), float32, ")
    assert lines["text"] == "7 characters: ' benort'"
    assert lines["run"].startswith(
        "lm from scratch, step 3 of 3; seed 7, lr 0.003 (cosine, warmup 1), "
    )
    tuned = tmp_path / "tuned"
    assert (
        main(
            [
                "train",
                "lm",
                "--init",
                str(run),
                "--text",
                str(text),
                "--steps",
                "1",
                "--out",
                str(tuned),
                "--quiet",
            ]
        )
        == 0
    )
    assert info_lines(capsys, tuned)["run"].startswith(f"lm from {run}, step 1 of 1; ")
    best = load_checkpoint(run / "best").meta
    assert info_lines(capsys, run / "best")["run"] == (
        f"none: a run's best weights, kept at step {best['step']} "
        f"(held-out loss {best['heldout_loss']:.4f})"
    )


def test_weights_without_a_run_and_a_long_vocabulary(tmp_path, capsys):
    """An imported GPT-2 keeps its tokenizer and source, and no optimizer state; a character
    vocabulary past 80 characters is shown cut, with its count."""
    model = GPT2(GPT2Config(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=8))
    meta = {"task": "import-hf", "source": "hf/gpt2", "tokenizer": "{}"}
    save_checkpoint(tmp_path / "imported", model, None, meta)
    lines = info_lines(capsys, tmp_path / "imported")
    assert lines["text"] == "the Hugging Face tokenizer (tokenizer.json) it was imported with"
    assert lines["run"] == "none: imported from hf/gpt2"
    assert (
        lines["optimizer"]
        == "none saved: the weights alone (train lm --init starts a run from them)"
    )
    chars = "".join(map(chr, range(0x100, 0x100 + 90)))
    small = MiniGPT(GPTConfig(vocab_size=90, d_model=8, n_heads=2, d_ff=16, n_layers=1))
    save_checkpoint(
        tmp_path / "chars.npz", small, {"exp_avg.x": np.zeros(3)}, {"vocabulary": chars}
    )
    lines = info_lines(capsys, tmp_path / "chars.npz")
    assert lines["text"] == f"90 characters: {chars[:80] + '...'!r}"
    assert lines["run"] == "none recorded"
    save_checkpoint(tmp_path / "80.npz", small, None, {"vocabulary": chars[:80]})
    assert info_lines(capsys, tmp_path / "80.npz")["text"] == f"80 characters: {chars[:80]!r}"
    assert lines["optimizer"] == "state saved (1 arrays)"  # no run to resume, no checkpoint.npz


def test_an_imported_tokenizers_ids_counted_as_the_tokenizers_library_counts_them(tmp_path, capsys):
    """The ids of tokenizer.json's vocabulary and its added tokens, one more for a token added
    past the vocabulary; the tokenizers library's get_vocab_size() is the witness."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"])
    tokenizer.train_from_iterator(["to be or not to be, that is the question"], trainer)
    model = GPT2(GPT2Config(vocab_size=512, d_model=8, n_heads=2, d_ff=16, n_layers=1))
    for added in ([], ["<pad>"]):
        tokenizer.add_special_tokens(added)
        meta = {"task": "import-hf", "source": "hf", "tokenizer": tokenizer.to_str()}
        path = save_checkpoint(tmp_path / f"t{len(added)}.npz", model, None, meta)
        ids = tokenizer.get_vocab_size()
        words = f"the Hugging Face tokenizer (tokenizer.json, {ids:,} ids) it was imported with"
        assert info_lines(capsys, path)["text"] == words
    assert ids == len(json.loads(meta["tokenizer"])["model"]["vocab"]) + 1  # <pad>'s id
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0))
    meta["tokenizer"] = unigram.to_str()  # its vocabulary a list of (piece, score)
    path = save_checkpoint(tmp_path / "unigram.npz", model, None, meta)
    assert info_lines(capsys, path)["text"] == (
        f"the Hugging Face tokenizer (tokenizer.json, {unigram.get_vocab_size()} ids) it was "
        "imported with"
    )


def test_a_copy_model_imported_from_a_state_dict(tmp_path, capsys, trained_copy):
    """`import` of a .pt keeps the task alone: no run, no optimizer, no --init for a seq2seq."""
    model = load_checkpoint(trained_copy).model
    save_checkpoint(tmp_path / "from-torch", model, None, {"task": "copy"})
    lines = info_lines(capsys, tmp_path / "from-torch")
    assert lines["text"] == "sequences of symbol ids (generate --source)"
    assert lines["run"] == "none recorded (task copy)"
    assert lines["optimizer"] == "none saved: the weights alone"


def test_info_reads_no_array_but_the_header(capsys, trained_copy, monkeypatch):
    read = []
    original = np.lib.npyio.NpzFile.__getitem__

    def recording(self, key):
        read.append(key)
        return original(self, key)

    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", recording)
    info_lines(capsys, trained_copy)
    assert sorted(read) == ["config", "format_version", "kind", "meta"]


def _garbled_member(path, out):
    """A copy of the checkpoint at path, as out, whose first parameter's .npy bytes are not
    an array."""
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(out, "w") as copy:
        for name in source.namelist():
            data = source.read(name)
            copy.writestr(name, b"not an array" if name == "param/embed.weight.npy" else data)
    return out


def _rewritten(path, out, **changes):
    """A copy of the checkpoint at path, as out, with the arrays in changes put in."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files} | changes
    np.savez(out, **arrays)
    return out


def test_a_file_that_is_no_checkpoint_is_refused_by_name(tmp_path, capsys, trained_copy):
    """What load_checkpoint refuses, info refuses too, by the same words, naming the file."""
    checkpoint = trained_copy / "checkpoint.npz"
    garbled = _garbled_member(checkpoint, tmp_path / "garbled.npz")
    pickled = _rewritten(
        checkpoint, tmp_path / "pickled.npz", **{"param/embed.weight": np.array([{}])}
    )
    version = _rewritten(checkpoint, tmp_path / "version.npz", format_version=np.array(2))
    pickled_kind = _rewritten(checkpoint, tmp_path / "kind.npz", kind=np.array([{}]))
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(checkpoint.read_bytes()[:1000])
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "notes.npz").write_text("hello")
    for path, words in [
        (tmp_path / "missing", "missing/checkpoint.npz: no such file"),
        (garbled, "garbled.npz: param/embed.weight.npy is not a readable array"),
        (pickled, "pickled.npz: refused, it holds pickled objects (param/embed.weight)"),
        (version, "version.npz: format version 2, expected 1"),
        (pickled_kind, "kind.npz: refused, it holds pickled objects (Object arrays"),
        (truncated, "truncated.npz: not a readable .npz file"),
        (tmp_path / "notes.txt", "a file, not a run directory"),
        (tmp_path / "notes.npz", "notes.npz: not an .npz file (it starts with b'hello')"),
    ]:
        capsys.readouterr()
        assert main(["info", "--checkpoint", str(path)]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err
