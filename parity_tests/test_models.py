"""Both whole models against their torch_reference twins: logits, loss, every gradient.

float64 within 1e-10 normwise; float32 within the rounding bound of crosscheck/compare.py
against a float64 golden run on the same weights. Padded batches; Hypothesis draws configs
and seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given

import numpy_engine as ne
from crosscheck.compare import float32_checks
from crosscheck.convert import grads_from_torch, tensor, torch_model_for
from parity_tests.helpers import (
    assert_all_close_float64,
    assert_float32_within_bound,
    engine_results,
    float32_golden,
    folding_every_layernorm,
)
from parity_tests.strategies import (
    SMALLEST_GPT,
    SMALLEST_SEQ2SEQ,
    GPTCase,
    Seq2SeqCase,
    gpt_cases,
    padded_ids,
    randomized_model,
    seq2seq_cases,
)


def torch_results(module, batch: tuple, dlogits: np.ndarray) -> dict[str, np.ndarray]:
    inputs = [tensor(x) for x in batch]
    logits = module(*inputs[:-1])
    logits.backward(tensor(dlogits).to(logits.dtype))
    upstream = grads_from_torch(module)
    module.zero_grad()
    loss = module.loss(*inputs)
    loss.backward()
    grads = grads_from_torch(module)
    module.zero_grad()
    return (
        {"logits": logits.detach().numpy(), "loss": loss.detach().numpy()}
        | {f"dloss/d{key}": g for key, g in grads.items()}
        | {f"dlogits-weighted d{key}": g for key, g in upstream.items()}
    )


def check_model(name: str, model, batch: tuple, rng: np.random.Generator) -> None:
    logits, _ = model.forward(*batch[:-1])
    dlogits = rng.standard_normal(logits.shape)  # random, never all ones
    golden = torch_results(torch_model_for(model), batch, dlogits)
    assert_all_close_float64(name, engine_results(model, batch, dlogits), golden)
    if model.config.d_model >= 3:  # over 2 channels layernorm's gradients are rounding noise
        engine32, _ = model_float32_checks(model, batch, dlogits, rng)
        assert_float32_within_bound(name, engine32)


def model_float32_checks(model, batch: tuple, dlogits: np.ndarray, rng) -> tuple:
    """(the engine's, torch's) float32 checks: each float32 run against a float64 golden run
    with the same float32-rounded weights and upstream gradient, under one bound."""
    model32, dlogits32, golden = float32_golden(model, batch, dlogits, rng)
    ours32 = engine_results(model32, batch, dlogits32)
    torch32 = torch_results(torch_model_for(model32), batch, dlogits32)
    return (
        float32_checks(ours32, *golden),
        float32_checks(torch32, *golden),
    )


@given(case=seq2seq_cases())
@example(case=SMALLEST_SEQ2SEQ)
def test_seq2seq_matches_torch(case):
    model, rng = randomized_model(case)
    check_model("Seq2SeqTransformer", model, case.batch, rng)


@given(case=gpt_cases())
@example(case=SMALLEST_GPT)
def test_gpt_matches_torch(case):
    model, rng = randomized_model(case)
    check_model("MiniGPT", model, case.batch, rng)


FOLDED_CASES = [
    Seq2SeqCase(
        ne.Seq2SeqConfig(vocab_size=7, d_model=6, n_heads=2, d_ff=5, dtype="float64"),
        source=np.array([[3, 4, 5], [6, 3, 0]]),
        decoder_input=np.array([[1, 3, 4, 5], [1, 6, 3, 0]]),
        target=np.array([[3, 4, 5, 2], [6, 3, 2, 0]]),
        seed=1,
    ),
    GPTCase(
        ne.GPTConfig(
            vocab_size=7, d_model=6, n_heads=2, d_ff=5, n_layers=2, max_len=4, dtype="float64"
        ),
        idx=np.array([[1, 2, 3, 4], [5, 6, 0, 1]]),
        targets=np.array([[2, 3, 4, 5], [6, 0, -100, -100]]),
        seed=1,
    ),
]


@pytest.mark.parametrize("case", FOLDED_CASES, ids=["seq2seq", "gpt"])
def test_models_with_every_layernorm_folded_match_torch(case):
    """Every layernorm's scale and shift folded into the projection it feeds (blocks.normed;
    at training sizes it folds by its rule), randomized so that neither is trivial."""
    model, rng = randomized_model(case)
    with folding_every_layernorm():
        check_model(f"{model.kind}, layernorms folded", model, case.batch, rng)


def test_default_models_at_their_own_init_match_torch():
    """The shipped defaults, unrandomized: the weights users actually start from."""
    rng = np.random.default_rng(0)
    seq2seq = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=0)
    source = np.array([[4, 5, 6], [7, 8, 0], [9, 0, 0]])
    decoder_input = np.array([[1, 4, 5, 6], [1, 7, 8, 0], [1, 9, 0, 0]])
    target = np.array([[4, 5, 6, 2], [7, 8, 2, 0], [9, 2, 0, 0]])
    check_model("default Seq2SeqTransformer", seq2seq, (source, decoder_input, target), rng)
    gpt = ne.MiniGPT(ne.GPTConfig(dtype="float64"), seed=0)
    idx = rng.integers(0, 13, size=(4, 32))
    targets = np.roll(idx, -1, axis=1)
    targets[:, -1] = -100
    check_model("default MiniGPT", gpt, (idx, targets), rng)


def test_gpt_past_two_query_blocks_matches_torch():
    """140 positions, past two attention_blocks.QUERY_BLOCKs of 64: each causal attention runs by
    blocks of queries at the size it takes in training (test_query_blocks.py forces small
    ones), against the twin's, whose softmax sees every key a query. Padding targets too."""
    from numpy_engine.attention_blocks import QUERY_BLOCK

    T = 140
    assert T > 2 * QUERY_BLOCK
    config = ne.GPTConfig(
        vocab_size=7, d_model=6, n_heads=2, d_ff=5, n_layers=2, max_len=T, dtype="float64"
    )
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 7, size=(2, T))
    targets = np.roll(idx, -1, axis=1)
    targets[1, -40:] = -100
    model, rng = randomized_model(GPTCase(config, idx=idx, targets=targets, seed=3))
    _, cache = model.forward(idx)
    assert all(block.attn.attention.query_blocks for block in cache.blocks)
    check_model("MiniGPT by query blocks", model, (idx, targets), rng)


