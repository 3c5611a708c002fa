"""Chains of elementwise passes, run block by block so each block stays in cache.

A layer like GELU is a chain of ~16 NumPy passes over its (N, F) input; over the whole
array each pass reads and writes memory, over a block of rows that fits in L2 only the
first pass does. Measured here, one thread, alternating old and new in one process: the
first GELU chains (7 passes forward, 13 backward; median of 15) on float32 (4096, 1024),
forward 12.2 -> 10.8 ms, backward 15.8 -> 13.3 ms, but on (256, 3072) (3 MB) 0.84 -> 0.92
and on (1024, 256) 0.24 -> 0.31, so arrays up to 4 MB ran whole. GELU's forward now also
computes its derivative (16 passes over four arrays, activations.gelu_forward), and blocks pay
at every size past one block (median of 60-80 forwards): (1024, 256) 1.20 -> 1.00 ms,
(256, 3072) 4.83 -> 3.52 ms, (4096, 1024) 30.0 -> 18.4 ms; A/B char-lm 0.988 and 0.981.
The results are the same bits: the same operations in the same order, on fewer rows at a
time. Layernorm runs whole: on (4096, 256), 4 MB, its blocks were faster alone but made
every config's step slower (A/B copy 1.042, char-lm 1.007, large 1.014).

`slices` is the one helper that cuts work into cache-sized pieces; attention
(`attention_blocks.batch_groups`), the fused readout + loss and the optimizer use it too,
each with the block size measured for it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

BLOCK_BYTES = 256 * 1024  # one block of the chain's first input (64K-512K measured: best)


def slices(n: int, item_bytes: int, block_bytes: int, whole_bytes: int = 0) -> list[slice]:
    """Consecutive slices covering range(n), each of about block_bytes of items of
    item_bytes (at least one item); one slice when all n items fit in whole_bytes.

    The one way the engine cuts work into cache-sized pieces: rows of an elementwise chain
    (below), batch rows of attention, rows of the fused readout + loss, entries of the
    optimizer's update; each caller's block size is its own, measured and documented there."""
    if n * item_bytes <= whole_bytes:
        return [slice(0, n)]
    step = max(1, block_bytes // max(1, item_bytes))
    return [slice(start, min(start + step, n)) for start in range(0, n, step)]


def in_row_blocks(chain: Callable, inputs: tuple, outputs: tuple) -> None:
    """chain(*input_blocks, *output_blocks) on consecutive blocks of rows of arrays (..., C)
    read as (N, C) rows (every array with the same N); chain writes its results into the
    output blocks. Outputs must be C-contiguous: their rows are then views, where a strided
    output's would be a copy, and the results written into it lost."""
    for o in outputs:
        if not o.flags.c_contiguous:
            raise ValueError("in_row_blocks: every output must be C-contiguous")
    inputs = tuple(as_rows(a) for a in inputs)
    outputs = tuple(as_rows(o) for o in outputs)
    n_rows, width = inputs[0].shape
    row_bytes = width * inputs[0].itemsize
    for block in slices(n_rows, row_bytes, BLOCK_BYTES):
        chain(*(a[block] for a in inputs), *(o[block] for o in outputs))


def as_rows(x: np.ndarray) -> np.ndarray:
    """x (..., C) as (N, C) rows (a view for contiguous x)."""
    return x.reshape(-1, x.shape[-1])
