"""The pictures: written, of a real size, and not blank; and a clear message without matplotlib."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli import main

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
from matplotlib.image import imread  # noqa: E402


def assert_real_picture(path, min_bytes: int = 10_000) -> None:
    assert path.exists(), f"{path} was not written"
    assert path.stat().st_size >= min_bytes, f"{path} is only {path.stat().st_size} bytes"
    pixels = imread(path)[..., :3]  # (H, W, RGB) in [0, 1]
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(int), axis=0)
    assert pixels.std() > 0.05 and len(colours) > 50, f"{path} looks blank"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    assert (
        main(["train", "copy", "--steps", "200", "--out", str(root / "copy"), "--plot", "--quiet"])
        == 0
    )
    assert main(["train", "char-lm", "--steps", "20", "--out", str(root / "char"), "--quiet"]) == 0
    return root


def test_training_with_plot_draws_the_loss_curve(runs):
    assert_real_picture(runs / "copy" / "loss.png")


def test_plot_redraws_from_the_history(runs, tmp_path):
    again = tmp_path / "new" / "folders" / "again.png"  # made as needed
    assert main(["plot", str(runs / "copy"), "--out", str(again)]) == 0
    assert_real_picture(again)
    assert main(["plot", str(runs / "char"), "--out", str(tmp_path / "char.png")]) == 0
    assert_real_picture(tmp_path / "char.png")
    assert not (runs / "char" / "loss.png").exists()  # trained without --plot
    assert main(["plot", str(runs / "char")]) == 0  # by default into the run
    assert_real_picture(runs / "char" / "loss.png")


def test_plot_names_what_a_run_directory_lacks(tmp_path, capsys):
    """Each was "DIR/history.json: cannot read the history ([Errno 2] ...)": now what is wrong
    with the directory given, exit 2, nothing drawn."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "imported").mkdir()  # as import-hf leaves it: a checkpoint and no history
    (tmp_path / "imported" / "checkpoint.npz").write_bytes(b"PK\x05\x06" + bytes(18))
    (tmp_path / "spoiled").mkdir()
    (tmp_path / "spoiled" / "history.json").write_text("{not json")
    for name, said in [
        ("missing", "missing: no such directory"),
        ("notes.txt", "notes.txt: a file, not a run directory"),
        ("imported", "imported: no history.json; plot redraws the losses of a run that train"),
        ("spoiled", "history.json: cannot read the history (Expecting property name"),
    ]:
        assert main(["plot", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert f"error: {tmp_path / name}" in err and said in err and "Traceback" not in err, err
    assert sorted(path.name for path in tmp_path.rglob("*.png")) == []


def _holding(history: dict, path: tuple):
    """The list or dict that holds the entry at path (keys and indices), and its key."""
    *into, last = path
    for key in into:
        history = history[key]
    return history, last


def _with(history: dict, value, *path) -> dict:
    place, key = _holding(history, path)
    place[key] = value
    return history


def _without(history: dict, *path) -> dict:
    place, key = _holding(history, path)
    del place[key]
    return history


SPOILED_HISTORIES = {  # what is wrong: (a change to a copy run's history, what plot says)
    "a list": (lambda h: [h], "not a JSON object with step and train_loss lists: a list"),
    "no losses": (lambda h: _without(h, "train_loss"), '"train_loss" is not a list of numbers'),
    "a text loss": (lambda h: _with(h, "x", "train_loss", 3), '"train_loss" is not a list of'),
    "a true step": (lambda h: _with(h, True, "step", 0), '"step" is not a list of numbers'),
    "a loss short": (
        lambda h: _with(h, h["train_loss"][:-1], "train_loss"),
        '"train_loss" has 199 values and "step" 200',
    ),
    "one lr": (lambda h: _with(h, [0.1], "lr"), '"lr" has 1 values and "step" 200'),
    "an eval without its loss": (
        lambda h: _without(h, "eval", 0, "heldout_loss"),
        '"eval" is not a list of objects with a step and a heldout_loss',
    ),
    "an eval that is an object": (lambda h: _with(h, {}, "eval"), '"eval" is not a list of'),
    "an eval without exact match": (
        lambda h: _without(h, "eval", -1, "exact_match"),
        '"eval" has an exact_match in its first entry and not in every one',
    ),
}


@pytest.mark.parametrize("wrong", SPOILED_HISTORIES)
def test_plot_refuses_a_history_it_cannot_draw_naming_what_is_wrong(runs, tmp_path, capsys, wrong):
    """Each was a traceback (AttributeError, KeyError or matplotlib's own) after the figure
    was begun: now exit 2 naming the key, nothing drawn."""
    change, said = SPOILED_HISTORIES[wrong]
    history = json.loads((runs / "copy" / "history.json").read_text())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "history.json").write_text(json.dumps(change(history)))
    assert main(["plot", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"run/history.json: not a run's history: {said}" in err, err
    assert sorted(path.name for path in tmp_path.rglob("*.png")) == []


def test_attention_takes_a_prompt_of_one_token_up_to_the_context(runs, tmp_path, capsys):
    char = str(runs / "char")
    context = load_checkpoint(char).model.config.max_len
    run = ["attention", "--checkpoint", char, "--out", str(tmp_path / "a.png"), "--prompt"]
    assert main([*run, "t"]) == 0 and (tmp_path / "a.png").stat().st_size > 1000
    for prompt in ["", "t" * (context + 1)]:
        assert main([*run, prompt]) == 2
        said = capsys.readouterr().err.strip()
        assert said.endswith(
            f"--prompt has {len(prompt)} tokens; this model attends over 1 to {context}, "
            "and the picture shows each of them"
        ), said


def test_a_picture_that_cannot_be_written_is_refused_by_name(runs, tmp_path, capsys):
    """A name without a picture's suffix is refused before any work (matplotlib's refusal was
    a traceback), and a path that cannot be written (here a directory) after it, exit 2."""
    char = str(runs / "char")
    (tmp_path / "taken.png").mkdir()
    for command, out, said in [
        ("attention", "a.txt", "argument --out: 'OUT': a picture's name ends in one of .png,"),
        ("grads", "g", "argument --plot: 'OUT': a picture's name ends in one of .png,"),
        ("plot", "l.csv", "argument --out: 'OUT': a picture's name ends in one of .png,"),
        ("attention", "taken.png", "OUT: cannot write the picture (Is a directory)"),
    ]:
        path = str(tmp_path / out)
        args = {
            "attention": ["attention", "--checkpoint", char, "--prompt", "to", "--out", path],
            "grads": ["grads", "--entries", "1", "--plot", path],
            "plot": ["plot", char, "--out", path],
        }[command]
        capsys.readouterr()
        try:
            status = main(args)
        except SystemExit as exit:  # argparse refuses a flag's value by exiting
            status = exit.code
        assert status == 2
        err = capsys.readouterr().err
        assert said.replace("OUT", path) in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.png"]


def test_attention_pictures_for_both_models(runs, tmp_path):
    out = tmp_path / "seq2seq.png"
    assert (
        main(
            [
                "attention",
                "--checkpoint",
                str(runs / "copy"),
                "--source",
                "4",
                "7",
                "9",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert_real_picture(out, min_bytes=30_000)
    out = tmp_path / "gpt.png"
    assert (
        main(
            [
                "attention",
                "--checkpoint",
                str(runs / "char"),
                "--prompt",
                "to be",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert_real_picture(out, min_bytes=30_000)


def test_gradient_bars(tmp_path, capsys):
    out = tmp_path / "grads.png"
    assert main(["grads", "--model", "gpt", "--entries", "1", "--plot", str(out)]) == 0
    assert_real_picture(out)
    table = capsys.readouterr().out
    assert "tok_embed.weight" in table and "head.bias" in table


def run_without_matplotlib(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys; sys.modules['matplotlib'] = None; from numpy_engine.cli import main; "
        f"sys.exit(main({list(args)!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_without_matplotlib_pictures_name_the_extra_and_training_still_works(runs, tmp_path):
    result = run_without_matplotlib(
        "attention",
        "--checkpoint",
        str(runs / "copy"),
        "--source",
        "4",
        "--out",
        str(tmp_path / "a.png"),
    )
    assert result.returncode == 2 and "pip install 'numpy-engine[plot]'" in result.stderr
    result = run_without_matplotlib(
        "train", "copy", "--steps", "5", "--out", str(tmp_path / "r"), "--plot", "--quiet"
    )
    assert result.returncode == 2 and "plot extra" in result.stderr
    assert not (tmp_path / "r").exists()  # refused before training
    result = run_without_matplotlib("train", "copy", "--steps", "5", "--quiet")
    assert result.returncode == 0, result.stderr
    grads = ["grads", "--model", "seq2seq", "--entries", "1"]
    result = run_without_matplotlib(*grads, "--plot", str(tmp_path / "g.png"))
    assert result.returncode == 2 and "plot extra" in result.stderr and result.stdout == ""
    result = run_without_matplotlib(*grads)  # the table needs no matplotlib
    assert result.returncode == 0 and "rel. error" in result.stdout, result.stderr
