"""The `grads` study (numpy_engine/study.py) and command: each parameter's gradient against
central differences of the loss, the loss's rounding measured once, the rows printed as
they come, a wrong gradient failed by name, and the parameters a pattern asks for. The
finite-difference witness it uses: test_gradcheck.py."""

from __future__ import annotations

import fnmatch

import numpy as np
import pytest

from numpy_engine.gradcheck import sample_indices
from numpy_engine.study import example_batch, gradient_study


def test_the_grads_study_is_each_parameters_gradient_against_its_differences():
    # entries differs from the seed: the model and its batch must come from the seed alone
    loss, rows = gradient_study("seq2seq", seed=3, entries=2)
    model, batch = example_batch("seq2seq", 3)
    assert len(batch[0]) == 4 and gradient_study("seq2seq", 3, 4) == gradient_study("seq2seq", 3)
    assert model.config.dtype == "float64" and (batch[0] == model.config.pad_id).any()  # padded
    expected_loss, grads = model.loss_and_grads(*batch)
    assert loss == expected_loss and [row["name"] for row in rows] == list(grads)
    rng = np.random.default_rng(3)  # the study's sampler, drawn in the same order
    for row, (key, grad) in zip(rows, grads.items(), strict=True):
        sampled = grad.reshape(-1)[sample_indices(rng, grad.size, 2)]
        assert row["shape"] == grad.shape and row["grad_norm"] == np.linalg.norm(grad)
        assert row["sampled_norm"] == np.linalg.norm(sampled), key
        gap = abs(row["fd_norm"] - row["sampled_norm"])
        assert row["rel_error"] <= 1e-6 and gap <= 1e-6 * row["sampled_norm"] + 1e-9, key


def test_the_grads_study_measures_the_losss_rounding_once(monkeypatch):
    """Nine evaluations of the loss for its rounding, for the whole study; then per parameter
    one for its region, two an entry for the first step's plain central difference, and four
    for each Richardson estimate where that was not within a hundredth of the tolerance
    (some of the entries, on this smooth (GELU) model)."""
    from numpy_engine.models import model_class

    model_type, evaluations = model_class("gpt"), []
    loss = model_type.loss

    def counted(self, *batch):
        evaluations.append(1)
        return loss(self, *batch)

    monkeypatch.setattr(model_type, "loss", counted)
    from numpy_engine import study

    along, measure = [], study.rounding_noise

    def recorded(f, x, direction):
        along.append((x.copy(), direction))
        return measure(f, x, direction)

    monkeypatch.setattr(study, "rounding_noise", recorded)
    from numpy_engine import gradcheck

    richardson, derivative = [], gradcheck.directional_derivative

    def counted_derivative(*args, **kwargs):
        richardson.append(kwargs["richardson"])
        return derivative(*args, **kwargs)

    monkeypatch.setattr(gradcheck, "directional_derivative", counted_derivative)
    _, rows = gradient_study("gpt", seed=0, entries=2)
    sampled = sum(min(2, int(np.prod(row["shape"]))) for row in rows)
    assert richardson.count(False) == sampled and 0 < richardson.count(True) < sampled
    assert len(evaluations) == 9 + len(rows) + 2 * sampled + 4 * richardson.count(True)
    assert np.max([row["rel_error"] for row in rows]) <= 1e-6  # a NaN fails it
    # measured along the sampled entry with the largest gradient, the study's draws redone
    model, batch = example_batch("gpt", 0)
    _, grads = model.loss_and_grads(*batch)
    rng = np.random.default_rng(0)
    draws = [(key, sample_indices(rng, g.size, 2)) for key, g in grads.items()]
    size, key, entry = max((abs(grads[k].flat[i]), k, i) for k, ids in draws for i in ids)
    [(x, direction)] = along
    assert direction == entry and np.array_equal(x, model.params[key]), (key, entry, size)


