"""The command line against careless input: each mistake a user made on a first run gets one
line naming what was wrong and exit 2, or does what was asked; nothing is lost."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.cli import main
from numpy_engine.generate import generate, greedy_decode
from numpy_engine.tasks import corpus_from_meta
from parity_tests.helpers import run_cli


def assert_refused(result: subprocess.CompletedProcess, *words: str, code: int = 2) -> None:
    """Exit code, one line on stderr containing every word, no traceback, no raw warning."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert all(word in lines[0] for word in words), lines[0]


@pytest.fixture(scope="module")
def short_copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("copy30")
    result = run_cli("train", "copy", "--steps", "30", "--eval-every", "10", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_resume_with_more_steps_extends_the_run_bit_for_bit(tmp_path, short_copy):
    whole = tmp_path / "whole"
    assert (
        run_cli(
            "train", "copy", "--steps", "45", "--eval-every", "10", "--quiet", "--out", str(whole)
        ).returncode
        == 0
    )
    extended = tmp_path / "extended"
    extended.mkdir()
    for name in ("checkpoint.npz", "history.json", "result.json"):
        (extended / name).write_bytes((short_copy / name).read_bytes())
    result = run_cli("train", "--resume", str(extended), "--steps", "45", "--quiet")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["steps"] == 45
    a, b = load_checkpoint(whole), load_checkpoint(extended)
    assert a.meta["step"] == b.meta["step"] == 45
    for key, value in a.model.params.items():
        assert np.array_equal(value, b.model.params[key]), key  # bit for bit
    assert a.meta["history"]["train_loss"] == b.meta["history"]["train_loss"]


def test_fine_tuning_a_model_that_reads_a_source_is_refused(short_copy):
    result = run_cli("train", "lm", "--init", str(short_copy), "--steps", "2")
    assert_refused(result, "a seq2seq model reads a source: it cannot learn to continue text")


def test_resume_of_a_finished_run_says_so(short_copy):
    assert_refused(run_cli("train", "--resume", str(short_copy)), "30 steps of 30", "--steps")
    assert_refused(run_cli("train", "--resume", str(short_copy), "--steps", "20"), "30 steps")


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--lr", "0.01", ["--lr 0.01", "lr=0.001"]),
        ("--batch-size", "8", ["--batch-size 8", "batch_size=32"]),
        ("--seed", "3", ["--seed 3", "seed=7"]),
        ("--context", "8", ["--context", "does not apply"]),
    ],
)
def test_resume_refuses_a_flag_that_conflicts_with_the_checkpoint(short_copy, flag, value, words):
    before = (short_copy / "checkpoint.npz").read_bytes()
    assert_refused(
        run_cli("train", "--resume", str(short_copy), "--steps", "40", flag, value), *words
    )
    assert (short_copy / "checkpoint.npz").read_bytes() == before  # nothing lost


def test_resume_accepts_a_flag_equal_to_the_checkpoints(tmp_path, short_copy):
    run = tmp_path / "same"
    run.mkdir()
    (run / "checkpoint.npz").write_bytes((short_copy / "checkpoint.npz").read_bytes())
    result = run_cli("train", "--resume", str(run), "--steps", "31", "--lr", "0.001", "--quiet")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["train", "copy", "--batch-size", "10000000000"],
        ["train", "char-lm", "--context", "100000", "--batch-size", "64"],
    ],
)
def test_a_step_too_large_for_memory_is_refused_up_front(args):
    result = run_cli(*args)
    assert_refused(result, "would need about", "GiB", "available", "batch_size=")


def test_an_overflow_stops_training_like_a_nan(tmp_path):
    out = tmp_path / "diverging"
    result = run_cli(
        "train",
        "copy",
        "--lr",
        "1e6",
        "--steps",
        "50",
        "--out",
        str(out),
        "--checkpoint-every",
        "1",
        "--quiet",
    )
    assert_refused(result, "step", "overflow", "largest parameter", "intact", code=1)
    saved = load_checkpoint(out)  # the last checkpoint before the overflow loads
    assert all(np.isfinite(value).all() for value in saved.model.params.values())


