"""Layers as pairs of pure functions, in data-flow order.

Each ``X_forward(...) -> (out, cache)`` has an ``X_backward(dout, cache)`` that
returns fresh gradients, one per input, each with exactly its input's shape.
The derivations live in docs/gradients.md, one section per backward. The activations
the feed-forward layer applies (ReLU, GELU) are in activations.py, layernorm in layernorm.py.

Shape legend: B batch, T time, C channels (d_model), F FFN width, V vocabulary,
N = B * T rows once the leading axes are flattened.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from numpy_engine.activations import ACTIVATIONS
from numpy_engine.faster import FasterOfTwo
from numpy_engine.keys import with_prefix
from numpy_engine.reductions import mean_leading, sum_leading

# ----------------------------------------------------------------------------- linear


# Tiny weights are copied into (in, out) order for a product over many rows: at the copy
# model's (up to 3K entries, 96-256 rows) the product on the copy, copy included, took
# 10-25% less than on a W.T view. Past 4K entries the copy, a strided transpose at ~1 ns an
# entry, cost more than it saved (Intel, one thread, in-process A/B): without it, char-lm's
# step was 0.4% faster, a d_model 128 MiniGPT's 1.2% (1024 rows) and 6.3% (128 rows), and
# its generation past the context (each step reruns the window's 128 rows) 7-16%; GPT-2's
# copies had cost 14%. No copy for a few rows either (the KV cache's decoding step).
SMALL_WEIGHT_ENTRIES, MANY_ROWS = 4096, 64

# Decoding's few rows against a weight too large to stay in L2 (GPT-2's, read from memory
# at every token): row dots (np.vecdot) or the product linear_forward takes otherwise,
# whichever is faster on this machine, timed on the first calls (FEW_ROW_PATHS): the AMD
# EPYC Zen 4 decoded GPT-2 faster with row dots, the Intel Xeon 1.13-1.54x faster with the
# products (numpy_engine/faster.py; docs/performance.md, section 5). Weights that stay in
# cache multiply faster as products on both.
FEW_ROWS, LARGE_WEIGHT_ENTRIES = 4, 2**19

# 2 to 64 rows against a weight of 32K entries or more (batched decoding, a prompt, a small
# batch): there OpenBLAS's x @ W.T on the (out, in) weight took up to 10x one row's time
# (one thread, float32); the same product as W @ x.T on blocks of 512 outputs, each block's
# (512, N) product copied into its columns of the (N, out) result, took 0.11-0.96 of its
# time on weights of 196K entries or more, in cache or in memory, the gain shrinking as the
# rows grow, to none at 96-128. Under 32K entries (char-lm's weights) it lost at 2-4 rows, and
# by 2 us at 2-3 rows on a (384, 128) weight. The blocks also keep a language model's head
# to one logits array. `python -m benchmarks.linear_paths` times linear_forward's three
# paths (docs/performance.md, section 3).
SOME_ROWS, MID_WEIGHT_ENTRIES, TRANSPOSED_OUTPUTS = 64, 2**15, 512


def linear_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, affine: tuple | None = None
) -> tuple:
    """y = x @ weight.T + bias, weight stored (out, in) as in PyTorch; bias None: no bias.

    affine (scale, shift), each (in,): x enters as x * scale + shift (a layernorm's scale and
    shift, see blocks.normed), folded into the weight and bias (docs/gradients.md#linear):
    (x s + t) W^T + b = x (W s)^T + (b + W t)."""
    if affine is not None:
        return _folded_forward(x, weight, bias, affine)
    x2 = x.reshape(-1, x.shape[-1])  # (N, in): one 2-D matmul, not a batched one
    if _few_rows(len(x2), weight.shape):
        out = FEW_ROW_PATHS[len(x2)](x2, weight, work=len(x2) * weight.size)
    elif _some_rows(len(x2), weight.shape):
        out = _transposed_product(x2, weight)
    else:
        out = _product(x2, weight)
    if bias is not None:
        out += bias  # in place: a second (N, out) temporary costs about as much as the add
    out = out.reshape(*x.shape[:-1], weight.shape[0])  # (..., out)
    cache = (x, weight, bias is not None)
    return out, cache


def _few_rows(rows: int, weight_shape: tuple) -> bool:
    """Whether linear_forward multiplies rows of x by a (out, in) weight by the faster of
    row dots and a product (FEW_ROW_PATHS)."""
    return 0 < rows <= FEW_ROWS and weight_shape[0] * weight_shape[1] >= LARGE_WEIGHT_ENTRIES


def _row_dots(x2: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x2 (N, in) @ weight.T as N x out dot products: out[n, o] = W[o] . x[n]."""
    return np.vecdot(weight, x2[:, None, :])  # (out, in) with (N, 1, in): (N, out)


def _some_rows(rows: int, weight_shape: tuple) -> bool:
    """Whether linear_forward multiplies rows of x by a (out, in) weight as W @ x.T."""
    return 1 < rows <= SOME_ROWS and weight_shape[0] * weight_shape[1] >= MID_WEIGHT_ENTRIES


def _transposed_product(x2: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x2 (N, in) @ weight.T as weight @ x2.T, TRANSPOSED_OUTPUTS outputs at a time: each
    block's (outputs, N) product is copied into its columns of the (N, out) result, so no
    second (N, out) array exists (a language model's head: a second logits array)."""
    out = np.empty((len(x2), len(weight)), np.result_type(x2, weight))
    for start in range(0, len(weight), TRANSPOSED_OUTPUTS):
        stop = start + TRANSPOSED_OUTPUTS
        out[:, start:stop] = (weight[start:stop] @ x2.T).T
    return out


def _product(x2: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x2 (N, in) @ weight.T: (N, out)."""
    weight_t = weight.T  # (in, out)
    if weight.size <= SMALL_WEIGHT_ENTRIES and len(x2) >= MANY_ROWS:
        weight_t = np.copy(weight_t, order="C")  # not np.ascontiguousarray: see call_count.py
    return x2 @ weight_t


# Rows (1 to FEW_ROWS): row dots or the product linear_forward takes for them otherwise.
FEW_ROW_PATHS = {
    rows: FasterOfTwo(_row_dots, _product if rows == 1 else _transposed_product)
    for rows in range(1, FEW_ROWS + 1)
}


def linear_backward(dout: np.ndarray, cache: tuple, zero_sum: slice | None = None) -> tuple:
    """See docs/gradients.md#linear. Returns (dx, {"weight": dweight, "bias": dbias}), without
    "bias" when the forward had none; with "input_scale" and "input_shift" when it had an
    affine. zero_sum: outputs whose gradient sums to exactly zero over the rows (a key
    projection's, under softmax): their bias gradient comes back as that 0, and the weight
    gradient is taken from x less its mean row (_zero_sum_grads)."""
    if type(cache) is FoldedCache:
        return _folded_backward(dout, cache, zero_sum)
    x, weight, has_bias = cache
    dout2 = dout.reshape(-1, dout.shape[-1])  # (N, out)
    x2 = x.reshape(-1, x.shape[-1])  # (N, in)
    dx = (dout2 @ weight).reshape(x.shape)  # forward was x @ W.T, so dx = dout @ W
    if zero_sum is not None:
        return dx, _zero_sum_grads(dout2, x2, zero_sum, has_bias)
    dweight = dout2.T @ x2  # (out, in)
    if not has_bias:
        return dx, {"weight": dweight}
    dbias = sum_leading(dout2)  # the bias was broadcast over all N rows
    return dx, {"weight": dweight, "bias": dbias}


def _zero_sum_grads(dout2, x2, zero_sum: slice, has_bias: bool) -> dict[str, np.ndarray]:
    """dW = dout^T x = dout^T (x - c) + db c^T for any row c (db = sum of dout's rows). With c
    the mean row of x, the outputs whose db is exactly 0 take their dW from x - c alone:
    nothing of what x's rows share (a layernorm's shift) cancels in them, as it would in
    float32 in dout^T x (docs/gradients.md#linear)."""
    dbias = sum_leading(dout2)  # (out,)
    dbias[zero_sum] = 0.0  # their exact value; summed, the rounding of dout's rows
    mean = mean_leading(x2)  # (in,)
    dweight = dout2.T @ (x2 - mean)  # (out, in)
    dweight += np.multiply.outer(dbias, mean)
    return {"weight": dweight, "bias": dbias} if has_bias else {"weight": dweight}


def input_affine_grads(grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The gradients of a linear's folded input affine, taken out of its grads; {} if none."""
    if "input_scale" not in grads:
        return {}
    return {"input_scale": grads.pop("input_scale"), "input_shift": grads.pop("input_shift")}


class FoldedCache(NamedTuple):
    linear: tuple  # linear_forward's cache of the product with the folded weight and bias
    weight: np.ndarray  # (out, in) as given
    affine: tuple  # (scale, shift)
    has_bias: bool  # whether the linear itself has one (the folded product always does)


def _folded_forward(x, weight, bias, affine) -> tuple:
    scale, shift = affine
    folded_bias = weight @ shift  # (out,): always a bias, even where the linear has none
    if bias is not None:
        folded_bias += bias
    out, cache = linear_forward(x, weight * scale, folded_bias)
    return out, FoldedCache(cache, weight, affine, bias is not None)


def _folded_backward(dout: np.ndarray, cache: FoldedCache, zero_sum: slice | None) -> tuple:
    """The folded product's gradients, then those of W, b, s and t (docs/gradients.md#linear):
    dW = dW' s + db t^T, db = db', ds = sum over out of W * dW', dt = W^T db'."""
    dx, folded = linear_backward(dout, cache.linear, zero_sum)  # forward was out = x W'^T + b'
    (scale, shift), weight = cache.affine, cache.weight
    # forward was W' = W diag(s), b' = b + W t: W fed both, b and t only b', s only W'
    dweight = folded["weight"] * scale
    dweight += np.multiply.outer(folded["bias"], shift)
    grads = {"weight": dweight, "bias": folded["bias"]} if cache.has_bias else {"weight": dweight}
    grads["input_scale"] = sum_leading(weight * folded["weight"])  # (in,): column sums
    grads["input_shift"] = folded["bias"] @ weight  # W^T db'
    return dx, grads


def stacked(p: dict[str, np.ndarray], names: tuple[str, ...]) -> tuple:
    """Several projections as one: weights stacked row-wise (len(names) * C, C), biases joined.

    x @ [Wq; Wk; Wv].T is [x @ Wq.T, x @ Wk.T, x @ Wv.T] side by side: one matmul
    instead of three, and in the backward one matmul sums the three input gradients.
    """
    weight = np.concatenate([p[f"{name}.weight"] for name in names])
    bias = np.concatenate([p[f"{name}.bias"] for name in names])
    return weight, bias


def unstacked(joined: dict[str, np.ndarray], names: tuple[str, ...]) -> dict:
    """The stacked projection's gradients, split back into each projection's (row blocks)."""
    C = joined["weight"].shape[0] // len(names)
    grads = {}
    for i, name in enumerate(names):
        grads[f"{name}.weight"] = joined["weight"][i * C : (i + 1) * C]
        grads[f"{name}.bias"] = joined["bias"][i * C : (i + 1) * C]
    return grads


# -------------------------------------------------------------------------- embedding


def embedding_forward(ids: np.ndarray, weight: np.ndarray, padding_idx: int | None = None) -> tuple:
    """out[b, t] = weight[ids[b, t]]; the row padding_idx receives no gradient."""
    out = weight[ids]  # (B, T, C)
    cache = (ids, weight.shape, padding_idx)
    return out, cache


def embedding_backward(dout: np.ndarray, cache: tuple) -> tuple:
    """See docs/gradients.md#embedding. Repeated ids accumulate their gradients.

    Returns (None, {"weight": dweight}): integer ids have no gradient.

    A table no longer than it is wide (V <= C: the character models') takes the sum as one
    product, dW = onehot(ids)^T dout, the one-hot (N, V) no larger than dout (N, C): char-lm's
    (1024 ids, 13 x 64) 93 -> 33 us, the copy model's 16 -> 6 us, against sorting the ids."""
    ids, weight_shape, padding_idx = cache
    V, C = weight_shape
    if V <= C:
        one_hot = (ids.reshape(-1, 1) == np.arange(V)).astype(dout.dtype)  # (N, V)
        dweight = one_hot.T @ dout.reshape(-1, C)  # (V, C)
    else:
        unique_ids, row_grads = embedding_row_grads(dout, cache)
        dweight = np.zeros(weight_shape, dtype=dout.dtype)
        dweight[unique_ids] = row_grads
    if padding_idx is not None:
        dweight[padding_idx] = 0.0  # PyTorch's padding_idx: that row never learns
    return None, {"weight": dweight}


def embedding_row_grads(dout: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The rows of embedding_backward's dweight that can be nonzero: (the distinct ids (U,),
    their gradients (U, C)); padding_idx is not excluded here. For a large table whose few
    used rows are added into another gradient (GPT-2's tied head) instead of a zero table."""
    ids, weight_shape, _ = cache
    flat_ids = ids.reshape(-1)  # (N,)
    dout2 = dout.reshape(-1, weight_shape[1])  # (N, C)
    # `dW[ids] += g` would keep only one of a repeated id's rows: sort the ids,
    # then sum each run of equal ids in one reduceat.
    order = np.argsort(flat_ids, kind="stable")
    unique_ids, run_starts = np.unique(flat_ids[order], return_index=True)
    return unique_ids, np.add.reduceat(dout2[order], run_starts, axis=0)


# -------------------------------------------------------------------------- positions


@functools.lru_cache(maxsize=32)
def sinusoidal_table(max_len: int, channels: int, dtype: np.dtype | str) -> np.ndarray:
    """pe[p, 2i] = sin(p / 10000^(2i/C)), pe[p, 2i+1] = cos(p / 10000^(2i/C)).

    Read-only and cached: every forward of the same shape adds the same constant table."""
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (T, 1)
    inv_freq = np.exp(np.arange(0, channels, 2) * (-math.log(10000.0) / channels))  # (ceil(C/2),)
    table = np.zeros((max_len, channels))
    table[:, 0::2] = np.sin(position * inv_freq)
    table[:, 1::2] = np.cos(position * inv_freq[: channels // 2])
    table = table.astype(dtype)  # (T, C)
    table.flags.writeable = False  # shared by every caller
    return table


def sinusoidal_forward(x: np.ndarray) -> tuple:
    """x + pe[:T]; the table is a constant, so nothing is cached."""
    table = sinusoidal_table(x.shape[1], x.shape[2], x.dtype)  # (T, C)
    return x + table, None


def sinusoidal_backward(dout: np.ndarray, cache: None) -> np.ndarray:
    """See docs/gradients.md#positions. Adding a constant passes the gradient through."""
    return dout.copy()


def learned_positions_forward(x: np.ndarray, weight: np.ndarray) -> tuple:
    """x + weight[:T], weight (max_len, C)."""
    T = x.shape[1]
    out = x + weight[:T]  # (B, T, C)
    cache = weight.shape
    return out, cache


def learned_positions_backward(dout: np.ndarray, cache: tuple) -> tuple:
    """See docs/gradients.md#positions. Row t was added to every batch row.
    Returns (dx, {"weight": dweight})."""
    weight_shape = cache
    B, T, C = dout.shape
    dweight = np.zeros(weight_shape, dtype=dout.dtype)
    dweight[:T] = sum_leading(dout.reshape(B, T * C)).reshape(T, C)  # rows past T: unused, zero
    return dout.copy(), {"weight": dweight}


# ------------------------------------------------------------------------ feed-forward


class FFNCache(NamedTuple):
    fc1: tuple
    act: object
    fc2: tuple
    activation: str


def ffn_forward(
    x: np.ndarray,
    p: dict[str, np.ndarray],
    activation: str,
    affine: tuple | None = None,
    for_backward: bool = True,
) -> tuple:
    """fc2(act(fc1(x))): (..., C) -> (..., F) -> (..., C). p holds fc1.* and fc2.*.
    for_backward=False: decoding, whose cache no backward will read (see gelu_forward)."""
    act_forward, _ = ACTIVATIONS[activation]
    h, fc1_cache = linear_forward(x, p["fc1.weight"], p["fc1.bias"], affine)  # (..., F)
    a, act_cache = act_forward(h, for_backward, out=h)  # (..., F), over h: fc1's fresh output
    out, fc2_cache = linear_forward(a, p["fc2.weight"], p["fc2.bias"])  # (..., C)
    return out, FFNCache(fc1_cache, act_cache, fc2_cache, activation)


def ffn_backward(dout: np.ndarray, cache: FFNCache) -> tuple:
    """See docs/gradients.md#feed-forward. Returns (dx, grads keyed like p)."""
    _, act_backward = ACTIVATIONS[cache.activation]
    da, fc2_grads = linear_backward(dout, cache.fc2)  # forward was out = fc2(a)
    # forward was a = act(h); da is fc2's fresh input gradient, which dh overwrites: no
    # fresh (..., F) array (large's (4096, 1024): one 16 MB array fewer to bring into cache)
    dh = act_backward(da, cache.act, out=da)
    dx, fc1_grads = linear_backward(dh, cache.fc1)  # forward was h = fc1(x)
    affine_grads = input_affine_grads(fc1_grads)  # x's, if fc1 folded them in
    return dx, with_prefix(fc1_grads, "fc1.") | with_prefix(fc2_grads, "fc2.") | affine_grads
