"""Each model kind starts from the distribution its _init_params names, tensor by tensor:
GPT-2 against the one transformers' GPT2LMHeadModel draws, the copy model against
torch_reference's PyTorch defaults, MiniGPT against GPT-2's N(0, 0.02). (Every other model
test redraws the weights first, so that no layer sits at its init: only these see it.)

A tensor drawn at random is compared with its witness by three statistics: mean (about 0),
standard deviation and kurtosis (3 for a normal distribution, 1.8 for a uniform one). The
seeds are fixed, so each check is exact; its bound is six standard errors of the
statistic, so another seed would pass as well, and each tensor holds at least 8K entries,
so that a wrong scale (GPT-2's residual projections take 0.02 / sqrt(2 n_layers)) or a
wrong family is far outside it.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from transformers import GPT2Config as HFConfig
from transformers import GPT2LMHeadModel

import torch_reference
from numpy_engine.checks import InputError
from numpy_engine.hf import engine_params_from_hf, hf_config_from_engine
from numpy_engine.models import GPT2, GPT2Config, GPTConfig, MiniGPT, Seq2SeqConfig
from numpy_engine.models import Seq2SeqTransformer as EngineSeq2Seq
from numpy_engine.models.gpt2 import RESIDUAL_PROJECTIONS

SIZES = dict(d_model=96, n_heads=4, d_ff=384, dtype="float64")  # 96 x 96: 9,216 entries
# The other sizes differ from d_model and from each other, so that one read for another shows.


def statistics(x: np.ndarray) -> tuple[float, float, float]:
    """(mean / std, std, kurtosis E[(x - mean)^4] / std^4) of x's entries."""
    x = x.ravel()
    centered = x - x.mean()
    std = math.sqrt(np.mean(centered**2))
    return x.mean() / std, std, np.mean(centered**4) / std**4


def assert_drawn_alike(key: str, ours: np.ndarray, witness: np.ndarray) -> None:
    """ours drawn from witness's distribution: a constant witness (zeros, ones) equal entry
    for entry; a random one with mean 0, the same std and the same kurtosis, each within
    six standard errors (a normal sample's: the largest of the two families here)."""
    assert ours.shape == witness.shape, f"{key}: shape {ours.shape}, witness {witness.shape}"
    if np.ptp(witness) == 0:
        assert np.array_equal(ours, witness), f"{key}: not {witness.flat[0]} everywhere"
        return
    n, m = ours.size, witness.size
    assert min(n, m) >= 8192, f"{key}: too few entries ({min(n, m)}) for these bounds"
    mean, std, kurtosis = statistics(ours)
    _, witness_std, witness_kurtosis = statistics(witness)
    assert abs(mean) < 6 / math.sqrt(n), f"{key}: mean {mean:.4f} std from 0"
    ratio_bound = 6 * math.sqrt(1 / (2 * n) + 1 / (2 * m))
    assert abs(std / witness_std - 1) < ratio_bound, f"{key}: std {std:.5g}, {witness_std:.5g}"
    kurtosis_bound = 6 * math.sqrt(24 / n + 24 / m)
    assert abs(kurtosis - witness_kurtosis) < kurtosis_bound, (
        f"{key}: kurtosis {kurtosis:.3f}, witness {witness_kurtosis:.3f}"
    )


def test_gpt2_starts_where_transformers_gpt2_starts():
    config = GPT2Config(vocab_size=128, n_layers=4, max_len=100, **SIZES)
    engine = GPT2(config, seed=0)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(HFConfig(**hf_config_from_engine(config)))
    state = {key: p.detach().double().numpy() for key, p in hf.named_parameters()}
    witness = engine_params_from_hf(state, config.n_layers)
    assert witness.keys() == engine.params.keys()
    for key, value in engine.params.items():
        assert_drawn_alike(key, value, witness[key])
    # the scale that tells the residual projections apart, in numbers: 0.02 / sqrt(2 n_layers)
    last = config.n_layers - 1
    for key in RESIDUAL_PROJECTIONS:
        _, std, _ = statistics(engine.params[f"blocks.{last}.{key}"])
        assert abs(std / (0.02 / math.sqrt(2 * config.n_layers)) - 1) < 0.07, (key, std)


def test_copy_model_starts_from_pytorchs_defaults_with_zero_biases():
    """Weights as nn.Linear draws them, U(+-1/sqrt(fan_in)), and the embedding as
    nn.Embedding(padding_idx) does, N(0, 1) with the padding row 0; the biases start at 0
    (nn.Linear draws them too: the engine's choice), layernorms at 1 and 0."""
    sizes = dict(SIZES, vocab_size=112, n_encoder_layers=2, n_decoder_layers=1)
    engine = EngineSeq2Seq(Seq2SeqConfig(**sizes), seed=0)
    torch.manual_seed(0)
    module = torch_reference.Seq2SeqTransformer(
        **{key: value for key, value in sizes.items() if key != "dtype"}
    )
    witness = {key: t.detach().double().numpy() for key, t in module.state_dict().items()}
    assert witness.keys() == engine.params.keys()
    for key, value in engine.params.items():
        if key.endswith(".bias") and value.ndim == 1 and np.ptp(witness[key]) > 0:
            assert np.array_equal(value, np.zeros_like(value)), f"{key}: not 0"
        elif key == "embed.weight":
            assert not value[0].any(), "the padding row is not 0"
            assert_drawn_alike(key, value[1:], witness[key][1:])
        else:
            assert_drawn_alike(key, value, witness[key])
            if value.ndim == 2:  # a linear weight: within its uniform bound
                assert np.abs(value).max() <= 1 / math.sqrt(value.shape[1]), key