HEAD_RULES = {  # (NARROW_HEAD, ONE_HEAD_WIDTH) for the 3-wide heads of the test below
    "every head a block": (32, 16),
    "one head a block": (32, 2),
    "wide heads": (2, 2),
}


@pytest.mark.parametrize("rule", list(HEAD_RULES))
def test_seq2seq_past_a_rows_group_bytes_by_query_blocks_matches_torch(monkeypatch, rule):
    """370 source and 371 target positions over 2 heads: a batch row's scores pass
    attention_blocks.GROUP_BYTES (1 MiB) in float32 and float64, so every attention, the encoder's,
    the decoder's causal & padding and the cross-attention, runs by blocks of queries at the
    sizes training takes, each block's keys ending at the last one its queries see: against
    the twin's, whose softmax sees every key. Rows padded at different lengths. The heads'
    width counted under each rule of query_blocks: below ONE_HEAD_WIDTH, every attention by
    blocks of both heads; at it, the encoder and the cross-attention (whose blocks all stop
    at S) by blocks of one head; counted wide too (past NARROW_HEAD), the decoder's blocks of
    both heads only where they skip enough keys (WIDE_KEPT): in float64, not float32."""
    from numpy_engine import attention, attention_blocks

    found = []  # each attention's blocks, as query_blocks chose them
    choose = attention.query_blocks

    def recorded(*args):
        found.append(choose(*args))
        return found[-1]

    monkeypatch.setattr(attention, "query_blocks", recorded)
    narrow_head, one_head_width = HEAD_RULES[rule]
    monkeypatch.setattr(attention_blocks, "NARROW_HEAD", narrow_head)
    monkeypatch.setattr(attention_blocks, "ONE_HEAD_WIDTH", one_head_width)
    S, lengths = 370, [370, 301]
    config = ne.Seq2SeqConfig(vocab_size=7, d_model=6, n_heads=2, d_ff=5, dtype="float64")
    rng = np.random.default_rng(4)
    source = padded_ids(rng, lengths, S, 7)
    target = np.concatenate([source, np.zeros((2, 1), np.int64)], axis=1)
    target[[0, 1], lengths] = config.eos_id  # (2, 371): each row's ids, then its end
    decoder_input = np.concatenate([np.full((2, 1), config.bos_id), source], axis=1)
    model, rng = randomized_model(Seq2SeqCase(config, source, decoder_input, target, seed=4))
    model.forward(source, decoder_input)
    encoder, decoder, cross = found
    assert decoder.stops == (176, 352, 371)  # causal: each block's end (176 queries)
    assert decoder.heads == attention_blocks.ALL_HEADS
    if rule == "every head a block":  # the encoder's and the cross-attention's keys end at S
        assert encoder.stops == cross.stops == (S,) * 3
        assert encoder.heads == cross.heads == attention_blocks.ALL_HEADS
    else:  # one head's scores: 354 float64 queries a block
        assert encoder.stops == cross.stops == (S, S) and encoder.rows[0] == slice(0, 354)
        assert encoder.heads == cross.heads == (slice(0, 1), slice(1, 2))
    check_model("Seq2SeqTransformer by query blocks", model, (source, decoder_input, target), rng)
    float32_blocks = [blocks for blocks in found[-3:] if blocks is not None]
    # float32: 353-354 queries a block of both heads, two blocks (the decoder's then keep 95%
    # of its scores), or one block of a head's 370
    rows = {"every head a block": [2, 2, 2], "one head a block": [1, 2, 1], "wide heads": [1, 1]}
    assert [len(blocks.rows) for blocks in float32_blocks] == rows[rule]


