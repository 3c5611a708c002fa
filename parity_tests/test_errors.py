"""Every bad input raises ValueError or TypeError with a message naming what was wrong."""

from __future__ import annotations

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine import attention as A
from numpy_engine import layers as L

SOURCE = np.array([[4, 5, 6], [7, 8, 0]])
DECODER_INPUT = np.array([[1, 4, 5, 6], [1, 7, 8, 0]])
TARGET = np.array([[4, 5, 6, 2], [7, 8, 2, 0]])


@pytest.fixture(scope="module")
def seq2seq():
    return ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=0)


@pytest.fixture(scope="module")
def gpt():
    return ne.MiniGPT(ne.GPTConfig(n_layers=1, max_len=8, dtype="float64"), seed=0)


def replaced(array: np.ndarray, index: tuple, value: int) -> np.ndarray:
    out = array.copy()
    out[index] = value
    return out


SEQ2SEQ_BAD_INPUTS = {
    "source id too large": (
        dict(source=replaced(SOURCE, (1, 0), 12)),
        ValueError,
        r"source\[1, 0\] = 12 is outside",
    ),
    "source id negative": (
        dict(source=replaced(SOURCE, (0, 2), -1)),
        ValueError,
        r"source\[0, 2\] = -1 is outside",
    ),
    "decoder_input id too large": (
        dict(decoder_input=replaced(DECODER_INPUT, (0, 3), 99)),
        ValueError,
        r"decoder_input\[0, 3\] = 99",
    ),
    "float source ids": (dict(source=SOURCE.astype(float)), TypeError, "source must hold integer"),
    "bool decoder ids": (
        dict(decoder_input=DECODER_INPUT > 0),
        TypeError,
        "decoder_input must hold integer",
    ),
    "1-D source": (dict(source=SOURCE[0]), ValueError, r"source must have shape \(batch, time\)"),
    "empty batch": (
        dict(source=SOURCE[:0], decoder_input=DECODER_INPUT[:0], target=TARGET[:0]),
        ValueError,
        "source is an empty batch",
    ),
    "no time steps": (dict(decoder_input=DECODER_INPUT[:, :0]), ValueError, "decoder_input has no"),
    "batch sizes differ": (dict(source=SOURCE[:1]), ValueError, "same batch size, got 1 and 2"),
    "target shape": (dict(target=TARGET[:, :3]), ValueError, r"target must have shape \(2, 4\)"),
    "target id too large": (
        dict(target=replaced(TARGET, (1, 1), 12)),
        ValueError,
        r"target\[1, 1\] = 12 is outside",
    ),
    "float target": (dict(target=TARGET.astype(np.float32)), TypeError, "target must hold integer"),
    "all-padding target": (dict(target=np.zeros_like(TARGET)), ValueError, "target: every target"),
    "all-padding source row": (
        dict(source=replaced(SOURCE, (1, slice(None)), 0)),
        ValueError,
        "source row 1 is all padding",
    ),
}


@pytest.mark.parametrize("case", SEQ2SEQ_BAD_INPUTS, ids=str)
def test_seq2seq_bad_input(seq2seq, case):
    changes, error, message = SEQ2SEQ_BAD_INPUTS[case]
    batch = dict(source=SOURCE, decoder_input=DECODER_INPUT, target=TARGET) | changes
    with pytest.raises(error, match=message):
        seq2seq.loss_and_grads(**batch)


IDX = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
TARGETS = np.array([[2, 3, 4, 5], [6, 7, 8, -100]])

GPT_BAD_INPUTS = {
    "idx id too large": (dict(idx=replaced(IDX, (1, 3), 13)), ValueError, r"idx\[1, 3\] = 13"),
    "float idx": (dict(idx=IDX.astype(float)), TypeError, "idx must hold integer"),
    "longer than max_len": (
        dict(idx=np.ones((2, 9), dtype=int), targets=np.ones((2, 9), dtype=int)),
        ValueError,
        "idx has 9 positions but max_len is 8",
    ),
    "targets shape": (dict(targets=TARGETS[:1]), ValueError, r"targets must have shape \(2, 4\)"),
    "target id negative": (
        dict(targets=replaced(TARGETS, (0, 0), -1)),
        ValueError,
        r"targets\[0, 0\] = -1",
    ),
    "all targets ignored": (
        dict(targets=np.full_like(TARGETS, -100)),
        ValueError,
        "ignore_index=-100",
    ),
    "empty batch": (dict(idx=IDX[:0], targets=TARGETS[:0]), ValueError, "idx is an empty batch"),
}


