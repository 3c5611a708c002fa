"""Dropout (numpy_engine/dropout.py) in training steps.

Against transformers' GPT2LMHeadModel in training mode, float64: its dropout is made to
multiply by the engine's masks, in the order the forward reaches its sites, and the loss and
every gradient must agree within the 1e-10 normwise rule. MiniGPT's own head, against finite
differences under fixed masks. Then the masks themselves, evaluation without dropout, the
training loop's keying of masks by step and micro-batch, and the flags.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import numpy_engine as ne
from crosscheck.convert import grads_from_torch, tensor, torch_model_for
from numpy_engine import cli
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.dropout import Dropout, training_rng
from numpy_engine.hf import config_from_hf, hf_config_from_engine
from numpy_engine.models import GPT2Config
from numpy_engine.parallel import DataParallel, OneProcess
from parity_tests.float32_panel import dropout_draw
from parity_tests.helpers import (
    assert_all_close_float64,
    assert_float32_within_bound,
    assert_gradients_match_fd,
)
from parity_tests.strategies import gpt_cases, randomized_model, seq2seq_cases
from parity_tests.test_gpt2 import Case, gpt2_cases

rates = st.sampled_from([0.0, 0.1, 0.5, 0.9])


def recording_masks(patch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """Every mask the engine's Dropout draws from now on, in order."""
    masks, draw = [], Dropout.mask

    def recorded(self, site, shape, dtype):
        mask = draw(self, site, shape, dtype)
        if mask is not None:
            masks.append(mask)
        return mask

    patch.setattr(Dropout, "mask", recorded)
    return masks


def replaying(patch: pytest.MonkeyPatch, masks: list[np.ndarray]) -> None:
    """torch's dropout (nn.Dropout's and transformers' functional call alike) multiplies by
    the next of masks instead of drawing its own; a site whose rate is 0 draws none."""
    left = iter(masks)

    def replay(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        mask = torch.from_numpy(next(left))
        assert tuple(mask.shape) == tuple(x.shape)
        return x * mask

    patch.setattr(F, "dropout", replay)  # torch.nn.functional: nn.Dropout's F as well
    return left


def training_results(model, batch: tuple, seed: int, torch_loss) -> tuple[dict, dict]:
    """(the engine's, torch's) loss and gradients of one training step with dropout, under
    the masks the engine draws from default_rng(seed); torch_loss() computes torch's loss
    (its dropout replaying them) and returns it with its gradients, keyed as the engine's."""
    with pytest.MonkeyPatch.context() as patch:
        masks = recording_masks(patch)
        loss, grads = model.loss_and_grads(*batch, np.random.default_rng(seed))
        assert masks  # the case drops somewhere
        left = replaying(patch, masks)
        theirs_loss, theirs_grads = torch_loss()
        assert next(left, None) is None  # torch reached every site the engine did
    ours = {"loss": np.array(loss)} | {f"dloss/d{key}": g for key, g in grads.items()}
    theirs = {"loss": theirs_loss} | {f"dloss/d{key}": g for key, g in theirs_grads.items()}
    return ours, theirs


def with_rates(case, embed: float, attn: float, resid: float):
    """The case's model, randomized, at these dropout rates."""
    rates = dict(embed_dropout=embed, attn_dropout=attn, resid_dropout=resid)
    model, _ = randomized_model(case._replace(config=dataclasses.replace(case.config, **rates)))
    return model


def twin_loss(model, batch: tuple):
    """torch_reference's twin of model in training mode: its loss and gradients."""

    def run():
        twin = torch_model_for(model).train()
        loss = twin.loss(*(tensor(x) for x in batch))
        loss.backward()
        return loss.detach().numpy(), grads_from_torch(twin)

    return run


@given(case=gpt_cases(), embed=rates, attn=rates, resid=rates.filter(bool))
def test_minigpt_dropout_matches_its_torch_twin(case, embed, attn, resid):
    model = with_rates(case, embed, attn, resid)
    ours, theirs = training_results(model, case.batch, case.seed, twin_loss(model, case.batch))
    assert_all_close_float64("MiniGPT with dropout", ours, theirs)


@given(case=seq2seq_cases(), embed=rates, attn=rates, resid=rates.filter(bool))
def test_seq2seq_dropout_matches_its_torch_twin(case, embed, attn, resid):
    model = with_rates(case, embed, attn, resid)
    ours, theirs = training_results(model, case.batch, case.seed, twin_loss(model, case.batch))
    assert_all_close_float64("Seq2SeqTransformer with dropout", ours, theirs)


@given(case=gpt2_cases(), embd=rates, attn=rates, resid=rates.filter(bool))
def test_dropout_matches_transformers_in_training(case, embd, attn, resid):
    sizes, idx, targets, seed = case
    idx, targets = np.asarray(idx), np.asarray(targets)
    pdrop = dict(embd_pdrop=embd, attn_pdrop=attn, resid_pdrop=resid)
    gpt2 = Case(sizes | pdrop, seed)  # through import-hf: the engine takes config.json's rates
    config = gpt2.engine.config
    assert (config.embed_dropout, config.attn_dropout, config.resid_dropout) == (embd, attn, resid)

    def hf_loss():
        logits = gpt2.hf.train()(torch.tensor(idx)).logits
        loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(targets).flatten())
        loss.backward()
        return loss.detach().numpy(), gpt2.hf_grads()

    ours, theirs = training_results(gpt2.engine, (idx, targets), seed, hf_loss)
    assert_all_close_float64("GPT2 with dropout", ours, theirs)


