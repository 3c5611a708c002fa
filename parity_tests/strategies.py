"""Hypothesis strategies for whole-model cases: a valid config, a padded batch, a seed.

Configs are built valid (d_model = heads * head width) rather than filtered, and
each draw that depends on another sits next to it, so failures shrink well.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

import numpy_engine as ne
from numpy_engine.models import GPT_IGNORE_INDEX

seeds = st.integers(0, 2**32 - 1)
activations = st.sampled_from(["relu", "gelu"])


class Seq2SeqCase(NamedTuple):
    config: ne.Seq2SeqConfig
    source: np.ndarray  # (B, S), padded with 0 after each row's length
    decoder_input: np.ndarray  # (B, T)
    target: np.ndarray  # (B, T), 0 (ignored) where decoder_input is padding
    seed: int


class GPTCase(NamedTuple):
    config: ne.GPTConfig
    idx: np.ndarray  # (B, T)
    targets: np.ndarray  # (B, T), -100 (ignored) after each row's length
    seed: int


def padded_ids(rng: np.random.Generator, lengths: list[int], width: int, vocab: int) -> np.ndarray:
    """Rows of non-padding ids in [1, vocab) followed by padding (0) up to width."""
    ids = rng.integers(1, vocab, size=(len(lengths), width))
    ids[np.arange(width)[None, :] >= np.array(lengths)[:, None]] = 0
    return ids


@st.composite
def seq2seq_cases(draw, dtype: str = "float64") -> Seq2SeqCase:
    n_heads, head_width = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    config = ne.Seq2SeqConfig(
        vocab_size=draw(st.integers(3, 9)),
        d_model=n_heads * head_width,
        n_heads=n_heads,
        d_ff=draw(st.integers(1, 8)),
        n_encoder_layers=draw(st.integers(1, 2)),
        n_decoder_layers=draw(st.integers(1, 2)),
        activation=draw(activations),
        dtype=dtype,
    )
    B, S = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    source_lengths = draw(st.lists(st.integers(1, S), min_size=B, max_size=B))
    T = draw(st.integers(1, 5))
    target_lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    V = config.vocab_size
    source = padded_ids(rng, source_lengths, S, V)
    decoder_input = padded_ids(rng, target_lengths, T, V)
    target = padded_ids(rng, target_lengths, T, V)
    return Seq2SeqCase(config, source, decoder_input, target, seed)


@st.composite
def gpt_cases(draw, dtype: str = "float64") -> GPTCase:
    n_heads, head_width = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    config = ne.GPTConfig(
        vocab_size=draw(st.integers(2, 9)),
        d_model=n_heads * head_width,
        n_heads=n_heads,
        d_ff=draw(st.integers(1, 8)),
        n_layers=draw(st.integers(1, 2)),
        max_len=T + draw(st.integers(0, 3)),
        activation=draw(activations),
        dtype=dtype,
    )
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, config.vocab_size, size=(B, T))
    targets = rng.integers(0, config.vocab_size, size=(B, T))
    targets[np.arange(T)[None, :] >= np.array(lengths)[:, None]] = GPT_IGNORE_INDEX
    return GPTCase(config, idx, targets, seed)


def randomize_params(model, rng: np.random.Generator, scale: float = 0.5) -> None:
    """Redraw every parameter so that gradients are large and no layer sits at its init.

    Layernorm weights stay near 1; a padding row (Seq2Seq's id pad_id) stays at zero,
    as PyTorch's Embedding(padding_idx) keeps it.
    """
    for key, value in model.params.items():
        fresh = scale * rng.standard_normal(value.shape)
        if ("ln" in key or "norm" in key) and key.endswith(".weight"):
            fresh += 1.0
        if key == "embed.weight":
            fresh[model.config.pad_id] = 0.0
        value[...] = fresh
