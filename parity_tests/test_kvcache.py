"""KV-cache decoding gives the same logits (1e-12, float64) and tokens as rerunning the prefix.

Both decoders are driven with the same ids, step by step: padded sources, rows that
feed PAD after finishing, and MiniGPT prompts that outgrow max_len (the window slides).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numpy_engine as ne
from crosscheck.compare import compare
from numpy_engine.generate import generate, greedy_decode
from parity_tests.helpers import record
from parity_tests.strategies import gpt_cases, randomize_params, seeds, seq2seq_cases

RTOL = 1e-12


def assert_same_logits(name: str, cached: np.ndarray, full: np.ndarray) -> None:
    c = compare(name, cached, full)
    record(f"kv cache {name}", c.rel)
    assert c.diff_norm <= RTOL * c.ref_norm, c.describe()


@given(case=seq2seq_cases(), steps=st.integers(1, 6), seed=seeds)
def test_seq2seq_cached_steps_match_the_full_prefix(case, steps, seed):
    model = ne.Seq2SeqTransformer(case.config, seed=case.seed)
    rng = np.random.default_rng(seed)
    randomize_params(model, rng)
    full = model.decoder(case.source, use_cache=False)
    cached = model.decoder(case.source, use_cache=True)
    finished = np.zeros(len(case.source), dtype=bool)
    for _ in range(steps):
        assert_same_logits("Seq2SeqTransformer", cached.next_logits(), full.next_logits())
        next_ids = rng.integers(1, case.config.vocab_size, len(case.source))  # EOS (2) likely
        next_ids = np.where(finished, 0, next_ids)  # finished rows feed PAD, as greedy_decode
        finished |= next_ids == 2
        full.append(next_ids)
        cached.append(next_ids)
    assert_same_logits("Seq2SeqTransformer", cached.next_logits(), full.next_logits())


@given(case=gpt_cases(), steps=st.integers(1, 12), seed=seeds)
def test_gpt_cached_steps_match_the_full_window(case, steps, seed):
    model = ne.MiniGPT(case.config, seed=case.seed)
    rng = np.random.default_rng(seed)
    randomize_params(model, rng)
    full, cached = model.decoder(case.idx, use_cache=False), model.decoder(case.idx)
    for _ in range(steps):  # often past max_len, so the window slides
        assert_same_logits("MiniGPT", cached.next_logits(), full.next_logits())
        next_ids = rng.integers(0, case.config.vocab_size, len(case.idx))
        full.append(next_ids)
        cached.append(next_ids)
    assert_same_logits("MiniGPT", cached.next_logits(), full.next_logits())


@given(case=seq2seq_cases())
def test_greedy_tokens_are_the_same_with_and_without_the_cache(case):
    model = ne.Seq2SeqTransformer(case.config, seed=case.seed)
    randomize_params(model, np.random.default_rng(case.seed))
    cached = greedy_decode(model, case.source, 6, use_cache=True)
    np.testing.assert_array_equal(cached, greedy_decode(model, case.source, 6, use_cache=False))


sampling = st.fixed_dictionaries(
    {
        "temperature": st.sampled_from([0.0, 0.7, 1.5]),
        "top_k": st.sampled_from([None, 2]),
        "top_p": st.sampled_from([None, 0.9]),
        "seed": seeds,
    }
)


@given(case=gpt_cases(), kwargs=sampling)
def test_sampled_tokens_are_the_same_with_and_without_the_cache(case, kwargs):
    model = ne.MiniGPT(case.config, seed=case.seed)
    randomize_params(model, np.random.default_rng(case.seed))
    cached = generate(model, case.idx, 10, use_cache=True, **kwargs)
    np.testing.assert_array_equal(cached, generate(model, case.idx, 10, use_cache=False, **kwargs))


def test_a_two_token_prompt_is_masked_causally_in_the_cached_decoder():
    """The cached decoder's prompt of 2 positions gets its causal mask: were the first to
    see the second, the second layer's keys and values, and so the logits, would differ
    from the full window's (the Hypothesis cases above need not draw this one)."""
    config = ne.GPTConfig(7, d_model=8, n_heads=2, d_ff=8, n_layers=2, max_len=8, dtype="float64")
    model = ne.MiniGPT(config, seed=0)
    randomize_params(model, np.random.default_rng(0))
    prompt = np.array([[3, 5]])
    full, cached = model.decoder(prompt, use_cache=False), model.decoder(prompt)
    for next_id in (1, 6):
        assert_same_logits("MiniGPT", cached.next_logits(), full.next_logits())
        full.append(np.array([next_id]))
        cached.append(np.array([next_id]))
    assert_same_logits("MiniGPT", cached.next_logits(), full.next_logits())