@pytest.mark.parametrize("kind", ["gpt", "seq2seq"])
@pytest.mark.parametrize("seed", range(4))
def test_dropout_in_float32_stays_within_the_rounding_bound(kind, seed):
    """float32_panel's fixed model draws at its dropout rates (its survey runs many more)."""
    checks = dropout_draw(kind, seed)
    assert_float32_within_bound(f"{kind} with dropout, panel case {seed}", checks)


def test_the_dropout_draw_that_lost_digits_stays_within_the_bound():
    """The survey's draw 2127 (`python -m parity_tests.float32_panel`): one token, d_model 3,
    its FFN's output kept in two of three channels. Layernorm's forward then skipped its
    second pass up to |mean| = 4 std; the final norm's input at 3.5 std left xhat ~5 u off,
    its backward cancelled 4.75x, and the mask kept the small part of that: fc1's gradient
    134 u off, 1.075 of the bound made of the weights' sensitivity alone. Layernorm now takes
    the second pass past 2 std. A whole model is now also judged by its rounding spread
    (crosscheck/rounding.py), which sees that cancellation: 0.028, and 0.095 with the
    threshold back at 4 std; the layernorm tests of test_float32.py hold the threshold."""
    checks = dropout_draw("gpt", 2127)
    worst = max(check.ratio for check in checks.values())
    assert worst < 0.5, f"the dropout draw 2127 reached {worst:.3f} of the float32 bound"


def test_a_models_sensitivity_from_few_draws_no_longer_fails_a_correct_step():
    """The survey's draw 100421 (a seq2seq model, three rows of two targets): with 3 random
    draws the sensitivity of decoder.0.ffn.fc2's gradient read 3.6e-8, a quarter of what 30
    draws read (1.44e-7), and the engine's error, 36 of that, 1.13 of the bound; with
    compare.JOINT_DRAWS (16) the worst tensor read 0.54, and with the rounding spread 0.073."""
    checks = dropout_draw("seq2seq", 100421)
    worst = max(check.ratio for check in checks.values())
    assert worst < 0.8, f"the dropout draw 100421 reached {worst:.3f} of the float32 bound"


def test_an_intermediates_rounding_that_a_later_step_cancels_is_within_the_bound():
    """The survey's draw 300688 (seq2seq, d_model 3, two target positions): the final
    layernorm's backward hands back a gradient 34x smaller than its input, so that input's
    own rounding, which no move of the weights reproduces, leaves it 113 u off, and the
    cross-attention's dropout mask keeps a part 2,535 u off, which out_proj.bias's gradient
    sums: 5.0x 32 times its sensitivity, 1.04 of the bound made of the sensitivity alone.
    The rounding spread, every operation rounded at random (88x the sensitivity there), is
    what float32's rounding does: that tensor reads 0.057 of the bound, the worst 0.073."""
    checks = dropout_draw("seq2seq", 300688)
    worst = max(check.ratio for check in checks.values())
    assert worst < 0.5, f"the dropout draw 300688 reached {worst:.3f} of the float32 bound"


