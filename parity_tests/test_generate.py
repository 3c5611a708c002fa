"""Decoding: greedy for the encoder-decoder, greedy and sampled for MiniGPT."""

from __future__ import annotations

import math

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine.generate import generate, greedy_decode, next_token_probabilities, sample_next
from numpy_engine.tasks import EOS, PAD


class ScriptedSeq2Seq(ne.Seq2SeqTransformer):
    """Emits a fixed script per row, so where decoding stops is known exactly."""

    def __init__(self, script: np.ndarray) -> None:
        super().__init__(ne.Seq2SeqConfig())
        self.script = script  # (B, steps)

    def decode(self, memory, source, decoder_input):
        t = decoder_input.shape[1] - 1
        logits = np.zeros((len(source), decoder_input.shape[1], 12))
        logits[np.arange(len(source)), -1, self.script[:, t]] = 1.0
        return logits, None


def test_greedy_decode_stops_at_eos_and_pads_finished_rows():
    script = np.array([[5, 2, 7, 7], [6, 8, 9, 2], [2, 4, 4, 4]])
    out = greedy_decode(ScriptedSeq2Seq(script), np.array([[4, 5, 6]] * 3), 4, use_cache=False)
    assert out.tolist() == [[5, EOS, PAD, PAD], [6, 8, 9, EOS], [EOS, PAD, PAD, PAD]]


def test_greedy_decode_respects_max_new_tokens():
    script = np.full((2, 6), 5)  # never emits EOS
    out = greedy_decode(ScriptedSeq2Seq(script), np.array([[4], [5]]), 3, use_cache=False)
    assert out.shape == (2, 3) and (out == 5).all()
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        greedy_decode(ScriptedSeq2Seq(script), np.array([[4]]), max_new_tokens=0)


def test_greedy_decode_matches_argmax_of_the_full_forward():
    model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=3)
    source = np.array([[4, 5, 6], [7, 0, 0]])
    out = greedy_decode(model, source, max_new_tokens=3)
    decoder_input = np.concatenate([np.ones((2, 1), dtype=int), out[:, :2]], axis=1)
    logits, _ = model.forward(source, decoder_input)
    still_running = np.cumsum(out == EOS, axis=1) - (out == EOS) == 0
    assert (logits.argmax(-1)[still_running] == out[still_running]).all()


def test_top_k_and_top_p_filter_the_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    np.testing.assert_allclose(next_token_probabilities(logits, 1.0), [[0.5, 0.3, 0.15, 0.05]])
    np.testing.assert_allclose(
        next_token_probabilities(logits, 1.0, top_k=2), [[0.625, 0.375, 0, 0]]
    )
    np.testing.assert_allclose(
        next_token_probabilities(logits, 1.0, top_p=0.7), [[0.625, 0.375, 0, 0]]
    )
    np.testing.assert_allclose(next_token_probabilities(logits, 1.0, top_p=0.5), [[1.0, 0, 0, 0]])
    hot = next_token_probabilities(logits, 100.0)
    assert np.ptp(hot) < 0.01  # a high temperature flattens the distribution
    cold = next_token_probabilities(logits + 1000.0, 0.5)  # exp(2000) would overflow
    squared = np.array([[0.5, 0.3, 0.15, 0.05]]) ** 2  # temperature 1/2: p^2, renormalized
    np.testing.assert_allclose(cold, squared / squared.sum())


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1, max_len=8), seed=0)
    prompt = np.array([1, 2, 3])
    greedy = generate(model, prompt, 12)
    assert greedy.shape == (1, 15) and (greedy[0, :3] == prompt).all()
    np.testing.assert_array_equal(generate(model, prompt, 12, temperature=1.0, top_k=1), greedy)
    a = generate(model, prompt, 12, temperature=1.5, seed=4)
    np.testing.assert_array_equal(a, generate(model, prompt, 12, temperature=1.5, seed=4))
    assert not np.array_equal(a, generate(model, prompt, 12, temperature=1.5, seed=5))


def test_generation_slides_its_context_window_past_max_len():
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1, max_len=4), seed=0)
    out = generate(model, np.arange(6) % 13, max_new_tokens=5)  # prompt already past max_len
    assert out.shape == (1, 11)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1.0}, "temperature must be finite and >= 0"),
        ({"temperature": math.inf}, "temperature must be finite and >= 0"),
        ({"temperature": math.nan}, "temperature must be finite and >= 0"),
        ({"top_k": 0}, "top_k must be"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"top_p": 0.0}, "top_p must be in"),
    ],
)
def test_bad_sampling_settings(kwargs, message):
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0)
    with pytest.raises(ValueError, match=message):
        generate(model, np.array([1]), 3, **kwargs)


def test_each_decoding_refuses_the_other_kind_of_model_and_a_negative_count():
    gpt = ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0)
    copier = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(), seed=0)
    assert generate(gpt, np.array([1, 4]), 0).tolist() == [[1, 4]]  # none: the prompt
    with pytest.raises(ValueError, match="max_new_tokens must be at least 0, got -1"):
        generate(gpt, np.array([1]), -1)
    with pytest.raises(ValueError, match="generate continues a prompt; a seq2seq model reads"):
        generate(copier, np.array([4, 5]), 3)
    with pytest.raises(ValueError, match="greedy_decode reads a source; a gpt model continues"):
        greedy_decode(gpt, np.array([[4, 5]]), 3)


def test_the_defaults_are_greedy_seed_0_and_four_tokens():
    gpt = ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0)
    logits = np.random.default_rng(0).standard_normal((3, 13))
    assert sample_next(logits, np.random.default_rng(1)).tolist() == logits.argmax(-1).tolist()
    sampled = generate(gpt, np.array([1, 4]), 6, temperature=1.0)
    assert np.array_equal(sampled, generate(gpt, np.array([1, 4]), 6, temperature=1.0, seed=0))
    assert not np.array_equal(sampled, generate(gpt, np.array([1, 4]), 6, temperature=1.0, seed=1))
    copier = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(), seed=0)
    assert greedy_decode(copier, np.array([[4, 5, 6]])).shape == (1, 4)