def test_the_studys_rounding_is_measured_along_the_sampled_entry_with_the_largest_gradient(
    monkeypatch,
):
    from numpy_engine import study

    params = {"a": np.array([9.0, 8.0, 7.0]), "b": np.array([10.0, 20.0, 30.0, 40.0])}
    grads = {"a": np.array([5.0, -0.5, 0.0]), "b": np.array([0.1, 0.2, -6.0, 7.0])}
    sampled = {"a": np.array([0, 2]), "b": np.array([0, 2])}  # b's 7.0 is not sampled
    measured = []
    monkeypatch.setattr(study, "rounding_noise", lambda f, x, d: measured.append((x, d)) or 1.0)
    analytic = {key: grads[key][indices] for key, indices in sampled.items()}  # b: 0.1, -6.0
    assert study.loss_rounding(None, params, sampled, analytic) == 1.0
    [(x, direction)] = measured
    assert x is params["b"] and direction == 2 and type(direction) is int  # |-6.0|, entry 2


def test_the_grads_command_prints_the_study_row_by_row(capsys):
    from numpy_engine.cli import main

    loss, rows = gradient_study("seq2seq", seed=1, entries=2)
    assert main(["grads", "--model", "seq2seq", "--seed", "1", "--entries", "2"]) == 0
    title, header, rule, *lines = capsys.readouterr().out.splitlines()
    table, summary = lines[: len(rows)], lines[len(rows) :]
    assert title == f"seq2seq, seed 1: loss {loss:.6f} on one padded batch (float64)"
    assert header.split()[:2] == ["parameter", "shape"] and rule == "-" * len(header)
    assert {len(line) for line in table} == {len(header)}  # every column aligned, long names too
    for line, row in zip(table, rows, strict=True):
        name, *shape, grad_norm, sampled, fd, error, verdict = line.split()
        assert (name, " ".join(shape)) == (row["name"], str(row["shape"]))
        printed = [float(grad_norm), float(sampled), float(fd), float(error)]
        values = [row[k] for k in ("grad_norm", "sampled_norm", "fd_norm", "rel_error")]
        assert np.allclose(printed, values, rtol=0.06, atol=0), (printed, values)  # as rounded
        assert verdict == row["verdict"] == "pass"
    assert summary[0].startswith("rel. error: |grad - finite diff|")
    assert summary[2].endswith("a correct backward reads below 1e-6.")
    assert summary[3:] == [f"every judged parameter passed ({len(rows)} of {len(rows)})"]


def test_the_grads_command_studies_a_checkpoints_own_weights(trained_copy, capsys):
    """--checkpoint: the trained weights (float64) on a batch drawn from --seed, every
    parameter judged; the title names the checkpoint."""
    from numpy_engine.cli import main
    from numpy_engine.study import checkpoint_example

    run = str(trained_copy)
    capsys.readouterr()
    assert main(["grads", "--checkpoint", run, "--seed", "2", "--entries", "2"]) == 0
    title, *lines = capsys.readouterr().out.splitlines()
    model, batch = checkpoint_example(run, seed=2)
    assert title == f"{run}, seed 2: loss {model.loss(*batch):.6f} on one padded batch (float64)"
    n = len(model.params)
    assert lines[-1] == f"every judged parameter passed ({n} of {n})"
    fresh = type(model)(model.config, seed=0)  # the title's loss is the trained weights'
    assert abs(fresh.loss(*batch) - model.loss(*batch)) > 1e-3


@pytest.fixture
def one_wrong_gradient(monkeypatch):
    """The copy model's decoder_norm.weight gradient 1% off, as a wrong backward would leave
    it; every other gradient right."""
    from numpy_engine.models import model_class

    kind = model_class("seq2seq")
    right = kind.loss_and_grads

    def one_wrong(self, *batch):
        loss, grads = right(self, *batch)
        grads["decoder_norm.weight"] = grads["decoder_norm.weight"] * 1.01
        return loss, grads

    monkeypatch.setattr(kind, "loss_and_grads", one_wrong)


