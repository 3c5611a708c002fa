"""Scaled dot-product attention: the scores, their mask and softmax (softmax.py), the
weights' product with the values, and the backward, by groups of batch rows and blocks of
queries, shared by the engine's threads (threads.in_chunks_alone). Multi-head attention,
which projects its inputs into these heads, is multihead.py.

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
from numpy_engine.blocking import slices
from numpy_engine.dropout import dropped, dropped_copy
from numpy_engine.masks import hidden_scores, is_shared_causal
from numpy_engine.reductions import mean_second_last
from numpy_engine.softmax import softmax_backward, softmax_last

# --------------------------------------------------------- scaled dot-product attention


class AttentionCache(NamedTuple):
    q: np.ndarray  # (B, H, Tq, hs)
    k: np.ndarray  # (B, H, Tk, hs)
    v: np.ndarray  # (B, H, Tk, hs)
    weights: np.ndarray  # (B, H, Tq, Tk), rows sum to 1, hidden entries exactly 0
    drop: np.ndarray | None = None  # the weights' dropout mask (B, H, Tq, Tk); None: none
    query_blocks: QueryBlocks | None = None  # the forward's (query_blocks), for the backward

    def arrays(self, rows: slice) -> tuple:
        """(q, k, v, weights, drop) of a group of batch rows; a drop of None stays None."""
        arrays = (self.q, self.k, self.v, self.weights, self.drop)
        return tuple(None if x is None else x[rows] for x in arrays)


GROUP_BYTES = 1 << 20  # one group's scores, (rows, H, Tq, Tk): they stay in L2 (1 MiB here)
WHOLE_BYTES = 4 << 20  # scores up to this size are computed in one group


def batch_groups(scores_shape: tuple, itemsize: int) -> list[slice]:
    """Slices of the batch axis, each group's scores about GROUP_BYTES; one slice when all
    the scores fit in WHOLE_BYTES. A (B, H, T, T) pass chain (mask, softmax and their
    backward) then runs on scores that sit in cache instead of going to memory and back
    once per pass. Measured (one thread, float32, (32, 8, 128, 128) causal, median of 7):
    forward 16.6 -> 14.6 ms, backward 23.7 -> 18.2 ms, the same bits."""
    per_row = math.prod(scores_shape[1:]) * itemsize
    return slices(scores_shape[0], per_row, GROUP_BYTES, WHOLE_BYTES)


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
        return y, AttentionCache(q, k, v, weights, drop)
    weights = np.empty(shape, np.result_type(q, k))
    if out is None:
        out = np.empty((*shape[:-1], v.shape[-1]), np.result_type(weights, v))
    if blocks is not None:
        if hidden is not None and hidden.ndim == 1:  # a shared limit
            hidden = hidden.reshape(-1, shape[-1])  # (Tq or 1, Tk), as a block indexes it
        _blocks_forward(
            q, k, v, hidden, blocks, weights, out, drop, _pieces(groups, blocks, shape[1])
        )
    else:
        _groups_forward(q, k, v, hidden, weights, out, drop, groups)
    return out, AttentionCache(q, k, v, weights, drop, blocks)


def _groups_forward(q, k, v, hidden, weights, y, drop, groups: list[slice]) -> None:
    """_weights and weights @ v a group of batch rows at a time, into weights and y, the
    groups shared by the engine's threads (threads.in_chunks_alone)."""
    per_row = hidden is not None and hidden.ndim == 4 and len(hidden) > 1  # a (B, ...) mask

    def run(_, groups: list) -> None:
        for g in groups:
            _weights(q[g], k[g], hidden[g] if per_row else hidden, out=weights[g])
            group_drop = None if drop is None else drop[g]
            np.matmul(dropped_copy(weights[g], group_drop), v[g], out=y[g])

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
    if len(groups) == 1 and blocks is None:
        return _group_backward(dy, cache.q, cache.k, cache.v, cache.weights, cache.drop, out=out)
    if out is None:
        out = tuple(np.empty(x.shape, np.result_type(dy, x)) for x in cache[:3])
    if blocks is not None:
        _blocks_backward(dy, cache, blocks, out, _pieces(groups, blocks, dy.shape[1]))
    else:
        _groups_backward(dy, cache, out, groups)
    return out


