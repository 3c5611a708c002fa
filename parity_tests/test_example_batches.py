"""What each model kind tells the benchmark, the parity report, the `grads` study and the
`attention` command about itself: the example batch it hands them (what its docstring
promises, exactly), the FLOPs of its forward, which the bench turns into GFLOP/s and the
share of the matmul peak (exactly the FLOPs of the matrix products a forward makes), and
the attention panels it draws (each layer's weights, labelled with their tokens)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.call_count import calls_per_step
from numpy_engine.generate import greedy_decode
from numpy_engine.models import (
    GPT2,
    IGNORE_INDEX,
    GPT2Config,
    GPTConfig,
    MiniGPT,
    Seq2SeqConfig,
    Seq2SeqTransformer,
)


def assert_seq2seq_example(cfg, source, decoder_input, target, B: int, S: int) -> None:
    """Sources of lengths S, S - 1, ..., 1, S, ... of ids that are not special, then PAD;
    the decoder reads BOS and the source; the target is the source, EOS, then PAD."""
    lengths = S - np.arange(B) % S
    assert source.shape == (B, S) and decoder_input.shape == target.shape == (B, S + 1)
    for row, n in enumerate(lengths):
        symbols = source[row, :n]
        assert ((symbols >= 0) & (symbols < cfg.vocab_size)).all()
        assert not np.isin(symbols, (cfg.pad_id, cfg.bos_id, cfg.eos_id)).any()
        assert (source[row, n:] == cfg.pad_id).all()
        assert decoder_input[row, 0] == cfg.bos_id
        assert (decoder_input[row, 1:] == source[row]).all()
        assert (target[row, :n] == symbols).all() and target[row, n] == cfg.eos_id
        assert (target[row, n + 1 :] == cfg.pad_id).all()


def assert_gpt_example(cfg, idx, targets, B: int, T: int) -> None:
    """Ids of the vocabulary, each target the next id; the last position has none, and the
    last row's second half is ignored (as a padded row's would be) when there are two rows."""
    assert idx.shape == targets.shape == (B, T)
    assert ((idx >= 0) & (idx < cfg.vocab_size)).all()
    expected = np.concatenate([idx[:, 1:], np.full((B, 1), IGNORE_INDEX)], axis=1)
    if B > 1:
        expected[-1, T // 2 :] = IGNORE_INDEX
    assert (targets == expected).all()


def copy_model(sizes: dict, layers: list[int], max_len: int) -> Seq2SeqTransformer:
    config = Seq2SeqConfig(**sizes, n_encoder_layers=layers[0], n_decoder_layers=layers[1])
    return Seq2SeqTransformer(config, seed=0)


def minigpt(sizes: dict, layers: list[int], max_len: int) -> MiniGPT:
    return MiniGPT(GPTConfig(**sizes, n_layers=layers[0], max_len=max_len), seed=0)


def gpt2(sizes: dict, layers: list[int], max_len: int) -> GPT2:
    return GPT2(GPT2Config(**sizes, n_layers=layers[0], max_len=max_len), seed=0)


KINDS = (  # how to build a model of each kind, and what its example batch must be
    (copy_model, assert_seq2seq_example),
    (minigpt, assert_gpt_example),
    (gpt2, assert_gpt_example),
)


@st.composite
def kinds_and_sizes(draw) -> tuple:
    """(a model of one kind or another, batch size, length, what its example batch must
    be), the sizes drawn apart."""
    n_heads = draw(st.integers(1, 3))
    sizes = dict(
        vocab_size=draw(st.integers(4, 12)),
        d_model=n_heads * draw(st.integers(1, 5)),
        n_heads=n_heads,
        d_ff=draw(st.integers(1, 9)),
    )
    B, length = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    layers = [draw(st.integers(1, 3)) for _ in range(2)]
    build, assert_example = draw(st.sampled_from(KINDS))
    model = build(sizes, layers, max_len=length + draw(st.integers(0, 3)))
    return model, B, length, assert_example


def forward_products(model, batch: tuple) -> list:
    """(left shape, right shape) of each matrix product one forward over batch makes."""

    def forward(model, _, batch) -> None:
        model.forward(*batch[:-1])  # the inputs: all but the targets

    _, products = calls_per_step(model, None, batch, forward)
    return [(left, right) for left, right, _ in products]


@given(case=kinds_and_sizes())
def test_forward_flops_are_the_flops_of_the_forwards_matrix_products(case):
    """Counted: each product of matrices, 2 x (rows of the left) x inner x columns; not
    counted: the matrix-vector products that take sums (a row mean, a softmax's row sum),
    which are reductions, not the model's multiplications."""
    model, B, length, _ = case
    batch = model.example_batch(model.config, np.random.default_rng(0), B, length)
    flops = 0
    for left, right in forward_products(model, batch):
        if len(right) > 1:  # a vector on the right: a sum
            flops += 2 * math.prod(left) * right[-1]
    assert flops == model.forward_flops(model.config, B, length)


@given(case=kinds_and_sizes())
def test_example_batch_is_the_batch_its_docstring_promises(case):
    model, B, length, assert_example = case
    cfg = model.config
    assert_example(cfg, *model.example_batch(cfg, np.random.default_rng(0), B, length), B, length)


def test_example_batch_length_defaults_and_every_id_drawn():
    """Without a length: the copy model's sources of 3, MiniGPT's max_len; and a batch large
    enough draws every id it may (here P(an id missed) < 1e-50)."""
    rng = np.random.default_rng(0)
    seq2seq_config, gpt_config = Seq2SeqConfig(), GPTConfig(vocab_size=5, max_len=9)
    source, _, _ = Seq2SeqTransformer.example_batch(seq2seq_config, rng, 600)  # 1,200 ids
    assert source.shape == (600, 3)
    symbols = set(range(3, seq2seq_config.vocab_size))  # all but PAD 0, BOS 1 and EOS 2
    assert set(np.unique(source)) == symbols | {seq2seq_config.pad_id}
    idx, _ = MiniGPT.example_batch(gpt_config, rng, 64)
    assert idx.shape == (64, 9) and set(np.unique(idx)) == set(range(5))


def test_attention_panels_are_each_layers_weights_with_the_tokens_as_labels():
    """What the `attention` command draws. MiniGPT: each layer's causal weights over the
    last max_len ids, labelled with their tokens. The copy model: per layer, the encoder's
    self-attention over the source, then the decoder's self- and cross-attention over the
    decoder's input, BOS and the greedy output but its last token."""
    gpt = MiniGPT(GPTConfig(vocab_size=7, n_layers=2, max_len=5), seed=3)
    ids, labels = np.arange(7), list("abcdefg")  # 7 ids: the first two fall out
    panels = gpt.attention_panels(ids, labels)
    _, cache = gpt.forward(ids[None, 2:])
    assert [title for title, *_ in panels] == ["layer 0", "layer 1"]
    for (_, weights, keys, queries), block in zip(panels, cache.blocks, strict=True):
        assert np.array_equal(weights, block.attn.attention.weights[0])
        assert weights.shape == (gpt.config.n_heads, 5, 5) and keys == queries == list("cdefg")

    model = Seq2SeqTransformer(Seq2SeqConfig(n_encoder_layers=2, n_decoder_layers=1), seed=3)
    source = np.array([4, 7, 9])
    output = [t for t in greedy_decode(model, source[None], 4)[0] if t != model.config.pad_id]
    decoder_input = np.array([[model.config.bos_id, *output[:-1]]])
    _, cache = model.forward(source[None], decoder_input)
    panels = model.attention_panels(source, ["4", "7", "9"])
    decoded = ["BOS", *[str(t) for t in output[:-1]]]
    expected = [
        ("encoder 0 self", cache.encoder.blocks[0].attn, ["4", "7", "9"], ["4", "7", "9"]),
        ("encoder 1 self", cache.encoder.blocks[1].attn, ["4", "7", "9"], ["4", "7", "9"]),
        ("decoder 0 self", cache.decoder.blocks[0].self_attn, decoded, decoded),
        ("decoder 0 cross", cache.decoder.blocks[0].cross_attn, ["4", "7", "9"], decoded),
    ]
    for panel, (name, attn, keys, queries) in zip(panels, expected, strict=True):
        title, weights, *labels = panel  # (title, weights (H, Tq, Tk), key labels, query labels)
        assert title == name and labels == [keys, queries]
        assert np.array_equal(weights, attn.attention.weights[0])
        assert weights.shape == (model.config.n_heads, len(queries), len(keys))