@given(case=gpt_cases(), rate=rates.filter(bool))
def test_minigpt_dropout_gradients_match_finite_differences(case, rate):
    """Under fixed masks (the same generator state every call) the loss is a smooth
    function of the weights (GELU: no ReLU kink to step over)."""
    config = dataclasses.replace(case.config, activation="gelu")
    config = dataclasses.replace(config, embed_dropout=rate, attn_dropout=rate, resid_dropout=rate)
    model, rng = randomized_model(case._replace(config=config))
    _, grads = model.loss_and_grads(*case.batch, np.random.default_rng(case.seed))

    def probe():  # the loss alone under the same masks: loss_and_grads' bits, checked below
        return model.loss(*case.batch, np.random.default_rng(case.seed))

    assert_gradients_match_fd("MiniGPT loss with dropout", probe, model.params, grads, rng)


def test_a_mask_keeps_one_minus_rate_of_its_entries_scaled_by_its_inverse():
    mask = Dropout(np.random.default_rng(0), resid=0.3).mask("resid", (200, 1000), np.float32)
    assert mask.dtype == np.float32 and mask.shape == (200, 1000)
    kept = mask != 0
    assert set(np.unique(mask)) == {np.float32(0), np.float32(1 / 0.7)}
    # 200,000 draws: the kept share's standard deviation is 0.001
    assert abs(kept.mean() - 0.7) < 0.005
    assert Dropout(np.random.default_rng(0), resid=0.3).mask("attn", (4,), np.float32) is None


def test_decoding_with_past_keys_takes_no_dropout():
    from numpy_engine.blocks import decoder_block_forward, self_attention_block_forward
    from numpy_engine.kvcache import KeysValues

    x = np.random.default_rng(0).standard_normal((3, 1, 8))
    past = KeysValues(np.zeros((3, 2, 4, 4)), np.zeros((3, 2, 4, 4)))
    dropout = Dropout(np.random.default_rng(0), attn=0.1)
    words = "dropout applies to training steps, not to decoding with past keys"
    block = small_gpt()[0]._under("blocks.0.")
    with pytest.raises(InputError, match=words):
        self_attention_block_forward(x, block, 2, None, "gelu", past, dropout=dropout)
    seq2seq = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(d_model=8, n_heads=2), seed=0)
    block = seq2seq._under("decoder.0.")
    with pytest.raises(InputError, match=words):
        decoder_block_forward(x, x, block, 2, None, None, "relu", past, dropout=dropout)


def small_gpt(**rates) -> tuple:
    sizes = dict(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=2, dtype="float64")
    model = ne.MiniGPT(ne.GPTConfig(**sizes, **rates), seed=3)
    return model, ne.MiniGPT.example_batch(model.config, np.random.default_rng(1), 3, 10)


def test_without_a_generator_or_a_rate_nothing_is_dropped():
    """Evaluation (no generator) and rates of 0 give the bits of a model without dropout;
    with both, the loss differs, and the same generator state gives the same loss again."""
    plain, batch = small_gpt()
    dropping, _ = small_gpt(embed_dropout=0.2, attn_dropout=0.2, resid_dropout=0.2)
    loss, grads = plain.loss_and_grads(*batch)
    rng_loss, rng_grads = plain.loss_and_grads(*batch, np.random.default_rng(0))
    eval_loss, eval_grads = dropping.loss_and_grads(*batch)
    assert loss == rng_loss == eval_loss == dropping.loss(*batch)
    for key in grads:
        assert np.array_equal(grads[key], rng_grads[key])
        assert np.array_equal(grads[key], eval_grads[key])
    dropped = dropping.loss_and_grads(*batch, np.random.default_rng(0))[0]
    assert abs(dropped - loss) > 1e-3
    assert dropping.loss_and_grads(*batch, np.random.default_rng(0))[0] == dropped
    assert dropping.loss(*batch, np.random.default_rng(0)) == dropped  # the loss alone
    seq2seq = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(resid_dropout=0.3, dtype="float64"), seed=0)
    copy_batch = seq2seq.example_batch(seq2seq.config, np.random.default_rng(0), 4)
    with_masks = seq2seq.loss_and_grads(*copy_batch, np.random.default_rng(1))[0]
    assert seq2seq.loss(*copy_batch, np.random.default_rng(1)) == with_masks
    assert seq2seq.loss(*copy_batch) != with_masks
    assert not plain.uses_dropout() and dropping.uses_dropout()