def _groups_backward(dy, cache: AttentionCache, out: tuple, groups: list[slice]) -> None:
    """_group_backward a group of batch rows at a time, into out's (dq, dk, dv), the groups
    shared by the engine's threads."""

    def run(_, groups: list) -> None:
        for g in groups:
            _group_backward(dy[g], *cache.arrays(g), out=tuple(d[g] for d in out))

    threads.in_chunks_alone(run, groups)


def _group_backward(dy, q, k, v, weights, drop=None, out: tuple | None = None) -> tuple:
    """(dq, dk, dv) of a group of batch rows, into out's three arrays if given."""
    dq, dk, dv = (None, None, None) if out is None else out
    # forward was y = (weights * drop) @ v; dweights is taken times s = 1/sqrt(hs), so the
    # softmax's backward (linear in dweights) gives s dscores, which is what dq and dk need
    s_dweights = dropped(dy @ scaled_transpose(v), drop)  # (n, H, Tq, Tk)
    # the dropped weights are made again here, not kept from the forward: one (n, H, Tq, Tk)
    # array fewer a layer for the step to hold
    dv = np.matmul(dropped_copy(weights, drop).swapaxes(-1, -2), dy, out=dv)  # (n, H, Tk, hs)
    s_dscores = softmax_backward(s_dweights, weights)  # forward was weights = softmax(scores)
    # forward was scores = s q @ k^T; each row of dscores sums to zero, so dq is the same from
    # the keys less any vector they share: from their mean, nothing of it cancels in float32
    dq = np.matmul(s_dscores, centered_keys(k), out=dq)  # (n, H, Tq, hs)
    dk = np.matmul(s_dscores.swapaxes(-1, -2), q, out=dk)  # (n, H, Tk, hs)
    return dq, dk, dv


# Causal self-attention's queries per block past two blocks' positions (query_blocks).
# Training steps, one thread, float32, blocks against none (Zen 4): benchmarks.ab's long
# (char-lm's model over 1024 positions, batch 2) 0.514; alternating in one process, the
# same model over 256 positions at batch 8 0.891, GPT-2 (124M) over 1024 at batch 1 0.920;
# at 1024 positions blocks of 32 0.568 and of 128 0.572 against 64's 0.538
QUERY_BLOCK = 64

# Any other mask: blocks of queries whose scores are about BLOCK_BYTES, where one batch row's
# scores outgrow GROUP_BYTES and the heads are at most NARROW_HEAD wide. Then the (T, T)
# passes (mask, softmax and their backward) dwarf the products, and a block's scores stay
# in cache. Attention alone, forward and backward, one thread, float32, a padding mask,
# (B, H, T, hs) = (2, 4, 1000, 16): 57.3 ms whole, 34.0 by blocks of 32 queries (512 KiB),
# 39.3 by 64; hs 8: 49.2 -> 27.8; hs 32: 72.2 -> 54.9; hs 64 gained nothing (97.6 -> 103.3
# by 32): its products outweigh the passes, and each block adds its share to dk and dv.
# The block's size, in training steps over 1000 positions at batch 2 (4 heads, so 65
# queries a block), alternating in one process, 1 MiB against 512 KiB: heads of 8 0.877,
# of 32 0.902 and 0.952, of 16 1.003 and of 64 0.997; 2 MiB against 1 MiB at heads of 8
# 1.102, 4 MiB 1.196
BLOCK_BYTES, NARROW_HEAD = 1 << 20, 32

# Wider heads take blocks only where the blocks' keys stop early enough to skip scores: the
# blocks compute at most WIDE_KEPT of the (Tq, Tk) scores. Alone as above, blocks of 512 KiB,
# (2, 4, 1000, 64): a causal & padding mask (the seq2seq decoder's, about half kept) 107.9
# -> 59.4 ms (1 MiB blocks 59.9); every row's last keys padding, 75% kept 102.5 -> 85.1, 65%
# 105.0 -> 77.9; at 85% and 95% kept the two readings of each disagreed (whole 100.5-120.7,
# blocks 92.1-127.5). Causal & padding at (2, 4, 1000, 128) 167.1 -> 108.4, at GPT-2's
# (1, 12, 1024, 64) 175.6 -> 104.8
WIDE_KEPT = 0.75

