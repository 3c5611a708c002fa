"""Central finite differences: a torch-free witness for every backward.

    numeric = numerical_gradient(lambda: float(np.sum(f(x) * g)), x, indices)
    relative_error(analytic.flat[indices], numeric)   # ~1e-9 in float64

The truncation error of a central difference grows like h^2 and its rounding error
like eps * |f| / h; h = 1e-5 with one Richardson step keeps both near 1e-10.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

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


def rounding_noise(f: Callable[[], float], x: np.ndarray, index: int, delta: float = 1e-6) -> float:
    """How much rounding moves f's value, measured at 9 points delta apart around x[index].

    Third differences cancel f's slope and curvature (the third derivative times delta^3
    is ~1e-18), so what is left is rounding, each difference carrying it sqrt(20) times
    (noise estimation after More & Wild). A loss computed through cancelling sums can
    round at tens of times eps * |f|, so guessing the noise from |f| alone is not enough.
    """
    flat = x.reshape(-1)
    original = flat[index]
    values = []
    for k in range(-4, 5):
        flat[index] = original + k * delta
        values.append(f())
    flat[index] = original
    third_differences = np.diff(np.array(values), n=3)  # coefficients 1, -3, 3, -1
    measured = float(np.sqrt(np.mean(third_differences**2) / 20.0))
    return max(measured, np.finfo(np.float64).eps * abs(values[4]))


def noise_floor(noise: float, count: int, h: float, headroom: float = 3e7) -> float:
    """A floor for relative_error's scale: the finite difference's own rounding, times headroom.

    Each central difference carries ~noise / h of rounding (~3x that after the Richardson
    step), `count` of them ~sqrt(count) times that. A gradient that is truly zero (a key
    bias under softmax's shift invariance) would otherwise divide that by ~0. With
    headroom 3e7 and a relative tolerance of 1e-6, up to 30x the measured rounding
    passes: ~2x for the Richardson step, ~3x for a noise estimate from six differences
    that came out low, and 5x to spare. A wrong gradient is off by far more.
    """
    return float(headroom * noise / h * np.sqrt(count))


class GradientCheck(NamedTuple):
    error: float  # the smallest relative error over the steps tried
    numeric: np.ndarray  # the finite-difference estimate at the step that gave it


def check_gradient(
    f: Callable[[], float],
    x: np.ndarray,
    analytic: np.ndarray,
    indices: np.ndarray,
    tolerance: float = 1e-6,
    steps: tuple[float, ...] = (1e-5, 1e-4),
    f_terms: float = 0.0,
) -> GradientCheck:
    """The smallest relative error of analytic (at indices) against finite differences over steps.

    A finite difference goes wrong in two ways: rounding, which shrinks as h grows (a loss
    computed through cancelling sums rounds at far more than eps * |f|), and kinks or
    curvature, which shrink as h shrinks. A correct gradient agrees at one of the steps;
    a wrong one at none. Stops at the first step whose error is within tolerance.
    f_terms, when f is a sum, is the sum of its terms' magnitudes: its rounding is at
    least eps * f_terms even where the measurement saw none (f flat in x, as for a key bias).
    """
    busiest = int(indices[np.argmax(np.abs(np.ravel(analytic)[indices]))])  # one f depends on
    noise = max(rounding_noise(f, x, busiest), np.finfo(np.float64).eps * f_terms)
    best = GradientCheck(np.inf, np.zeros(len(indices)))
    for h in steps:
        numeric = numerical_gradient(f, x, indices, h)
        error = relative_error(
            np.ravel(analytic)[indices], numeric, noise_floor(noise, len(indices), h)
        )
        best = min(best, GradientCheck(error, numeric), key=lambda check: check.error)
        if best.error < tolerance:
            break
    return best


def sample_indices(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    """count distinct flat indices (all of them when size <= count)."""
    if size <= count:
        return np.arange(size)
    return np.sort(rng.choice(size, count, replace=False))
