"""`numpy-engine eval`: a language model's loss on a text, against transformers' loss on the
same windows (float64), and against the held-out loss training reports; bad input refused."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel

from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.tasks import DEFAULT_TEXT
from parity_tests.hf_cases import cli

TEXT = DEFAULT_TEXT + " whether tis nobler in the mind to suffer"


def float64_copy(run, out) -> None:
    """The checkpoint in run, its weights in float64, written to out (meta kept)."""
    checkpoint = load_checkpoint(run, optimizer=False)
    model = checkpoint.model
    wide = type(model)(dataclasses.replace(model.config, dtype="float64"), seed=0)
    wide.load_params({key: value.astype(np.float64) for key, value in model.params.items()})
    save_checkpoint(out, wide, None, checkpoint.meta)


def transformers_mean_loss(directory, text: str, context: int) -> float:
    """transformers' GPT-2 in float64 on the text's tokens, window after window of context
    inputs, each predicting the tokens one on (the last window shorter): every token but
    the first predicted once. The sum of their losses over the count of them."""
    ids = Tokenizer.from_file(str(directory / "tokenizer.json")).encode(text).ids
    model = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager").double()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, context):
            inputs = torch.tensor([ids[start : start + context]])
            targets = torch.tensor(ids[start + 1 : start + context + 1])
            logits = model.eval()(inputs).logits[0, : len(targets)]
            total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
    return total / (len(ids) - 1)


@pytest.mark.parametrize(("context", "batch_size"), [(12, 3), (32, None)])
def test_eval_is_transformers_loss_over_the_same_windows(
    tmp_path, capsys, hf_dir, context, batch_size
):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(tmp_path / "run"))[0] == 0
    float64_copy(tmp_path / "run", tmp_path / "wide")
    args = ["eval", "--checkpoint", str(tmp_path / "wide"), "--text", str(text)]
    args += ["--context", str(context)] + (["--batch-size", str(batch_size)] if batch_size else [])
    status, out, _ = cli(capsys, *args)
    assert status == 0 and out.startswith('{\n  "checkpoint": ')  # JSON, indented by 2
    result = json.loads(out)
    assert (result["checkpoint"], result["text"]) == (str(tmp_path / "wide"), str(text))
    theirs = transformers_mean_loss(hf_dir, TEXT, context)
    assert abs(result["loss"] - theirs) <= 1e-12 * theirs, (result["loss"], theirs)
    assert result["perplexity"] == math.exp(result["loss"])
    n = len(Tokenizer.from_file(str(hf_dir / "tokenizer.json")).encode(TEXT).ids)
    assert (result["tokens"], result["targets"], result["context"]) == (n, n - 1, context)


def test_eval_of_the_held_out_text_is_the_loss_training_reported(tmp_path, capsys):
    """A char-lm run's held-out part, read back by eval at the run's context and batch (cut
    off by hand, or by --holdout): the same windows, in the same batches, the same number."""
    run = tmp_path / "run"
    args = ["train", "char-lm", "--steps", "30", "--holdout", "0.3", "--out", str(run)]
    assert cli(capsys, *args, "--quiet")[0] == 0
    reported = json.loads((run / "result.json").read_text())["heldout_loss"]
    whole, held_out = tmp_path / "whole.txt", tmp_path / "heldout.txt"
    whole.write_text(DEFAULT_TEXT)
    held_out.write_text(DEFAULT_TEXT[-round(len(DEFAULT_TEXT) * 0.3) :])  # a character a token
    same = ["--context", "32", "--batch-size", "32"]
    for text, holdout in ((held_out, []), (whole, ["--holdout", "0.3"])):
        args = ["eval", "--checkpoint", str(run), "--text", str(text), *holdout, *same]
        status, out, _ = cli(capsys, *args)
        result = json.loads(out)
        assert status == 0 and result["loss"] == reported and result["tokens"] == 600
        assert ("holdout" in result) == bool(holdout) and result.get("holdout", 0.3) == 0.3
    status, out, _ = cli(capsys, "eval", "--checkpoint", str(run), "--text", str(held_out))
    default = json.loads(out)  # the model's 32 positions, 128 windows a batch: 1 batch
    assert status == 0 and default["context"] == 32
    assert abs(default["loss"] - reported) <= 1e-6 * reported


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("char")
    from numpy_engine.cli import main

    assert main(["train", "char-lm", "--steps", "2", "--out", str(run), "--quiet"]) == 0
    return run


@pytest.mark.parametrize(
    ("text", "extra", "words"),
    [
        ("t", [], "--text is 1 token long: eval needs 2 or more (one to predict)"),
        ("to be", ["--context", "33"], "--context 33: this model has 32 positions"),
        ("to bez", [], "--text has characters outside the vocabulary: ['z']"),
        ("to be or not", ["--holdout", "0.5"], "a context of 32 needs at least 33"),
    ],
)
def test_eval_refuses_what_it_cannot_measure_in_one_line(
    tmp_path, capsys, char_run, text, extra, words
):
    path = tmp_path / "text.txt"
    path.write_text(text)
    status, out, err = cli(
        capsys, "eval", "--checkpoint", str(char_run), "--text", str(path), *extra
    )
    assert (status, out) == (2, "")
    assert err.startswith("numpy-engine eval: error: ") and words in err and err.count("\n") == 1


def test_eval_refuses_a_model_that_reads_a_source(tmp_path, capsys):
    run = tmp_path / "copy"
    assert cli(capsys, "train", "copy", "--steps", "1", "--out", str(run), "--quiet")[0] == 0
    (tmp_path / "t.txt").write_text("to be")
    status, _, err = cli(
        capsys, "eval", "--checkpoint", str(run), "--text", str(tmp_path / "t.txt")
    )
    assert status == 2 and "holds a seq2seq model, which reads a source" in err


def test_a_text_of_two_tokens_is_measured_and_one_token_of_several_characters_refused(
    tmp_path, capsys, hf_dir
):
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(tmp_path / "run"))[0] == 0
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    merges = (token for token in tokenizer.get_vocab() if token != "<|endoftext|>")
    word = max(merges, key=len)  # the longest merge: one token, many bytes
    one = tmp_path / "one.txt"
    one.write_text(tokenizer.decode([tokenizer.token_to_id(word)]))
    assert len(one.read_text()) > 2 and len(tokenizer.encode(one.read_text()).ids) == 1
    status, _, err = cli(capsys, "eval", "--checkpoint", str(tmp_path / "run"), "--text", str(one))
    assert status == 2 and "--text is 1 token long" in err
    two = tmp_path / "two.txt"
    two.write_text(one.read_text() + "!")
    assert len(tokenizer.encode(two.read_text()).ids) == 2
    status, out, _ = cli(capsys, "eval", "--checkpoint", str(tmp_path / "run"), "--text", str(two))
    assert status == 0 and json.loads(out)["targets"] == 1


@pytest.mark.parametrize(
    ("tokens", "extra", "batch_size"),
    [(4096, [], 128), (4096, ["--context", "12"], 341), (16, [], 1)],  # 16: fewer than a window
)
def test_evals_default_batch_holds_4096_tokens(
    monkeypatch, capsys, char_run, tokens, extra, batch_size
):
    from numpy_engine import cli_study, evaluation

    monkeypatch.setattr(cli_study, "EVAL_BATCH_TOKENS", tokens)

    taken, measure = [], evaluation.heldout_loss
    monkeypatch.setattr(
        evaluation, "heldout_loss", lambda *a, **k: taken.append(a[2]) or measure(*a, **k)
    )
    args = ["eval", "--checkpoint", str(char_run), "--text", str(char_run / "text.txt")]
    (char_run / "text.txt").write_text(DEFAULT_TEXT)
    assert cli(capsys, *args, *extra)[0] == 0 and taken == [batch_size]


def test_a_long_eval_says_how_far_it_is_every_30_seconds(monkeypatch):
    """Windows of 10 s each on a fake clock: a line at 30, 60 and 90 s, none at the end."""
    from numpy_engine import cli_study

    clock = iter(range(100, 300, 10))  # a clock that did not start at 0
    monkeypatch.setattr(cli_study.time, "perf_counter", lambda: float(next(clock)))
    stream = io.StringIO()
    progress = cli_study.EvalProgress(stream)  # the clock reads 100
    for measured in range(1, 11):
        progress(measured, 10)  # the clock reads 10 s a window more
    assert stream.getvalue().splitlines() == [
        "eval: 3 of 10 windows   1 min 10 s left",
        "eval: 6 of 10 windows   40.0 s left",
        "eval: 9 of 10 windows   10.0 s left",
    ]


def test_evals_progress_lines_go_to_stderr(monkeypatch, capsys, char_run):
    from numpy_engine import loop

    monkeypatch.setattr(loop, "PROGRESS_SECONDS", 0.0)  # a line after every batch but the last
    (char_run / "text.txt").write_text(DEFAULT_TEXT)  # 1,999 targets: 63 windows of 32
    args = ["eval", "--checkpoint", str(char_run), "--text", str(char_run / "text.txt")]
    status, out, err = cli(capsys, *args, "--batch-size", "20")
    lines = err.splitlines()
    assert status == 0 and json.loads(out)["targets"] == 1999 and len(lines) == 3
    assert [line.split(" windows")[0] for line in lines] == [
        f"eval: {n} of 63" for n in (20, 40, 60)
    ]


def test_a_held_out_part_needs_one_window_of_the_context_asked_for(tmp_path, capsys, char_run):
    """20 held-out tokens hold a window of 8 (9 tokens), not one of the model's 32."""
    path = tmp_path / "text.txt"
    path.write_text(DEFAULT_TEXT[:40])
    args = ["eval", "--checkpoint", str(char_run), "--text", str(path), "--holdout", "0.5"]
    status, out, _ = cli(capsys, *args, "--context", "8")
    assert status == 0 and json.loads(out)["tokens"] == 20
    status, _, err = cli(capsys, *args)
    assert status == 2 and "leaves the held-out part 20 of the text's 40 tokens" in err