# Heads at least ONE_HEAD_WIDTH wide, where every block would stop at the same key (no mask,
# padding: nothing to skip), take blocks of one head and more queries, wider heads too: the
# products then run on 262 queries of a head, not 32 of 8 heads. Products alone, one thread,
# float32, 1000 keys, 8 heads of 32 queries against one of 256: heads of 32 196, 212 and 205
# us -> 173, 180 and 185 (q k^T, w v, w^T q), of 64 377, 398, 379 -> 327, 333, 338. Training
# steps, benchmarks.ab against the code without it: wide-seq2seq 0.956 (its padding masks had
# run whole); the encoder-decoder over 1000 positions at batch 2, heads of 32 (d_model
# 256 in 8, 128 in 4) 0.953 and 0.978, of 16 (long-seq2seq; d_model 64 over 2000 at batch
# 1) 0.984-0.990 and 0.967, of 8 (copy's model) 1.151: narrower heads keep every head
ALL_HEADS = (slice(None),)
ONE_HEAD_WIDTH = 16


class QueryBlocks(NamedTuple):
    """Blocks of queries, each computed against keys 0..stop-1 alone: every key past its
    stop is hidden from all of its queries, in every batch row and head."""

    rows: tuple  # slices of the query axis, in order, covering it
    stops: tuple  # each block's keys: 0..stop-1
    causal: bool  # the shared causal mask: a block [a, b)'s keys 0..a-1 are all visible
    heads: tuple = ALL_HEADS  # groups of heads, each run by every block of rows in turn

    def pairs(self) -> list[tuple[slice, int]]:
        """(rows, stop) of each block, in order."""
        return list(zip(self.rows, self.stops, strict=True))


def query_blocks(visible: np.ndarray | None, shape: tuple, itemsize: int, hs: int):
    """The blocks attention over scores of `shape` (B, H, Tq, Tk) runs by, or None (whole):
    for causal_visible(T)'s own mask over more than two blocks' positions, QUERY_BLOCK
    queries, each block [a, b) against keys 0..b-1; for any other mask (or none), where one
    batch row's scores outgrow GROUP_BYTES, BLOCK_BYTES of scores a block (as much as
    GROUP_BYTES: two blocks or more, unless one query's scores pass it), each against the
    keys up to the last any of its queries sees: of one head where every block would stop
    at the same key and heads are at least ONE_HEAD_WIDTH wide; else of every head, for
    heads at most NARROW_HEAD wide always, for wider ones where the blocks then compute at
    most WIDE_KEPT of the scores."""
    H, Tq, Tk = shape[1:]
    if is_shared_causal(visible) and Tq == Tk:
        if Tq <= 2 * QUERY_BLOCK:
            return None
        rows = tuple(slices(Tq, 1, QUERY_BLOCK))
        return QueryBlocks(rows, tuple(r.stop for r in rows), causal=True)
    row_bytes = H * Tk * itemsize  # one query's scores in a batch row
    if Tq * row_bytes <= GROUP_BYTES:
        return None
    rows = tuple(slices(Tq, row_bytes, BLOCK_BYTES))
    stops = _key_stops(visible, rows, Tk)
    if hs >= ONE_HEAD_WIDTH and len(set(stops)) == 1:  # nothing to skip: one head a block
        rows = tuple(slices(Tq, Tk * itemsize, BLOCK_BYTES))
        heads = tuple(slice(h, h + 1) for h in range(H))
        return QueryBlocks(rows, stops[:1] * len(rows), causal=False, heads=heads)
    if hs > NARROW_HEAD and _kept_share(rows, stops, Tk) > WIDE_KEPT:
        return None
    return QueryBlocks(rows, stops, causal=False)


def _kept_share(rows: tuple, stops: tuple, Tk: int) -> float:
    """The share of the (Tq, Tk) scores that blocks of these rows and stops compute."""
    kept = sum((r.stop - r.start) * stop for r, stop in zip(rows, stops, strict=True))
    return kept / (rows[-1].stop * Tk)