@pytest.mark.parametrize("command", ["generate", "attention"])
def test_a_source_of_special_or_unused_ids_is_refused(short_copy, tmp_path, command):
    """PAD, BOS and EOS are the model's to add; 3 is in the vocabulary but no copy symbol."""
    out = ["--out", str(tmp_path / "a.png")] if command == "attention" else []
    assert_refused(
        run_cli(command, "--checkpoint", str(short_copy), "--source", "1", "2", "3", *out),
        "--source ids must be the copy task's symbols 4..11",
        "got [1, 2, 3]",
    )


def test_generate_notes_a_source_longer_than_the_task_taught(short_copy):
    result = run_cli("generate", "--checkpoint", str(short_copy), "--source", *"45674567")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == (
        "note: this copy model learned sources of 1 to 3 symbols; "
        "on 8 it shows how far that generalizes"
    )
    assert len(result.stdout.split()) <= 9  # at most 8 symbols and EOS
    short = run_cli("generate", "--checkpoint", str(short_copy), "--source", "4", "5", "6")
    assert short.returncode == 0 and short.stderr == ""  # within the task: no note


def test_a_checkpoint_of_no_task_takes_every_id_but_its_special_ones(tmp_path, capsys):
    """A copy-kind model not trained here (one imported from PyTorch, say) reads any id of its
    vocabulary but PAD, BOS and EOS, wherever they are, in sources of any length, no note."""
    cfg = ne.Seq2SeqConfig(vocab_size=10, pad_id=3, bos_id=7, eos_id=5)
    model = ne.Seq2SeqTransformer(cfg, seed=0)
    run = ["generate", "--checkpoint", str(save_checkpoint(tmp_path / "m.npz", model)), "--source"]
    source = [0, 1, 2, 4, 6, 8, 9, 9]
    assert main([*run, *map(str, source)]) == 0
    out, err = capsys.readouterr()
    decoded = greedy_decode(model, np.array([source]), len(source) + 1)[0]
    assert out.split() == [str(i) for i in decoded if i != cfg.pad_id] and err == ""
    assert main([*run, "4", "3", "7", "5", "10"]) == 2
    assert capsys.readouterr().err.strip() == (
        "numpy-engine generate: error: --source ids must be symbols 0..2, 4, 6, 8..9, "
        "got [3, 7, 5, 10] (3, 7, 5 are PAD, BOS and EOS; the model adds them itself)"
    )