@pytest.mark.parametrize("rate", [1.0, -0.1, "0.1", True, False, float("nan")])
def test_a_rate_outside_zero_to_one_is_refused_by_name(rate):
    with pytest.raises(InputError, match=r"attn_dropout=.* must be a number in \[0, 1\)"):
        ne.GPTConfig(attn_dropout=rate)
    with pytest.raises(InputError, match=r"resid_pdrop=.* must be a number in \[0, 1\)"):
        config_from_hf(hf_config_from_engine(GPT2Config()) | {"resid_pdrop": rate}, "float64")


def test_import_and_export_carry_the_rates():
    config = GPT2Config(embed_dropout=0.1, attn_dropout=0.2, resid_dropout=0.3)
    hf = hf_config_from_engine(config)
    assert (hf["embd_pdrop"], hf["attn_pdrop"], hf["resid_pdrop"]) == (0.1, 0.2, 0.3)
    assert config_from_hf(hf, "float32") == config
    del hf["attn_pdrop"]  # transformers' default, 0.1, as GPT2Config(...) would read it
    assert config_from_hf(hf, "float32").attn_dropout == 0.1


def test_each_step_and_part_draws_its_own_masks():
    draws = {(s, p): training_rng(7, s, p).random(4).tobytes() for s in (1, 2) for p in (0, 1)}
    assert len(set(draws.values())) == 4
    assert training_rng(7, 2, 1).random(4).tobytes() == draws[(2, 1)]  # resumed: the same
    assert training_rng(8, 2, 1).random(4).tobytes() != draws[(2, 1)]  # another seed


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((-1, 0), "seed must be a non-negative int, got -1"),
        ((7, 0.5), "step must be a non-negative int, got 0.5"),
        ((7, 0, None), "part must be a non-negative int, got None"),
    ],
)
def test_a_masks_generator_refuses_what_numpy_would_refuse_without_a_name(args, words):
    with pytest.raises(InputError, match=re.escape(words)):
        training_rng(*args)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_loop_draws_each_steps_masks_from_its_seed_step_and_part(monkeypatch, accumulate):
    """training_rng(seed, step, part), as the README tells a loop of its own to draw them:
    part 0 in one process, parts 0 .. K - 1 over K micro-batches."""
    from numpy_engine import train
    from numpy_engine.configs import CharTrainConfig

    states, loss_and_grads = [], ne.MiniGPT.loss_and_grads

    def recorded(self, idx, targets, dropout_rng=None):
        states.append(dropout_rng.bit_generator.state["state"])
        return loss_and_grads(self, idx, targets, dropout_rng)

    monkeypatch.setattr(ne.MiniGPT, "loss_and_grads", recorded)
    cfg = CharTrainConfig(steps=3, batch_size=4, context=8, dropout=0.1, seed=5)
    parallel = DataParallel(OneProcess(), accumulate) if accumulate > 1 else None
    train.run_task(cfg, None, None, parallel=parallel)
    keys = [(step, part) for step in (1, 2, 3) for part in range(accumulate)]
    assert states == [training_rng(5, s, p).bit_generator.state["state"] for s, p in keys]
    if accumulate == 1:  # the README's and the example's call, without a part
        assert states == [training_rng(5, s).bit_generator.state["state"] for s in (1, 2, 3)]


