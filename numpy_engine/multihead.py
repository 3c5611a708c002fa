"""Multi-head attention: self-attention (with past keys and values, for decoding) and
cross-attention over an encoder's memory. Each projects its inputs into heads, runs
attention.py's scaled dot-product attention on them, and merges the heads back through its
output projection.

Shape legend: B batch, H heads, T positions, S memory positions, hs = C // H head width,
C channels.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from numpy_engine.attention import AttentionCache, attention_backward, attention_forward
from numpy_engine.checks import InputError
from numpy_engine.keys import with_prefix
from numpy_engine.kvcache import KeysValues, KeyValueBuffer
from numpy_engine.layers import (
    input_affine_grads,
    linear_backward,
    linear_forward,
    stacked,
    unstacked,
)


def split_heads(x: np.ndarray, n_heads: int, n_parts: int = 1) -> np.ndarray:
    """(B, T, n_parts * C) -> (B, H, T, hs) views, one per part (a tuple when n_parts > 1)."""
    B, T, width = x.shape
    hs = width // (n_parts * n_heads)
    parts = x.reshape(B, T, n_parts, n_heads, hs).transpose(2, 0, 3, 1, 4)  # (parts, B, H, T, hs)
    return parts[0] if n_parts == 1 else tuple(parts)


def heads_buffer(leading: tuple, width: int, n_heads: int, n_parts: int, dtype) -> tuple:
    """An empty (*leading, n_parts * width) array and its split_heads views, (B, H, T, hs)
    each: a product written into the views fills the array in the merged layout a
    projection reads (heads side by side, then parts), with no copy to merge them."""
    merged = np.empty((*leading, n_parts * width), dtype)
    return merged, split_heads(merged, n_heads, n_parts)


def prestacked_qkv(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """p's q, k, v projections stacked once, as entries to add to p: for a decoder, whose
    weights stay fixed while it runs (stacking copies 3 C^2 weights; GPT-2: 8 ms a token)."""
    weight, bias = stacked(p, QKV)
    return {"qkv_proj.weight": weight, "qkv_proj.bias": bias}


def _qkv(p: dict[str, np.ndarray]) -> tuple:
    """The q, k, v projections as one (layers.stacked): prestacked_qkv's, or stacked now."""
    if "qkv_proj.weight" in p:
        return p["qkv_proj.weight"], p["qkv_proj.bias"]
    return stacked(p, QKV)


QKV = ("q_proj", "k_proj", "v_proj")
KV = ("k_proj", "v_proj")


class SelfAttentionCache(NamedTuple):
    qkv_proj: tuple
    attention: AttentionCache
    out_proj: tuple
    n_heads: int
    past_length: int  # positions whose keys and values came from past (decoding)


def keys_values(cache: SelfAttentionCache | CrossAttentionCache) -> KeysValues:
    """The keys and values the attention read: the past and this call's, for the next step."""
    return KeysValues(cache.attention.k, cache.attention.v)


def self_attention_forward(
    x: np.ndarray,
    p: dict[str, np.ndarray],
    n_heads: int,
    visible: np.ndarray | None,
    past: KeysValues | KeyValueBuffer | None = None,
    affine: tuple | None = None,
    drop: np.ndarray | None = None,
) -> tuple:
    """Multi-head attention of x (B, T, C) over itself. p holds {q,k,v,out}_proj.{weight,bias}.

    The three input projections run as one matmul with their weights stacked. With past,
    the keys and values of earlier positions (B, H, L, hs), x's positions come after them:
    its queries see past + x's keys, and keys_values(cache) is the next step's past
    (incremental decoding; there is no backward through past); a KeyValueBuffer takes x's
    keys and values in place and is the next step's past itself. affine: x's layernorm
    scale and shift, for the stacked projection to fold in (layers.linear_forward). drop: a
    dropout mask on the attention weights (attention_forward).
    """
    qkv, qkv_cache = linear_forward(x, *_qkv(p), affine)  # (B, T, 3C)
    q, k, v = split_heads(qkv, n_heads, n_parts=3)  # (B, H, T, hs) each
    past_length = 0 if past is None else past.k.shape[2]
    if past is not None:
        k, v = past.extended(k, v)  # (B, H, past_length + T, hs) each
    merged, y = heads_buffer(x.shape[:-1], x.shape[-1], n_heads, 1, qkv.dtype)  # (B, T, C)
    _, attn_cache = attention_forward(q, k, v, visible, out=y, drop=drop)  # y: (B, H, T, hs)
    out, out_cache = linear_forward(merged, p["out_proj.weight"], p["out_proj.bias"])
    return out, SelfAttentionCache(qkv_cache, attn_cache, out_cache, n_heads, past_length)


