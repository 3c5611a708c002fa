"""Layernorm as a pair of pure functions, and its normalization without the scale and
shift (normalize_forward / normalize_backward), which blocks.py uses where a layernorm's
scale and shift fold into the projection it feeds (layers.linear_forward's affine).
The derivation of the backward's three terms: docs/gradients.md#layernorm.

Shape legend: x is (..., C), any leading axes, each row normalized over its C channels
(d_model).
"""

from __future__ import annotations

import numpy as np

from numpy_engine.reductions import dot_last, mean_last, sum_leading


def layernorm_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5
) -> tuple:
    """Normalise the last axis with the biased variance, then scale and shift."""
    xhat, norm = normalize_forward(x, eps)
    out = xhat * weight
    out += bias
    cache = (norm, weight)
    return out, cache


# Rows whose |mean| is at most 2 std skip the corrected two-pass's second pass: there the
# first mean's rounding cost xhat at most 5.0 u max|xhat|, against 4.5 u with the second
# pass (float32, C = 32 to 768, 20 draws of 512 rows each; at 4 std 7.7 u against 3.7), and
# the two passes are a third of the forward (char-lm's (1024, 64): 124 -> 80 us). The
# threshold was 4 std, until a float32 step with dropout (float32_panel's "gpt, dropout",
# seed 2127) carried that ~5 u through a layernorm backward that cancels 4.75x, and a mask
# that kept a small part of the result, to 1.075 of the float32 bound (0.104 at 2 std).
# Training runs: no row of char-lm's exceeds 2 std, 3 of copy's 5,827 layernorms have one.
_MEAN_SQUARED_OVER_VAR = 4.0


def normalize_forward(x: np.ndarray, eps: float = 1e-5) -> tuple:
    """A layernorm without its scale and shift: (x - mean) / sqrt(var + eps) over the last axis."""
    mean = mean_last(x)  # (..., 1)
    xc = x - mean  # (..., C)
    var = dot_last(xc, xc) * (1.0 / x.shape[-1])  # (..., 1) biased, as torch.nn.LayerNorm
    if np.greater(mean * mean, var * _MEAN_SQUARED_OVER_VAR).any():
        # The mean rounds at u |x|, which where |mean| >> std is far more than u std: one
        # more pass over xc, whose own mean d is that rounding, removes it (the corrected
        # two-pass), and the variance of xc - d is var - d^2.
        shift = mean_last(xc)
        xc -= shift
        var -= shift * shift
    rstd = 1.0 / np.sqrt(var + eps)  # (..., 1)
    xhat = xc
    xhat *= rstd  # (..., C), in place: xc is not needed again
    return xhat, (xhat, rstd)


def layernorm_backward(dout: np.ndarray, cache: tuple) -> tuple:
    """See docs/gradients.md#layernorm: three terms, from xhat's direct path, the mean and the
    variance. Returns (dx, {"weight": dweight, "bias": dbias})."""
    norm, weight = cache
    xhat, _ = norm
    # forward was out = xhat * weight + bias; weight and bias were shared by every row
    dweight = sum_leading(dout * xhat)
    dbias = sum_leading(dout)
    dxhat = dout * weight  # g in docs/gradients.md
    return normalize_backward(dxhat, norm), {"weight": dweight, "bias": dbias}


def normalize_backward(dxhat: np.ndarray, cache: tuple) -> np.ndarray:
    """dx of normalize_forward; overwrites dxhat."""
    xhat, rstd = cache
    # forward was xhat = (x - mean) * rstd: the direct path, minus the mean's, minus the variance's
    mean_dxhat_xhat = dot_last(dxhat, xhat) * (1.0 / xhat.shape[-1])  # (..., 1)
    dx = dxhat
    dx -= mean_last(dxhat)  # in place from here: dxhat is not needed again
    dx -= xhat * mean_dxhat_xhat
    dx *= rstd
    return dx