@pytest.mark.parametrize("kind", [ne.MiniGPT, ne.Seq2SeqTransformer])
def test_with_dtype_is_the_same_model_cast_and_the_default_seed_is_0(kind):
    model = kind(kind.config_class(), seed=5)
    wide = model.with_dtype("float64")
    assert type(wide) is kind and wide.config.dtype == "float64" and wide.flat.dtype == np.float64
    assert list(wide.params) == list(model.params)
    for key, value in model.params.items():
        assert np.array_equal(wide.params[key], value.astype(np.float64)), key
    assert np.array_equal(kind(kind.config_class()).flat, kind(kind.config_class(), seed=0).flat)


@pytest.mark.parametrize("kind", [ne.MiniGPT, ne.Seq2SeqTransformer])
def test_the_references_defaults_are_the_engines(kind):
    """torch_reference's model built without arguments is the engine's default config's."""
    import inspect

    import torch_reference.models as reference

    twin = getattr(reference, kind.torch_twin)
    defaults = {
        name: parameter.default for name, parameter in inspect.signature(twin).parameters.items()
    }
    config = kind.config_class()
    assert defaults == {name: getattr(config, name) for name in defaults}


def test_the_reference_names_the_first_query_that_sees_no_key():
    import torch

    from torch_reference.modules import attention

    q = k = v = torch.ones((1, 2, 3, 4))
    visible = torch.ones((1, 2, 3, 3), dtype=torch.bool)
    visible[0, 0, 1] = visible[0, 1, 2] = False
    with pytest.raises(ValueError, match=r"batch row 0, position 1 \(head 0\) has no visible"):
        attention(q, k, v, visible)


def test_the_references_attention_with_dropout_and_no_mask_sees_every_key(monkeypatch):
    """The reference's attention under dropout is written out instead of the fused kernel;
    with no mask, every key is visible: NumPy's softmax times the same kept entries."""
    import torch
    import torch.nn.functional as F

    from torch_reference.modules import attention

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 3, 4)) for _ in range(3))  # (B, H, T, hs)
    kept = (rng.random((2, 2, 3, 3)) < 0.5) / 0.5  # a dropout mask at rate 0.5, scaled
    monkeypatch.setattr(F, "dropout", lambda x, p, training: x * torch.from_numpy(kept))
    out = attention(*(torch.from_numpy(a) for a in (q, k, v)), None, dropout_p=0.5)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(4)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    ours = {"out": (weights * kept) @ v}
    assert_all_close_float64("reference attention, dropout, no mask", ours, {"out": out.numpy()})
