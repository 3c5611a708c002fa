"""Decoding: greedy for the encoder-decoder, greedy and sampled for MiniGPT."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine.checks import InputError
from numpy_engine.generate import (
    continuation,
    generate,
    greedy_decode,
    next_token_probabilities,
    sample_next,
)
from numpy_engine.models.base import RerunDecoder
from numpy_engine.tasks import EOS, PAD

PROBS = np.array([[0.5, 0.3, 0.15, 0.05]])  # one row of next-token probabilities, in order


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


class ScriptedGPT(ne.MiniGPT):
    """Continues every prompt of one token with a fixed script per row (the rerun decoder)."""

    def __init__(self, script: np.ndarray, eos_id: int | None) -> None:
        super().__init__(ne.GPTConfig(n_layers=1, max_len=16, eos_id=eos_id))
        self.script = script  # (B, steps)

    def decoder(self, prompt, use_cache=True):
        return RerunDecoder(self, prompt)

    def forward(self, idx):
        t = idx.shape[1] - 1  # tokens generated so far
        logits = np.zeros((*idx.shape, self.config.vocab_size))
        logits[np.arange(len(idx)), -1, self.script[:, t]] = 1.0
        return logits, None


class CountingAppends:
    """A model's decoder, counting the tokens fed back to it (each a step of the model)."""

    def __init__(self, decoder) -> None:
        self.decoder, self.appends = decoder, 0

    def next_logits(self):
        return self.decoder.next_logits()

    def append(self, next_ids) -> None:
        self.appends += 1
        self.decoder.append(next_ids)

    @property
    def ids(self):
        return self.decoder.ids


def counting(model):
    """model, whose decoder() returns a CountingAppends kept as model.counted."""
    build = model.decoder

    def decoder(inputs, use_cache=True):
        model.counted = CountingAppends(build(inputs, use_cache))
        return model.counted

    model.decoder = decoder
    return model


def test_generate_stops_when_every_row_has_produced_eos_and_repeats_it():
    script = np.array([[5, 2, 7, 7], [6, 8, 2, 9]])
    out = generate(ScriptedGPT(script, eos_id=2), np.array([[1], [1]]), max_new_tokens=4)
    assert out.tolist() == [[1, 5, 2, 2], [1, 6, 8, 2]]  # stopped after the last row's EOS
    script = np.array([[5, 2, 7, 7], [6, 8, 9, 9]])  # the second row never ends
    out = generate(ScriptedGPT(script, eos_id=2), np.array([[1], [1]]), max_new_tokens=4)
    assert out.tolist() == [[1, 5, 2, 2, 2], [1, 6, 8, 9, 9]]
    out = generate(ScriptedGPT(script, eos_id=None), np.array([[1], [1]]), max_new_tokens=4)
    assert out.tolist() == [[1, 5, 2, 7, 7], [1, 6, 8, 9, 9]]  # no eos_id: never stops early


def test_decoding_runs_no_step_after_the_last_token():
    """n new tokens feed n - 1 of them back: the last one needs no logits after it."""
    gpt = counting(ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0))
    assert generate(gpt, np.array([1, 4]), 5).shape == (1, 7) and gpt.counted.appends == 4
    copier = counting(ScriptedSeq2Seq(np.full((1, 6), 5)))  # never emits EOS
    assert greedy_decode(copier, np.array([[4, 5]]), 5, use_cache=False).shape == (1, 5)
    assert copier.counted.appends == 4


def test_greedy_decode_stops_at_eos_and_pads_finished_rows():
    script = np.array([[5, 2, 7, 7], [6, 8, 9, 2], [2, 4, 4, 4]])
    out = greedy_decode(ScriptedSeq2Seq(script), np.array([[4, 5, 6]] * 3), 4, use_cache=False)
    assert out.tolist() == [[5, EOS, PAD, PAD], [6, 8, 9, EOS], [EOS, PAD, PAD, PAD]]
    # every row done after two steps: decoding stops there (one token fed back), and the
    # steps not taken are PAD too
    copier = counting(ScriptedSeq2Seq(script[[0, 2]]))
    out = greedy_decode(copier, np.array([[4, 5, 6]] * 2), 4, use_cache=False)
    assert out.tolist() == [[5, EOS, PAD, PAD], [EOS, PAD, PAD, PAD]]
    assert copier.counted.appends == 1


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


def test_temperature_sharpens_and_flattens_the_distribution():
    logits = np.log(PROBS)
    np.testing.assert_allclose(next_token_probabilities(logits, 1.0), PROBS)
    hot = next_token_probabilities(logits, 100.0)
    assert np.ptp(hot) < 0.01  # a high temperature flattens the distribution
    cold = next_token_probabilities(logits + 1000.0, 0.5)  # exp(2000) would overflow
    squared = PROBS**2  # temperature 1/2: p^2, renormalized
    np.testing.assert_allclose(cold, squared / squared.sum())


