"""Scaled dot-product attention: the scores, their mask and softmax (softmax.py), the
weights' product with the values, and the backward, by groups of batch rows and blocks of
queries (attention_blocks.py), shared by the engine's threads (threads.in_chunks_alone).
Multi-head attention, which projects its inputs into these heads, is multihead.py.

On two threads, alternating in one process against the same groups and blocks on one
(Zen 4, benchmarks' workloads): large 0.928 (its batch groups), long 0.758, long-seq2seq
0.799, wide-seq2seq 0.914 (their blocks).

Shape legend: B batch, H heads, Tq query positions, Tk key positions,
hs = C // H head width, C channels.

The masks are masks.py's boolean "visible" arrays (True = this query may attend to this
key), broadcastable to (B, H, Tq, Tk). Hidden scores become -inf before the softmax, so
hidden weights are exactly 0. A query row with no visible key is an InputError.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from numpy_engine import threads
from numpy_engine.attention_blocks import (
    EVERY_HEAD,
    QueryBlocks,
    batch_groups,
    piece,
    pieces_of,
    query_blocks,
)
from numpy_engine.dropout import dropped, dropped_copy
from numpy_engine.masks import hidden_scores
from numpy_engine.reductions import mean_second_last
from numpy_engine.softmax import softmax_backward, softmax_last

# --------------------------------------------------------- scaled dot-product attention


class AttentionCache(NamedTuple):
    q: np.ndarray  # (B, H, Tq, hs)
    k: np.ndarray  # (B, H, Tk, hs)
    v: np.ndarray  # (B, H, Tk, hs)
    weights: np.ndarray  # (B, H, Tq, Tk), rows sum to 1, hidden entries exactly 0
    y: np.ndarray  # (B, H, Tq, hs), the output, read by the backward (scaled_row_dots): kept as is
    drop: np.ndarray | None = None  # the weights' dropout mask (B, H, Tq, Tk); None: none
    query_blocks: QueryBlocks | None = None  # the forward's (query_blocks), for the backward


def attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    visible: np.ndarray | None,
    out: np.ndarray | None = None,
    drop: np.ndarray | None = None,
) -> tuple:
    """y = softmax(q k^T / sqrt(hs), hidden keys at -inf) v, (B, H, Tq, hs), written into out
    if given (e.g. split_heads of the (B, Tq, C) array the heads are merged into: the product
    writes the merged layout itself, no copy after). Past WHOLE_BYTES of scores, a group of
    batch rows at a time (batch_groups), and for causal self-attention or a row's scores
    past GROUP_BYTES, a block of queries at a time (query_blocks). The weights are kept
    whole, for the backward and the study commands. drop: a dropout mask (B, H, Tq, Tk) on
    the weights (dropout.py): y = (weights * drop) v; the cache keeps the weights before
    it, and the mask."""
    shape = (*q.shape[:-1], k.shape[-2])  # (B, H, Tq, Tk)
    hidden = hidden_scores(visible, q, k)
    groups = batch_groups(shape, q.itemsize)
    blocks = query_blocks(visible, shape, q.itemsize, q.shape[-1])
    if len(groups) == 1 and blocks is None:
        weights = _weights(q, k, hidden)
        y = np.matmul(dropped_copy(weights, drop), v, out=out)
        return y, AttentionCache(q, k, v, weights, y, drop)
    weights = np.empty(shape, np.result_type(q, k))
    if out is None:
        out = np.empty((*shape[:-1], v.shape[-1]), np.result_type(weights, v))
    if blocks is not None:
        if hidden is not None and hidden.ndim == 1:  # a shared limit
            hidden = hidden.reshape(-1, shape[-1])  # (Tq or 1, Tk), as a block indexes it
        _blocks_forward(
            q, k, v, hidden, blocks, weights, out, drop, pieces_of(groups, blocks, shape[1])
        )
    else:
        _groups_forward(q, k, v, hidden, weights, out, drop, groups)
    return out, AttentionCache(q, k, v, weights, out, drop, blocks)


def _groups_forward(q, k, v, hidden, weights, y, drop, groups: list[slice]) -> None:
    """_weights and weights @ v a group of batch rows at a time, into weights and y, the
    groups shared by the engine's threads (threads.in_chunks_alone)."""

    def run(_, groups: list) -> None:
        for g in groups:
            group = (piece(x, g, EVERY_HEAD) for x in (q, k, v, hidden, weights, y, drop))
            q_g, k_g, v_g, hidden_g, weights_g, y_g, drop_g = group
            _weights(q_g, k_g, hidden_g, out=weights_g)
            np.matmul(dropped_copy(weights_g, drop_g), v_g, out=y_g)

    threads.in_chunks_alone(run, groups)


