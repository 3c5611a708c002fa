"""Activations as pairs of pure functions: ReLU, and GELU in its tanh form.

Each ``X_forward(x, for_backward, out) -> (out, cache)`` has an ``X_backward(dout, cache,
out)``; either may write into the array it is given (the feed-forward layer gives each the
fresh array it has just made, layers.ffn_forward). The derivations live in
docs/gradients.md (#relu, #gelu). GELU's chain of elementwise passes runs on blocks of rows
that stay in cache (blocking.py), and computes its derivative while it does, so its
backward is one product.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from numpy_engine.blocking import in_row_blocks
from numpy_engine.checks import InputError, InputTypeError


def relu_forward(x: np.ndarray, for_backward: bool = True, out: np.ndarray | None = None) -> tuple:
    """max(x, 0), into out if given (x itself may be out); the cache is the output, positive
    exactly where x is, so for_backward changes nothing here."""
    out = np.maximum(x, 0, out=out)
    return out, out


def relu_backward(dout: np.ndarray, cache: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """See docs/gradients.md#relu. The gradient at exactly 0 is 0, as in PyTorch. Into out
    if given (dout itself may be out)."""
    relu_x = cache  # max(x, 0) > 0 exactly where x > 0
    return np.multiply(dout, relu_x > 0, out=out)


_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def _exp2_runs_in_simd() -> bool:
    """Whether this NumPy runs float32 exp2 with SIMD on this processor. With AVX-512 (Zen 4,
    the Xeon) its exp2 is SIMD and takes half its exp's time; on a processor without (Zen 3,
    AVX2) exp2 is the C library's and takes twice exp's: 64K float32 numbers, exp2 0.26 G
    a second, exp 0.53; GELU's (1024, 256) forward there 2.2-2.6 -> 1.1-1.6 ms
    (docs/performance.md)."""
    try:
        from numpy.lib.introspect import opt_func_info  # NumPy >= 2.0

        loop = opt_func_info(func_name="^exp2$")["exp2"]["ff"]  # ff: float32 -> float32
    except (ImportError, KeyError):  # not known: exp2, as before this check
        return True
    return not loop["current"].startswith("baseline")


class ExpForm(NamedTuple):
    """How GELU computes e = exp(-2u): exp(z) = 2^(z log2 e), so as exp2 of the exponent in
    octaves, or as exp itself; the exponent's constant (log_e) folds into the polynomial's."""

    exp: np.ufunc  # np.exp2 or np.exp
    square_coef: float  # -2u log_e = x (square_coef x^2 - offset), u = k x (1 + a x^2)
    offset: float
    cap: dict  # dtype: the exponent's cap (exp_form)


def exp_form(exp: np.ufunc) -> ExpForm:
    """GELU's ExpForm by exp (np.exp2 or np.exp). The exponent is capped where e reaches
    2^(maxexp - 2) (float32 2^126, float64 2^1022), two octaves below the power of two that
    overflows: the largest exponent of the dtype where exp is at most that (126 ln 2 rounds
    up in float32: one step down). For float32 and float64 only (_exp_minus_2u)."""
    log_e, octave = (1.0 / math.log(2.0), 1.0) if exp is np.exp2 else (1.0, math.log(2.0))
    caps = {}
    for dtype in (np.float32, np.float64):
        limit = dtype(2.0) ** (np.finfo(dtype).maxexp - 2)
        cap = dtype((np.finfo(dtype).maxexp - 2) * octave)
        while exp(cap) > limit:
            cap = np.nextafter(cap, dtype(0))
        caps[np.dtype(dtype)] = cap
    return ExpForm(exp, -2 * _GELU_K * _GELU_A * log_e, 2 * _GELU_K * log_e, caps)


GELU_EXP = exp_form(np.exp2 if _exp2_runs_in_simd() else np.exp)  # the faster on this machine


def gelu_forward(x: np.ndarray, for_backward: bool = True, out: np.ndarray | None = None) -> tuple:
    """GELU, tanh form: 0.5 x (1 + tanh(k (x + a x^3))), as approximate="tanh".

    With e = exp(-2u) and s = 1 / (1 + e) = (1 + tanh(u)) / 2, out = x s. tanh(u) itself
    rounds near -1 (or 1) in GELU's tails, and 1 + tanh(u) (or 1 - tanh(u), in the
    derivative) would keep only the digits of that rounding: a unit whose inputs sit in a
    tail would get a gradient of noise. s and 1 - s = e s have no such subtraction.
    The forward also computes the derivative, while its inputs sit in cache: the cache is
    that one array, and the backward is one product. for_backward=False (decoding) skips
    the derivative: the cache is then None, and out is x / (1 + e), within a rounding of
    x s. The chain runs on blocks of rows that stay in cache (blocking.py). out: a
    C-contiguous array shaped like x to write the output into (x itself may be out); any
    other out is left alone, and the output is returned in a new array, as for out=None.
    """
    if x.dtype not in GELU_EXP.cap:
        raise InputTypeError(f"gelu_forward: x must be float32 or float64, got {x.dtype}")
    if out is None or not out.flags.c_contiguous:  # its rows must be views
        out = np.empty_like(x, order="C")  # whatever x's layout: in_row_blocks needs C order
    if not for_backward:
        in_row_blocks(_gelu_output_block, (x,), (out,))
        return out, None
    slope = np.empty_like(x, order="C")
    in_row_blocks(_gelu_block, (x,), (out, slope))
    return out, slope


def _gelu_block(x, out, slope) -> None:
    """out = x s and slope = s (1 + (1 - s) 2 x k (1 + 3 a x^2)) on one block of rows; out
    is written last, so it may be x itself."""
    np.multiply(x, x, out=slope)  # x^2, kept in slope until the derivative needs it
    e = _exp_minus_2u(x, np.multiply(slope, GELU_EXP.square_coef))
    s = np.add(e, 1.0)
    np.divide(1.0, s, out=s)  # s = 1 / (1 + e)
    _gelu_slope(x, s, e, slope)
    np.multiply(x, s, out=out)


def _gelu_output_block(x, out) -> None:
    """out = x / (1 + e) alone (decoding): one pass fewer than x s, the division taking x
    itself; the same values to within a rounding."""
    e = np.multiply(x, x)
    e *= GELU_EXP.square_coef
    e = _exp_minus_2u(x, e)
    np.add(e, 1.0, out=e)
    np.divide(x, e, out=out)  # the last read of x: out may be x itself


def _exp_minus_2u(x, e):
    """exp(-2u), written over e = x^2 GELU_EXP.square_coef (x**3 would call pow, ~100x
    slower)."""
    form = GELU_EXP
    e -= form.offset
    e *= x  # -2u log_e
    # e <= 2^(maxexp - 2) (2^maxexp overflows; float32 2^126): e stays finite, so 1 - s = e s
    # is never inf * 0, and s = 1 / (1 + e) stays a normal number (far in the lower tail,
    # out = x s is then about |x| 2^-126 in float32, ~1e-37, where tanh's form gives 0). float16's
    # 2^-14 would not be negligible there (its slope at x = -30 would read -0.36): refused
    # Capped only when an exponent exceeds the cap (float32 x below ~-10): the max is one
    # reduction, where np.minimum by a scalar is a pass at a quarter of its speed on AVX2
    # (Zen 3: 5.0 against 1.25 G entries/s); an empty block's max is the initial -inf
    cap = form.cap[x.dtype]
    if e.max(initial=-np.inf) > cap:
        np.minimum(e, cap, out=e)
    return form.exp(e, out=e)


def _gelu_slope(x, s, e, slope) -> None:
    """slope = s (1 + (1 - s) 2 x k (1 + 3 a x^2)) from slope = x^2, s and e = exp(-2u)."""
    e *= s  # 1 - s
    slope *= 6 * _GELU_K * _GELU_A
    slope += 2 * _GELU_K
    slope *= x  # 2u' x = 2 x k (1 + 3 a x^2)
    slope *= e
    slope += 1.0
    slope *= s  # d(x s)/dx = s + x s (1 - s) 2u', s = sigmoid(2u)


def gelu_backward(dout: np.ndarray, cache: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """See docs/gradients.md#gelu: dout times the derivative the forward computed. Into out
    if given (dout itself may be out)."""
    if cache is None:
        raise InputError("gelu_backward: its forward ran with for_backward=False (decoding)")
    return np.multiply(dout, cache, out=out)  # forward was x s(x); cache is d out / dx


ACTIVATIONS = {
    "relu": (relu_forward, relu_backward),
    "gelu": (gelu_forward, gelu_backward),
}