def _key_stops(visible: np.ndarray | None, rows: tuple, Tk: int) -> tuple:
    """Each block's stop: one past the last key any of its queries sees, in any batch row or
    head (a causal & padding mask: the block's end; a mask of right padding: the longest
    row's length). Every query sees a key (hidden_scores checks)."""
    if visible is None:
        return (Tk,) * len(rows)
    seen = visible.reshape(-1, *visible.shape[-2:]).any(axis=0)  # (Tq or 1, Tk)
    stops = []
    for r in rows:
        keys = seen[r].any(axis=0) if len(seen) > 1 else seen[0]  # (Tk,): seen by a query
        stops.append(Tk - int(np.argmax(keys[::-1])))
    return tuple(stops)


def _pieces(groups: list[slice], blocks: QueryBlocks, H: int) -> list[tuple[slice, slice]]:
    """(batch rows, heads) of each piece attention's blocks run on, in order: each batch
    group's groups of heads (blocks.heads). Blocks of every head over fewer batch groups than
    the engine has threads take their heads in as many parts, for the threads to share: each
    head's work is its own, so the bits are the same."""
    heads, n = blocks.heads, threads.threads()
    if heads == ALL_HEADS and len(groups) < n and H > 1:
        parts = min(n, H)
        heads = tuple(slice(i * H // parts, (i + 1) * H // parts) for i in range(parts))
    return [(rows, h) for rows in groups for h in heads]


def _piece(x, rows: slice, heads: slice):
    """x's part for a piece's batch rows and heads, along each of those axes x has of its own
    (a 4-D array: q, a mask, a dropout mask); None, a limit, a shared mask stay as they are."""
    if x is None or x.ndim < 4:
        return x
    x = x[rows] if len(x) > 1 else x
    return x[:, heads] if x.shape[1] > 1 else x


def _blocks_forward(q, k, v, hidden, blocks: QueryBlocks, weights, y, drop, pieces) -> None:
    """_weights and weights @ v block by block of queries (query_blocks), into weights and y,
    a piece (_pieces) at a time, the pieces shared by the engine's threads
    (threads.in_chunks_alone). hidden: as hidden_scores gives it, a limit reshaped to
    (Tq or 1, Tk)."""

    def run(_, pieces: list) -> None:
        for g, h in pieces:
            arrays = (_piece(x, g, h) for x in (q, k, v, hidden, weights, y, drop))
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
    piece = hidden[..., rows, :stop] if hidden.shape[-2] > 1 else hidden[..., :stop]
    if hidden.dtype == bool:
        np.copyto(scores, -np.inf, where=piece)
    else:  # a shared mask's limit: -inf hidden, +inf visible
        np.fmin(scores, piece, out=scores)


def _blocks_backward(dy, cache: AttentionCache, blocks: QueryBlocks, out: tuple, pieces) -> None:
    """_group_backward block by block of queries (query_blocks), into out's (dq, dk, dv), a
    piece (_pieces) at a time, the pieces shared by the engine's threads."""

    def run(_, pieces: list) -> None:
        for g, h in pieces:
            arrays = (_piece(x, g, h) for x in (dy, *cache[:3], cache.weights, cache.drop))
            _head_blocks_backward(*arrays, blocks, tuple(_piece(d, g, h) for d in out))

    threads.in_chunks_alone(run, pieces)


def _head_blocks_backward(dy, q, k, v, weights, drop, blocks: QueryBlocks, out: tuple) -> None:
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
        s_dscores = softmax_backward(s_dweights, block_weights)
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


def centered_keys(k: np.ndarray) -> np.ndarray:
    """k (..., Tk, hs) less its mean over the keys, for dq_i = sum_j ds_ij k_j: the row's
    ds sums to zero, so the sum cancels whatever the keys share (a key bias, a layernorm's
    shift), and in float32 keeps that part's rounding (docs/gradients.md#attention)."""
    return k - mean_second_last(k)  # (..., Tk, hs) less (..., 1, hs)
