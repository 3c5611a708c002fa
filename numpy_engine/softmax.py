"""The softmax over the last axis and its backward, as attention takes them: the weights of
scores whose hidden entries are -inf, and the scores' gradient from the weights'. The
derivation, and why each shortcut keeps PyTorch's values: docs/gradients.md#attention."""

from __future__ import annotations

import numpy as np

from numpy_engine.reductions import dot_last, sum_last

SAFE_EXP_MAX = 60.0  # exp(60) ~ 1e26: even 1e10 of them sum below float32's 3e38
MIN_ROW_SUM = 1e-8  # rows summing below this take the textbook path (see softmax_last)


def softmax_last(scores: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis; entries at -inf get exactly 0. Overwrites scores; the
    weights go to out when given (a different array shaped like scores), else to a new one
    or to scores.

    Softmax is unchanged by subtracting anything per row; the textbook subtracts each
    row's max, only so that exp cannot overflow. NumPy's row max over a short last axis
    is slow (a (4096, 32) array: 0.5 ms, more than the exp), so when no score exceeds 60
    the max is skipped: exp cannot overflow, and if also every row's sum is at least 1e-8
    (its largest score is not far below zero) no entry that underflowed could have
    mattered. Otherwise, or on NaN, the textbook path runs. Which path runs depends only
    on the finite scores, so hidden entries still cannot change the result.
    """
    if scores.max() <= SAFE_EXP_MAX:  # the method: np.max's Python wrapper costs ~1 us more
        weights = np.exp(scores, out=out)
        sums = sum_last(weights)  # (..., 1)
        if sums.min() >= MIN_ROW_SUM:
            weights /= sums
            return weights
    scores -= scores.max(axis=-1, keepdims=True)  # each row has a finite max: it sees a key
    weights = np.exp(scores, out=scores if out is None else out)
    weights /= sum_last(weights)
    return weights


def softmax_backward(
    dweights: np.ndarray, weights: np.ndarray, row_dots: np.ndarray | None = None
) -> np.ndarray:
    """See docs/gradients.md#attention. dscores = w * (dw - sum(dw * w)) per row; hidden
    w = 0 gives 0. Overwrites dweights when it is contiguous (a matmul's result is).
    row_dots: sum(dw * w) (..., 1), where the caller has it cheaper (attention's dy . y).

    A row's entries sum to exactly 0. Where one weight dominates (w ~ 1), its entry
    w (dw - sum(w dw)) cancels to a few correct digits, while the others, each w_j times
    dw_j - sum(w dw), are accurate: so the dominant entry is taken as minus their sum.
    That is done for every weight above 1/2, at most one a row: a weight of at most 1/2
    carries at most half of sum(w dw), so its entry is no more prone to cancel than the
    others. (A threshold, not each row's argmax: a row argmax over a short axis was half of
    this function's time on char-lm.)
    """
    dscores = dweights if dweights.flags.c_contiguous else np.ascontiguousarray(dweights)
    dscores -= dot_last(dscores, weights) if row_dots is None else row_dots  # in place
    dscores *= weights
    T = weights.shape[-1]
    top = np.flatnonzero(weights > 0.5)  # (n,) flat indices of the dominant weights
    rows = top // T  # ascending: a row with two (by rounding) has them side by side
    twice = rows[1:] == rows[:-1]
    if twice.any():  # weights summing to 1 have two over 1/2 only by rounding: skip that row
        once = np.concatenate([[True], ~twice]) & np.concatenate([~twice, [True]])
        top, rows = top[once], rows[once]
    flat = dscores.reshape(-1)  # a view: dscores is contiguous
    flat[top] = 0.0
    flat[top] = -sum_last(dscores.reshape(-1, T))[rows, 0]
    return dscores