def test_top_k_keeps_the_k_most_likely_tokens():
    logits = np.log(PROBS)
    np.testing.assert_allclose(
        next_token_probabilities(logits, 1.0, top_k=2), [[0.625, 0.375, 0, 0]]
    )
    # top-k of the tempered logits: at temperature 1/2 the two kept are p^2, renormalized
    kept = np.array([[0.25, 0.09, 0, 0]]) / 0.34
    np.testing.assert_allclose(next_token_probabilities(logits, 0.5, top_k=2), kept)
    every_token = next_token_probabilities(logits, 1.0)
    for top_k in (4, 9):  # the whole vocabulary, or more: every token kept
        np.testing.assert_array_equal(
            next_token_probabilities(logits, 1.0, top_k=top_k), every_token
        )


def test_top_p_keeps_the_most_likely_tokens_up_to_that_mass():
    logits = np.log(PROBS)
    np.testing.assert_allclose(
        next_token_probabilities(logits, 1.0, top_p=0.7), [[0.625, 0.375, 0, 0]]
    )
    np.testing.assert_allclose(next_token_probabilities(logits, 1.0, top_p=0.5), [[1.0, 0, 0, 0]])
    # the same over logits in another order: tokens are ranked by probability, not place
    backwards = logits[:, ::-1]
    np.testing.assert_allclose(
        next_token_probabilities(backwards, 1.0, top_p=0.7), [[0, 0, 0.375, 0.625]]
    )
    # top_p 1 filters nothing, as transformers' top_p=1.0: not even tokens whose more likely
    # ones' mass rounds to 1 (here the first's, 1 / (1 + 2e-22): a filter would drop the others)
    tiny = np.array([[0.0, -50.0, -100.0]])
    unfiltered = next_token_probabilities(tiny, 1.0)
    assert (unfiltered > 0).all()
    np.testing.assert_array_equal(next_token_probabilities(tiny, 1.0, top_p=1.0), unfiltered)


def test_sampling_is_seeded_and_top_k_1_or_a_tiny_top_p_is_greedy():
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1, max_len=8), seed=0)
    prompt = np.array([1, 2, 3])
    greedy = generate(model, prompt, 12)
    assert greedy.shape == (1, 15) and (greedy[0, :3] == prompt).all()
    assert not np.array_equal(generate(model, prompt, 12, temperature=1.0), greedy)
    np.testing.assert_array_equal(generate(model, prompt, 12, temperature=1.0, top_k=1), greedy)
    # top_p below every token's probability keeps the likeliest token alone
    np.testing.assert_array_equal(generate(model, prompt, 12, temperature=1.0, top_p=1e-6), greedy)
    a = generate(model, prompt, 12, temperature=1.5, seed=4)
    np.testing.assert_array_equal(a, generate(model, prompt, 12, temperature=1.5, seed=4))
    assert not np.array_equal(a, generate(model, prompt, 12, temperature=1.5, seed=5))
    # a draw keeps to top_p: of PROBS, top_p 1/2 leaves the first alone
    rows = np.log(np.repeat(PROBS, 100, axis=0))
    drawn = sample_next(rows, np.random.default_rng(0), temperature=1.0, top_p=0.5)
    assert drawn.tolist() == [0] * 100


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
        ({"top_p": "0.9"}, "top_p must be a number, got str"),
        ({"temperature": "1"}, "temperature must be a number, got str"),
    ],
)
def test_bad_sampling_settings(kwargs, message):
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0)
    with pytest.raises(ValueError, match=message):
        generate(model, np.array([1]), 3, **kwargs)
    with pytest.raises(ValueError, match=message):  # when called, before its first token
        continuation(model, np.array([1]), 3, **kwargs)


@pytest.mark.parametrize("name", ["max_new_tokens", "temperature", "top_k", "top_p"])
def test_a_bool_setting_is_refused_by_name_though_python_counts_true_as_1(name):
    """True is an int of 1 to Python, in range for each of these; refused as a bool."""
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0)
    settings = {"max_new_tokens": 3, "temperature": 1.0} | {name: True}
    with pytest.raises(InputError, match=rf"^{name} must be .*(bool|True)$"):
        generate(model, np.array([1]), **settings)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0", None])
def test_a_seed_default_rng_would_refuse_or_draw_afresh_is_refused_by_name(seed):
    """Before the first step: continuation's checks run when it is called, not at its first
    token (NumPy's own refusal names no argument; None would draw a new seed each run)."""
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0)
    words = f"seed must be a non-negative int, got {seed!r}"
    with pytest.raises(InputError, match=re.escape(words)):
        generate(model, np.array([1]), 3, temperature=1.0, seed=seed)
    with pytest.raises(InputError, match=re.escape(words)):
        continuation(model, np.array([1]), 3, temperature=1.0, seed=seed)
    with pytest.raises(InputError, match=re.escape(words)):
        ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=seed)
    assert generate(model, np.array([1]), 2, temperature=1.0, seed=np.int64(2**40)).shape == (1, 3)


def test_a_prompt_given_as_a_list_is_read_as_the_array_it_spells():
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1), seed=0)
    expected = generate(model, np.array([[1, 4]]), 3)
    np.testing.assert_array_equal(generate(model, [1, 4], 3), expected)
    np.testing.assert_array_equal(generate(model, [[1, 4]], 3), expected)


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
