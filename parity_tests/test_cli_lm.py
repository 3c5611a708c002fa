"""The command line's language-model runs: char-lm on a text file, lm from scratch on a
text's characters or from a checkpoint (--init) at fine-tuning's defaults, and how a text
is named when refused and shown in the result."""

from __future__ import annotations

import io
import json

from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli import main as engine_main
from numpy_engine.cli_train import print_result
from numpy_engine.models.gpt2 import GPT2
from parity_tests.helpers import run_cli


def test_char_lm_trains_on_a_text_file_and_generates(tmp_path):
    text = tmp_path / "abc.txt"
    text.write_text("abcabcabcabc " * 20)
    out = tmp_path / "run"
    result = run_cli(
        "train",
        "char-lm",
        "--text",
        str(text),
        "--steps",
        "30",
        "--context",
        "8",
        "--holdout",
        "0.1",  # the last 26 of 260 characters
        "--eval-every",
        "10",
        "--out",
        str(out),
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert result.stderr == "" and printed["vocab_size"] == 4 and printed["heldout_targets"] == 25
    evaluations = json.loads((out / "history.json").read_text())["eval"]
    assert [e["step"] for e in evaluations] == [10, 20, 30]
    assert (
        printed["heldout_loss"] == evaluations[-1]["heldout_loss"] < evaluations[0]["heldout_loss"]
    )
    sample = run_cli(
        "generate", "--checkpoint", str(out), "--prompt", "ab", "--max-new-tokens", "5"
    )
    assert sample.returncode == 0 and sample.stdout.startswith("ab") and len(sample.stdout) == 8
    outside = run_cli("generate", "--checkpoint", str(out), "--prompt", "xyz")
    assert outside.returncode == 2 and "--prompt has characters outside the vocabulary: " in (
        outside.stderr
    )
    assert "['x', 'y', 'z'] (the model's 4 characters are ' abc')" in outside.stderr
    assert len(outside.stderr.strip().splitlines()) == 1 and "Traceback" not in outside.stderr


def test_lm_without_init_trains_a_small_gpt2_on_the_texts_characters(tmp_path, capsys):
    text, out = tmp_path / "abc.txt", tmp_path / "run"
    text.write_text("abcabc " * 40)
    run = ["train", "lm", "--text", str(text), "--steps", "2", "--out", str(out), "--quiet"]
    assert engine_main(run) == 0
    checkpoint = load_checkpoint(out)
    assert type(checkpoint.model) is GPT2 and checkpoint.meta["vocabulary"] == " abc"
    assert (checkpoint.model.config.d_model, checkpoint.model.config.max_len) == (32, 64)
    settings = checkpoint.meta["train_config"]  # a new model's defaults: char-lm's pace
    assert (settings["lr"], settings["batch_size"], settings["context"]) == (3e-3, 16, 64)
    tuned = tmp_path / "tuned"
    fine_tune = ["train", "lm", "--init", str(out), "--text", str(text), "--steps", "1"]
    assert engine_main([*fine_tune, "--out", str(tuned), "--quiet"]) == 0
    settings = load_checkpoint(tuned).meta["train_config"]  # from a checkpoint: fine-tuning's
    assert (settings["lr"], settings["batch_size"], settings["context"]) == (1e-4, 4, 64)


def test_lm_init_takes_no_more_context_than_the_models_positions(tmp_path, capsys):
    """lm's default context is 64: from a char-lm run's model (32 positions) it was refused,
    "context=64 is longer than the model's 32 positions". Now the default is 32 there; a
    --context given is taken as given, or refused so."""
    text, char, tuned = tmp_path / "abc.txt", tmp_path / "char", tmp_path / "tuned"
    text.write_text("abcabc " * 40)
    train = ["train", "--steps", "1", "--quiet", "--text", str(text)]
    assert engine_main([*train, "char-lm", "--out", str(char)]) == 0
    assert engine_main([*train, "lm", "--init", str(char), "--out", str(tuned)]) == 0
    assert load_checkpoint(tuned).meta["train_config"]["context"] == 32
    capsys.readouterr()
    assert engine_main([*train, "lm", "--init", str(char), "--context", "33"]) == 2
    assert capsys.readouterr().err.endswith(
        "error: context=33 is longer than the model's 32 positions (its max_len): give "
        "--context 32 or less\n"
    )


def test_a_text_refused_is_named_as_the_user_gave_it(tmp_path, capsys):
    """The built-in line, when no --text is given, or --text: not "text", which the user of
    `train lm --init RUN` without --text never gave."""
    text, run = tmp_path / "abc.txt", tmp_path / "run"
    text.write_text("abcabc " * 40)
    assert engine_main(["train", "lm", "--text", str(text), "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    assert engine_main(["train", "lm", "--init", str(run), "--steps", "1"]) == 2
    assert capsys.readouterr().err == (
        "numpy-engine train: error: the built-in text has characters outside the vocabulary: "
        "['e', 'h', 'i', 'n', 'o', 'q', 'r', 's', 't', 'u'] (the model's 4 characters are ' abc')\n"
    )
    text.write_text("a cab, abc")
    assert engine_main(["train", "lm", "--init", str(run), "--text", str(text)]) == 2
    assert "error: --text has characters outside the vocabulary: [',']" in capsys.readouterr().err
    text.write_text("a")  # a new model's vocabulary is its text's: one character is too few
    assert engine_main(["train", "lm", "--text", str(text)]) == 2
    assert capsys.readouterr().err.endswith(": --text must have at least 2 characters, got 1\n")


def test_lm_without_init_learns_the_built_in_line_at_its_defaults(capsys):
    """A new model at lm's fine-tuning defaults (lr 1e-4, batch 4) learned next to nothing:
    in 100 steps its loss went from 2.59 to 2.20, its sample "to t t t t ..."."""
    assert engine_main(["train", "lm", "--steps", "100", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["final_train_loss"] < 1.0, result  # seen 0.68
    assert "to be" in result["greedy_sample"], result


def test_the_result_shows_a_texts_own_characters_where_the_terminal_can(tmp_path, capsys):
    text = tmp_path / "accents.txt"
    text.write_text("héllo wörld " * 40, encoding="utf-8")
    assert engine_main(["train", "char-lm", "--text", str(text), "--steps", "1", "--quiet"]) == 0
    shown = capsys.readouterr().out
    result = json.loads(shown)
    assert result["prompt"] == "hél" and '\n  "prompt": "hél",\n' in shown  # stdout: UTF-8
    ascii_terminal = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    print_result(result, ascii_terminal)
    ascii_terminal.seek(0)
    escaped = ascii_terminal.read()
    assert '\n  "prompt": "h\\u00e9l",\n' in escaped and json.loads(escaped) == result
