"""Every layer pair against two witnesses: central finite differences (float64) and
PyTorch autograd (float64 within 1e-10, float32 no worse than 4x torch's own error).

Hypothesis draws shapes, masks, activations and a seed; values come from the seed.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from torch.func import functional_call

import torch_reference.modules as TM
from numpy_engine import attention as A
from numpy_engine import blocks
from numpy_engine import layers as L
from parity_tests.helpers import (
    LayerCase,
    assert_matches_finite_differences,
    assert_matches_torch,
    check_layer,
    random_visible,
)
from parity_tests.strategies import activations, model_widths, seeds

small = st.integers(1, 4)


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def linear_params(rng, out_features, in_features, prefix=""):
    """Weights scaled by 1/sqrt(fan_in), as in training, so activations stay O(1) and
    softmaxes do not saturate (a saturated softmax leaves gradients at rounding level)."""
    return {
        f"{prefix}weight": normal(rng, out_features, in_features) / np.sqrt(in_features),
        f"{prefix}bias": normal(rng, out_features),
    }


def layernorm_params(rng, C, prefix):
    return {f"{prefix}.weight": 1 + 0.3 * normal(rng, C), f"{prefix}.bias": normal(rng, C)}


def attention_params(rng, C, prefix=""):
    params = {}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        params.update(linear_params(rng, C, C, f"{prefix}{proj}."))
    return params


def ffn_params(rng, C, F, prefix=""):
    return {
        **linear_params(rng, F, C, f"{prefix}fc1."),
        **linear_params(rng, C, F, f"{prefix}fc2."),
    }


def params_of(inputs: dict, *not_params: str) -> dict:
    return {key: value for key, value in inputs.items() if key not in not_params}


def as_torch(visible: np.ndarray | None) -> torch.Tensor | None:
    return None if visible is None else torch.tensor(visible)


# ------------------------------------------------------------------------------ layers


@given(B=small, T=small, c_in=small, c_out=small, seed=seeds)
@example(B=1, T=1, c_in=1, c_out=1, seed=0)
def test_linear(B, T, c_in, c_out, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": normal(rng, B, T, c_in), **linear_params(rng, c_out, c_in)}

    def forward(i):
        return L.linear_forward(i["x"], i["weight"], i["bias"])

    def backward(dout, cache):
        return dict(zip(("x", "weight", "bias"), L.linear_backward(dout, cache), strict=True))

    def torch_forward(t):
        return F.linear(t["x"], t["weight"], t["bias"])

    check_layer(LayerCase("linear", inputs, forward, backward, torch_forward), rng)


@given(B=small, T=st.integers(1, 6), V=st.integers(2, 6), C=small, seed=seeds)
@example(B=2, T=3, V=2, C=1, seed=0)  # two ids only: heavy repeats and padding
def test_embedding_with_padding_and_repeats(B, T, V, C, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, size=(B, T))  # id 0 is padding; repeats are likely

    def backward(dout, cache):
        return {"weight": L.embedding_backward(dout, cache)}

    def torch_forward(t):
        return F.embedding(torch.tensor(ids), t["weight"], padding_idx=0)

    # Against torch: the whole table, padding row included (its gradient must be 0 in both).
    def forward(i):
        return L.embedding_forward(ids, i["weight"], padding_idx=0)

    inputs = {"weight": normal(rng, V, C)}
    assert_matches_torch(LayerCase("embedding", inputs, forward, backward, torch_forward), rng)

    # Against finite differences: the padding row's zero gradient is PyTorch's rule, not
    # calculus, so the padding row is held at zero and the other rows are nudged.
    def forward_rest(i):
        weight = np.concatenate([np.zeros((1, C)), i["weight[1:]"]])  # (V, C)
        return L.embedding_forward(ids, weight, padding_idx=0)

    def backward_rest(dout, cache):
        return {"weight[1:]": L.embedding_backward(dout, cache)[1:]}

    rest = {"weight[1:]": inputs["weight"][1:].copy()}
    assert_matches_finite_differences("embedding", forward_rest, backward_rest, rest, rng)


@given(B=small, T=small, C=small, seed=seeds)
def test_sinusoidal_positions(B, T, C, seed):
    rng = np.random.default_rng(seed)

    def forward(i):
        return L.sinusoidal_forward(i["x"])

    def backward(dout, cache):
        return {"x": L.sinusoidal_backward(dout, cache)}

    def torch_forward(t):
        return t["x"] + TM.sinusoidal_table(T, C, t["x"].dtype)

    inputs = {"x": normal(rng, B, T, C)}
    check_layer(LayerCase("sinusoidal positions", inputs, forward, backward, torch_forward), rng)


@given(B=small, T=small, extra=st.integers(0, 3), C=small, seed=seeds)
def test_learned_positions(B, T, extra, C, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": normal(rng, B, T, C), "weight": normal(rng, T + extra, C)}

    def forward(i):
        return L.learned_positions_forward(i["x"], i["weight"])

    def backward(dout, cache):
        return dict(zip(("x", "weight"), L.learned_positions_backward(dout, cache), strict=True))

    def torch_forward(t):
        return t["x"] + t["weight"][:T]

    check_layer(LayerCase("learned positions", inputs, forward, backward, torch_forward), rng)


@given(B=small, T=small, C=st.integers(2, 8), seed=seeds)
@example(B=1, T=1, C=2, seed=0)
def test_layernorm(B, T, C, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": 3 * normal(rng, B, T, C) + 1, **layernorm_params(rng, C, "ln")}

    def forward(i):
        return L.layernorm_forward(i["x"], i["ln.weight"], i["ln.bias"])

    def backward(dout, cache):
        grads = L.layernorm_backward(dout, cache)
        return dict(zip(("x", "ln.weight", "ln.bias"), grads, strict=True))

    def torch_forward(t):
        return F.layer_norm(t["x"], (C,), t["ln.weight"], t["ln.bias"], eps=1e-5)

    check_layer(LayerCase("layernorm", inputs, forward, backward, torch_forward), rng)


TORCH_ACTIVATIONS = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh")}


@given(activation=activations, B=small, T=small, C=small, seed=seeds)
def test_activation(activation, B, T, C, seed):
    rng = np.random.default_rng(seed)
    act_forward, act_backward = L.ACTIVATIONS[activation]

    def forward(i):
        return act_forward(i["x"])

    def backward(dout, cache):
        return {"x": act_backward(dout, cache)}

    def torch_forward(t):
        return TORCH_ACTIVATIONS[activation](t["x"])

    inputs = {"x": normal(rng, B, T, C)}  # a draw within h of ReLU's kink has probability ~1e-5
    check_layer(LayerCase(activation, inputs, forward, backward, torch_forward), rng)


@given(activation=activations, B=small, T=small, C=small, F_=st.integers(1, 8), seed=seeds)
def test_feed_forward(activation, B, T, C, F_, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": normal(rng, B, T, C), **ffn_params(rng, C, F_)}

    def forward(i):
        return L.ffn_forward(i["x"], params_of(i, "x"), activation)

    def backward(dout, cache):
        dx, grads = L.ffn_backward(dout, cache)
        return {"x": dx, **grads}

    def torch_forward(t):
        module = TM.FeedForward(C, F_, activation)
        return functional_call(module, params_of(t, "x"), (t["x"],))

    check_layer(LayerCase(f"ffn ({activation})", inputs, forward, backward, torch_forward), rng)


def cross_entropy_case(name: str, inputs: dict, targets: np.ndarray, ignore_index: int):
    """Cross-entropy of inputs["logits"] (B, T, V) against targets (B, T)."""

    def forward(i):
        return L.cross_entropy_forward(i["logits"], targets, ignore_index)

    def backward(dloss, cache):
        return {"logits": L.cross_entropy_backward(float(dloss), cache)}

    def torch_forward(t):
        flat = t["logits"].reshape(-1, t["logits"].shape[-1])
        return F.cross_entropy(flat, torch.tensor(targets).reshape(-1), ignore_index=ignore_index)

    return LayerCase(name, inputs, forward, backward, torch_forward)


@given(B=small, T=small, V=st.integers(2, 7), ignore_index=st.sampled_from([0, -100]), seed=seeds)
@example(B=1, T=1, V=2, ignore_index=-100, seed=0)
@example(B=1, T=1, V=2, ignore_index=0, seed=3_094_535_186)  # float32: p_y - 1 cancelled
def test_cross_entropy_with_ignore_index(B, T, V, ignore_index, seed):
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, V, size=(B, T))
    targets[rng.random((B, T)) < 0.3] = ignore_index
    targets[0, 0] = 1  # at least one counted target
    inputs = {"logits": 2 * normal(rng, B, T, V)}
    check_layer(cross_entropy_case("cross-entropy", inputs, targets, ignore_index), rng)


# --------------------------------------------------------------------------- attention

mask_kinds = st.sampled_from(["none", "causal", "padding", "random"])


def attention_case(name: str, inputs: dict, visible: np.ndarray | None) -> LayerCase:
    """Scaled dot-product attention of inputs q, k, v (B, H, T, hs) under the mask visible."""

    def forward(i):
        return A.attention_forward(i["q"], i["k"], i["v"], visible)

    def backward(dout, cache):
        return dict(zip("qkv", A.attention_backward(dout, cache), strict=True))

    def torch_forward(t):
        return TM.attention(t["q"], t["k"], t["v"], as_torch(visible))

    return LayerCase(name, inputs, forward, backward, torch_forward)


@given(B=small, H=st.integers(1, 3), Tq=small, Tk=small, hs=small, kind=mask_kinds, seed=seeds)
@example(B=1, H=1, Tq=3, Tk=3, hs=1, kind="causal", seed=0)
def test_scaled_dot_product_attention(B, H, Tq, Tk, hs, kind, seed):
    if kind == "causal":
        Tk = Tq
    rng = np.random.default_rng(seed)
    visible = random_visible(rng, (B, H, Tq, Tk), kind)
    inputs = {"q": normal(rng, B, H, Tq, hs), "k": normal(rng, B, H, Tk, hs)}
    inputs["v"] = normal(rng, B, H, Tk, hs)
    check_layer(attention_case(f"attention ({kind} mask)", inputs, visible), rng)


@given(B=small, H=st.integers(1, 3), T=small, hs=small, offset=st.sampled_from([100.0, -100.0]),
       kind=mask_kinds, seed=seeds)  # fmt: skip
def test_attention_with_scores_far_from_zero_matches_torch(B, H, T, hs, offset, kind, seed):
    """Every score near +100 (exp would overflow) or -100 (every exp tiny): softmax_last must
    take the textbook path, with the row max. Finite differences are meaningless this far out,
    so the witness is PyTorch alone, in float64 and float32."""
    rng = np.random.default_rng(seed)
    visible = random_visible(rng, (B, H, T, T), kind)
    q, k = normal(rng, B, H, T, hs), normal(rng, B, H, T, hs)
    k[..., 0] = 1.0  # then q's first coordinate adds the same amount to every score in its row
    q[..., 0] = offset * np.sqrt(hs)
    inputs = {"q": q, "k": k, "v": normal(rng, B, H, T, hs)}
    assert_matches_torch(
        attention_case(f"attention, scores near {offset:+.0f}", inputs, visible), rng
    )


@given(B=small, H=st.integers(1, 3), T=small, hs=small, causal=st.booleans(), seed=seeds)
def test_multi_head_self_attention(B, H, T, hs, causal, seed):
    rng = np.random.default_rng(seed)
    visible = random_visible(rng, (B, H, T, T), "causal" if causal else "padding")
    inputs = {"x": normal(rng, B, T, H * hs), **attention_params(rng, H * hs)}

    def forward(i):
        return A.self_attention_forward(i["x"], params_of(i, "x"), H, visible)

    def backward(dout, cache):
        dx, grads = A.self_attention_backward(dout, cache)
        return {"x": dx, **grads}

    def torch_forward(t):
        module = TM.MultiHeadAttention(H * hs, H)
        return functional_call(module, params_of(t, "x"), (t["x"], t["x"], as_torch(visible)))

    name = "causal self-attention" if causal else "self-attention"
    check_layer(LayerCase(name, inputs, forward, backward, torch_forward), rng)


@given(B=small, H=st.integers(1, 3), T=small, S=small, hs=small, seed=seeds)
def test_multi_head_cross_attention(B, H, T, S, hs, seed):
    rng = np.random.default_rng(seed)
    visible = random_visible(rng, (B, H, T, S), "padding")
    C = H * hs
    inputs = {"x": normal(rng, B, T, C), "memory": normal(rng, B, S, C), **attention_params(rng, C)}

    def forward(i):
        return A.cross_attention_forward(
            i["x"], i["memory"], params_of(i, "x", "memory"), H, visible
        )

    def backward(dout, cache):
        dx, dmemory, grads = A.cross_attention_backward(dout, cache)
        return {"x": dx, "memory": dmemory, **grads}

    def torch_forward(t):
        module = TM.MultiHeadAttention(C, H)
        args = (t["x"], t["memory"], as_torch(visible))
        return functional_call(module, params_of(t, "x", "memory"), args)

    check_layer(LayerCase("cross-attention", inputs, forward, backward, torch_forward), rng)


# ------------------------------------------------------------------------------ blocks


def self_block_params(rng, C, F_):
    return {
        **layernorm_params(rng, C, "ln1"),
        **attention_params(rng, C, "attn."),
        **layernorm_params(rng, C, "ln2"),
        **ffn_params(rng, C, F_, "ffn."),
    }


# Blocks draw C >= 3 (model_widths): a layernorm over 1 or 2 channels leaves gradients
# that are rounding noise in both engines (see parity_tests/strategies.py).
@given(B=small, widths=model_widths(), T=small, F_=small, activation=activations,
       causal=st.booleans(), seed=seeds)  # fmt: skip
def test_self_attention_block(B, widths, T, F_, activation, causal, seed):
    rng = np.random.default_rng(seed)
    H, hs = widths
    C = H * hs
    visible = random_visible(rng, (B, H, T, T), "causal" if causal else "padding")
    inputs = {"x": normal(rng, B, T, C), **self_block_params(rng, C, F_)}

    def forward(i):
        return blocks.self_attention_block_forward(
            i["x"], params_of(i, "x"), H, visible, activation
        )

    def backward(dout, cache):
        dx, grads = blocks.self_attention_block_backward(dout, cache)
        return {"x": dx, **grads}

    def torch_forward(t):
        module = TM.SelfAttentionBlock(C, H, F_, activation)
        return functional_call(module, params_of(t, "x"), (t["x"], as_torch(visible)))

    name = "decoder-only block" if causal else "encoder block"
    check_layer(LayerCase(name, inputs, forward, backward, torch_forward), rng)


@given(B=small, widths=model_widths(), T=small, S=small, F_=small, activation=activations,
       seed=seeds)  # fmt: skip
def test_decoder_block(B, widths, T, S, F_, activation, seed):
    rng = np.random.default_rng(seed)
    H, hs = widths
    C = H * hs
    self_visible = random_visible(rng, (B, H, T, T), "causal")
    memory_visible = random_visible(rng, (B, H, T, S), "padding")
    inputs = {
        "y": normal(rng, B, T, C),
        "memory": normal(rng, B, S, C),
        **layernorm_params(rng, C, "ln1"),
        **attention_params(rng, C, "self_attn."),
        **layernorm_params(rng, C, "ln2"),
        **attention_params(rng, C, "cross_attn."),
        **layernorm_params(rng, C, "ln3"),
        **ffn_params(rng, C, F_, "ffn."),
    }

    def forward(i):
        p = params_of(i, "y", "memory")
        return blocks.decoder_block_forward(
            i["y"], i["memory"], p, H, self_visible, memory_visible, activation
        )

    def backward(dout, cache):
        dy, dmemory, grads = blocks.decoder_block_backward(dout, cache)
        return {"y": dy, "memory": dmemory, **grads}

    def torch_forward(t):
        module = TM.DecoderBlock(C, H, F_, activation)
        args = (t["y"], t["memory"], as_torch(self_visible), as_torch(memory_visible))
        return functional_call(module, params_of(t, "y", "memory"), args)

    check_layer(LayerCase("decoder block", inputs, forward, backward, torch_forward), rng)


@example(B=1, T=1, V=2, ignore_index=0, seed=3_094_535_186)  # a confident model, float32
@given(B=small, T=small, V=st.integers(2, 7), ignore_index=st.sampled_from([0, -100]), seed=seeds)
def test_cross_entropy_when_confident(B, T, V, ignore_index, seed):
    """Large logit gaps: p_y rounds near 1, so p_y - 1 must not be computed by subtraction."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(1, V, size=(B, T))
    logits = normal(rng, B, T, V)
    np.put_along_axis(logits, targets[..., None], 12.0, axis=-1)  # p_target ~ 1 - 1e-5
    case = cross_entropy_case("cross-entropy, confident", {"logits": logits}, targets, ignore_index)
    check_layer(case, rng)
