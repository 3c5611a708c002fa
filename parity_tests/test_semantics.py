"""PyTorch's semantics, pinned with exact values the engine must reproduce."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import numpy_engine as ne
from numpy_engine import activations as Act
from numpy_engine import attention as A
from numpy_engine import layernorm as LN
from numpy_engine import layers as L
from numpy_engine import losses, masks


def test_embedding_padding_row_starts_at_zero_and_never_gets_a_gradient():
    model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=0)
    assert np.count_nonzero(model.params["embed.weight"][0]) == 0
    source = np.array([[4, 5, 0], [6, 0, 0]])
    decoder_input, target = np.array([[1, 4, 0]] * 2), np.array([[4, 2, 0]] * 2)
    _, grads = model.loss_and_grads(source, decoder_input, target)
    assert np.count_nonzero(grads["embed.weight"][0]) == 0
    assert np.count_nonzero(grads["embed.weight"][4]) > 0


def test_embedding_repeated_ids_accumulate():
    weight = np.zeros((4, 2))
    _, cache = L.embedding_forward(np.array([[3, 3, 1], [3, 0, 1]]), weight, padding_idx=0)
    dids, grads = L.embedding_backward(np.ones((2, 3, 2)), cache)
    assert dids is None  # integer ids have no gradient
    np.testing.assert_array_equal(grads["weight"], [[0, 0], [2, 2], [0, 0], [3, 3]])


def test_relu_gradient_at_zero_is_zero():
    _, cache = Act.relu_forward(np.array([-1.0, 0.0, 2.0]))
    np.testing.assert_array_equal(Act.relu_backward(np.ones(3), cache), [0.0, 0.0, 1.0])


def test_gelu_is_the_tanh_form():
    out, _ = Act.gelu_forward(np.array([1.0, -0.5]))
    inner = math.sqrt(2 / math.pi) * (1.0 + 0.044715)
    assert out[0] == pytest.approx(0.5 * (1 + math.tanh(inner)), rel=1e-15)
    assert out[0] != pytest.approx(0.8413447460685429, rel=1e-6)  # the exact-erf GELU(1)


def test_layernorm_uses_the_biased_variance_and_eps_1e_5():
    out, _ = LN.layernorm_forward(np.array([1.0, 2.0, 3.0]), np.ones(3), np.zeros(3))
    expected = (np.array([1.0, 2.0, 3.0]) - 2.0) / math.sqrt(2.0 / 3.0 + 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-15)


def test_cross_entropy_keeps_the_ignored_class_in_the_denominator():
    logits = np.array([[3.0, 1.0, 0.5], [0.2, 0.1, 4.0]])
    loss, _ = losses.cross_entropy_forward(logits, np.array([1, 0]), ignore_index=0)
    expected = -(1.0 - np.log(np.exp(logits[0]).sum()))  # only row 0 counts; class 0 stays in
    assert loss == pytest.approx(expected, rel=1e-15)


def test_sinusoidal_table_values():
    table = L.sinusoidal_table(3, 4, "float64")
    np.testing.assert_allclose(table[0], [0, 1, 0, 1], atol=0)
    np.testing.assert_allclose(table[2], [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)])
    with pytest.raises(ValueError, match="read-only"):  # cached, shared by every forward
        table[0, 0] = 1.0


def test_attention_rows_sum_to_one_and_hidden_weights_are_exactly_zero():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    visible = masks.causal_visible(4) & (np.arange(4) < np.array([[4], [2]]))[:, None, None, :]
    _, cache = A.attention_forward(q, k, v, visible)
    np.testing.assert_allclose(cache.weights.sum(axis=-1), 1.0, rtol=1e-14)
    hidden = np.broadcast_to(~visible, cache.weights.shape)
    assert np.count_nonzero(cache.weights[hidden]) == 0
    assert np.all(cache.weights[~hidden] > 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_models_run_end_to_end_in_their_dtype(dtype):
    model = ne.MiniGPT(ne.GPTConfig(n_layers=1, dtype=dtype), seed=0)
    idx = np.arange(20).reshape(2, 10) % 13
    logits, _ = model.forward(idx)
    loss, grads = model.loss_and_grads(idx, np.roll(idx, -1, axis=1))
    assert logits.dtype == dtype
    assert all(
        grads[key].dtype == dtype and grads[key].shape == p.shape for key, p in model.params.items()
    )
    assert abs(loss - math.log(13)) < 0.15  # small init: near-uniform predictions
    assert all(np.isfinite(g).all() for g in grads.values())


def test_same_seed_same_params_different_seed_different_params():
    a, b, c = (ne.Seq2SeqTransformer(ne.Seq2SeqConfig(), seed=s) for s in (3, 3, 4))
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert not np.array_equal(a.params["readout.weight"], c.params["readout.weight"])


def test_engine_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None; import numpy_engine; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
