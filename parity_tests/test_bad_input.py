"""Bad input thrown at the public API: every one must raise InputError (a ValueError;
InputTypeError is also a TypeError) whose message names what was wrong; never another
exception (numpy's own ValueError included), a hang, or a silent NaN.

Here, specific mistakes with the exact message each gets; test_malformed_input.py has
Hypothesis drawing malformed arrays, configs and settings against the same models.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine import activations as Act
from numpy_engine import attention as A
from numpy_engine import layers as L
from numpy_engine import losses, masks
from numpy_engine import multihead as MH
from numpy_engine.checks import InputError, InputTypeError, check_finite

SOURCE = np.array([[4, 5, 6], [7, 8, 0]])
DECODER_INPUT = np.array([[1, 4, 5, 6], [1, 7, 8, 0]])
TARGET = np.array([[4, 5, 6, 2], [7, 8, 2, 0]])
IDX = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
TARGETS = np.array([[2, 3, 4, 5], [6, 7, 8, -100]])
SEQ2SEQ = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=0)
GPT = ne.MiniGPT(ne.GPTConfig(n_layers=1, max_len=8, dtype="float64"), seed=0)


# ------------------------------------------------------ specific mistakes, exact messages


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
@pytest.mark.parametrize("method", ["loss_and_grads", "loss"])  # training, evaluation
def test_seq2seq_bad_input(case, method):
    changes, error, message = SEQ2SEQ_BAD_INPUTS[case]
    batch = dict(source=SOURCE, decoder_input=DECODER_INPUT, target=TARGET) | changes
    with pytest.raises(error, match=message):
        getattr(SEQ2SEQ, method)(**batch)


def test_seq2seq_decode_refuses_a_source_of_another_batch():
    """decode checks source's batch, not memory's: memory may match decoder_input while a
    source of one row would broadcast its padding mask over every row."""
    memory, _ = SEQ2SEQ.encode(SOURCE)
    with pytest.raises(ValueError, match="source and decoder_input .* got 1 and 2"):
        SEQ2SEQ.decode(memory, SOURCE[:1], DECODER_INPUT)


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
        r"targets: every target equals ignore_index=-100 \(all padding\)",  # the model's
    ),
    "empty batch": (dict(idx=IDX[:0], targets=TARGETS[:0]), ValueError, "idx is an empty batch"),
}


@pytest.mark.parametrize("case", GPT_BAD_INPUTS, ids=str)
@pytest.mark.parametrize("method", ["loss_and_grads", "loss"])  # training, evaluation
def test_gpt_bad_input(case, method):
    changes, error, message = GPT_BAD_INPUTS[case]
    batch = dict(idx=IDX, targets=TARGETS) | changes
    with pytest.raises(error, match=message):
        getattr(GPT, method)(**batch)


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


def test_bad_layer_counts_and_special_ids():
    with pytest.raises(ValueError, match="n_encoder_layers must be positive"):
        ne.Seq2SeqConfig(n_encoder_layers=0)
    with pytest.raises(ValueError, match="max_len must be positive"):
        ne.GPTConfig(max_len=0)
    with pytest.raises(ValueError, match=r"pad_id=12 must be in \[0, vocab_size=12\)"):
        ne.Seq2SeqConfig(pad_id=12)


def test_load_params_rejects_mismatches():
    good = {key: value.copy() for key, value in GPT.params.items()}
    missing = {key: value for key, value in good.items() if key != "head.bias"}
    with pytest.raises(ValueError, match=r"missing keys \['head.bias'\]"):
        GPT.load_params(missing)
    with pytest.raises(ValueError, match=r"unexpected keys \['extra'\]"):
        GPT.load_params(good | {"extra": np.zeros(1)})
    with pytest.raises(ValueError, match=r"params\['head.bias'\] must have shape \(13,\)"):
        GPT.load_params(good | {"head.bias": np.zeros(12)})
    with pytest.raises(TypeError, match=r"params\['head.bias'\] must have dtype float64"):
        GPT.load_params(good | {"head.bias": np.zeros(13, dtype=np.float32)})
    before = GPT.flat.copy()
    with pytest.raises(ValueError, match=r"params\['head.bias'\]\[4\] = nan"):
        GPT.load_params(good | {"head.bias": np.where(np.arange(13) == 4, np.nan, 0.0)})
    assert np.array_equal(GPT.flat, before)  # nothing loaded
    with pytest.raises(ValueError, match="dtype must be one of"):
        GPT.with_dtype("float16")


def test_fully_hidden_attention_row_is_rejected():
    q = k = v = np.ones((2, 1, 3, 4))
    visible = np.ones((2, 1, 3, 3), dtype=bool)
    visible[1, 0, 2] = False  # batch row 1, query position 2 sees nothing
    with pytest.raises(ValueError, match="batch row 1, position 2"):
        A.attention_forward(q, k, v, visible)
    all_padding = masks.padding_visible(np.array([[1, 1, 0], [0, 0, 0]]), pad_id=0)  # (2, 1, 1, 3)
    with pytest.raises(ValueError, match=r"batch row 1, position 0 \(head 0\)"):
        A.attention_forward(q, k, v, all_padding)  # broadcast over heads and queries
    # one (Tq, Tk) mask for every batch row and head, over 2 queries and 3 keys (as
    # cross-attention has): the row is found in the scores' (B, H, Tq), not the mask's shape
    q, (k, v) = np.ones((2, 2, 2, 4)), (np.ones((2, 2, 3, 4)) for _ in range(2))
    shared = np.array([[True, False, True], [False, False, False]])
    with pytest.raises(InputError, match=r"batch row 0, position 1 \(head 0\)"):
        A.attention_forward(q, k, v, shared)


def test_no_backward_through_attention_that_read_cached_keys_and_values():
    """A decoding step's attention read keys and values made by an earlier call (past, or
    memory_kv): its cache has no path back to them, so a backward through it is refused by
    name instead of returning gradients that miss them (or failing deep inside)."""
    from numpy_engine.params import attention_params

    rng = np.random.default_rng(0)
    p = attention_params(lambda shape: rng.standard_normal(shape), 8)
    x, memory = rng.standard_normal((2, 1, 8)), rng.standard_normal((2, 3, 8))
    _, earlier = MH.self_attention_forward(rng.standard_normal((2, 2, 8)), p, 2, None)
    _, cache = MH.self_attention_forward(x, p, 2, None, past=MH.keys_values(earlier))
    with pytest.raises(InputError, match="read past keys and values"):
        MH.self_attention_backward(np.ones((2, 1, 8)), cache)
    memory_kv, _ = MH.memory_keys_values(memory, p, 2)
    _, cache = MH.cross_attention_forward(x, memory, p, 2, None, memory_kv)
    with pytest.raises(InputError, match="was given memory_kv"):
        MH.cross_attention_backward(np.ones((2, 1, 8)), cache)


@pytest.mark.parametrize("dtype", [np.float16, np.int64])
def test_gelu_refuses_dtypes_other_than_float32_and_float64(dtype):
    """Far in the lower tail GELU caps its exponential at 2^(maxexp - 2), where 1 / (1 + e)
    is negligible in float32 and float64; in float16 it is 2^-14, and the slope at x = -30
    would read -0.36 (the true one ~0). So a layer called directly refuses other dtypes
    (the models take only these two)."""
    with pytest.raises(InputTypeError, match="x must be float32 or float64, got " + dtype.__name__):
        Act.gelu_forward(np.linspace(-30, 30, 7).astype(dtype))


def test_no_backward_through_a_forward_that_kept_no_derivative():
    """Decoding's forward (for_backward=False) keeps no GELU derivative: a backward through
    it is refused by name, through the FFN too."""
    x = np.linspace(-3, 3, 8).reshape(2, 4)
    _, cache = Act.gelu_forward(x, for_backward=False)
    with pytest.raises(InputError, match="for_backward=False"):
        Act.gelu_backward(np.ones_like(x), cache)
    p = {"fc1.weight": np.ones((3, 4)), "fc1.bias": np.zeros(3)}
    p |= {"fc2.weight": np.ones((4, 3)), "fc2.bias": np.zeros(4)}
    _, cache = L.ffn_forward(x, p, "gelu", for_backward=False)
    with pytest.raises(InputError, match="for_backward=False"):
        L.ffn_backward(np.ones_like(x), cache)


def test_cross_entropy_with_every_target_ignored():
    with pytest.raises(ValueError, match="every target equals ignore_index=0"):
        losses.cross_entropy_forward(
            np.zeros((2, 3, 5)), np.zeros((2, 3), dtype=int), ignore_index=0
        )


def test_ids_and_targets_given_as_lists_are_read_as_the_arrays_they_spell():
    loss, grads = GPT.loss_and_grads(IDX, TARGETS)
    from_lists = GPT.loss_and_grads(IDX.tolist(), TARGETS.tolist())
    assert from_lists[0] == loss
    assert all(np.array_equal(from_lists[1][key], value) for key, value in grads.items())
    with pytest.raises(InputError, match=r"idx\[1, 3\] = 13"):
        GPT.loss_and_grads(replaced(IDX, (1, 3), 13).tolist(), TARGETS.tolist())


def test_a_non_finite_gradient_is_named_by_its_first_bad_entry():
    grad = np.zeros((2, 3))
    grad[0, 2], grad[1, 1] = np.nan, np.inf
    with pytest.raises(InputError, match=re.escape("g must be finite, but g[0, 2] = nan")):
        check_finite("g", grad)


def test_valid_inputs_still_give_finite_results():
    loss, grads = SEQ2SEQ.loss_and_grads(SOURCE, DECODER_INPUT, TARGET)
    assert np.isfinite(loss) and all(np.isfinite(g).all() for g in grads.values())
