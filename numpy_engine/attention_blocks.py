"""How attention cuts its work (attention.py): groups of batch rows whose scores stay in
cache (batch_groups), blocks of queries each against the keys it sees (query_blocks), and
the pieces of those, a group's batch rows by a group of heads, that the engine's threads
share (pieces_of, piece).

Shape legend: B batch, H heads, Tq query positions, Tk key positions, hs head width.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from numpy_engine import threads
from numpy_engine.blocking import slices
from numpy_engine.masks import is_shared_causal

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
EVERY_HEAD = slice(None)  # a piece of every head (piece)
ALL_HEADS = (EVERY_HEAD,)
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


def pieces_of(groups: list[slice], blocks: QueryBlocks, H: int) -> list[tuple[slice, slice]]:
    """(batch rows, heads) of each piece attention's blocks run on, in order: each batch
    group's groups of heads (blocks.heads). Blocks of every head over fewer batch groups than
    the engine has threads take their heads in as many parts, for the threads to share: each
    head's work is its own, so the bits are the same."""
    heads, n = blocks.heads, threads.threads()
    if heads == ALL_HEADS and len(groups) < n and H > 1:
        parts = min(n, H)
        heads = tuple(slice(i * H // parts, (i + 1) * H // parts) for i in range(parts))
    return [(rows, h) for rows in groups for h in heads]


def piece(x, rows: slice, heads: slice):
    """x's part for a piece's batch rows and heads, along each of those axes x has of its own
    (a 4-D array: q, a mask, a dropout mask); None, a limit, a shared mask stay as they are."""
    if x is None or x.ndim < 4:
        return x
    x = x[rows] if len(x) > 1 else x
    return x[:, heads] if x.shape[1] > 1 else x