def test_minigpt_starts_from_gpt2s_normal_without_the_residual_scale():
    """N(0, 0.02) for the embeddings, every weight matrix and the head; biases 0,
    layernorms 1 and 0."""
    config = GPTConfig(vocab_size=128, n_layers=2, max_len=100, **SIZES)
    model = MiniGPT(config, seed=0)
    sizes = ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len", "activation")
    twin = torch_reference.MiniGPT(**{name: getattr(config, name) for name in sizes})
    shapes = {key: tuple(t.shape) for key, t in twin.state_dict().items()}
    assert {key: value.shape for key, value in model.params.items()} == shapes
    rng = np.random.default_rng(1)
    for key, value in model.params.items():
        if value.ndim == 2:
            assert_drawn_alike(key, value, rng.normal(0.0, 0.02, value.shape))
        else:  # a 1-D weight is a layernorm's gain
            assert_drawn_alike(key, value, np.full(value.shape, float(key.endswith("weight"))))


def test_the_gpt2_preset_is_transformers_gpt2_with_its_124439808_parameters():
    """GPT2Config.preset("gpt2"): the sizes of transformers' default GPT2Config (which are
    gpt2's), <|endoftext|> 50256 as its end, and any size changed on request."""
    preset, hf = GPT2Config.preset("gpt2"), HFConfig()
    sizes = preset.vocab_size, preset.max_len, preset.d_model, preset.n_layers, preset.n_heads
    assert sizes == (hf.vocab_size, hf.n_positions, hf.n_embd, hf.n_layer, hf.n_head)
    assert sizes == (50257, 1024, 768, 12, 12) and preset.d_ff == 4 * 768
    assert preset.eos_id == hf.eos_token_id == 50256
    assert preset.activation == "gelu" and hf.activation_function == "gelu_new"  # tanh form

    def parameters(V: int, P: int, C: int, L: int) -> int:
        """wte, wpe; a block: two layernorms 4C, q k v 3(C^2 + C), c_proj C^2 + C, the FFN's
        4C^2 + 4C and 4C^2 + C; ln_f 2C. The head is tied to wte: no parameters of its own."""
        return V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C

    small = GPT2(GPT2Config(vocab_size=5, max_len=3, d_model=4, n_heads=2, d_ff=16, n_layers=2))
    assert small.num_parameters() == parameters(5, 3, 4, 2)  # the formula is the engine's
    assert parameters(*sizes[:4]) == 124_439_808
    smaller = GPT2Config.preset("gpt2", n_layers=2, dtype="float64")
    assert (smaller.n_layers, smaller.dtype, smaller.d_model, smaller.eos_id) == (
        2,
        "float64",
        768,
        50256,
    )


@pytest.mark.parametrize(
    "kind, config",
    [
        (EngineSeq2Seq, Seq2SeqConfig(vocab_size=11, n_encoder_layers=2, **SIZES)),
        (MiniGPT, GPTConfig(vocab_size=11, n_layers=2, max_len=7, **SIZES)),
        (GPT2, GPT2Config(vocab_size=11, n_layers=2, max_len=7, **SIZES)),
    ],
    ids=["seq2seq", "minigpt", "gpt2"],
)
def test_a_model_made_from_weights_holds_them_and_draws_none(monkeypatch, kind, config):
    """Model.with_params, how a checkpoint, an import and with_dtype make a model: the
    weights given, in the parameter vector's order, as a model drawn and then loaded holds
    them; no initial weights drawn on the way (GPT-2's took 3-5 s at every read of a
    checkpoint); and weights of the wrong shape refused as load_params refuses them."""
    drawn = kind(config, seed=1)
    rng = np.random.default_rng(2)
    weights = {key: rng.standard_normal(value.shape) for key, value in drawn.params.items()}
    drawn.load_params(weights)

    def no_draws(*args, **kwargs):
        raise AssertionError("initial weights drawn for a model whose weights were given")

    monkeypatch.setattr(np.random, "default_rng", no_draws)
    made = kind.with_params(config, weights)
    assert list(made.params) == list(drawn.params) and np.array_equal(made.flat, drawn.flat)
    assert not any(np.shares_memory(made.flat, value) for value in weights.values())
    key = next(iter(weights))
    shape, short = weights[key].shape, weights[key][:-1]
    for value, got in ((short, short.shape), (short.tolist(), "list")):
        message = rf"^params\['{re.escape(key)}'\] must have shape {re.escape(str(shape))}, got "
        with pytest.raises(InputError, match=message + re.escape(str(got)) + "$"):
            kind.with_params(config, weights | {key: value})
