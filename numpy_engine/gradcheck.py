"""Central finite differences: a torch-free witness for every backward.

    numeric = numerical_gradient(lambda: float(np.sum(f(x) * g)), x, indices)
    relative_error(analytic.flat[indices], numeric)   # ~1e-9 in float64

h = 1e-5 is near the float64 optimum for a central difference, eps^(1/3): the
truncation error grows like h^2 and the rounding error like eps * |f| / h.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def numerical_gradient(
    f: Callable[[], float], x: np.ndarray, indices: np.ndarray | None = None, h: float = 1e-5
) -> np.ndarray:
    """(f(x + h e_i) - f(x - h e_i)) / 2h for each flat index i; x is nudged in place and restored.

    f takes no arguments: it reads x (or something built on it) each time it is called.
    indices defaults to every entry of x. Use float64: in float32 the rounding of f swamps h.
    """
    if x.dtype != np.float64:
        raise TypeError(f"x must be float64 for finite differences, got {x.dtype}")
    flat = x.reshape(-1)  # a view: writing it nudges x
    if not np.shares_memory(flat, x):
        raise ValueError("x must be contiguous so that it can be nudged in place")
    indices = np.arange(x.size) if indices is None else np.asarray(indices)
    numeric = np.empty(len(indices))
    for n, i in enumerate(indices):
        original = flat[i]
        flat[i] = original + h
        f_plus = f()
        flat[i] = original - h
        f_minus = f()
        flat[i] = original
        numeric[n] = (f_plus - f_minus) / (2 * h)
    return numeric


def relative_error(analytic: np.ndarray, numeric: np.ndarray, floor: float = 0.0) -> float:
    """||analytic - numeric|| / max(||analytic||, ||numeric||, floor), normwise."""
    diff = np.linalg.norm(np.ravel(analytic) - np.ravel(numeric))
    scale = max(np.linalg.norm(analytic), np.linalg.norm(numeric), floor)
    return float(diff / scale) if scale > 0 else 0.0


def noise_floor(f_value: float, count: int, h: float = 1e-5, headroom: float = 1e7) -> float:
    """A floor for relative_error's scale, from the rounding of the finite difference itself.

    Each central difference of f carries a rounding error of about eps * |f| / h, so
    `count` of them about sqrt(count) times that. A gradient that is truly zero (a key
    bias under softmax's shift invariance) would otherwise divide that noise by ~0.
    With headroom 1e7, a relative tolerance of 1e-6 allows 10x the rounding noise.
    """
    rounding = np.finfo(np.float64).eps * max(abs(f_value), 1.0) / h * np.sqrt(count)
    return float(headroom * rounding)


def sample_indices(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    """count distinct flat indices (all of them when size <= count)."""
    if size <= count:
        return np.arange(size)
    return np.sort(rng.choice(size, count, replace=False))