def score_scale(x: np.ndarray) -> float:
    """1/sqrt(hs) for x (..., hs): a Python float, so float32 stays float32."""
    return 1.0 / math.sqrt(x.shape[-1])


def scaled_transpose(x: np.ndarray) -> np.ndarray:
    """x (..., T, hs) times 1/sqrt(hs), as a contiguous (..., hs, T) array: the right side
    of q @ k^T / sqrt(hs) and dy @ v^T / sqrt(hs), transposed and scaled in one pass.

    Contiguous, because with a transposed view there OpenBLAS's small products ran at half
    speed: float32 (32, 4, 32, 16) @ (32, 4, 16, 32) 92 -> 46 us, for a 22 us copy
    (in-process A/B of both products so: char-lm -0.8% to -1.4%, large -0.6%, copy -0.5%
    a step). Scaled here, because the copy is a pass anyway: q and the gradients dq, dk
    need no scaling pass of their own (see _group_backward)."""
    *leading, T, hs = x.shape
    out = np.empty((*leading, hs, T), x.dtype)
    return np.multiply(x.swapaxes(-1, -2), score_scale(x), out=out)


def _weights(q, k, hidden, out=None) -> np.ndarray:
    """softmax(q k^T / sqrt(hs), hidden entries at -inf): (n, H, Tq, Tk), into out if given.
    hidden: as masks.hidden_scores gives it: None, a 4-D boolean mask (True = hidden), or
    a shared mask's hidden_limit."""
    if q.shape[-2] > 1:
        scores = q @ scaled_transpose(k)
    else:  # one query (a decoding step): the product reads k once, a copy would only add a
        # pass over every past key (GPT-2 at 1024 positions: 53 -> 654 us a layer)
        scores = (q * score_scale(q)) @ k.swapaxes(-1, -2)
    if hidden is not None and hidden.dtype == bool:
        np.copyto(scores, -np.inf, where=hidden)  # far cheaper than scores[hidden] = -inf
    elif hidden is not None:  # a shared mask's limit: -inf hidden, +inf visible (hidden_limit)
        rows = scores.reshape(-1, hidden.size)  # a view: a product's result is contiguous
        np.fmin(rows, hidden, out=rows)
    return softmax_last(scores, out=out)  # hidden entries get exactly 0


def attention_backward(dy: np.ndarray, cache: AttentionCache, out: tuple | None = None) -> tuple:
    """See docs/gradients.md#attention. Returns (dq, dk, dv), written into out's three
    arrays if given (e.g. split_heads views of the merged array a projection's backward
    reads); by the forward's batch groups."""
    groups = batch_groups(cache.weights.shape, cache.weights.itemsize)
    blocks = cache.query_blocks
    # each softmax row's sum of s dweights * weights from dy . y where that dot is the shorter
    # (Tk > hs), for every row before the work is cut into pieces; else softmax_backward's
    row_dots = scaled_row_dots(dy, cache.y) if cache.k.shape[-2] > dy.shape[-1] else None
    if len(groups) == 1 and blocks is None:
        return _group_backward(dy, *cache[:4], row_dots, cache.drop, out=out)
    if out is None:
        out = tuple(np.empty(x.shape, np.result_type(dy, x)) for x in cache[:3])
    if blocks is not None:
        pieces = pieces_of(groups, blocks, dy.shape[1])
        _blocks_backward(dy, cache, row_dots, blocks, out, pieces)
    else:
        _groups_backward(dy, cache, row_dots, out, groups)
    return out