def test_the_cache_really_skips_recomputation():
    """A cached step feeds one position: its keys grow by one per step, written after the
    earlier ones in the same buffer (no copy of them each step)."""
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1, max_len=16, dtype="float64"), seed=0)
    decoder = model.decoder(np.array([[1, 2, 3]]))
    first_keys = decoder.kv[0].k.copy()
    for expected_length in (4, 5, 6):
        earlier = decoder.kv[0].k
        decoder.append(np.array([4]))
        assert decoder.kv[0].k.shape[2] == expected_length
        assert np.shares_memory(decoder.kv[0].k, earlier)
    np.testing.assert_array_equal(decoder.kv[0].k[:, :, :3], first_keys)


def test_a_key_value_buffer_is_the_concatenation_and_refuses_to_overflow():
    from numpy_engine.kvcache import KeysValues, KeyValueBuffer

    rng = np.random.default_rng(0)
    start = KeysValues(*rng.standard_normal((2, 2, 3, 2, 4)))  # (B, H, L, hs) = (2, 3, 2, 4)
    new = rng.standard_normal((2, 2, 3, 1, 4))
    buffer = KeyValueBuffer(start, capacity=3)
    expected = start.extended(*new)
    for got in (buffer.extended(*new), (buffer.k, buffer.v)):
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])
    assert buffer.length == 3
    with pytest.raises(ValueError, match="4 positions do not fit a capacity of 3"):
        buffer.extended(*new)
    with pytest.raises(ValueError, match="2 positions do not fit a capacity of 1"):
        KeyValueBuffer(start, capacity=1)


def test_no_backward_through_past_keys_and_values():
    """past (and cross-attention's memory_kv) serve decoding: a backward through them would
    have no input to return the past's gradient to, so it is refused. A past of no positions
    is no past: the same output, and a backward that gives the same gradients."""
    from numpy_engine.kvcache import KeysValues
    from numpy_engine.multihead import (
        cross_attention_backward,
        cross_attention_forward,
        keys_values,
        memory_keys_values,
        self_attention_backward,
        self_attention_forward,
    )
    from numpy_engine.params import attention_params

    rng = np.random.default_rng(0)
    p = attention_params(lambda shape: rng.standard_normal(shape) / 2, 4)
    x = rng.standard_normal((1, 3, 4))
    out, cache = self_attention_forward(x[:, :2], p, 2, None)
    out, cache = self_attention_forward(x[:, 2:], p, 2, None, past=keys_values(cache))
    assert keys_values(cache).k.shape == (1, 2, 3, 2)  # two past positions and the new one
    with pytest.raises(ValueError, match="past keys and values"):
        self_attention_backward(out, cache)
    empty = KeysValues(np.empty((1, 2, 0, 2)), np.empty((1, 2, 0, 2)))  # (B, H, 0, hs)
    (out, cache), (plain, plain_cache) = (
        self_attention_forward(x, p, 2, None, past=past) for past in (empty, None)
    )
    np.testing.assert_array_equal(out, plain)
    dout = rng.standard_normal(out.shape)
    (dx, grads), (plain_dx, plain_grads) = (
        self_attention_backward(dout, c) for c in (cache, plain_cache)
    )
    np.testing.assert_array_equal(dx, plain_dx)
    assert grads.keys() == plain_grads.keys()
    for key, grad in grads.items():
        np.testing.assert_array_equal(grad, plain_grads[key], err_msg=key)
    memory_kv, _ = memory_keys_values(x, p, 2)
    out, cache = cross_attention_forward(x, x, p, 2, None, memory_kv=memory_kv)
    with pytest.raises(ValueError, match="memory_kv"):
        cross_attention_backward(out, cache)


def test_decoding_computes_no_gelu_derivative(monkeypatch):
    """GELU's forward computes its derivative for the backward (activations.gelu_forward); a
    KV-cache decoder's steps never take a backward, so they skip it, a window that slides
    past max_len included (a seq2seq decoder's source is encoded once, by the full
    forward). The full forward, which training runs, still computes it."""
    from numpy_engine import activations

    def no_derivative(*args):
        raise AssertionError("computed GELU's derivative")

    gpt = ne.MiniGPT(ne.GPTConfig(vocab_size=7, max_len=4, activation="gelu"), seed=0)
    expected = generate(gpt, np.array([[1, 2, 3]]), 5, use_cache=False)
    seq2seq = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(activation="gelu"), seed=0)
    decoder = seq2seq.decoder(np.array([[4, 5, 6]]))
    monkeypatch.setattr(activations, "_gelu_slope", no_derivative)
    np.testing.assert_array_equal(generate(gpt, np.array([[1, 2, 3]]), 5), expected)
    for token in (4, 5, 6):
        decoder.append(np.array([token]))
    assert decoder.next_logits().shape == (1, seq2seq.config.vocab_size)
    with pytest.raises(AssertionError, match="computed GELU's derivative"):
        gpt.forward(np.array([[1, 2, 3]]))
