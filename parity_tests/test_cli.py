"""The command line: help, short training runs with --out, their files and results, and
clear errors on bad input. Flags refused as they are parsed: test_cli_flags.py; the
generate command: test_cli_generate.py; the language models' runs: test_cli_lm.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from crosscheck.cli import build_parser as crosscheck_parser
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.cli import build_parser as engine_parser
from numpy_engine.cli import main as engine_main
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.train import SequenceTrainConfig, train_sequence_task
from parity_tests.helpers import argument_helps, run_cli, unexplained

RUN_FILES = ["checkpoint.npz", "history.json", "result.json"]  # what --out DIR holds


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


def test_a_run_directory_ending_in_npz_is_refused_before_the_first_step(tmp_path, capsys):
    """A path ending in .npz names a checkpoint file (checkpoint.resolve): a run trained into
    one made it a directory and lost its steps to an error when it saved; one resumed from
    its checkpoint file could not make its directory. Both are refused by name, before any
    step, with nothing written."""
    out = tmp_path / "x.npz"
    assert engine_main(["train", "copy", "--steps", "2000", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"numpy-engine train: error: {out}: a run's directory cannot end in .npz, which names "
        "a checkpoint file; give a directory (the run writes its checkpoint.npz into it)\n"
    )  # and no progress line: refused before the first step
    assert not out.exists()
    run = tmp_path / "run"
    assert engine_main(["train", "copy", "--steps", "1", "--out", str(run), "--quiet"]) == 0
    kept = {path.name: path.read_bytes() for path in run.iterdir()}
    capsys.readouterr()
    assert engine_main(["train", "--resume", str(run / "checkpoint.npz"), "--steps", "2"]) == 2
    assert "checkpoint.npz: a run's directory cannot end in .npz" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in run.iterdir()} == kept


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
    weights, damaged = tmp_path / "weights", tmp_path / "damaged"
    checkpoint = load_checkpoint(untrained_copy)
    save_checkpoint(weights, checkpoint.model, None, {"task": "copy"})  # as import leaves one
    damaged.mkdir()
    (damaged / "checkpoint.npz").write_bytes(b"not a checkpoint")
    for out, hint in [  # --resume of weights alone is refused: the hint no longer points there
        (weights, "it holds weights, not a run to resume: give another --out"),
        (damaged, "give another --out"),
    ]:
        assert engine_main(["train", "copy", "--steps", "1", "--out", str(out)]) == 2
        said = f"error: --out {out}: {out / 'checkpoint.npz'} already exists; {hint}\n"
        assert capsys.readouterr().err.endswith(said)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert engine_main(["train", "copy", "--steps", "1", "--out", str(a_file), "--quiet"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert a_file.read_text() == "mine"


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
