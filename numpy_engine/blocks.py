"""Pre-norm residual blocks: x + sublayer(layernorm(x)), one sublayer at a time.

Shape legend: B batch, T target (or only) positions, S source positions, C channels.
Every residual is a fork: x feeds the skip path and the sublayer, so its gradient
is the sum of both, written out where it happens.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from numpy_engine.checks import InputError
from numpy_engine.dropout import Dropout, dropped, dropped_copy, site_mask
from numpy_engine.keys import sub
from numpy_engine.kvcache import KeysValues, KeyValueBuffer
from numpy_engine.layernorm import (
    layernorm_backward,
    layernorm_forward,
    normalize_backward,
    normalize_forward,
)
from numpy_engine.layers import ffn_backward, ffn_forward, input_affine_grads
from numpy_engine.multihead import (
    cross_attention_backward,
    cross_attention_forward,
    self_attention_backward,
    self_attention_forward,
)

# Fold when x has at least 4x as many rows as the projection has outputs, and 16K entries.
# A layernorm + linear, forward and backward, folded / not (alone, float32, C 64 and 256,
# median of 20), by rows per output: 1-1.3x 1.01-1.03; 2x 0.99-1.00; 2.7x 0.97-1.01; 4x
# 0.97-0.98; 5.3x 0.97-0.98; 16x 0.92. The step gains more (char-lm -2%). On the copy
# model's tiny arrays (4K entries) a fold's few more calls cost its step 1.9%.
FOLD_ROWS, FOLD_ENTRIES = 4, 16384


def normed(x: np.ndarray, p: dict, name: str, width: int) -> tuple:
    """(The layernorm `name` of x, its cache, None), or, when the projection it feeds (width
    outputs) is small against x's rows, (x normalised without the layernorm's scale and
    shift, its cache, that (scale, shift)) for the projection to fold into its weight and
    bias (layers.linear_forward's affine): passes over the (width, C) weight instead of
    over x, two forward and three backward."""
    if x.size < FOLD_ENTRIES or x.size < FOLD_ROWS * width * x.shape[-1]:
        xn, cache = layernorm_forward(x, p[f"{name}.weight"], p[f"{name}.bias"])
        return xn, cache, None
    xhat, cache = normalize_forward(x)
    return xhat, cache, (p[f"{name}.weight"], p[f"{name}.bias"])


def normed_backward(dxn: np.ndarray, cache: tuple, sublayer_grads: dict) -> tuple:
    """(dx, the layernorm's grads) of normed; a folded layernorm's grads are those of the
    projection's affine, taken out of sublayer_grads."""
    affine = input_affine_grads(sublayer_grads)
    if not affine:
        return layernorm_backward(dxn, cache)
    grads = {"weight": affine["input_scale"], "bias": affine["input_shift"]}
    return normalize_backward(dxn, cache), grads


def _residual(skip: np.ndarray, branch: np.ndarray) -> np.ndarray:
    """skip + branch, written into branch: a sublayer's fresh output (or input gradient),
    which no cache holds. One (B, T, C) temporary fewer a residual (char-lm -0.4% a step)."""
    branch += skip
    return branch


def _training_only(dropout: Dropout | None, past) -> None:
    """Dropout is a training step's, over whole sequences: decoding (past keys and values)
    drops nothing."""
    if dropout is not None and past is not None:
        raise InputError("dropout applies to training steps, not to decoding with past keys")


def _named(**parts: dict) -> dict[str, np.ndarray]:
    """One grads dict from each sublayer's, keyed "<sublayer>.<key>" in the order given."""
    return {f"{name}.{key}": value for name, grads in parts.items() for key, value in grads.items()}


# ------------------------------------------------------------- self-attention block


class SelfBlockCache(NamedTuple):
    ln1: tuple
    attn: tuple
    ln2: tuple
    ffn: tuple
    attn_drop: np.ndarray | None = None  # dropout masks on the two sublayers' outputs
    ffn_drop: np.ndarray | None = None


def self_attention_block_forward(
    x: np.ndarray,
    p: dict,
    n_heads: int,
    visible: np.ndarray,
    activation: str,
    past: KeysValues | KeyValueBuffer | None = None,
    for_backward: bool = True,
    dropout: Dropout | None = None,
) -> tuple:
    """The encoder block, and under a causal mask MiniGPT's decoder-only block.

    h = x + attn(ln1(x)); out = h + ffn(ln2(h)). x (B, T, C) -> (B, T, C). past: the
    attention's keys and values of earlier positions (see self_attention_forward);
    keys_values(cache.attn) is the next step's. for_backward=False: decoding, whose cache
    no backward reads (ffn_forward leaves out what only a backward needs). dropout (a
    training step's, dropout.py): on the attention weights, and on each sublayer's output
    before it joins the residual, as GPT-2's block: h = x + drop(attn(ln1(x))).
    """
    B, T, _ = x.shape
    _training_only(dropout, past)
    xn, ln1, affine = normed(x, p, "ln1", 3 * x.shape[-1])  # into q, k, v
    weights_drop = site_mask(dropout, "attn", (B, n_heads, T, T), xn.dtype)
    a, attn = self_attention_forward(
        xn, sub(p, "attn."), n_heads, visible, past, affine, weights_drop
    )
    attn_drop = site_mask(dropout, "resid", a.shape, a.dtype)
    h = _residual(x, dropped(a, attn_drop))  # (B, T, C)
    hn, ln2, affine = normed(h, p, "ln2", len(p["ffn.fc1.bias"]))
    f, ffn = ffn_forward(hn, sub(p, "ffn."), activation, affine, for_backward)  # (B, T, C)
    ffn_drop = site_mask(dropout, "resid", f.shape, f.dtype)
    out = _residual(h, dropped(f, ffn_drop))
    return out, SelfBlockCache(ln1, attn, ln2, ffn, attn_drop, ffn_drop)


def self_attention_block_backward(dout: np.ndarray, cache: SelfBlockCache) -> tuple:
    """See docs/gradients.md#residual-blocks (and #dropout, for the masks). Returns (dx,
    grads keyed like p)."""
    # forward was out = h + drop(ffn(ln2(h))): the FFN's output gets dout times its mask
    dhn, ffn_grads = ffn_backward(dropped_copy(dout, cache.ffn_drop), cache.ffn)
    dh_ln2, ln2_grads = normed_backward(dhn, cache.ln2, ffn_grads)
    dh = _residual(dout, dh_ln2)  # h fed the skip and the FFN
    # the attention's output was dropped, so is its gradient; the backward sums q, k, v paths
    dxn, attn_grads = self_attention_backward(dropped_copy(dh, cache.attn_drop), cache.attn)
    dx_ln1, ln1_grads = normed_backward(dxn, cache.ln1, attn_grads)
    dx = _residual(dh, dx_ln1)  # x fed the skip and the attention
    return dx, _named(ln1=ln1_grads, attn=attn_grads, ln2=ln2_grads, ffn=ffn_grads)


# -------------------------------------------------------------------- decoder block


class DecoderBlockCache(NamedTuple):
    ln1: tuple
    self_attn: tuple
    ln2: tuple
    cross_attn: tuple
    ln3: tuple
    ffn: tuple
    self_drop: np.ndarray | None = None  # dropout masks on the three sublayers' outputs
    cross_drop: np.ndarray | None = None
    ffn_drop: np.ndarray | None = None


def decoder_block_forward(
    y: np.ndarray,
    memory: np.ndarray,
    p: dict,
    n_heads: int,
    self_visible: np.ndarray,
    memory_visible: np.ndarray,
    activation: str,
    past: KeysValues | KeyValueBuffer | None = None,
    memory_kv: KeysValues | None = None,
    for_backward: bool = True,
    dropout: Dropout | None = None,
) -> tuple:
    """Causal self-attention, cross-attention over memory (B, S, C), then the FFN.

    h1 = y + self_attn(ln1(y)); h2 = h1 + cross_attn(ln2(h1), memory); out = h2 + ffn(ln3(h2)).
    For incremental decoding, past holds the self-attention's earlier keys and values and
    memory_kv the cross-attention's over memory (see multihead.py); for_backward and
    dropout (on both attentions' weights and each sublayer's output) as in
    self_attention_block_forward.
    """
    B, T, _ = y.shape
    _training_only(dropout, past)
    yn, ln1, affine = normed(y, p, "ln1", 3 * y.shape[-1])
    weights_drop = site_mask(dropout, "attn", (B, n_heads, T, T), yn.dtype)
    a, self_attn = self_attention_forward(
        yn, sub(p, "self_attn."), n_heads, self_visible, past, affine, weights_drop
    )
    self_drop = site_mask(dropout, "resid", a.shape, a.dtype)
    h1 = _residual(y, dropped(a, self_drop))  # (B, T, C)
    h1n, ln2, affine = normed(h1, p, "ln2", h1.shape[-1])  # into q
    weights_drop = site_mask(dropout, "attn", (B, n_heads, T, memory.shape[1]), h1n.dtype)
    c, cross_attn = cross_attention_forward(
        h1n, memory, sub(p, "cross_attn."), n_heads, memory_visible, memory_kv, affine, weights_drop
    )
    cross_drop = site_mask(dropout, "resid", c.shape, c.dtype)
    h2 = _residual(h1, dropped(c, cross_drop))  # (B, T, C)
    h2n, ln3, affine = normed(h2, p, "ln3", len(p["ffn.fc1.bias"]))
    f, ffn = ffn_forward(h2n, sub(p, "ffn."), activation, affine, for_backward)
    ffn_drop = site_mask(dropout, "resid", f.shape, f.dtype)
    out = _residual(h2, dropped(f, ffn_drop))
    drops = (self_drop, cross_drop, ffn_drop)
    return out, DecoderBlockCache(ln1, self_attn, ln2, cross_attn, ln3, ffn, *drops)


def decoder_block_backward(dout: np.ndarray, cache: DecoderBlockCache) -> tuple:
    """See docs/gradients.md#residual-blocks (and #dropout, for the masks). Returns (dy,
    dmemory, grads keyed like p)."""
    # forward was out = h2 + drop(ffn(ln3(h2))): the FFN's output gets dout times its mask
    dh2n, ffn_grads = ffn_backward(dropped_copy(dout, cache.ffn_drop), cache.ffn)
    dh2_ln3, ln3_grads = normed_backward(dh2n, cache.ln3, ffn_grads)
    dh2 = _residual(dout, dh2_ln3)  # h2 fed the skip and the FFN
    dh2_cross = dropped_copy(dh2, cache.cross_drop)  # a dropped output's gradient is dropped
    dh1n, dmemory, cross_grads = cross_attention_backward(dh2_cross, cache.cross_attn)
    dh1_ln2, ln2_grads = normed_backward(dh1n, cache.ln2, cross_grads)
    dh1 = _residual(dh2, dh1_ln2)  # h1 fed the skip and the cross-attention
    dh1_self = dropped_copy(dh1, cache.self_drop)
    dyn, self_grads = self_attention_backward(dh1_self, cache.self_attn)  # sums q, k, v paths
    dy_ln1, ln1_grads = normed_backward(dyn, cache.ln1, self_grads)
    dy = _residual(dh1, dy_ln1)  # y fed the skip and the self-attention
    grads = _named(ln1=ln1_grads, self_attn=self_grads, ln2=ln2_grads, cross_attn=cross_grads)
    return dy, dmemory, grads | _named(ln3=ln3_grads, ffn=ffn_grads)
