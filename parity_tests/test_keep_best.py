"""--keep-best: a language model's run keeps the weights of its lowest held-out loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numpy_engine import evaluation, saved_runs, train
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli import main
from numpy_engine.configs import CharTrainConfig
from numpy_engine.loop import TrainState
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.tasks import DEFAULT_TEXT


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_best_checkpoint_is_the_lowest_held_out_loss_and_eval_reads_it_again(tmp_path, capsys):
    """30 char-lm steps evaluated every 5: best/ holds the weights of the first evaluation
    of the lowest held-out loss, and eval of the held-out part gives that loss again."""
    run, text = tmp_path / "run", tmp_path / "text.txt"
    text.write_text(DEFAULT_TEXT)
    flags = ["--steps", "30", "--eval-every", "5", "--holdout", "0.3", "--text", str(text)]
    status, out, err = run_cli(capsys, "train", "char-lm", *flags, "--keep-best", "--out", str(run))
    assert status == 0
    evaluations = json.loads((run / "history.json").read_text())["eval"]
    best = min(evaluations, key=lambda e: e["heldout_loss"])
    assert json.loads(out)["best"] == {**best, "checkpoint": str(run / "best")}
    kept = load_checkpoint(run / "best")
    assert (kept.meta["step"], kept.meta["heldout_loss"]) == (best["step"], best["heldout_loss"])
    assert kept.optimizer_state in (None, {})  # weights and tokenizer: it resumes no run
    lines = [line for line in err.splitlines() if "best so far" in line]
    assert lines and lines[-1].startswith(f"step {best['step']:>5}/30")
    same = ["--holdout", "0.3", "--context", "32", "--batch-size", "32"]
    status, out, _ = run_cli(
        capsys, "eval", "--checkpoint", str(run / "best"), "--text", str(text), *same
    )
    assert status == 0 and json.loads(out)["loss"] == best["heldout_loss"]
    status, out, _ = run_cli(
        capsys, "generate", "--checkpoint", str(run / "best"), "--prompt", "to "
    )
    assert status == 0 and out.startswith("to ")


def test_only_an_evaluation_below_every_earlier_one_is_kept(tmp_path, monkeypatch):
    """Held-out losses 3, 2, 2, 2.5, 1 (with two from before a resume): kept at the second
    and the fifth; a tie keeps the earlier. A rank that does not write keeps nothing."""
    written = []
    monkeypatch.setattr(
        evaluation, "save_checkpoint", lambda out, model, opt, meta: written.append(meta)
    )
    losses = iter([2.0, 2.5, 1.0])
    history = {"eval": [{"step": 1, "heldout_loss": 3.0}, {"step": 2, "heldout_loss": 2.0}]}
    state = TrainState(None, None, None, 2, history)

    def evaluate(state):
        state.history["eval"].append({"step": state.step, "heldout_loss": next(losses)})
        return "  held-out loss"

    keep = evaluation._keeping_the_best(evaluate, tmp_path / "best", {"vocabulary": "ab"}, True)
    lines = []
    for step in (3, 4, 5):
        state.step = step
        lines.append(keep(state))
    assert written == [{"step": 5, "heldout_loss": 1.0, "vocabulary": "ab"}]
    assert lines[:2] == ["  held-out loss"] * 2
    assert lines[2] == f"  held-out loss  best so far: kept in {tmp_path / 'best'}"
    history["eval"], losses = [], iter([4.0, 3.0, 5.0, 2.0])
    keep(state)  # a run's first evaluation is the best so far
    assert written[-1] == {"step": 5, "heldout_loss": 4.0, "vocabulary": "ab"}
    quiet = evaluation._keeping_the_best(evaluate, tmp_path / "best", {}, False)
    assert quiet(state).endswith("best so far: kept in " + str(tmp_path / "best"))  # 3.0
    assert quiet(state) == "  held-out loss"  # 5.0
    assert quiet(state).endswith("best so far: kept in " + str(tmp_path / "best"))  # 2.0
    assert len(written) == 2  # the best so far, but not this rank's to write


def test_a_nan_held_out_loss_is_never_kept_nor_the_best_later_ones_must_beat(tmp_path, monkeypatch):
    """A NaN compares false both ways: kept, it wrote the diverged weights over the best ones,
    and no later loss could beat it. Losses 2, NaN, 3, 1.5: kept at 2 and at 1.5 only."""
    written = []
    monkeypatch.setattr(
        evaluation,
        "save_checkpoint",
        lambda out, model, opt, meta: written.append(meta["heldout_loss"]),
    )
    losses = iter([2.0, float("nan"), 3.0, 1.5])
    state = TrainState(None, None, None, 0, {"eval": []})

    def evaluate(state):
        state.history["eval"].append({"step": state.step, "heldout_loss": next(losses)})
        return ""

    keep = evaluation._keeping_the_best(evaluate, tmp_path / "best", {}, True)
    kept = [keep(state) != "" for _ in range(4)]
    assert kept == [True, False, False, True] and written == [2.0, 1.5]
    assert evaluation.best_evaluation(state.history["eval"])["heldout_loss"] == 1.5
    nan_first = [{"step": 1, "heldout_loss": float("nan")}, {"step": 2, "heldout_loss": 4.0}]
    assert evaluation.best_evaluation(nan_first)["step"] == 2
    assert evaluation.best_evaluation(nan_first[:1]) is None
    only_nan = TrainState(None, None, None, 1, {"eval": nan_first[:1]})
    checkpointing = train.Checkpointing(tmp_path, None, keep_best=True)
    assert evaluation.best_result(only_nan, checkpointing) == {"best": None}
    saved_runs.refuse_a_best_already_lost(tmp_path, only_nan.history)  # no best was there to lose


def test_a_run_without_keep_best_reports_no_best(tmp_path):
    state = TrainState(None, None, None, 2, {"eval": [{"step": 2, "heldout_loss": 1.0}]})
    assert evaluation.best_result(state, None) == {}
    assert evaluation.best_result(state, train.Checkpointing(tmp_path, None)) == {}
    kept = evaluation.best_result(state, train.Checkpointing(tmp_path, None, keep_best=True))
    assert kept == {"best": {"step": 2, "heldout_loss": 1.0, "checkpoint": str(tmp_path / "best")}}


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["copy", "--keep-best", "--out"], "--keep-best is for a language model's run"),
        (["char-lm", "--keep-best", "--out"], "the run needs a held-out part (--holdout"),
        (["char-lm", "--keep-best", "--holdout", "0.3"], "--keep-best needs --out DIR"),
    ],
)
def test_keep_best_without_a_held_out_loss_or_a_place_is_refused(tmp_path, capsys, flags, words):
    run = tmp_path / "run"
    args = ["train", *flags, *([str(run)] if flags[-1] == "--out" else []), "--steps", "2"]
    status, _, err = run_cli(capsys, *args)
    assert status == 2 and words in err and err.count("\n") == 1, err
    assert not Path(run).exists()  # refused before the run's directory was made


def test_resuming_with_keep_best_needs_the_best_kept_so_far(tmp_path):
    """A run that evaluated without --keep-best has no weights for its lowest held-out loss so
    far: resuming it with --keep-best is refused, naming it. A run started with it resumes
    with it, and its best is over both parts."""
    from numpy_engine.configs import CharTrainConfig

    cfg = CharTrainConfig(steps=10, eval_every=5, holdout=0.3)
    plain, kept = tmp_path / "plain", tmp_path / "kept"
    train.run_task(cfg, None, None, train.Checkpointing(plain, 10))
    run = train.run_task(cfg, None, None, train.Checkpointing(kept, 10, keep_best=True))
    best = min(run.history["eval"], key=lambda e: e["heldout_loss"])
    words = f"--keep-best: the run in {plain} was not kept at its best so far (held-out loss "
    with pytest.raises(train.InputError) as refused:
        train.resume(plain, None, steps=15, keep_best=True)
    assert str(refused.value).startswith(
        words + f"{best['heldout_loss']:.4f} at step {best['step']}, without --keep-best)"
    )
    assert train.resume(plain, None, steps=15).history["step"][-1] == 15  # without it: on
    resumed = train.resume(kept, None, steps=15, keep_best=True)
    best = min(resumed.history["eval"], key=lambda e: e["heldout_loss"])
    assert resumed.result["best"]["step"] == best["step"]
    assert load_checkpoint(kept / "best").meta["step"] == best["step"]


def test_a_run_that_kept_its_best_keeps_it_on_when_resumed_without_the_flag(tmp_path):
    """Resumed without --keep-best, a run started with it goes on keeping its best: else
    best/ would stay at an evaluation that later ones beat. The held-out loss here falls at
    every evaluation, so the best is the last one."""
    from numpy_engine.configs import CharTrainConfig

    cfg = CharTrainConfig(steps=10, eval_every=5, holdout=0.3)
    train.run_task(cfg, None, None, train.Checkpointing(tmp_path, 10, keep_best=True))
    assert load_checkpoint(tmp_path / "best").meta["step"] == 10
    resumed = train.resume(tmp_path, None, steps=20)
    losses = [e["heldout_loss"] for e in resumed.history["eval"]]
    assert losses == sorted(losses, reverse=True) and len(losses) == 4  # steps 5 .. 20
    assert resumed.result["best"]["step"] == 20
    assert load_checkpoint(tmp_path / "best").meta["step"] == 20


def test_resuming_a_run_without_a_holdout_with_keep_best_is_refused_as_a_new_one(tmp_path):
    from numpy_engine.configs import CharTrainConfig

    train.run_task(CharTrainConfig(steps=4), None, None, train.Checkpointing(tmp_path, 4))
    with pytest.raises(train.InputError, match=r"the run needs a held-out part \(--holdout"):
        train.resume(tmp_path, None, steps=6, keep_best=True)


def test_resuming_a_sequence_run_with_keep_best_says_it_is_for_language_models(tmp_path):
    from numpy_engine.configs import SequenceTrainConfig

    cfg = SequenceTrainConfig(steps=4, eval_every=2)
    train.run_task(cfg, None, None, train.Checkpointing(tmp_path, 4))
    with pytest.raises(train.InputError, match="^--keep-best is for a language model's run "):
        train.resume(tmp_path, None, steps=6, keep_best=True)


class SecondOfTwoRanks(OneProcess):
    """Rank 1 of a data-parallel pair, in one process: its reductions are the identity, so
    it trains on its own share of each batch."""

    rank, size = 1, 2


@pytest.mark.parametrize(
    ("group", "writes"),
    [(OneProcess(), True), (SecondOfTwoRanks(), False)],
    ids=["rank 0", "rank 1 of 2"],
)
def test_the_best_is_kept_by_the_rank_that_writes_alone(tmp_path, group, writes):
    """Under --data-parallel every rank evaluates and knows the best so far, but only rank
    0 writes it (as it writes the run's checkpoints): two writing one path could leave it
    torn."""
    cfg = CharTrainConfig(steps=4, batch_size=4, context=8, holdout=0.3, eval_every=2)
    checkpointing = train.Checkpointing(tmp_path / "run", None, keep_best=True)
    train.train_char_lm(cfg, None, None, checkpointing, parallel=DataParallel(group))
    assert (tmp_path / "run" / "best").exists() == writes


def test_the_command_line_resumes_with_keep_best_as_resume_does(tmp_path, capsys):
    """`train --resume DIR --keep-best`, with no --out (DIR is where best/ goes): refused for a
    run that evaluated without it, as train.resume refuses; taken for a run that kept its best,
    whose best/ then holds the lowest held-out loss of both parts."""
    plain, kept = tmp_path / "plain", tmp_path / "kept"
    flags = ["--steps", "4", "--eval-every", "2", "--holdout", "0.3", "--schedule", "constant"]
    assert run_cli(capsys, "train", "char-lm", *flags, "--out", str(plain), "--quiet")[0] == 0
    status, _, err = run_cli(capsys, "train", "--resume", str(plain), "--keep-best", "--steps", "6")
    assert status == 2 and f"--keep-best: the run in {plain} was not kept at its best" in err, err
    keep = [*flags, "--keep-best", "--out", str(kept), "--quiet"]
    assert run_cli(capsys, "train", "char-lm", *keep)[0] == 0
    status, out, _ = run_cli(capsys, "train", "--resume", str(kept), "--keep-best", "--steps", "6")
    assert status == 0
    history = json.loads((kept / "history.json").read_text())
    best = min(history["eval"], key=lambda e: e["heldout_loss"])
    assert history["step"][-1] == 6 and json.loads(out)["best"]["step"] == best["step"]
    assert load_checkpoint(kept / "best").meta["step"] == best["step"]
