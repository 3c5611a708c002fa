"""The command line: help, a short training run with --out, generation, and clear errors."""

from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from crosscheck.cli import build_parser as crosscheck_parser
from numpy_engine import cli_generate
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli import build_parser as engine_parser
from numpy_engine.cli import main as engine_main
from numpy_engine.cli import print_result
from numpy_engine.cli_args import parse_command
from numpy_engine.generate import generate, greedy_decode
from numpy_engine.models.gpt2 import GPT2
from numpy_engine.models.minigpt import MiniGPT
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.tasks import corpus_from_meta
from numpy_engine.train import SequenceTrainConfig, train_sequence_task
from parity_tests.helpers import argument_helps, unexplained

RUN_FILES = ["checkpoint.npz", "history.json", "result.json"]  # what --out DIR holds


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "numpy_engine", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


HELP_WORDS = {
    (): [
        "train",
        "generate",
        "info",
        "parity",
        "export",
        "import",
        "bench",
        "attention",
        "grads",
        "eval",
    ],
    ("train",): [
        "--steps",
        "--seed",
        "--lr",
        "--batch-size",
        "--out",
        "--text",
        "char-lm 32",
        "lm 0.0001 (0.003 without --init)",
        "the batches (default: 7)",  # one default for every task: said once
        "norm to this (default: 1.0)",
        "--init",
        "(default: none, every token is trained on)",
        "(default: none, a new model)",
        "--schedule",
        "in a line or a half cosine",
        "(default: constant)",
        "--warmup",
        "--min-lr",
        "--weight-decay",
        "p *= 1 - lr * this (default: 0.01)",
    ],
    ("generate",): ["--checkpoint", "--source", "--prompt", "--temperature", "--top-k", "--top-p"],
    ("parity",): ["--model", "--dtype", "--seed"],
    ("eval",): [
        "--checkpoint",
        "--text",
        "--context",
        "--batch-size",
        "perplexity, exp(loss)",
        "--holdout FRACTION",
    ],
}


@pytest.mark.parametrize("command", [[], ["train"], ["generate"], ["parity"], ["eval"]])
def test_help_explains_every_command_and_flag(command):
    result = run_cli(*command, "--help")  # parity's help comes from crosscheck's process
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # argparse wraps its lines at any space
    expected = HELP_WORDS[tuple(command)]
    assert all(word in out for word in expected), out
    assert "default: None)" not in out and "default: 0.0)" not in out  # a default that is "off"


@pytest.mark.parametrize(
    "build, known, at_least",
    [(engine_parser, "train --lr", 50), (crosscheck_parser, "bench --configs", 15)],
    ids=["numpy-engine", "crosscheck"],
)
def test_every_argument_of_every_command_says_what_it_is(build, known, at_least):
    helps = argument_helps(build())
    assert known in helps and len(helps) >= at_least  # the walk reached the subcommands' arguments
    assert unexplained(helps) == {}


def test_version_names_the_installed_package_numpy_and_python(capsys):
    import importlib.metadata
    import platform

    with pytest.raises(SystemExit) as stop:
        engine_main(["--version"])
    assert stop.value.code == 0
    installed = importlib.metadata.version("numpy-engine")  # pyproject.toml's, as installed
    python = platform.python_version()
    expected = f"numpy-engine {installed} (NumPy {np.__version__}, Python {python})\n"
    assert capsys.readouterr().out == expected


