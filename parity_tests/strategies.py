"""Hypothesis strategies for whole-model cases: a valid config, a padded batch, a seed.

Configs are built valid (d_model = heads * head width) rather than filtered, and
each draw that depends on another sits next to it, so failures shrink well.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

import numpy_engine as ne
from numpy_engine.models import IGNORE_INDEX

seeds = st.integers(0, 2**32 - 1)
activations = st.sampled_from(["relu", "gelu"])


class Seq2SeqCase(NamedTuple):
    config: ne.Seq2SeqConfig
    source: np.ndarray  # (B, S), padded with 0 after each row's length
    decoder_input: np.ndarray  # (B, T)
    target: np.ndarray  # (B, T), 0 (ignored) where decoder_input is padding
    seed: int
    model_class = ne.Seq2SeqTransformer

    @property
    def batch(self) -> tuple:
        return self.source, self.decoder_input, self.target


class GPTCase(NamedTuple):
    config: ne.GPTConfig
    idx: np.ndarray  # (B, T)
    targets: np.ndarray  # (B, T), -100 (ignored) after each row's length
    seed: int
    model_class = ne.MiniGPT

    @property
    def batch(self) -> tuple:
        return self.idx, self.targets


def padded_ids(rng: np.random.Generator, lengths: list[int], width: int, vocab: int) -> np.ndarray:
    """Rows of non-padding ids in [1, vocab) followed by padding (0) up to width."""
    ids = rng.integers(1, vocab, size=(len(lengths), width))
    ids[np.arange(width)[None, :] >= np.array(lengths)[:, None]] = 0
    return ids


# The smallest cases, pinned as @example in every model test.
SMALLEST_SEQ2SEQ = Seq2SeqCase(
    ne.Seq2SeqConfig(vocab_size=3, d_model=2, n_heads=1, d_ff=1, dtype="float64"),
    source=np.array([[1, 2], [2, 0]]),
    decoder_input=np.array([[1, 2], [1, 0]]),
    target=np.array([[2, 1], [2, 0]]),
    seed=0,
)
SMALLEST_GPT = GPTCase(
    ne.GPTConfig(
        vocab_size=2, d_model=2, n_heads=1, d_ff=1, n_layers=1, max_len=2, dtype="float64"
    ),
    idx=np.array([[0, 1], [1, 1]]),
    targets=np.array([[1, 0], [0, -100]]),
    seed=0,
)


@st.composite
def model_widths(draw) -> tuple[int, int]:
    """(n_heads, head_width) with d_model >= 3. Over one channel a layernorm outputs only
    its bias; over two it outputs +-(1, -1) times sqrt(var / (var + eps)), so everything
    before it gets an eps-sized gradient that both engines compute as rounding noise."""
    n_heads = draw(st.integers(1, 3))
    head_width = draw(st.integers(-(-3 // n_heads), 4))  # ceil(3 / n_heads)
    return n_heads, head_width


@st.composite
def seq2seq_cases(draw, dtype: str = "float64") -> Seq2SeqCase:
    n_heads, head_width = draw(model_widths())
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
    n_heads, head_width = draw(model_widths())
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
    targets[np.arange(T)[None, :] >= np.array(lengths)[:, None]] = IGNORE_INDEX
    return GPTCase(config, idx, targets, seed)


def randomized_model(case: Seq2SeqCase | GPTCase) -> tuple:
    """Every model test's preamble: (the case's model with every weight redrawn from
    case.seed, the generator that drew them, for what the test draws next)."""
    model = case.model_class(case.config, seed=case.seed)
    rng = np.random.default_rng(case.seed)
    randomize_params(model, rng)
    return model, rng


def randomize_params(model, rng: np.random.Generator) -> None:
    """Redraw every parameter so that no layer sits at its init (zero biases, unit norms).

    Scales keep activations O(1), as in training: linear weights N(0, 1/fan_in),
    embeddings N(0, 1), biases N(0, 0.1^2), layernorm weights 1 + N(0, 0.1^2). A padding
    row (Seq2Seq's pad_id) stays at zero, as PyTorch's Embedding(padding_idx) keeps it.
    """
    for key, value in model.params.items():
        fresh = rng.standard_normal(value.shape)
        if "embed" in key:
            pass
        elif "ln" in key or "norm" in key:
            fresh = (1.0 if key.endswith(".weight") else 0.0) + 0.1 * fresh
        elif key.endswith(".weight"):
            fresh /= np.sqrt(value.shape[1])
        else:
            fresh *= 0.1
        if key == "embed.weight":
            fresh[model.config.pad_id] = 0.0
        value[...] = fresh