def self_attention_backward(dout: np.ndarray, cache: SelfAttentionCache) -> tuple:
    """See docs/gradients.md#multi-head-attention. Returns (dx, grads keyed like p)."""
    if cache.past_length:
        raise InputError("self_attention_backward: the forward read past keys and values")
    dy, out_grads = linear_backward(dout, cache.out_proj)  # forward was out = out_proj(merge(y))
    # merging the heads was a reshape, so split_heads undoes it on the gradient; dq, dk and
    # dv are written side by side, (B, T, 3C), as the stacked projection's output was
    dqkv, heads = heads_buffer(dout.shape[:-1], dout.shape[-1], cache.n_heads, 3, dy.dtype)
    attention_backward(split_heads(dy, cache.n_heads), cache.attention, out=heads)
    # x fed the queries, keys and values: the stacked matmul adds the three paths. dk sums
    # to zero over the keys (key_part), and so over the projection's rows
    dx, qkv_grads = linear_backward(dqkv, cache.qkv_proj, key_part(QKV, dout.shape[-1]))
    grads = unstacked(qkv_grads, QKV) | with_prefix(out_grads, "out_proj.")
    return dx, grads | input_affine_grads(qkv_grads)


def key_part(names: tuple[str, ...], C: int) -> slice:
    """The key projection's outputs in a stacked projection (its parts named by names, C each),
    whose gradient sums to exactly zero over the keys: a vector c added to every key adds
    q_i . c to every score of row i, and softmax ignores a shift of a whole row, so the
    loss does not change along it. Hence b_k's gradient (dk summed over the keys) is 0, and
    linear_backward returns it as that 0, not as the rounding noise of the sum, and keeps
    the key weight's gradient clear of what the keys' inputs share
    (docs/gradients.md#multi-head-attention)."""
    part = names.index("k_proj")
    return slice(part * C, (part + 1) * C)


class CrossAttentionCache(NamedTuple):
    q_proj: tuple
    kv_proj: tuple
    attention: AttentionCache
    out_proj: tuple
    n_heads: int


def memory_keys_values(memory: np.ndarray, p: dict[str, np.ndarray], n_heads: int) -> tuple:
    """Keys and values over memory (B, Tk, C) in one matmul: ((k, v), the projection's cache)."""
    kv, kv_cache = linear_forward(memory, *stacked(p, KV))  # (B, Tk, 2C)
    return KeysValues(*split_heads(kv, n_heads, n_parts=2)), kv_cache  # (B, H, Tk, hs) each


def cross_attention_forward(
    x: np.ndarray,
    memory: np.ndarray,
    p: dict[str, np.ndarray],
    n_heads: int,
    visible: np.ndarray | None,
    memory_kv: KeysValues | None = None,
    affine: tuple | None = None,
    drop: np.ndarray | None = None,
) -> tuple:
    """Queries from x (B, Tq, C); keys and values from memory (B, Tk, C), the encoder's
    output. p holds {q,k,v,out}_proj.{weight,bias}; keys and values share one matmul.
    memory_kv, memory_keys_values' (k, v) from an earlier call, skips that matmul
    (incremental decoding; there is no backward through it). affine: x's layernorm scale and
    shift, for the query projection to fold in (layers.linear_forward). drop: a dropout mask
    on the attention weights (attention_forward)."""
    q, q_cache = linear_forward(x, p["q_proj.weight"], p["q_proj.bias"], affine)  # (B, Tq, C)
    if memory_kv is None:
        (k, v), kv_cache = memory_keys_values(memory, p, n_heads)
    else:
        (k, v), kv_cache = memory_kv, None
    merged, y = heads_buffer(x.shape[:-1], x.shape[-1], n_heads, 1, q.dtype)  # (B, Tq, C)
    _, attn_cache = attention_forward(split_heads(q, n_heads), k, v, visible, out=y, drop=drop)
    out, out_cache = linear_forward(merged, p["out_proj.weight"], p["out_proj.bias"])
    return out, CrossAttentionCache(q_cache, kv_cache, attn_cache, out_cache, n_heads)


def cross_attention_backward(dout: np.ndarray, cache: CrossAttentionCache) -> tuple:
    """See docs/gradients.md#multi-head-attention. Returns (dx, dmemory, grads keyed like p)."""
    if cache.kv_proj is None:
        raise InputError("cross_attention_backward: the forward was given memory_kv")
    dy, out_grads = linear_backward(dout, cache.out_proj)  # forward was out = out_proj(merge(y))
    H, C = cache.n_heads, dout.shape[-1]
    B, _, Tk, _ = cache.attention.k.shape  # memory's
    dq, dq_heads = heads_buffer(dout.shape[:-1], C, H, 1, dy.dtype)  # (B, Tq, C)
    dkv, (dk_heads, dv_heads) = heads_buffer((B, Tk), C, H, 2, dy.dtype)  # (B, Tk, 2C)
    attention_backward(split_heads(dy, H), cache.attention, out=(dq_heads, dk_heads, dv_heads))
    dx, q_grads = linear_backward(dq, cache.q_proj)  # forward was q = q_proj(x)
    # memory fed the keys and the values: the stacked matmul adds the two paths; dk sums to
    # zero over memory's keys, as in self-attention
    dmemory, kv_grads = linear_backward(dkv, cache.kv_proj, key_part(KV, C))
    affine_grads = input_affine_grads(q_grads)
    grads = with_prefix(q_grads, "q_proj.") | unstacked(kv_grads, KV)
    return dx, dmemory, grads | with_prefix(out_grads, "out_proj.") | affine_grads
