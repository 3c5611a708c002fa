"""`numpy-engine parity`: a table per tensor, exit 0 when all pass, 1 when a backward is broken.

`numpy-engine parity` hands over to `python -m crosscheck parity`; these tests call
crosscheck.cli.main directly, and one runs the whole path through numpy-engine.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import numpy_engine.blocks
from crosscheck.cli import main  # in-process, so that monkeypatch reaches the engine
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli import main as engine_main
from numpy_engine.layernorm import layernorm_backward
from numpy_engine.study import CHECKPOINT_LENGTH, EXAMPLE_ROWS, checkpoint_example


@pytest.mark.parametrize("model", ["seq2seq", "gpt", "gpt2"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_parity_report_passes_and_lists_every_tensor(model, dtype, capsys):
    assert main(["parity", "--model", model, "--dtype", dtype, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    expected_tensors = {"seq2seq": 51, "gpt": 56, "gpt2": 38}[model]  # params + logits + loss
    assert f"{expected_tensors} tensors compared, 0 failed ({model}, {dtype}, seed 3)" in out
    assert out.count("  pass") == expected_tensors
    assert "readout.weight" in out or "head.weight" in out or "tok_embed.weight" in out
    header, rule, *rows = out.splitlines()
    columns = "tensor shape max |diff| rel diff" + (
        " err vs f64 bound" if dtype == "float32" else ""
    )
    assert header.split() == f"{columns} result".split()
    assert rule == "-" * len(header)
    loss_row = next(row for row in rows if row.startswith("loss "))
    # name, shape (), max |diff|, rel diff, [error against float64, bound,] result
    assert len(loss_row.split()) == 5 + (2 if dtype == "float32" else 0)
    # every kind has attention key biases, judged by the absolute bound in float64 only
    assert out.splitlines()[-1].startswith("* true value ~0") == (dtype == "float64")


def _layernorm_backward_without_mean_term(dout, cache):
    (xhat, rstd), weight = cache
    dx, grads = layernorm_backward(dout, cache)
    dxhat = dout * weight
    return dx + rstd * dxhat.mean(axis=-1, keepdims=True), grads  # drops "- mean(g)"


def test_parity_report_fails_on_a_broken_backward(monkeypatch, capsys):
    monkeypatch.setattr(
        numpy_engine.blocks, "layernorm_backward", _layernorm_backward_without_mean_term
    )
    assert main(["parity", "--model", "gpt"]) == 1
    out = capsys.readouterr().out
    failed = [line.split()[0] for line in out.splitlines() if line.endswith("FAIL")]
    assert f"56 tensors compared, {len(failed)} failed (gpt, float64, seed 0)" in out
    assert "blocks.0.ln1.weight" in failed or "tok_embed.weight" in failed
    assert np.isin(["head.weight", "head.bias"], failed).sum() == 0  # upstream of the break


def test_python_dash_m_runs_the_same_command():
    result = subprocess.run(
        [sys.executable, "-m", "numpy_engine", "parity", "--model", "seq2seq"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "0 failed" in result.stdout


def test_bad_flag_exits_2_with_a_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["parity", "--model", "bert"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'bert'" in capsys.readouterr().err


def test_rows_whose_true_value_is_zero_are_marked_as_judged_by_the_absolute_bound(capsys):
    """A key bias's gradient is exactly 0: its relative difference (~1) is rounding over
    rounding, so the row says it was judged by the absolute bound, and one line says why."""
    assert main(["parity", "--model", "seq2seq"]) == 0
    lines = capsys.readouterr().out.splitlines()
    marked = [line.split()[0] for line in lines if "*" in line and line.endswith("pass")]
    assert marked and all(name.endswith("k_proj.bias") for name in marked), marked
    assert lines[-1].startswith("* true value ~0") and "absolute bound" in lines[-1]


def test_parity_of_a_checkpoint_runs_its_own_weights(trained_copy, capsys):
    assert main(["parity", "--checkpoint", str(trained_copy)]) == 0
    out = capsys.readouterr().out
    assert f"51 tensors compared, 0 failed ({trained_copy}: seq2seq, float64, seed 0)" in out
    model, (source, decoder_input, target) = checkpoint_example(str(trained_copy), seed=0)
    saved = load_checkpoint(trained_copy, optimizer=False).model.params
    assert model.config.dtype == "float64" and saved.keys() == model.params.keys()
    assert all(np.array_equal(model.params[k], saved[k]) for k in saved)  # float32 -> float64
    assert source.shape == (4, 3) and decoder_input.shape == target.shape == (4, 4)


def test_parity_of_an_imported_gpt2_against_transformers(tmp_path, capsys, hf_dir):
    """A random transformers GPT-2 saved by save_pretrained, through import-hf, then parity:
    every gradient against GPT2LMHeadModel, on at most CHECKPOINT_LENGTH positions."""
    run = tmp_path / "run"
    assert engine_main(["import-hf", str(hf_dir), "--out", str(run)]) == 0
    for dtype in ("float64", "float32"):
        assert main(["parity", "--checkpoint", str(run), "--dtype", dtype]) == 0
        assert f"38 tensors compared, 0 failed ({run}: gpt2, {dtype}" in capsys.readouterr().out
    _, (idx, targets) = checkpoint_example(str(run), seed=0)
    assert idx.shape == targets.shape == (4, CHECKPOINT_LENGTH)  # its n_positions is 32


def test_parity_of_a_checkpoint_fails_on_a_broken_backward(trained_copy, monkeypatch, capsys):
    monkeypatch.setattr(
        numpy_engine.blocks, "layernorm_backward", _layernorm_backward_without_mean_term
    )
    assert main(["parity", "--checkpoint", str(trained_copy)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_the_help_gives_a_checkpoints_batch_its_length(capsys):
    with pytest.raises(SystemExit):
        main(["parity", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"a batch of {EXAMPLE_ROWS} rows of at most {CHECKPOINT_LENGTH} positions" in help_text


def test_parity_takes_a_model_or_a_checkpoint_not_both(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["parity", "--model", "gpt", "--checkpoint", "RUN"])
    assert exit_info.value.code == 2
    assert "--checkpoint: not allowed with argument --model" in capsys.readouterr().err


def test_parity_of_a_missing_checkpoint_names_it(capsys):
    assert main(["parity", "--checkpoint", "nowhere"]) == 2
    assert "checkpoint nowhere/checkpoint.npz: no such file" in capsys.readouterr().err


def test_parity_draws_the_default_model_from_its_seed(monkeypatch):
    import crosscheck.report

    drawn = []
    real = crosscheck.report.example_batch
    monkeypatch.setattr(
        crosscheck.report,
        "example_batch",
        lambda kind, seed: drawn.append(seed) or real(kind, seed),
    )
    assert main(["parity", "--model", "seq2seq", "--seed", "5"]) == 0
    assert drawn == [5]


def test_a_checkpoints_batch_is_drawn_from_the_seed_and_cut_to_32_positions(tmp_path):
    from numpy_engine.checkpoint import save_checkpoint
    from numpy_engine.models import GPTConfig, MiniGPT

    config = GPTConfig(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=64)
    path = save_checkpoint(tmp_path / "run", MiniGPT(config, seed=0))
    model, (idx, targets) = checkpoint_example(str(path), seed=5)
    assert idx.shape == targets.shape == (4, CHECKPOINT_LENGTH)  # not its 64 positions
    again, expected = (
        checkpoint_example(str(path), seed=5)[1],
        MiniGPT.example_batch(model.config, np.random.default_rng(5), 4, CHECKPOINT_LENGTH),
    )
    for a, b, c in zip((idx, targets), again, expected, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