@pytest.fixture(scope="module")
def copy_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("copy")
    result = run_cli("train", "copy", "--steps", "60", "--eval-every", "30", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, result


def test_train_prints_progress_and_a_json_result(copy_dir):
    out, result = copy_dir
    assert "step    60/60  loss" in result.stderr and "steps/s" in result.stderr
    summary = json.loads(result.stdout)
    assert summary["steps"] == 60 and summary["out"] == str(out)
    for key in (
        "seed",
        "train_size",
        "test_size",
        "initial_train_loss",
        "heldout_loss",
        "exact_match",
        "seconds",
        "examples",
    ):
        assert key in summary
    assert sorted(p.name for p in out.iterdir()) == RUN_FILES
    assert json.loads((out / "result.json").read_text())["steps"] == 60
    history = json.loads((out / "history.json").read_text())
    assert len(history["train_loss"]) == 60
    printed = re.findall(r"step +(\d+)/60  loss (\d+\.\d{4})", result.stderr)
    assert [int(step) for step, _ in printed] == [1, 6, 12, 18, 24, 30, 36, 42, 48, 54, 60]
    for step, loss in printed:  # the step's training loss, not another number of it
        assert loss == f"{history['train_loss'][int(step) - 1]:.4f}"


def test_generate_from_a_copy_checkpoint(copy_dir):
    result = run_cli("generate", "--checkpoint", str(copy_dir[0]), "--source", "4", "7", "9")
    assert result.returncode == 0, result.stderr
    tokens = [int(t) for t in result.stdout.split()]
    assert 1 <= len(tokens) <= 4 and all(1 < t < 12 for t in tokens), tokens  # no PAD, no BOS
    assert tokens[-1] == 2 or len(tokens) == 4, tokens  # ends at EOS, or at 3 symbols + 1
    assert 2 not in tokens[:-1], tokens


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


def test_generate_shows_its_text_as_it_comes_and_ctrl_c_keeps_it(tmp_path):
    """Asked for 10^8 tokens, generate has shown the prompt and generated characters long
    before its end; Ctrl-C then stops it with the text shown so far and the line ended."""
    out = tmp_path / "run"
    assert engine_main(["train", "char-lm", "--steps", "1", "--out", str(out), "--quiet"]) == 0
    args = [
        "generate",
        "--checkpoint",
        str(out),
        "--prompt",
        "to ",
        "--max-new-tokens",
        "100000000",
    ]
    with subprocess.Popen(
        [sys.executable, "-m", "numpy_engine", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    ) as run:
        shown, deadline = b"", time.monotonic() + 60
        while len(shown) < 40 and time.monotonic() < deadline:  # the prompt, 37 characters more
            if select.select([run.stdout], [], [], 1.0)[0]:
                shown += os.read(run.stdout.fileno(), 4096) or b"(ended)"
        run.send_signal(signal.SIGINT)
        rest, err = run.communicate(timeout=60)
    text = (shown + rest).decode()
    assert len(shown) >= 40, shown  # before Ctrl-C, before the end
    assert run.returncode == 130 and err.decode() == "numpy-engine generate: interrupted\n", err
    assert text.startswith("to ") and text.endswith("\n") and len(text) > 40, text


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


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "copy", "--steps", "0"], "must be a positive integer"),
        (["train", "copy", "--bogus"], "unrecognized arguments: --bogus"),
        (["train", "sort"], "invalid choice: 'sort'"),
        (["generate", "--checkpoint", "missing-dir", "--source", "4"], "no such file"),
        (["grads", "--model", "gpt", "--checkpoint", "RUN"], "not allowed with argument --model"),
        (["grads", "--checkpoint", "missing-dir"], "missing-dir/checkpoint.npz: no such file"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args, message):
    result = run_cli(*args)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, command, unknown",
    [
        (["grads", "--weights", "RUN"], "grads", "--weights RUN"),
        (["train", "copy", "--bogus", "1"], "train", "--bogus 1"),
        (["generate", "--checkpoint", "RUN", "--prompt", "a", "extra"], "generate", "extra"),
        (["parity", "--weights", "RUN"], "parity", "--weights RUN"),
        (["bench", "--bogus"], "bench", "--bogus"),
    ],
)
def test_an_unknown_flag_is_refused_with_its_commands_usage(args, command, unknown, capsys):
    """The command's own usage and flags, not the top-level list of commands."""
    parser = crosscheck_parser() if args[0] in ("parity", "bench") else engine_parser()
    with pytest.raises(SystemExit) as exit_status:
        parse_command(parser, args)
    err = capsys.readouterr().err
    assert exit_status.value.code == 2 and err.startswith(f"usage: numpy-engine {command} ")
    assert err.endswith(f"numpy-engine {command}: error: unrecognized arguments: {unknown}\n")


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "copy", "--seed", "-1"], "--seed: must be a non-negative integer, got -1"),
        (["train", "copy", "--seed", "1e3"], "--seed: must be a non-negative integer, got '1e3'"),
        (["train", "copy", "--steps", "ten"], "--steps: must be a positive integer, got 'ten'"),
        (["train", "copy", "--lr", "fast"], "--lr: must be a positive finite number, got 'fast'"),
        (["train", "copy", "--dropout", "a"], "--dropout: must be at least 0 and below 1, got 'a'"),
        (["train", "char-lm", "--holdout", "x"], "--holdout: must be a fraction between 0 and 1"),
        (
            ["generate", "--checkpoint", "R", "--prompt", "a", "--top-p", "all"],
            "at most 1, got 'all'",
        ),
        (
            ["generate", "--checkpoint", "R", "--prompt", "a", "--temperature", "hot"],
            ">= 0, got 'hot'",
        ),
        (["generate", "--checkpoint", "RUN", "--prompt", "a", "--seed", "-2"], "got -2"),
        (["grads", "--seed", "-1"], "--seed: must be a non-negative integer"),
        (["grads", "--entries", "x"], "--entries: must be an integer from 1 to 64, got 'x'"),
        (["parity", "--seed", "-1"], "--seed: must be a non-negative integer"),
        (["train", "copy", "--lr", "inf"], "--lr: must be a positive finite number, got inf"),
        (["train", "copy", "--lr", "1e400"], "must be a positive finite number, got 1e400"),
        (["train", "copy", "--clip", "nan"], "--clip: must be a positive finite number"),
        (["generate", "--checkpoint", "RUN", "--prompt", "a", "--top-p", "inf"], "got inf"),
        (["generate", "--checkpoint", "RUN", "--prompt", "a", "--top-p", "1.5"], "--top-p: must"),
        (["generate", "--checkpoint", "RUN", "--prompt", "a", "--top-p", "0"], "at most 1, got 0"),
        (["generate", "--checkpoint", "RUN", "--prompt", "a", "--top-p", "nan"], "got nan"),
        (["generate", "--checkpoint", "RUN", "--temperature", "-1"], "--temperature: must be"),
        (["generate", "--checkpoint", "RUN", "--temperature", "inf"], "number >= 0, got inf"),
        (["generate", "--checkpoint", "RUN", "--temperature", "nan"], ">= 0, got nan"),
        (["train", "lm", "--holdout", "0"], "--holdout: must be a fraction between 0 and 1, got 0"),
        (["train", "lm", "--holdout", "1"], "--holdout: must be a fraction between 0 and 1"),
        (["train", "char-lm", "--holdout", "nan"], "must be a fraction between 0 and 1, got nan"),
    ],
)
def test_flags_out_of_range_are_refused_as_they_are_parsed(args, message, capsys):
    """In this process (argparse's exit 2 and its message): no subprocess to pay for."""
    parser = crosscheck_parser() if args[0] == "parity" else engine_parser()
    with pytest.raises(SystemExit) as exit_status:
        parser.parse_args(args)
    assert exit_status.value.code == 2 and message in capsys.readouterr().err