def _groups_backward(dy, cache: AttentionCache, row_dots, out: tuple, groups: list) -> None:
    """_group_backward a group of batch rows at a time, into out's (dq, dk, dv), the groups
    shared by the engine's threads."""

    def run(_, groups: list) -> None:
        for g in groups:
            arrays = (piece(x, g, EVERY_HEAD) for x in (dy, *cache[:4], row_dots, cache.drop))
            _group_backward(*arrays, out=tuple(piece(d, g, EVERY_HEAD) for d in out))

    threads.in_chunks_alone(run, groups)


def _group_backward(dy, q, k, v, weights, row_dots, drop=None, out=None) -> tuple:
    """(dq, dk, dv) of a group of batch rows, into out's three arrays if given. row_dots:
    scaled_row_dots' for these rows, or None (softmax_backward takes them over Tk)."""
    dq, dk, dv = (None, None, None) if out is None else out
    # forward was y = (weights * drop) @ v; dweights is taken times s = 1/sqrt(hs), so the
    # softmax's backward (linear in dweights) gives s dscores, which is what dq and dk need
    s_dweights = dropped(dy @ scaled_transpose(v), drop)  # (n, H, Tq, Tk)
    # the dropped weights are made again here, not kept from the forward: one (n, H, Tq, Tk)
    # array fewer a layer for the step to hold
    dv = np.matmul(dropped_copy(weights, drop).swapaxes(-1, -2), dy, out=dv)  # (n, H, Tk, hs)
    # forward was weights = softmax(scores)
    s_dscores = softmax_backward(s_dweights, weights, row_dots)
    # forward was scores = s q @ k^T; each row of dscores sums to zero, so dq is the same from
    # the keys less any vector they share: from their mean, nothing of it cancels in float32
    dq = np.matmul(s_dscores, centered_keys(k), out=dq)  # (n, H, Tq, hs)
    dk = np.matmul(s_dscores.swapaxes(-1, -2), q, out=dk)  # (n, H, Tk, hs)
    return dq, dk, dv


def _blocks_forward(q, k, v, hidden, blocks: QueryBlocks, weights, y, drop, pieces) -> None:
    """_weights and weights @ v block by block of queries (query_blocks), into weights and y,
    a piece (pieces_of) at a time, the pieces shared by the engine's threads
    (threads.in_chunks_alone). hidden: as hidden_scores gives it, a limit reshaped to
    (Tq or 1, Tk)."""

    def run(_, pieces: list) -> None:
        for g, h in pieces:
            arrays = (piece(x, g, h) for x in (q, k, v, hidden, weights, y, drop))
            _head_blocks_forward(*arrays, blocks)

    threads.in_chunks_alone(run, pieces)


def _head_blocks_forward(q, k, v, hidden, weights, y, drop, blocks: QueryBlocks) -> None:
    """_blocks_forward for one piece."""
    k_t = scaled_transpose(k)  # (n, H, hs, Tk)
    for rows, stop in blocks.pairs():
        scores = q[:, :, rows] @ k_t[..., :stop]  # (n, H, b - a, stop): the keys they see
        _mask_block(scores, hidden, rows, blocks.causal)
        block_weights = softmax_last(scores, out=weights[:, :, rows, :stop])
        weights[:, :, rows, stop:] = 0.0  # hidden
        block_drop = None if drop is None else drop[:, :, rows, :stop]
        np.matmul(dropped_copy(block_weights, block_drop), v[:, :, :stop], out=y[:, :, rows])


def _mask_block(scores, hidden, rows: slice, causal: bool) -> None:
    """A block's scores (n, H, b - a, stop) at -inf where hidden."""
    if hidden is None:
        return
    stop = scores.shape[-1]
    if causal:  # only the diagonal square hides keys: those left of it are all visible
        diagonal = scores[..., rows.start :]  # (n, H, b - a, b - a)
        np.fmin(diagonal, hidden[rows, rows.start : stop], out=diagonal)
        return
    block_hidden = hidden[..., rows, :stop] if hidden.shape[-2] > 1 else hidden[..., :stop]
    if hidden.dtype == bool:
        np.copyto(scores, -np.inf, where=block_hidden)
    else:  # a shared mask's limit: -inf hidden, +inf visible
        np.fmin(scores, block_hidden, out=scores)