@pytest.mark.parametrize("case", GPT_BAD_INPUTS, ids=str)
def test_gpt_bad_input(gpt, case):
    changes, error, message = GPT_BAD_INPUTS[case]
    batch = dict(idx=IDX, targets=TARGETS) | changes
    with pytest.raises(error, match=message):
        gpt.loss_and_grads(**batch)


BAD_CONFIGS = {
    "d_model not divisible": (dict(d_model=30, n_heads=4), ValueError, "d_model=30 must be divis"),
    "zero heads": (dict(n_heads=0), ValueError, "n_heads must be positive"),
    "negative d_ff": (dict(d_ff=-1), ValueError, "d_ff must be positive"),
    "float d_model": (dict(d_model=32.0), TypeError, "d_model must be an int"),
    "bool vocab": (dict(vocab_size=True), TypeError, "vocab_size must be an int"),
    "unknown activation": (dict(activation="swish"), ValueError, "activation must be one of"),
    "unknown dtype": (dict(dtype="float16"), ValueError, "dtype must be one of"),
}


@pytest.mark.parametrize("config_class", [ne.Seq2SeqConfig, ne.GPTConfig])
@pytest.mark.parametrize("case", BAD_CONFIGS, ids=str)
def test_bad_config(config_class, case):
    changes, error, message = BAD_CONFIGS[case]
    with pytest.raises(error, match=message):
        config_class(**changes)


def test_bad_layer_counts_and_pad_id():
    with pytest.raises(ValueError, match="n_encoder_layers must be positive"):
        ne.Seq2SeqConfig(n_encoder_layers=0)
    with pytest.raises(ValueError, match="max_len must be positive"):
        ne.GPTConfig(max_len=0)
    with pytest.raises(ValueError, match=r"pad_id=12 must be in \[0, vocab_size=12\)"):
        ne.Seq2SeqConfig(pad_id=12)


def test_backward_rejects_a_wrong_upstream_gradient(seq2seq):
    logits, cache = seq2seq.forward(SOURCE, DECODER_INPUT)
    with pytest.raises(ValueError, match=r"dlogits must have shape \(2, 4, 12\)"):
        seq2seq.backward(np.ones((2, 4, 11)), cache)
    with pytest.raises(TypeError, match="dlogits must be a float ndarray"):
        seq2seq.backward(np.ones(logits.shape, dtype=int), cache)


def test_load_params_rejects_mismatches(gpt):
    good = {key: value.copy() for key, value in gpt.params.items()}
    missing = {key: value for key, value in good.items() if key != "head.bias"}
    with pytest.raises(ValueError, match=r"missing keys \['head.bias'\]"):
        gpt.load_params(missing)
    with pytest.raises(ValueError, match=r"unexpected keys \['extra'\]"):
        gpt.load_params(good | {"extra": np.zeros(1)})
    with pytest.raises(ValueError, match=r"params\['head.bias'\] must have shape \(13,\)"):
        gpt.load_params(good | {"head.bias": np.zeros(12)})
    with pytest.raises(TypeError, match=r"params\['head.bias'\] must have dtype float64"):
        gpt.load_params(good | {"head.bias": np.zeros(13, dtype=np.float32)})


def test_fully_hidden_attention_row_is_rejected():
    q = k = v = np.ones((2, 1, 3, 4))
    visible = np.ones((2, 1, 3, 3), dtype=bool)
    visible[1, 0, 2] = False  # batch row 1, query position 2 sees nothing
    with pytest.raises(ValueError, match="batch row 1, position 2"):
        A.attention_forward(q, k, v, visible)


def test_cross_entropy_with_every_target_ignored():
    with pytest.raises(ValueError, match="every target equals ignore_index=0"):
        L.cross_entropy_forward(np.zeros((2, 3, 5)), np.zeros((2, 3), dtype=int), ignore_index=0)
