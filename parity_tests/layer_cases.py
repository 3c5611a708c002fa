"""Every layer pair as a LayerCase: its float64 inputs, the engine's forward and backward, and
torch's forward. One builder per layer, taking a generator and the sizes; the tests in
test_layers.py draw the sizes, test_float32.py runs a fixed panel of them.

Values are scaled as in training (weights N(0, 1/fan_in)), so activations stay O(1) and
softmaxes do not saturate (a saturated softmax leaves gradients at rounding level).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

import torch_reference.modules as TM
from numpy_engine import activations as Act
from numpy_engine import attention as A
from numpy_engine import blocks, losses, masks
from numpy_engine import layernorm as LN
from numpy_engine import layers as L
from numpy_engine import multihead as MH
from numpy_engine import params as P
from parity_tests.helpers import LayerCase, params_of, random_visible, region_of


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def randomized(params: dict[str, np.ndarray], rng: np.random.Generator) -> dict:
    """params.py's keys and shapes, every value random and scaled as in training: weight
    matrices N(0, 1/fan_in); 1-D weights (layernorm gains) 1 + 0.3 N(0, 1), not exactly 1;
    biases N(0, 1), not 0, so a forward or backward that drops one shows."""
    out = {}
    for key, value in params.items():
        if value.ndim == 2:  # (out, in)
            out[key] = normal(rng, *value.shape) / np.sqrt(value.shape[1])
        elif key.endswith("weight"):
            out[key] = 1 + 0.3 * normal(rng, *value.shape)
        else:
            out[key] = normal(rng, *value.shape)
    return out


def gradients(backward, *input_names: str):
    """A backward under the layer contract, (input grads..., grads dict), as one dict: each
    input's gradient by name, then the parameters' (integer ids' None is dropped)."""

    def run(dout, cache):
        *input_grads, param_grads = backward(dout, cache)
        named_inputs = zip(input_names, input_grads, strict=True)
        return {name: g for name, g in named_inputs if g is not None} | param_grads

    return run


def as_torch(visible: np.ndarray | None) -> torch.Tensor | None:
    return None if visible is None else torch.tensor(visible)


def named(names: tuple[str, ...], grads: tuple) -> dict:
    return dict(zip(names, grads, strict=True))


# ------------------------------------------------------------------------------ layers


def linear(rng, B, T, c_in, c_out, bias: bool = True, affine: bool = False) -> LayerCase:
    """A linear layer; with affine, its input enters through a layernorm's scale and shift,
    folded into it (layers.linear_forward's affine)."""
    params = randomized(P.linear_params(np.zeros, c_out, c_in), rng)
    if not bias:  # as GPT-2's tied head
        del params["bias"]
    if affine:
        params |= {"input_scale": 1 + 0.3 * normal(rng, c_in), "input_shift": normal(rng, c_in)}

    def forward(i):
        scale_shift = (i["input_scale"], i["input_shift"]) if affine else None
        return L.linear_forward(i["x"], i["weight"], i.get("bias"), scale_shift)

    def torch_forward(t):
        x = t["x"] * t["input_scale"] + t["input_shift"] if affine else t["x"]
        return F.linear(x, t["weight"], t.get("bias"))

    name = "linear" + (" with a folded input affine" if affine else "")
    return LayerCase(
        name if bias else f"{name} without bias",
        {"x": normal(rng, B, T, c_in), **params},
        forward,
        gradients(L.linear_backward, "x"),
        torch_forward,
    )


def embedding(rng, ids, C) -> LayerCase:
    """The whole table, the padding row (id 0) included: its gradient must be 0 in both."""
    V = int(ids.max()) + 1
    return LayerCase(
        "embedding",
        {"weight": normal(rng, V, C)},
        lambda i: L.embedding_forward(ids, i["weight"], padding_idx=0),
        gradients(L.embedding_backward, "ids"),
        lambda t: F.embedding(torch.tensor(ids), t["weight"], padding_idx=0),
    )


def sinusoidal_positions(rng, B, T, C) -> LayerCase:
    return LayerCase(
        "sinusoidal positions",
        {"x": normal(rng, B, T, C)},
        lambda i: L.sinusoidal_forward(i["x"]),
        lambda dout, cache: {"x": L.sinusoidal_backward(dout, cache)},
        lambda t: t["x"] + TM.sinusoidal_table(T, C, t["x"].dtype),
    )


def learned_positions(rng, B, T, extra, C) -> LayerCase:
    return LayerCase(
        "learned positions",
        {"x": normal(rng, B, T, C), "weight": normal(rng, T + extra, C)},
        lambda i: L.learned_positions_forward(i["x"], i["weight"]),
        gradients(L.learned_positions_backward, "x"),
        lambda t: t["x"] + t["weight"][:T],
    )


def layernorm(rng, B, T, C, mean=1.0) -> LayerCase:
    """x = 3 N(0, 1) + mean: a large mean is where E[x^2] - E[x]^2 would lose the variance."""
    inputs = {"x": 3 * normal(rng, B, T, C) + mean, **randomized(P.layernorm_params(C), rng)}
    return LayerCase(
        "layernorm",
        inputs,
        lambda i: LN.layernorm_forward(i["x"], i["weight"], i["bias"]),
        gradients(LN.layernorm_backward, "x"),
        lambda t: F.layer_norm(t["x"], (C,), t["weight"], t["bias"], eps=1e-5),
    )


TORCH_ACTIVATIONS = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh")}


def activation(rng, kind, B, T, C, mean=0.0) -> LayerCase:
    """x = N(0, 1) + mean: at mean -6 GELU is deep in its tail, where 1 + tanh(u) is tiny."""
    act_forward, act_backward = Act.ACTIVATIONS[kind]
    return LayerCase(
        kind,
        {"x": normal(rng, B, T, C) + mean},  # within h of ReLU's kink: probability ~1e-5 a draw
        lambda i: act_forward(i["x"]),
        lambda dout, cache: {"x": act_backward(dout, cache)},
        lambda t: TORCH_ACTIVATIONS[kind](t["x"]),
        region_of(kind, lambda out: (out > 0).tobytes()),  # ReLU's cache is its output
    )


def feed_forward(rng, kind, B, T, C, F_) -> LayerCase:
    def torch_forward(t):
        return functional_call(TM.FeedForward(C, F_, kind), params_of(t, "x"), (t["x"],))

    return LayerCase(
        f"ffn ({kind})",
        {"x": normal(rng, B, T, C), **randomized(P.ffn_params(np.zeros, C, F_), rng)},
        lambda i: L.ffn_forward(i["x"], params_of(i, "x"), kind),
        gradients(L.ffn_backward, "x"),
        torch_forward,
        region_of(kind),
    )


def cross_entropy_case(name, logits, targets, ignore_index) -> LayerCase:
    V = logits.shape[-1]

    def torch_forward(t):
        flat = t["logits"].reshape(-1, V)
        return F.cross_entropy(flat, torch.tensor(targets).reshape(-1), ignore_index=ignore_index)

    return LayerCase(
        name,
        {"logits": logits},
        lambda i: losses.cross_entropy_forward(i["logits"], targets, ignore_index),
        lambda dloss, cache: {"logits": losses.cross_entropy_backward(float(dloss), cache)},
        torch_forward,
    )


def cross_entropy(rng, B, T, V, ignore_index) -> LayerCase:
    """Logits (B, T, V) against targets of which ~30% are ignore_index."""
    targets = rng.integers(0, V, size=(B, T))
    targets[rng.random((B, T)) < 0.3] = ignore_index
    targets[0, 0] = 1  # at least one counted target
    return cross_entropy_case("cross-entropy", 2 * normal(rng, B, T, V), targets, ignore_index)


def confident_cross_entropy(rng, B, T, V, ignore_index) -> LayerCase:
    """The target's logit is 12, the others N(0, 1): p_target ~ 1 - 1e-5, and the loss is
    log(1 + a small mass), where 1 + that mass would round most of it away."""
    targets = rng.integers(1, V, size=(B, T))
    logits = normal(rng, B, T, V)
    np.put_along_axis(logits, targets[..., None], 12.0, axis=-1)
    return cross_entropy_case("cross-entropy, confident", logits, targets, ignore_index)


# --------------------------------------------------------------------------- attention


def attention(rng, B, H, Tq, Tk, hs, kind, offset=0.0) -> LayerCase:
    """Scaled dot-product attention of q, k, v (B, H, T, hs) under a mask of that kind; with an
    offset, every score of a row is shifted by it (near +100 exp would overflow). "shared
    causal": masks.causal_visible's own mask, as the decoder-only models give it."""
    Tk = Tq if kind in ("causal", "shared causal") else Tk
    if kind == "shared causal":
        visible = masks.causal_visible(Tq)
    else:
        visible = random_visible(rng, (B, H, Tq, Tk), kind)
    inputs = {"q": normal(rng, B, H, Tq, hs), "k": normal(rng, B, H, Tk, hs)}
    inputs["v"] = normal(rng, B, H, Tk, hs)
    if offset:
        inputs["k"][..., 0] = 1.0  # then q's first coordinate adds one amount to a whole row
        inputs["q"][..., 0] = offset * np.sqrt(hs)
    name = f"attention, scores near {offset:+.0f}" if offset else f"attention ({kind} mask)"
    return LayerCase(
        name,
        inputs,
        lambda i: A.attention_forward(i["q"], i["k"], i["v"], visible),
        lambda dout, cache: named(("q", "k", "v"), A.attention_backward(dout, cache)),
        lambda t: TM.attention(t["q"], t["k"], t["v"], as_torch(visible)),
    )


def self_attention(rng, B, H, T, hs, causal) -> LayerCase:
    visible = random_visible(rng, (B, H, T, T), "causal" if causal else "padding")

    def torch_forward(t):
        module = TM.MultiHeadAttention(H * hs, H)
        return functional_call(module, params_of(t, "x"), (t["x"], t["x"], as_torch(visible)))

    return LayerCase(
        "causal self-attention" if causal else "self-attention",
        {"x": normal(rng, B, T, H * hs), **randomized(P.attention_params(np.zeros, H * hs), rng)},
        lambda i: MH.self_attention_forward(i["x"], params_of(i, "x"), H, visible),
        gradients(MH.self_attention_backward, "x"),
        torch_forward,
    )


def cross_attention(rng, B, H, T, S, hs) -> LayerCase:
    visible = random_visible(rng, (B, H, T, S), "padding")
    C = H * hs

    def forward(i):
        return MH.cross_attention_forward(
            i["x"], i["memory"], params_of(i, "x", "memory"), H, visible
        )

    def torch_forward(t):
        args = (t["x"], t["memory"], as_torch(visible))
        return functional_call(TM.MultiHeadAttention(C, H), params_of(t, "x", "memory"), args)

    inputs = {
        "x": normal(rng, B, T, C),
        "memory": normal(rng, B, S, C),
        **randomized(P.attention_params(np.zeros, C), rng),
    }
    return LayerCase(
        "cross-attention",
        inputs,
        forward,
        gradients(MH.cross_attention_backward, "x", "memory"),
        torch_forward,
    )


# ------------------------------------------------------------------------------ blocks


def self_attention_block(rng, B, H, hs, T, F_, kind, causal) -> LayerCase:
    C = H * hs
    visible = random_visible(rng, (B, H, T, T), "causal" if causal else "padding")

    def forward(i):
        return blocks.self_attention_block_forward(i["x"], params_of(i, "x"), H, visible, kind)

    def torch_forward(t):
        module = TM.SelfAttentionBlock(C, H, F_, kind)
        return functional_call(module, params_of(t, "x"), (t["x"], as_torch(visible)))

    name = "decoder-only block" if causal else "encoder block"
    inputs = {"x": normal(rng, B, T, C), **randomized(P.self_block_params(np.zeros, C, F_), rng)}
    backward = gradients(blocks.self_attention_block_backward, "x")
    return LayerCase(name, inputs, forward, backward, torch_forward, region_of(kind))


def decoder_block(rng, B, H, hs, T, S, F_, kind) -> LayerCase:
    C = H * hs
    self_visible = random_visible(rng, (B, H, T, T), "causal")
    memory_visible = random_visible(rng, (B, H, T, S), "padding")

    def forward(i):
        p = params_of(i, "y", "memory")
        return blocks.decoder_block_forward(
            i["y"], i["memory"], p, H, self_visible, memory_visible, kind
        )

    def torch_forward(t):
        module = TM.DecoderBlock(C, H, F_, kind)
        args = (t["y"], t["memory"], as_torch(self_visible), as_torch(memory_visible))
        return functional_call(module, params_of(t, "y", "memory"), args)

    inputs = {
        "y": normal(rng, B, T, C),
        "memory": normal(rng, B, S, C),
        **randomized(P.decoder_block_params(np.zeros, C, F_), rng),
    }
    return LayerCase(
        "decoder block",
        inputs,
        forward,
        gradients(blocks.decoder_block_backward, "y", "memory"),
        torch_forward,
        region_of(kind),
    )
