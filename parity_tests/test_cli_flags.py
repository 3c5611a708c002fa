"""The command line's flags: each refused as it is parsed, or before training, with its
command's usage and one line naming what was wrong; the values at the edge of a range taken.
Runs with files and generation: test_cli.py and test_cli_generate.py."""

from __future__ import annotations

import pytest

from crosscheck.cli import build_parser as crosscheck_parser
from numpy_engine.cli import build_parser as engine_parser
from numpy_engine.cli import main as engine_main
from numpy_engine.cli_args import parse_command
from parity_tests.helpers import run_cli


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


@pytest.mark.parametrize(
    "args, flag",
    [
        (["train", "copy", "--out", ""], "--out"),  # trained, and saved nothing
        (["train", "char-lm", "--text", ""], "--text"),  # trained on the built-in line
        (["train", "--resume", " "], "--resume"),
        (["train", "lm", "--init", ""], "--init"),
        (["generate", "--checkpoint", "", "--source", "4"], "--checkpoint"),
        (["info", "--checkpoint", ""], "--checkpoint"),
        (["attention", "--checkpoint", "", "--prompt", "a"], "--checkpoint"),
        (["grads", "--checkpoint", ""], "--checkpoint"),
        (["eval", "--checkpoint", "RUN", "--text", ""], "--text"),
        (["plot", ""], "DIR"),
        (["import-hf", "", "--out", "RUN"], "DIR"),
        (["import-hf", "DIR", "--out", ""], "--out"),
        (["export-hf", "--checkpoint", "RUN", "--to", ""], "--to"),
        (["parity", "--checkpoint", ""], "--checkpoint"),
        (["export", "--checkpoint", "RUN", "--to", ""], "--to"),
        (["import", "", "--out", "DIR"], "FILE"),
        (["import", "FILE", "--out", ""], "--out"),
        (["import", "FILE", "--out", "DIR", "--config", ""], "--config"),
    ],
)
def test_an_empty_file_or_directory_name_is_refused_as_it_is_parsed(args, flag, capsys):
    """An empty name (an unset shell variable, say) named the current directory or nothing."""
    parser = crosscheck_parser() if args[0] in ("parity", "export", "import") else engine_parser()
    with pytest.raises(SystemExit) as exit_status:
        parser.parse_args(args)
    err = capsys.readouterr().err
    assert exit_status.value.code == 2
    assert f"argument {flag}: must name a file or directory, got an empty name" in err


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


def test_more_micro_batches_than_a_batch_has_rows_are_refused_before_any_file(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "copy", "--batch-size", "4", "--accumulate", "5", "--out", str(out)]
    assert engine_main(args) == 2
    expected = "accumulate=5 is more micro-batches than a batch of batch_size=4 rows makes"
    assert f"{expected}: at most 4, of one row each" in capsys.readouterr().err
    assert not out.exists()


def test_bench_offers_every_workload_and_times_them_all_by_default():
    """`bench --configs` lists its workloads by hand (the command line does not import the
    benchmarks): each of benchmarks/workloads.py's is taken, and is a default, and gpt2 is
    taken; a name that is not one is refused."""
    from benchmarks.workloads import WORKLOADS

    parser = crosscheck_parser()
    assert parser.parse_args(["bench"]).configs == list(WORKLOADS)
    every = [*WORKLOADS, "gpt2"]
    assert parser.parse_args(["bench", "--configs", *every]).configs == every
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--configs", "wide"])