def test_bad_inputs_exit_2_without_traceback(tmp_path, copy_dir):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00abc")
    (tmp_path / "empty.txt").write_text("")
    cases = [
        (["train", "char-lm", "--text", str(tmp_path / "bad.txt")], "not UTF-8"),
        (["train", "char-lm", "--text", str(tmp_path / "empty.txt")], "is empty"),
        (["train", "char-lm", "--text", str(tmp_path / "none.txt")], "cannot read it"),
        (["generate", "--checkpoint", str(copy_dir[0]), "--prompt", "to"], "give --source"),
        (
            ["generate", "--checkpoint", str(copy_dir[0]), "--source", "4", "12"],
            "--source ids must be the copy task's symbols 4..11, got [12]",
        ),
    ]
    for args, message in cases:
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, args


def test_torch_commands_without_torch_name_the_extra():
    code = (
        "import sys; sys.modules['torch'] = None; from numpy_engine.cli import main; "
        "sys.exit(main(['parity']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2 and "install the test extra" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint-every", "5"], "--checkpoint-every needs --out DIR"),
        (["--plot"], "--plot needs --out DIR"),
        (["--resume", "RUN"], "--resume continues a saved run: give no TASK with it"),
    ],
)
def test_a_train_flag_without_its_companion_is_refused_before_training(args, message, capsys):
    assert engine_main(["train", "copy", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"numpy-engine train: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(
    "task, flag, value",
    [
        ("copy", "--holdout", "0.1"),  # the copy task's held-out split is its own
        ("copy", "--context", "8"),
        ("reverse", "--init", "RUN"),
        ("copy", "--weight-decay-on", "all"),  # Adam, without weight decay
    ],
)
def test_a_flag_that_does_not_apply_to_the_task_is_refused(task, flag, value, capsys):
    assert engine_main(["train", task, flag, value, "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"numpy-engine train: error: {flag} does not apply to {task}\n"


@pytest.mark.parametrize("task", ["char-lm", "lm"])
def test_a_language_models_eval_every_needs_a_holdout(task, capsys):
    assert engine_main(["train", task, "--eval-every", "5", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"numpy-engine train: error: --eval-every needs --holdout FRACTION for {task}: a "
        "language model is evaluated on a held-out part of its text, and holds none out unless "
        "asked\n"
    )


def test_train_needs_a_task_or_a_run_to_resume(capsys):
    assert engine_main(["train"]) == 2
    assert "give a TASK (copy, reverse, char-lm, lm) or --resume DIR" in capsys.readouterr().err


def test_plot_without_matplotlib_is_refused_before_training(tmp_path, monkeypatch, capsys):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it now fails
    assert engine_main(["train", "copy", "--plot", "--out", str(tmp_path / "run")]) == 2
    assert "install the plot extra" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # no step was taken


def test_an_out_where_no_directory_can_be_made_is_refused_before_the_first_step(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    out = a_file / "run"  # a file's child: mkdir fails whoever runs the test
    assert engine_main(["train", "copy", "--steps", "2000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"numpy-engine train: error: {out}: cannot make the run's directory (Not a directory)\n"
    )
    assert a_file.read_text() == "mine"  # and no step's progress line was printed before


def test_only_plot_draws_a_picture_and_a_run_without_out_writes_nothing(tmp_path, capsys):
    """--quiet, --checkpoint-every and --resume draw no picture; --plot draws loss.png into
    the run's directory, a resumed run's too; without --out a run only prints its result."""
    out, drawn = tmp_path / "run", tmp_path / "drawn"
    steps = ["--steps", "2", "--eval-every", "2"]
    assert engine_main(["train", "copy", *steps, "--out", str(out), "--checkpoint-every", "1"]) == 0
    assert "plot" not in json.loads(capsys.readouterr().out)
    resume = ["train", "--resume", str(out)]
    assert engine_main([*resume, "--steps", "3", "--checkpoint-every", "1"]) == 0  # into out
    assert "plot" not in json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == RUN_FILES
    assert engine_main(["train", "copy", *steps, "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    capsys.readouterr()
    assert engine_main([*resume, "--steps", "4", "--plot"]) == 0  # into the resumed run's
    assert json.loads(capsys.readouterr().out)["plot"] == str(out / "loss.png")
    assert engine_main(["train", "copy", *steps, "--out", str(drawn), "--plot"]) == 0
    assert (out / "loss.png").stat().st_size > 0 and (drawn / "loss.png").stat().st_size > 0


@pytest.fixture(scope="module")
def untrained_copy(tmp_path_factory):
    """A copy checkpoint of one step: its greedy output does not stop at EOS early."""
    out = tmp_path_factory.mktemp("untrained")
    assert engine_main(["train", "copy", "--steps", "1", "--out", str(out), "--quiet"]) == 0
    return out


def test_train_keeps_an_existing_run_and_refuses_a_file_as_out(untrained_copy, tmp_path, capsys):
    """A run already in --out is not trained over: exit 2 before any step, the files as they
    were; continuing it is --resume's work."""
    kept = {path.name: path.read_bytes() for path in untrained_copy.iterdir()}
    capsys.readouterr()
    assert engine_main(["train", "copy", "--steps", "2", "--out", str(untrained_copy)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint.npz already exists; continue it with --resume {untrained_copy}" in err
    assert "step" not in err  # no progress line: refused before training
    assert {path.name: path.read_bytes() for path in untrained_copy.iterdir()} == kept
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert engine_main(["train", "copy", "--steps", "1", "--out", str(a_file), "--quiet"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert a_file.read_text() == "mine"


@pytest.fixture(scope="module")
def untrained_char(tmp_path_factory):
    """A char-lm checkpoint of one step: its next characters are near-uniform, so a draw
    depends on every sampling flag."""
    out = tmp_path_factory.mktemp("untrained-char")
    assert engine_main(["train", "char-lm", "--steps", "1", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize(
    "flags, expected",  # expected: generate's (max_new_tokens, temperature, top_k, top_p, seed)
    [
        ([], (80, 0.0, None, None, 0)),
        (["--max-new-tokens", "7", "--temperature", "1.5", "--seed", "3"], (7, 1.5, None, None, 3)),
        (["--max-new-tokens", "9", "--top-k", "3", "--seed", "5"], (9, 1.0, 3, None, 5)),
        (["--max-new-tokens", "9", "--top-p", "0.5", "--seed", "1"], (9, 1.0, None, 0.5, 1)),
        (["--max-new-tokens", "6", "--no-cache"], (6, 0.0, None, None, 0)),
    ],
)
def test_generate_from_a_prompt_is_the_librarys_generate(
    untrained_char, flags, expected, capsys, monkeypatch
):
    """The shown text is the library's generate with the flags' values (or the defaults:
    80 new tokens, greedy, seed 0), through the KV cache unless --no-cache. The prompt is
    shown before the first step; each new token takes the logits once, and the last one
    is not run through the model (nothing reads its logits)."""
    checkpoint = load_checkpoint(untrained_char, optimizer=False)
    corpus = corpus_from_meta(checkpoint.meta)
    ids = corpus.encode("to ")
    wanted = corpus.decode(generate(checkpoint.model, ids, *expected)[0]) + "\n"
    events, make_decoder, show = [], MiniGPT.decoder, cli_generate._show
    monkeypatch.setattr(MiniGPT, "decoder", recorded_decoder(make_decoder, events))

    def shown(piece: str) -> None:
        events.append(("show", piece))
        show(piece)

    monkeypatch.setattr(cli_generate, "_show", shown)
    capsys.readouterr()
    run = ["generate", "--checkpoint", str(untrained_char), "--prompt", "to ", *flags]
    assert engine_main(run) == 0
    assert capsys.readouterr().out == wanted
    assert events[:2] == [("show", "to "), ("decoder", "--no-cache" not in flags)]
    assert events.count("logits") == expected[0] and events.count("append") == expected[0] - 1


def recorded_decoder(make_decoder, events: list):
    """MiniGPT.decoder, its making and each call of the decoder it makes noted in events."""

    class Recorded:
        def __init__(self, decoder) -> None:
            self.decoder = decoder

        def next_logits(self):
            events.append("logits")
            return self.decoder.next_logits()

        def append(self, next_ids) -> None:
            events.append("append")
            self.decoder.append(next_ids)

    def decoder(model, prompt, use_cache=True):
        events.append(("decoder", use_cache))
        return Recorded(make_decoder(model, prompt, use_cache))

    return decoder


@pytest.mark.parametrize("flags, max_new", [([], 4), (["--max-new-tokens", "2"], 2)])
def test_generate_from_a_source_is_the_librarys_greedy_decode(
    untrained_copy, flags, max_new, capsys
):
    """As many tokens as the source has symbols, and EOS, unless --max-new-tokens says."""
    capsys.readouterr()
    assert (
        engine_main(
            ["generate", "--checkpoint", str(untrained_copy), "--source", "4", "7", "9", *flags]
        )
        == 0
    )
    model = load_checkpoint(untrained_copy).model
    generated = greedy_decode(model, np.array([[4, 7, 9]]), max_new)[0]
    assert (generated != 0).all()  # no EOS before the end, so no padding: all max_new shown
    assert capsys.readouterr().out == " ".join(map(str, generated)) + "\n"


@pytest.mark.parametrize("flag", [["--temperature", "1"], ["--top-k", "2"], ["--top-p", "0.5"]])
def test_each_sampling_flag_is_refused_for_a_copy_checkpoint(untrained_copy, flag, capsys):
    run = ["generate", "--checkpoint", str(untrained_copy), "--source", "4", *flag]
    assert engine_main(run) == 2
    assert "are for language models (char-lm, lm); copy/reverse decode greedily" in (
        capsys.readouterr().err
    )


def test_flags_at_the_edge_of_their_range(capsys):
    """A seed of 0, a dropout rate and a temperature of 0, a learning rate below 1 and the
    least and most --entries are taken; a learning rate of 0 is refused."""
    parse = engine_parser().parse_args
    assert parse(["train", "copy", "--seed", "0"]).seed == 0
    assert parse(["train", "copy", "--dropout", "0"]).dropout == 0.0  # README: "none"
    assert parse(["train", "copy", "--lr", "1e-4"]).lr == 1e-4  # a fine-tuning's
    generate = ["generate", "--checkpoint", "RUN", "--prompt", "a", "--temperature"]
    assert parse([*generate, "0"]).temperature == 0.0  # greedy
    assert parse([*generate, "0.5"]).temperature == 0.5
    assert parse(["grads", "--entries", "1"]).entries == 1
    assert parse(["grads", "--entries", "64"]).entries == 64
    with pytest.raises(SystemExit):
        parse(["train", "copy", "--lr", "0"])
    assert "--lr: must be a positive finite number, got 0" in capsys.readouterr().err


def test_a_resumed_run_saves_a_checkpoint_every_n_steps(tmp_path, monkeypatch):
    """... and reads its checkpoint once (checking the flags against it, then resuming)."""
    import numpy_engine.checkpoint as checkpoint
    import numpy_engine.loop as loop
    import numpy_engine.train as train

    out = str(tmp_path / "run")
    first = ["train", "copy", "--steps", "4", "--eval-every", "4", "--quiet", "--out", out]
    assert engine_main(first) == 0
    saved, save = [], loop.save_checkpoint
    loaded, load = [], checkpoint.load_checkpoint

    def recorded(path, model, optimizer_state, meta):
        saved.append(meta["step"])
        return save(path, model, optimizer_state, meta)

    def counted(path):
        loaded.append(str(path))
        return load(path)

    monkeypatch.setattr(loop, "save_checkpoint", recorded)  # the saves during a run
    monkeypatch.setattr(checkpoint, "load_checkpoint", counted)  # as the CLI imports it
    monkeypatch.setattr(train, "load_checkpoint", counted)
    resume = ["train", "--resume", out, "--steps", "10", "--checkpoint-every", "3", "--quiet"]
    assert engine_main(resume) == 0
    assert loaded == [out]
    assert saved == [6, 9] and load_checkpoint(out).meta["step"] == 10


def test_accumulate_without_data_parallel_trains_in_micro_batches(tmp_path):
    """--accumulate alone takes the micro-batch path in one process, as the library does."""
    steps = ["--steps", "3", "--eval-every", "3", "--quiet"]
    accumulated, plain = tmp_path / "accumulated", tmp_path / "plain"
    assert (
        engine_main(["train", "copy", *steps, "--accumulate", "2", "--out", str(accumulated)]) == 0
    )
    assert engine_main(["train", "copy", *steps, "--out", str(plain)]) == 0
    cfg = SequenceTrainConfig(steps=3, eval_every=3)
    run = train_sequence_task(cfg, progress_stream=None, parallel=DataParallel(OneProcess(), 2))
    assert np.array_equal(load_checkpoint(accumulated).model.flat, run.model.flat)
    assert not np.array_equal(load_checkpoint(plain).model.flat, run.model.flat)  # another path


def test_more_micro_batches_than_a_batch_has_rows_are_refused_before_any_file(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "copy", "--batch-size", "4", "--accumulate", "5", "--out", str(out)]
    assert engine_main(args) == 2
    expected = "accumulate=5 is more micro-batches than a batch of batch_size=4 rows makes"
    assert f"{expected}: at most 4, of one row each" in capsys.readouterr().err
    assert not out.exists()
