"""Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_'s), and how an optimizer
step reads the gradients: block by block, over vectors laid out like the model's flat
parameter vector (optim.py updates each block in turn).

A block of BLOCK_BYTES stays in cache while the norm or the update makes its passes over
it. The gradients are the dict loss_and_grads returns, read a block at a time without
being concatenated whole (Gradients), or one flat vector. Their norm adds each block's
squares, float32 ones in short rows so that few roundings pile up (_squares), on the
engine's threads in runs of blocks (threads.py), the same bits on any number of them.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from numpy_engine.blocking import slices
from numpy_engine.checks import InputError, InputTypeError, check_clipping_norm
from numpy_engine.threads import chunk_count, in_chunks

if TYPE_CHECKING:
    from numpy_engine.optim import Optimizer

BLOCK_BYTES = 256 * 1024  # of each vector the norm and the update read together (64K float32)
THREAD_BLOCKS = 8  # the fewest blocks a thread takes (threads.py): fewer run on fewer threads


def blocks(size: int, itemsize: int) -> list[slice]:
    """Slices of a vector of size entries, BLOCK_BYTES each. An update made of several
    whole-vector operations, run block by block, reads each array from memory once instead
    of once per operation: on a 124M-parameter model that is most of the optimizer's time.
    Measured there (float32, an AdamW step with clipping, one thread, sizes alternating in
    one process): on the Intel machine (2 MiB of L2 a core; median of 8) 256 KB blocks took
    0.77 and 0.81 of 1 MB's time (462-479 ms against 570-652), 128 KB 0.77, 192 KB 0.81,
    512 KB 0.87, 64 KB 0.87; the six block-sized arrays of an update (parameters, gradient,
    moments, scratch) then stay in L2. On the AMD machine (1 MiB of L2, a faster L3; median
    of 6) the order was the other way: whole vectors 908 ms, 256 KB 304-306, 512 KB 292,
    1 MB 282-283, 2 MB 284, 4 MB 325."""
    return slices(size, itemsize, BLOCK_BYTES)


def in_thread_runs(work: Callable[[int, list[slice]], object], pieces: list[slice]) -> list:
    """work(thread, run of pieces) on the engine's threads, at least THREAD_BLOCKS blocks a
    thread (threads.in_chunks): the results of each run, in the pieces' order."""
    return in_chunks(work, pieces, THREAD_BLOCKS)


def thread_runs(pieces: list[slice]) -> int:
    """How many threads in_thread_runs runs these pieces on."""
    return chunk_count(len(pieces), THREAD_BLOCKS)


def clip_grad_norm(flat_grads: np.ndarray, max_norm: float) -> float:
    """Scale the gradient vector in place so its L2 norm is at most max_norm; returns the
    norm before clipping.

    As torch.nn.utils.clip_grad_norm_ over all parameters: coef = max_norm / (norm + 1e-6),
    applied only when below 1. max_norm must be above 0, and inf clips nothing (the norm
    alone, as torch's idiom); torch takes any number, and 0 would zero every gradient, a
    negative one turn each around, NaN make each NaN.
    """
    check_clipping_norm("max_norm", max_norm)
    if not isinstance(flat_grads, np.ndarray) or flat_grads.ndim != 1:
        got = getattr(flat_grads, "shape", type(flat_grads).__name__)
        raise InputError(f"flat_grads must be a vector (model.flat_grads(grads)), got {got}")
    if flat_grads.dtype not in (np.float32, np.float64):
        raise InputTypeError(f"flat_grads must be float32 or float64, got {flat_grads.dtype}")
    norm = global_norm(flat_grads)
    coef = clip_coefficient(norm, max_norm)
    if coef is not None:
        flat_grads *= flat_grads.dtype.type(coef)
    return norm


def global_norm(flat: np.ndarray) -> float:
    """The L2 norm, block by block (see _squares: one float32 sum over many entries loses
    digits, and overflows past 1.8e19)."""
    return norm_of_blocks(lambda piece, _: flat[piece], blocks(flat.size, flat.itemsize))


def norm_of_blocks(block: Callable[[slice, int], np.ndarray], pieces: list[slice]) -> float:
    """The L2 norm of the vector whose entries pieces are, block(piece, thread) giving
    each; the blocks' squares on the engine's threads (threads.py), added in block order:
    the same bits on any number of threads."""

    def chunk_squares(thread: int, chunk: list[slice]) -> list[float]:
        return [_block_squares(block(piece, thread)) for piece in chunk]

    squares = 0.0
    for chunk in in_thread_runs(chunk_squares, pieces):
        for block_squares in chunk:
            squares += block_squares
    return math.sqrt(squares)