def test_the_grads_command_fails_a_wrong_gradient_by_name(capsys, one_wrong_gradient):
    """One parameter's gradient 1% off: its row reads FAIL, the others pass, the summary
    names it and the command exits 1."""
    from numpy_engine.cli import main

    assert main(["grads", "--model", "seq2seq", "--entries", "2"]) == 1
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.endswith(("pass", "FAIL"))]
    verdicts = {words[0]: words[-1] for words in rows}
    assert verdicts.pop("decoder_norm.weight") == "FAIL"
    assert len(verdicts) == 48 and set(verdicts.values()) == {"pass"}
    assert lines[-1] == "FAIL: 1 of 49 parameters: decoder_norm.weight"


def test_the_grads_study_of_some_parameters_is_their_rows_of_the_whole_study():
    """only: the parameters its pattern matches, in the model's order, each row equal to the
    whole study's (the same sampled entries, judged against the same rounding)."""
    _, every = gradient_study("seq2seq", seed=1, entries=2)
    counts = {"decoder.0.cross_attn.*": 8, "*norm.bias": 2, "embed.weight": 1}
    for pattern, count in (counts | {"*.[kv]_proj.weight": 6}).items():
        _, some = gradient_study("seq2seq", seed=1, entries=2, only=pattern)
        assert some == [row for row in every if fnmatch.fnmatchcase(row["name"], pattern)]
        assert len(some) == count
    assert [row["name"] for row in some] == [  # the last pattern: a character class
        f"{part}attn.{kv}_proj.weight"
        for part in ("encoder.0.", "decoder.0.self_", "decoder.0.cross_")
        for kv in "kv"
    ]


def test_the_grads_command_judges_only_the_parameters_asked_for(capsys, one_wrong_gradient):
    """--params: a wrong gradient among the matching parameters fails the command by name;
    outside them it is not looked at, and the command passes."""
    from numpy_engine.cli import main

    capsys.readouterr()
    assert main(["grads", "--entries", "2", "--params", "*_norm.*"]) == 1
    title, *lines = capsys.readouterr().out.splitlines()
    assert title.endswith("(float64); the parameters matching '*_norm.*'")
    assert lines[-1] == "FAIL: 1 of 4 parameters: decoder_norm.weight"
    assert main(["grads", "--entries", "2", "--params", "encoder*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "every judged parameter passed (18 of 18)"


def test_a_pattern_that_matches_no_parameter_is_refused_by_name(capsys):
    from numpy_engine.cli import main

    assert main(["grads", "--params", "blocks.*"]) == 2
    err = capsys.readouterr().err
    assert "--params 'blocks.*' matches none of the model's 49 parameters" in err, err
    assert "named like embed.weight, encoder.0.ln1.weight, encoder.0.ln1.bias, ..." in err


def test_the_grads_summary_names_what_it_could_not_judge_and_what_failed():
    from numpy_engine.cli_study import _grads_summary

    rows = [{"name": n, "verdict": v} for n, v in [("a", "pass"), ("b", "n/a"), ("c", "FAIL")]]
    *_, unjudged, failed = _grads_summary(rows).splitlines()
    assert unjudged == "n/a: every sampled entry of b sat on a kink"
    assert failed == "FAIL: 1 of 3 parameters: c"
    *_, unjudged, passed = _grads_summary(rows[:2]).splitlines()
    assert unjudged == "n/a: every sampled entry of b sat on a kink"
    assert passed == "every judged parameter passed (1 of 2)"
    assert len(_grads_summary(rows[:1]).splitlines()) == 4  # the note's three lines, the verdict


def test_the_grads_verdict_on_a_relative_error():
    from numpy_engine.gradcheck import TOLERANCE
    from numpy_engine.study import verdict

    assert [verdict(e) for e in (0.0, TOLERANCE, np.nextafter(TOLERANCE, 1.0), np.inf)] == [
        "pass",
        "pass",
        "FAIL",
        "FAIL",
    ]
    assert verdict(np.nan) == "n/a"  # no sampled entry judged
