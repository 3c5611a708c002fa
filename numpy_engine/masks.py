"""Masks: which keys each query may attend to, and the form attention applies them in.

A mask is a boolean "visible" array (True = this query may attend to this key)
broadcastable to (B, H, Tq, Tk): padding_visible hides a batch row's padding keys,
causal_visible a query's later positions, and `&` combines them. attention.py's scores
take -inf where hidden (hidden_scores), so hidden weights are exactly 0. A query row with
no visible key has no softmax: an InputError names it.
"""

from __future__ import annotations

import functools

import numpy as np

from numpy_engine.checks import InputError


def padding_visible(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """Keys that are not padding: (B, 1, 1, Tk), broadcast over heads and queries."""
    return (ids != pad_id)[:, None, None, :]


@functools.lru_cache(maxsize=64)
def causal_visible(T: int) -> np.ndarray:
    """Query t sees keys 0..t: (1, 1, T, T) lower triangle. Read-only and cached: building it
    took 5 us a forward (np.tril), for the same few lengths every step."""
    visible = np.tril(np.ones((T, T), dtype=bool))[None, None]
    visible.flags.writeable = False
    return visible


def check_every_row_sees_a_key(visible: np.ndarray, scores_shape: tuple) -> None:
    """A row with no visible key has no softmax (0/0); refuse it instead of returning NaN."""
    row_sees_a_key = visible.any(axis=-1)  # broadcastable to (B, H, Tq)
    if row_sees_a_key.all():
        return
    b, h, t = np.argwhere(~np.broadcast_to(row_sees_a_key, scores_shape[:-1]))[0]  # which row
    raise InputError(
        f"visible: the query at batch row {b}, position {t} (head {h}) has no visible key; "
        "every query must be allowed to attend to at least one key"
    )


def hidden_scores(visible: np.ndarray | None, q: np.ndarray, k: np.ndarray) -> np.ndarray | None:
    """The mask as attention applies it to the scores of q (B, H, Tq, hs) against k
    (B, H, Tk, hs): None (no mask), a 4-D boolean array (True = hidden), or, for a mask
    shared by every batch row and head, its hidden_limit in the scores' dtype (for
    causal_visible's own object, its cached one, unchecked: every row of it sees a key). A
    row that sees no key is refused here."""
    if visible is None:
        return None
    if is_shared_causal(visible):
        return causal_limit(visible.shape[-1], np.result_type(q, k))
    check_every_row_sees_a_key(visible, (*q.shape[:-1], k.shape[-2]))
    hidden = ~visible.reshape((1,) * (4 - visible.ndim) + visible.shape)  # 4-D
    if hidden.shape[:2] == (1, 1):  # one (Tq, Tk) mask for every batch row and head
        return hidden_limit(hidden, np.result_type(q, k))
    return hidden


def is_shared_causal(visible: np.ndarray | None) -> bool:
    """visible is causal_visible(T)'s cached object itself. The shape is checked first, so a
    padding or cross-attention mask never builds a causal mask of its length to compare."""
    if visible is None:
        return False
    T = visible.shape[-1]
    return visible.shape == (1, 1, T, T) and visible is causal_visible(T)


@functools.lru_cache(maxsize=64)
def causal_limit(T: int, dtype: np.dtype) -> np.ndarray:
    """hidden_limit of causal_visible(T), built once per length and dtype, read-only: the
    causal mask is the same every step (its check, its inverse and its limit took 11.3 us an
    attention layer at char-lm's length, 32, against 0.6 us for the two cached lookups)."""
    limit = hidden_limit(~causal_visible(T).reshape(1, 1, T, T), dtype)
    limit.flags.writeable = False
    return limit


def hidden_limit(hidden: np.ndarray, dtype) -> np.ndarray:
    """A mask shared by every batch row and head (causal) as a limit for np.fmin over rows of
    Tq * Tk scores: (Tq * Tk,) -inf where hidden, +inf where visible. fmin(s, +inf) = s, and
    fmin(s, -inf) = -inf whatever s (NaN too). At char-lm's (32, 4, 32, 32): 20 us, against
    52 us by np.copyto(where=), slow whatever the layout."""
    inf = np.dtype(dtype).type(np.inf)
    return np.where(hidden.reshape(-1), -inf, inf)