def test_output_into_a_closed_pipe_ends_quietly_with_status_1(short_copy):
    """As Unix tools do when a reader like `head` stops: no traceback, and status 1, not the
    2 of bad input."""
    command = [sys.executable, "-m", "numpy_engine", "generate", "--checkpoint", str(short_copy)]
    unread = subprocess.Popen(
        [*command, "--source", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    unread.stdout.close()  # no reader: the first write meets a broken pipe
    with unread.stderr:
        assert unread.wait(timeout=300) == 1 and unread.stderr.read() == ""


def test_generate_prints_no_padding(short_copy):
    result = run_cli("generate", "--checkpoint", str(short_copy), "--source", "5")
    assert result.returncode == 0, result.stderr
    tokens = [int(t) for t in result.stdout.split()]
    assert 0 not in tokens and len(tokens) <= 2, tokens  # the symbol and EOS at most


@pytest.mark.parametrize("entries", ["0", "1000000", "x"])
def test_grads_entries_is_validated_and_bounded(entries):
    result = run_cli("grads", "--entries", entries)
    assert result.returncode == 2 and "argument --entries" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("char")
    result = run_cli(
        "train", "char-lm", "--steps", "5", "--context", "8", "--out", str(out), "--quiet"
    )
    assert result.returncode == 0, result.stderr
    return out


def test_top_k_without_temperature_samples(char_run):
    def sample(*flags):
        result = run_cli(
            "generate",
            "--checkpoint",
            str(char_run),
            "--prompt",
            "to ",
            *flags,
            "--max-new-tokens",
            "40",
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    greedy = sample()
    assert sample("--top-k", "5", "--seed", "1") != greedy  # it samples (temperature 1)
    assert sample("--top-k", "5", "--seed", "1") == sample(
        "--top-k", "5", "--temperature", "1", "--seed", "1"
    )
    refused = run_cli(
        "generate",
        "--checkpoint",
        str(char_run),
        "--prompt",
        "to ",
        "--top-k",
        "5",
        "--temperature",
        "0",
    )
    assert_refused(refused, "--top-k", "--temperature")


def test_attention_refuses_a_prompt_longer_than_the_context(char_run):
    pytest.importorskip("matplotlib")
    result = run_cli("attention", "--checkpoint", str(char_run), "--prompt", "to be " * 20)
    assert_refused(result, "--prompt has 120 tokens", "1 to 8")


def test_final_train_loss_has_one_definition(short_copy, char_run):
    for run in (short_copy, char_run):
        result = json.loads((run / "result.json").read_text())
        losses = json.loads((run / "history.json").read_text())["train_loss"]
        assert result["final_train_loss"] == pytest.approx(np.mean(losses[-10:]), rel=1e-12)


def test_an_engine_bug_surfaces_as_the_bug_it_is(monkeypatch, capsys):
    """Only InputError (and a file's OSError) is the user's mistake: exit 2 and one line. A
    TypeError or ValueError from inside the engine is a bug and keeps its traceback."""
    import numpy_engine.cli as cli
    import numpy_engine.cli_generate as cli_generate
    from numpy_engine.checks import InputError

    def buggy(args):
        raise TypeError("unsupported operand type(s)")

    def refused(args):
        raise InputError("--source ids must be symbols 4..11, got [1]")

    argv = ["generate", "--checkpoint", "unused", "--source", "4"]
    monkeypatch.setattr(cli_generate, "run_generate", buggy)
    with pytest.raises(TypeError, match="unsupported operand"):
        cli.main(argv)
    monkeypatch.setattr(cli_generate, "run_generate", refused)
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "numpy-engine generate: error: --source ids must be symbols 4..11, got [1]"
    )


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (FloatingPointError("overflow encountered in matmul"), "numerical error: overflow"),
        (MemoryError("a step needs 9.1 GB"), "out of memory: a step needs 9.1 GB"),
    ],
)
def test_a_run_that_stops_exits_1_where_bad_input_exits_2(monkeypatch, capsys, error, said):
    import numpy_engine.cli as cli
    import numpy_engine.cli_generate as cli_generate

    def stops(args):
        raise error

    monkeypatch.setattr(cli_generate, "run_generate", stops)
    assert cli.main(["generate", "--checkpoint", "unused", "--source", "4"]) == 1
    assert capsys.readouterr().err.startswith(f"numpy-engine generate: stopped: {said}")


@pytest.mark.parametrize(
    "flags, sampling",
    [
        ([], dict(temperature=0.0)),  # no flag: greedy
        (["--top-p", "0.5", "--seed", "3"], dict(temperature=1.0, top_p=0.5, seed=3)),
        (["--top-k", "4"], dict(temperature=1.0, top_k=4)),
        (["--temperature", "0.7"], dict(temperature=0.7)),
    ],
)
def test_generates_flags_are_the_librarys_sampling_settings(char_run, flags, sampling, capsys):
    run = ["generate", "--checkpoint", str(char_run), "--prompt", "to ", "--max-new-tokens", "30"]
    assert main([*run, *flags]) == 0
    checkpoint = load_checkpoint(char_run)
    corpus = corpus_from_meta(checkpoint.meta)
    ids = generate(checkpoint.model, corpus.encode("to "), 30, **sampling)
    assert capsys.readouterr().out == corpus.decode(ids[0]) + "\n"


def test_generate_from_a_prompt_takes_80_tokens_by_default_and_a_one_token_prompt(char_run, capsys):
    run = ["generate", "--checkpoint", str(char_run)]
    assert main([*run, "--prompt", "t"]) == 0  # one token is a prompt
    assert len(capsys.readouterr().out) == 1 + 80 + 1  # the prompt, 80 new, a newline
    assert main([*run, "--prompt", ""]) == 2
    assert "--prompt is empty" in capsys.readouterr().err
    assert main([*run, "--source", "4"]) == 2
    assert "a language-model checkpoint: give --prompt, not --source" in capsys.readouterr().err
