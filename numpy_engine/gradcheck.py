"""Central finite differences: a torch-free witness for every backward.

    numeric = numerical_gradient(lambda: float(np.sum(f(x) * g)), x, indices)
    relative_error(analytic.flat[indices], numeric)   # ~1e-9 in float64

The truncation error of a central difference grows like h^2 and its rounding error
like eps * |f| / h; h = 1e-5 with one Richardson step keeps both near 1e-10.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def numerical_gradient(
    f: Callable[[], float], x: np.ndarray, indices: np.ndarray | None = None, h: float = 1e-5
) -> np.ndarray:
    """df/dx at each flat index, by central differences at steps h and h/2 combined.

    A central difference D(h) = (f(x + h) - f(x - h)) / 2h has an error c h^2 + O(h^4);
    (4 D(h/2) - D(h)) / 3 cancels the h^2 term (Richardson extrapolation), which matters
    where layernorm over few channels makes the loss sharply curved. Steps stay small,
    so a ReLU kink is crossed only by inputs within h of zero.

    f takes no arguments: it reads x (or something built on it) each time it is called;
    x is nudged in place and restored. indices defaults to every entry. Use float64.
    """
    if x.dtype != np.float64:
        raise TypeError(f"x must be float64 for finite differences, got {x.dtype}")
    flat = x.reshape(-1)  # a view: writing it nudges x
    if not np.shares_memory(flat, x):
        raise ValueError("x must be contiguous so that it can be nudged in place")
    indices = np.arange(x.size) if indices is None else np.asarray(indices)
    numeric = np.empty(len(indices))
    for n, i in enumerate(indices):
        d_h = _central_difference(f, flat, i, h)
        d_half = _central_difference(f, flat, i, h / 2)
        numeric[n] = (4.0 * d_half - d_h) / 3.0
    return numeric


def _central_difference(f: Callable[[], float], flat: np.ndarray, i: int, h: float) -> float:
    original = flat[i]
    flat[i] = original + h
    f_plus = f()
    flat[i] = original - h
    f_minus = f()
    flat[i] = original
    return (f_plus - f_minus) / (2 * h)


def relative_error(analytic: np.ndarray, numeric: np.ndarray, floor: float = 0.0) -> float:
    """||analytic - numeric|| / max(||analytic||, ||numeric||, floor), normwise."""
    diff = np.linalg.norm(np.ravel(analytic) - np.ravel(numeric))
    scale = max(np.linalg.norm(analytic), np.linalg.norm(numeric), floor)
    return float(diff / scale) if scale > 0 else 0.0


def noise_floor(f_value: float, count: int, h: float = 1e-5, headroom: float = 3e7) -> float:
    """A floor for relative_error's scale, from the rounding of the finite difference itself.

    Each central difference of f carries a rounding error of about eps * |f| / h
    (about 3x that after the Richardson step), so `count` of them about sqrt(count)
    times that. A gradient that is truly zero (a key
    bias under softmax's shift invariance) would otherwise divide that noise by ~0.
    The loss itself rounds at several eps * |f| (it sums many terms); headroom 3e7
    with a relative tolerance of 1e-6 allows 30x eps * |f| / h per entry, ~1e-9 on
    a loss near 1: far below the size of any real gradient error.
    """
    rounding = np.finfo(np.float64).eps * max(abs(f_value), 1.0) / h * np.sqrt(count)
    return float(headroom * rounding)


def sample_indices(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    """count distinct flat indices (all of them when size <= count)."""
    if size <= count:
        return np.arange(size)
    return np.sort(rng.choice(size, count, replace=False))
