"""The loss: cross-entropy over logits, and the readout fused with it for training.

A pair of pure functions like those of layers.py, ``cross_entropy_forward(logits, targets,
ignore_index) -> (loss, cache)`` and ``cross_entropy_backward(dloss, cache) -> dlogits``,
and ``linear_cross_entropy``, the readout and the loss in one call that never holds more than
one (N, V) array (``linear_cross_entropy_loss``: its loss alone, for evaluation).
docs/gradients.md#cross-entropy derives both.

Shape legend: N rows (B * T flattened), V classes (the vocabulary), C channels.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from numpy_engine.blocking import slices
from numpy_engine.checks import InputError
from numpy_engine.layers import linear_backward, linear_forward
from numpy_engine.reductions import sum_last


class CrossEntropyCache(NamedTuple):
    log_probs: np.ndarray  # (N, V)
    safe_targets: np.ndarray  # (N,) ignored rows read class 0
    counted: np.ndarray  # (N,) bool, target != ignore_index
    n_counted: int
    logits_shape: tuple


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, ignore_index: int) -> tuple:
    """Mean of -log softmax(logits)[target] over the targets that are not ignore_index.

    logits (..., V) raw scores, targets (...) ints. The ignored class, if it is a
    real class id, stays in the softmax denominator, as in torch.nn.functional.cross_entropy.
    """
    V = logits.shape[-1]
    logits2 = logits.reshape(-1, V)  # (N, V)
    safe_targets, counted, n_counted = _counted_targets(targets, ignore_index)
    rows = np.arange(len(safe_targets))
    shifted, top = _shifted_by_row_max(logits2, rows)  # (N, V), <= 0
    others = np.exp(shifted)
    log_probs = shifted - np.log1p(_other_classes_mass(others, rows, top))  # (N, V)
    picked = log_probs[rows, safe_targets]  # (N,)
    loss = -(picked * counted).sum() / n_counted
    return loss, CrossEntropyCache(log_probs, safe_targets, counted, n_counted, logits.shape)


def cross_entropy_backward(dloss: float, cache: CrossEntropyCache) -> np.ndarray:
    """See docs/gradients.md#cross-entropy: (softmax - onehot) / n_counted on counted rows."""
    log_probs, safe_targets, counted, n_counted, logits_shape = cache
    dlogits = np.exp(log_probs)  # softmax, (N, V)
    rows = np.arange(len(safe_targets))
    _minus_the_rest(dlogits, rows, safe_targets)  # p_y - 1 as minus the others: no cancellation
    dlogits *= (dloss / n_counted) * counted[:, None]  # ignored rows get exactly 0
    return dlogits.reshape(logits_shape)


def _counted_targets(targets: np.ndarray, ignore_index: int) -> tuple:
    """(safe targets (N,), ignored rows reading class 0 and then dropped; counted (N,) bool,
    target != ignore_index; their number), or an InputError if none counts."""
    flat_targets = targets.reshape(-1)  # (N,)
    counted = flat_targets != ignore_index
    n_counted = int(counted.sum())
    if n_counted == 0:
        raise InputError(f"targets: every target equals ignore_index={ignore_index}; no loss")
    return np.where(counted, flat_targets, 0), counted, n_counted


def _shifted_by_row_max(z: np.ndarray, rows: np.ndarray, out=None) -> tuple:
    """(z minus each row's max, into out if given; each row's top class). The top class's
    term is then exp(0) = 1 exactly: no overflow, and log(sum exp) = log(1 + others)."""
    top = z.argmax(axis=-1)  # (n,)
    return np.subtract(z, z[rows, top][:, None], out=out), top


def _other_classes_mass(exp_shifted: np.ndarray, rows: np.ndarray, top: np.ndarray):
    """others, (n, 1): exp(shifted)'s row sums without the top class (zeroed in place).
    1 + others would round away most of others' digits when one class dominates, and the
    loss (log(1 + others) itself for a right, confident prediction) with them: log1p."""
    exp_shifted[rows, top] = 0.0
    return sum_last(exp_shifted)