def test_a_run_config_refuses_a_rate_of_one_and_takes_zero():
    from numpy_engine.configs import CharTrainConfig, SequenceTrainConfig
    from numpy_engine.loop import check_run_config

    for run in (CharTrainConfig(), SequenceTrainConfig()):
        check_run_config(dataclasses.replace(run, dropout=0.0))
        with pytest.raises(InputError, match=r"dropout must be a number in \[0, 1\), got 1.0"):
            check_run_config(dataclasses.replace(run, dropout=1.0))


def test_each_rank_and_micro_batch_of_a_step_is_a_part_of_its_own():
    """Part = rank * K + micro-batch: rank 1 of 2 at K = 2 draws parts 2 and 3."""

    class SecondOfTwo(OneProcess):
        rank, size = 1, 2

    model, _ = small_gpt(resid_dropout=0.1)
    batch = ne.MiniGPT.example_batch(model.config, np.random.default_rng(1), 8, 10)
    parts = []

    def local_step(micro, part):
        parts.append(part)
        return model.loss_and_grads(*micro, training_rng(7, 1, part))

    DataParallel(SecondOfTwo(), accumulate=2).gradient(model, batch, local_step)
    assert parts == [2, 3]


def train(*args: str) -> None:
    assert cli.main(["train", *args, "--quiet"]) == 0


def test_a_run_with_dropout_resumes_bit_for_bit(tmp_path, capsys):
    """Step 7's masks are keyed by the step, so a run stopped after 6 and resumed to 12
    ends with the weights of a run of 12 at once; a run without dropout ends elsewhere."""
    common = ["char-lm", "--dropout", "0.2", "--batch-size", "4", "--context", "8"]
    train(*common, "--steps", "6", "--out", str(tmp_path / "halves"))
    train("--resume", str(tmp_path / "halves"), "--steps", "12")
    train(*common, "--steps", "12", "--out", str(tmp_path / "whole"))
    train(*common[:1], *common[3:], "--steps", "12", "--out", str(tmp_path / "none"))
    capsys.readouterr()
    halves, whole, none = (load_checkpoint(tmp_path / name) for name in ("halves", "whole", "none"))
    assert halves.model.config.resid_dropout == 0.2 and none.model.config.resid_dropout == 0
    assert np.array_equal(halves.model.flat, whole.model.flat)
    assert not np.array_equal(none.model.flat, whole.model.flat)
    assert cli.main(["train", "--resume", str(tmp_path / "halves"), "--dropout", "0.3"]) == 2
    assert "--dropout 0.3 conflicts with the checkpoint's dropout=0.2" in capsys.readouterr().err


def test_a_copy_run_keeps_its_rate_and_a_rate_of_one_is_refused(tmp_path, capsys):
    train("copy", "--dropout", "0.1", "--steps", "2", "--out", str(tmp_path / "copy"))
    config = load_checkpoint(tmp_path / "copy").model.config
    assert (config.embed_dropout, config.attn_dropout, config.resid_dropout) == (0.1,) * 3
    with pytest.raises(SystemExit) as stopped:  # argparse's refusal of the flag itself
        cli.main(["train", "char-lm", "--dropout", "1"])
    assert stopped.value.code == 2
    assert "argument --dropout: must be at least 0 and below 1, got 1" in capsys.readouterr().err


def test_fine_tuning_sets_an_imported_models_rate(tmp_path, capsys):
    """--dropout over --init: the rates the fine-tuned checkpoint keeps (and export-hf
    writes); without it, the imported model's own."""
    train("char-lm", "--steps", "2", "--out", str(tmp_path / "start"))
    train(
        "lm",
        "--init",
        str(tmp_path / "start"),
        "--steps",
        "2",
        "--context",
        "8",
        "--dropout",
        "0.15",
        "--out",
        str(tmp_path / "tuned"),
    )
    capsys.readouterr()
    config = load_checkpoint(tmp_path / "tuned").model.config
    assert (config.embed_dropout, config.attn_dropout, config.resid_dropout) == (0.15,) * 3
    result = json.loads((tmp_path / "tuned" / "result.json").read_text())
    assert result["steps"] == 2
