"""Masks, scaled dot-product attention and multi-head attention.

Shape legend: B batch, H heads, Tq query positions, Tk key positions,
hs = C // H head width, C channels.

A mask is a boolean "visible" array (True = this query may attend to this key)
broadcastable to (B, H, Tq, Tk). Hidden scores become -inf before the softmax,
so hidden weights are exactly 0. A query row with no visible key is a ValueError.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from numpy_engine.layers import linear_backward, linear_forward

# ------------------------------------------------------------------------------ masks


def padding_visible(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """Keys that are not padding: (B, 1, 1, Tk), broadcast over heads and queries."""
    return (ids != pad_id)[:, None, None, :]


def causal_visible(T: int) -> np.ndarray:
    """Query t sees keys 0..t: (1, 1, T, T) lower triangle."""
    return np.tril(np.ones((T, T), dtype=bool))[None, None]


def check_every_row_sees_a_key(visible: np.ndarray, scores_shape: tuple) -> None:
    """A row with no visible key has no softmax (0/0); refuse it instead of returning NaN."""
    row_sees_a_key = np.broadcast_to(visible.any(axis=-1), scores_shape[:-1])  # (B, H, Tq)
    if not row_sees_a_key.all():
        b, h, t = np.argwhere(~row_sees_a_key)[0]
        raise ValueError(
            f"visible: the query at batch row {b}, position {t} (head {h}) has no visible key; "
            "every query must be allowed to attend to at least one key"
        )


# --------------------------------------------------------- scaled dot-product attention


class AttentionCache(NamedTuple):
    q: np.ndarray  # (B, H, Tq, hs)
    k: np.ndarray  # (B, H, Tk, hs)
    v: np.ndarray  # (B, H, Tk, hs)
    weights: np.ndarray  # (B, H, Tq, Tk), rows sum to 1, hidden entries exactly 0


def attention_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None
) -> tuple:
    """y = softmax(q k^T / sqrt(hs), hidden keys at -inf) v."""
    scale = 1.0 / math.sqrt(q.shape[-1])  # a Python float keeps float32 float32
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, Tq, Tk)
    if visible is not None:
        check_every_row_sees_a_key(visible, scores.shape)
        np.copyto(scores, -np.inf, where=~visible)  # far cheaper than scores[~visible] = -inf
    scores -= scores.max(axis=-1, keepdims=True)  # each row has a finite max: it sees a key
    weights = np.exp(scores)  # exp(-inf) = 0 exactly
    weights /= weights.sum(axis=-1, keepdims=True)
    y = weights @ v  # (B, H, Tq, hs)
    return y, AttentionCache(q, k, v, weights)


def attention_backward(dy: np.ndarray, cache: AttentionCache) -> tuple:
    """See docs/gradients.md#attention. Returns (dq, dk, dv)."""
    q, k, v, weights = cache
    scale = 1.0 / math.sqrt(q.shape[-1])
    # forward was y = weights @ v
    dweights = dy @ v.swapaxes(-1, -2)  # (B, H, Tq, Tk)
    dv = weights.swapaxes(-1, -2) @ dy  # (B, H, Tk, hs)
    # softmax Jacobian per row: dscores = w * (dw - sum(dw * w)); hidden w = 0 gives 0
    dscores = weights * (dweights - (dweights * weights).sum(axis=-1, keepdims=True))
    # forward was scores = q @ k^T * scale
    dq = (dscores @ k) * scale  # (B, H, Tq, hs)
    dk = (dscores.swapaxes(-1, -2) @ q) * scale  # (B, H, Tk, hs)
    return dq, dk, dv


# ----------------------------------------------------------------- multi-head attention


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    B, T, C = x.shape
    return x.reshape(B, T, n_heads, C // n_heads).transpose(0, 2, 1, 3)  # (B, H, T, hs)


def merge_heads(x: np.ndarray) -> np.ndarray:
    B, H, T, hs = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * hs)  # (B, T, C)


class MHACache(NamedTuple):
    q_proj: tuple
    k_proj: tuple
    v_proj: tuple
    attention: AttentionCache
    out_proj: tuple
    n_heads: int


def mha_forward(
    x: np.ndarray,
    memory: np.ndarray,
    p: dict[str, np.ndarray],
    n_heads: int,
    visible: np.ndarray | None,
) -> tuple:
    """Queries from x (B, Tq, C); keys and values from memory (B, Tk, C).

    Self-attention passes the same array as x and memory; cross-attention passes
    the encoder output as memory. p holds {q,k,v,out}_proj.{weight,bias}.
    """
    q, q_cache = linear_forward(x, p["q_proj.weight"], p["q_proj.bias"])  # (B, Tq, C)
    k, k_cache = linear_forward(memory, p["k_proj.weight"], p["k_proj.bias"])  # (B, Tk, C)
    v, v_cache = linear_forward(memory, p["v_proj.weight"], p["v_proj.bias"])  # (B, Tk, C)
    y, attn_cache = attention_forward(
        split_heads(q, n_heads), split_heads(k, n_heads), split_heads(v, n_heads), visible
    )  # (B, H, Tq, hs)
    out, out_cache = linear_forward(merge_heads(y), p["out_proj.weight"], p["out_proj.bias"])
    return out, MHACache(q_cache, k_cache, v_cache, attn_cache, out_cache, n_heads)


def mha_backward(dout: np.ndarray, cache: MHACache) -> tuple:
    """See docs/gradients.md#multi-head-attention. Returns (dx, dmemory, grads keyed like p)."""
    dy, dwo, dbo = linear_backward(dout, cache.out_proj)  # forward was out = out_proj(merge(y))
    # merge_heads was a reshape, so split_heads undoes it on the gradient
    dq, dk, dv = attention_backward(split_heads(dy, cache.n_heads), cache.attention)
    dx, dwq, dbq = linear_backward(merge_heads(dq), cache.q_proj)  # forward was q = q_proj(x)
    dmemory_k, dwk, dbk = linear_backward(merge_heads(dk), cache.k_proj)  # k = k_proj(memory)
    dmemory_v, dwv, dbv = linear_backward(merge_heads(dv), cache.v_proj)  # v = v_proj(memory)
    dmemory = dmemory_k + dmemory_v  # memory fed both the keys and the values
    grads = {
        "q_proj.weight": dwq, "q_proj.bias": dbq,
        "k_proj.weight": dwk, "k_proj.bias": dbk,
        "v_proj.weight": dwv, "v_proj.bias": dbv,
        "out_proj.weight": dwo, "out_proj.bias": dbo,
    }  # fmt: skip
    return dx, dmemory, grads