def _block_squares(part: np.ndarray) -> float:
    """_squares(part), redone in float64 where float32 squares leave float32's range."""
    with np.errstate(over="ignore"):  # an overflow is seen below, and that block redone
        squares = _squares(part)
    if part.dtype != np.float64 and not SQUARES_FLOOR <= squares < math.inf:
        wide = part.astype(np.float64)  # rare: an overflow, or tiny or zero entries
        squares = float(np.dot(wide, wide))
    return squares


SQUARES_ROW = 256  # float32 entries squared and summed together (one BLAS sdot)
# A float32 block's sum of squares is redone in float64 below this or at inf: past 3.4e38 a
# square overflowed (|g| > 1.8e19); below 2^-60 its squares may have been subnormal or
# zero (|g| < 1e-19), while above it those could add at most 64K * 1.2e-38, 1e-15 of it.
# NaN is outside too, and stays NaN. Zero blocks (GPT-2's unused positions) take this path.
SQUARES_FLOOR = 2.0**-60


def _squares(part: np.ndarray) -> float:
    """The sum of part's squares: float64 in one dot; float32 in rows of SQUARES_ROW, each
    row's sum rounded in float32 (at most 255 roundings: a relative error below 255 u,
    u = 6e-8) and the rows' sums added in float64. One dot over a whole block would pile up
    64K roundings; a float64 copy of each block took twice the time (GPT-2: 85 -> 49 ms a
    step, the norm's error against float64 ~2e-10)."""
    if part.dtype == np.float64:
        return float(np.dot(part, part))
    n_rows, rest = divmod(part.size, SQUARES_ROW)
    rows = (part[: n_rows * SQUARES_ROW] if rest else part).reshape(n_rows, SQUARES_ROW)
    squares = float(np.vecdot(rows, rows).sum(dtype=np.float64))
    if rest:  # the vector's last block, or a short vector: a row shorter than the others
        tail = part[n_rows * SQUARES_ROW :]
        squares += float(np.dot(tail, tail))
    return squares


class NonFiniteGradients(FloatingPointError):
    """A step's gradients hold a NaN or an infinity (Optimizer.step's error_if_nonfinite)."""


def clip_coefficient(norm: float, max_norm: float):
    """torch's max_norm / (norm + 1e-6) as a float32 or float64 scalar to multiply the
    gradients by, or None when it is not below 1 (no clipping)."""
    coef = max_norm / (norm + 1e-6)
    return coef if coef < 1.0 else None


def arrays_spanned(piece: slice, starts: list[int]) -> list[tuple[int, int, int]]:
    """(i, lo, hi) for each array i that the block piece of a vector spans, lo:hi the array's
    entries inside it; starts: each array's offset in the vector, then the vector's size."""
    i = bisect.bisect_right(starts, piece.start) - 1  # the array the block starts in
    spanned = []
    while starts[i] < piece.stop:
        spanned.append(
            (i, max(piece.start - starts[i], 0), min(piece.stop, starts[i + 1]) - starts[i])
        )
        i += 1
    return spanned


class Gradients:
    """A step's gradients read as one vector laid out like the parameters, block by block:
    the flat vector itself, or the dict loss_and_grads returns. A block inside one array is a
    view of it; a block across arrays is gathered into the scratch row it is given. On GPT-2
    (124M parameters) that skips a 500 MB copy a step and its buffer. A dict of at most
    optim.GATHER_WHOLE_BLOCKS blocks is gathered whole, once, into gathered (the optimizer's
    vector-sized scratch, else None): block by block, the norm and the update would each
    gather every spanning block."""

    def __init__(self, grads, optimizer: Optimizer, gathered: np.ndarray | None) -> None:
        self.starts = optimizer.starts  # each array's offset, then the vector's size
        if isinstance(grads, dict):
            self.arrays, self.flat = list(grads.values()), None
            if gathered is not None:  # a few blocks: gather them once, here
                optimizer.check_grads_dict(grads, dtypes=False)  # casting="no" checks them
                try:
                    # axis None ravels each array; out is the scratch row
                    self.flat = np.concatenate(self.arrays, None, gathered, casting="no")
                except TypeError:
                    optimizer.check_grads_dict(grads)  # names the array
                    raise
            else:
                optimizer.check_grads_dict(grads)
        else:
            optimizer.check_vector("flat_grads", grads)
            self.flat = grads

    def block(self, piece: slice, scratch: np.ndarray) -> np.ndarray:
        """Entries piece.start:piece.stop of the vector: a view, or gathered into scratch (a
        row of at least the block's length)."""
        if self.flat is not None:
            return self.flat[piece]
        parts = []
        for i, lo, hi in arrays_spanned(piece, self.starts):
            array = self.arrays[i]
            parts.append(array if (lo, hi) == (0, array.size) else array.reshape(-1)[lo:hi])
        if len(parts) == 1:
            return parts[0].reshape(-1)
        return np.concatenate(parts, axis=None, out=scratch[: piece.stop - piece.start])