def _blocks_backward(dy, cache: AttentionCache, row_dots, blocks: QueryBlocks, out, pieces):
    """_group_backward block by block of queries (query_blocks), into out's (dq, dk, dv), a
    piece (pieces_of) at a time, the pieces shared by the engine's threads."""

    def run(_, pieces: list) -> None:
        for g, h in pieces:
            arrays = (piece(x, g, h) for x in (dy, *cache[:4], row_dots, cache.drop))
            _head_blocks_backward(*arrays, blocks, tuple(piece(d, g, h) for d in out))

    threads.in_chunks_alone(run, pieces)


def _head_blocks_backward(dy, q, k, v, weights, row_dots, drop, blocks, out: tuple) -> None:
    """_blocks_backward for one piece. The last block's products write dk and dv
    (zero past its stop), and each block before it adds its share to the rows of the keys
    it sees. Those adds run on contiguous arrays, copied into dk and dv at the end where
    those are views: into split_heads' view of a merged gradient (rows of hs, C apart) an
    add of (1, 8, 1000, 32) took 129 us, against 25 into a contiguous array (float32, one
    thread)."""
    dq, dk_out, dv_out = out
    dk, dv = (x if x.flags.c_contiguous else np.empty(x.shape, x.dtype) for x in out[1:])
    v_t, keys = scaled_transpose(v), centered_keys(k)  # as _group_backward's, once
    for i, (rows, stop) in enumerate(reversed(blocks.pairs())):
        block_weights = weights[:, :, rows, :stop]  # (n, H, b - a, stop)
        block_dy = dy[:, :, rows]  # (n, H, b - a, hs)
        block_drop = None if drop is None else drop[:, :, rows, :stop]
        # forward was y[rows] = (w * drop) v[:stop], w the softmax of s q[rows] k[:stop]^T
        s_dweights = dropped(block_dy @ v_t[..., :stop], block_drop)  # (n, H, b - a, stop)
        dropped_t = dropped_copy(block_weights, block_drop).swapaxes(-1, -2)  # (n, H, stop, b - a)
        block_dots = None if row_dots is None else row_dots[:, :, rows]
        s_dscores = softmax_backward(s_dweights, block_weights, block_dots)
        np.matmul(s_dscores, keys[:, :, :stop], out=dq[:, :, rows])
        if i == 0:  # the last block: every key's first share, none past its stop
            np.matmul(dropped_t, block_dy, out=dv[:, :, :stop])  # (n, H, stop, hs)
            np.matmul(s_dscores.swapaxes(-1, -2), q[:, :, rows], out=dk[:, :, :stop])
            dv[:, :, stop:] = 0.0
            dk[:, :, stop:] = 0.0
        else:  # keys 0..stop-1 fed these queries too: their gradients add (a fork)
            dv[:, :, :stop] += dropped_t @ block_dy
            dk[:, :, :stop] += s_dscores.swapaxes(-1, -2) @ q[:, :, rows]
    for summed, target in ((dk, dk_out), (dv, dv_out)):
        if summed is not target:
            target[...] = summed


def scaled_row_dots(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(dy . y) / sqrt(hs), (..., Tq, 1): each row's sum of s dweights * weights, which the
    softmax's backward subtracts. y = (weights * drop) v, so sum_j w_ij (s dw_ij) = s sum_j
    w_ij drop_ij (dy_i . v_j) = s dy_i . y_i: a dot over hs, not over the Tk keys
    (docs/gradients.md#attention). einsum, not vecdot: over rows of 16, (32, 4, 32, 16)
    float32 55 -> 26 us."""
    dots = np.einsum("...i,...i->...", dy, y)  # (..., Tq)
    dots *= score_scale(y)
    return dots[..., None]


def centered_keys(k: np.ndarray) -> np.ndarray:
    """k (..., Tk, hs) less its mean over the keys, for dq_i = sum_j ds_ij k_j: the row's
    ds sums to zero, so the sum cancels whatever the keys share (a key bias, a layernorm's
    shift), and in float32 keeps that part's rounding (docs/gradients.md#attention)."""
    return k - mean_second_last(k)  # (..., Tk, hs) less (..., 1, hs)