def _minus_the_rest(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
    """a[rows, cols] = minus the sum of its row's other entries, in place: a row of softmax
    minus one-hot sums to exactly 0, and its target entry, computed so, does not cancel."""
    a[rows, cols] = 0.0
    a[rows, cols] = -sum_last(a)[rows, 0]


# ------------------------------------------------------- readout and loss, fused (training)

FUSED_BLOCK_BYTES = 1 << 20  # logits transformed together: a block stays in L2 cache


def linear_cross_entropy(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    targets: np.ndarray,
    ignore_index: int,
    affine: tuple | None = None,
) -> tuple:
    """The readout and the loss fused, for training: (loss, dx, grads keyed like the readout's
    params), the values of linear_forward -> cross_entropy_forward -> cross_entropy_backward(1)
    -> linear_backward (affine as linear_forward's). The (N, V) logits exist once and become
    their own gradient in place, a block of rows at a time; unfused, the loss holds four (N, V)
    arrays (for GPT-2's 50257 classes at batch 4 x 64, 51 MB each).
    See docs/gradients.md#cross-entropy."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C)
    safe_targets, counted, n_counted = _counted_targets(targets, ignore_index)
    dlogits, readout = linear_forward(x2, weight, bias, affine)  # (N, V): the logits, for now
    loss_sum = _by_blocks(_dlogits_in_place, dlogits, safe_targets, counted, n_counted)
    dx, grads = linear_backward(dlogits, readout)  # forward was logits = x2 @ weight.T + bias
    return loss_sum / n_counted, dx.reshape(x.shape), grads


def linear_cross_entropy_loss(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    targets: np.ndarray,
    ignore_index: int,
    affine: tuple | None = None,
) -> float:
    """linear_cross_entropy's loss alone, for evaluation: the same values in the same blocks
    and order, so the same bits, and one (N, V) array (the logits, turned into exp(z - max)
    in place) where cross_entropy_forward over linear_forward's logits holds four."""
    safe_targets, counted, n_counted = _counted_targets(targets, ignore_index)
    logits, _ = linear_forward(x.reshape(-1, x.shape[-1]), weight, bias, affine)  # (N, V)
    return _by_blocks(_block_loss, logits, safe_targets, counted) / n_counted


def _by_blocks(transform, logits: np.ndarray, safe_targets, counted, *more) -> float:
    """The sum of transform(block of logits, its targets, its counted rows, *more) over the
    row blocks of FUSED_BLOCK_BYTES: each block transformed in place while it is in cache."""
    loss_sum = 0.0
    for rows in slices(len(logits), logits.shape[1] * logits.itemsize, FUSED_BLOCK_BYTES):
        loss_sum += transform(logits[rows], safe_targets[rows], counted[rows], *more)
    return loss_sum


def _block_loss(z: np.ndarray, targets: np.ndarray, counted: np.ndarray) -> float:
    return _loss_in_place(z, targets, counted)[0]


def _loss_in_place(z: np.ndarray, targets: np.ndarray, counted: np.ndarray) -> tuple:
    """A block's summed loss from its logits z (n_rows, V), which become exp(z - row max)
    with each row's top class zeroed; with the rows, the top classes and the others' mass
    (n_rows, 1) that _dlogits_in_place goes on from."""
    r = np.arange(len(z))
    _, top = _shifted_by_row_max(z, r, out=z)  # z <= 0 now
    picked = z[r, targets]  # the targets' shifted logits
    np.exp(z, out=z)
    others = _other_classes_mass(z, r, top)  # (n_rows, 1)
    loss = -float(((picked - np.log1p(others[:, 0])) * counted).sum())
    return loss, r, top, others


def _dlogits_in_place(z: np.ndarray, targets: np.ndarray, counted: np.ndarray, n: int) -> float:
    """Logits z (n_rows, V) -> (softmax - onehot) / n on counted rows, in place; returns the
    block's summed loss, with cross_entropy_forward's and _backward's helpers."""
    loss, r, top, others = _loss_in_place(z, targets, counted)
    z[r, top] = 1.0
    z /= 1.0 + others  # softmax
    _minus_the_rest(z, r, targets)  # p_y - 1 as minus the others' mass: no cancellation
    z *= (1.0 / n) * counted[:, None]  # ignored rows get exactly 0
    return loss
