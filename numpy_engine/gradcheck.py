"""Central finite differences: a torch-free witness for every backward.

    numeric = numerical_gradient(lambda: float(np.sum(f(x) * g)), x, indices)
    relative_error(analytic.flat[indices], numeric)   # ~1e-9 in float64
    check_directions(loss, param, grad, [rng.standard_normal(param.shape)])  # a whole tensor

The truncation error of a central difference grows like h^2 and its rounding error
like eps * |f| / h; h = 1e-5 with one Richardson step keeps both near 1e-10, and the
plain difference alone is that close wherever f is not sharply curved.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from numpy_engine.checks import InputError, InputTypeError

Probe = Callable[[], "float | tuple[float, bytes]"]


def numerical_gradient(
    f: Probe, x: np.ndarray, indices: np.ndarray | None = None, h: float = 1e-5
) -> np.ndarray:
    """df/dx at each flat index, by central differences at steps h and h/2 combined.

    A central difference D(h) = (f(x + h) - f(x - h)) / 2h has an error c h^2 + O(h^4);
    (4 D(h/2) - D(h)) / 3 cancels the h^2 term (Richardson extrapolation), which matters
    where layernorm over few channels makes the loss sharply curved.

    f takes no arguments: it reads x (or something built on it) each time it is called;
    x is nudged in place and restored. indices defaults to every entry. Use float64.
    An entry whose difference crosses a kink of f (see directional_derivative) is NaN.
    """
    _check_nudgeable(x)
    indices = np.arange(x.size) if indices is None else np.asarray(indices)
    _, region = _evaluate(f)  # once for every entry
    numeric = [directional_derivative(f, x, int(i), h, region=region) for i in indices]
    return np.array([np.nan if d is None else d for d in numeric])


_AT_X = object()  # directional_derivative's default: evaluate f at x to learn its region


def directional_derivative(
    f: Probe,
    x: np.ndarray,
    direction: int | np.ndarray,
    h: float = 1e-5,
    smallest_h: float = 1e-8,
    region: bytes | None | object = _AT_X,
    richardson: bool = True,
) -> float | None:
    """The derivative of f along direction (an array shaped like x, or a flat index of x), as
    numerical_gradient computes it; with richardson=False, the plain D(h) alone (two
    evaluations of f instead of four).

    f may return (value, region) instead of a value, where region names the smooth piece of
    a piecewise-smooth f that x lies in (e.g. the pattern of positive ReLU pre-activations).
    A difference whose points lie in another region than x straddles a kink, and there the
    central difference measures the jump, not the derivative: the step shrinks tenfold until
    no point leaves x's region. None if that takes a step below smallest_h. A caller that
    checks many directions at one x passes x's region (or None) instead of having it
    evaluated each time.
    """
    if region is _AT_X:
        region = region_at(f)
    while h >= smallest_h:
        d_h, left = _central_difference(f, x, direction, h, region)
        if richardson and not left:
            d_half, left = _central_difference(f, x, direction, h / 2, region)
            d_h = (4.0 * d_half - d_h) / 3.0
        if not left:
            return d_h
        h /= 10.0
    return None


def region_at(f: Probe) -> bytes | None:
    """The region f reports at its inputs as they are (None for a smooth f): the piece that
    each nudged point's region is compared with (directional_derivative)."""
    return _evaluate(f)[1]


def _evaluate(f: Probe) -> tuple[float, bytes | None]:
    out = f()
    return (out, None) if np.ndim(out) == 0 else out


def _central_difference(f, x, direction, h, region) -> tuple[float, bool]:
    """(f(x + h d) - f(x - h d)) / 2h, and whether either point left region."""
    f_plus, region_plus = _evaluate_at(f, x, direction, h)
    f_minus, region_minus = _evaluate_at(f, x, direction, -h)
    left = region is not None and (region_plus != region or region_minus != region)
    return (f_plus - f_minus) / (2 * h), left


def _evaluate_at(f, x, direction, t):
    """f at x + t * direction, with x restored afterwards bit for bit."""
    flat = x.reshape(-1)  # a view: writing it nudges x
    if isinstance(direction, int):
        original = flat[direction]
        flat[direction] = original + t
        try:
            return _evaluate(f)
        finally:
            flat[direction] = original
    original = flat.copy()
    flat += t * direction.reshape(-1)
    try:
        return _evaluate(f)
    finally:
        flat[...] = original


def _check_nudgeable(x: np.ndarray) -> None:
    if x.dtype != np.float64:
        raise InputTypeError(f"x must be float64 for finite differences, got {x.dtype}")
    if not np.shares_memory(x.reshape(-1), x):
        raise InputError("x must be contiguous so that it can be nudged in place")


def relative_error(analytic: np.ndarray, numeric: np.ndarray, floor: float = 0.0) -> float:
    """||analytic - numeric|| / max(||analytic||, ||numeric||, floor), normwise; inf where
    either holds a NaN or an inf (without that, a NaN gradient read 0: Python's max over the
    norms kept the NaN, and NaN > 0 is false)."""
    diff = np.linalg.norm(np.ravel(analytic) - np.ravel(numeric))
    if not np.isfinite(diff):
        return float("inf")
    scale = max(np.linalg.norm(analytic), np.linalg.norm(numeric), floor)
    return float(diff / scale) if scale > 0 else 0.0


def rounding_noise(
    f: Probe, x: np.ndarray, direction: int | np.ndarray, delta: float = 1e-6
) -> float:
    """How much rounding moves f's value, measured at 9 points delta apart along direction.

    Third differences cancel f's slope and curvature (the third derivative times delta^3
    is ~1e-18), so what is left is rounding, each difference carrying it sqrt(20) times
    (noise estimation after More & Wild). A loss computed through cancelling sums can
    round at tens of times eps * |f|, so guessing the noise from |f| alone is not enough.
    """
    values = np.array([_evaluate_at(f, x, direction, k * delta)[0] for k in range(-4, 5)])
    third_differences = np.diff(values, n=3)  # coefficients 1, -3, 3, -1
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


# A correct gradient's relative error against central differences stays below this (within
# noise_floor's headroom where it is as small as their rounding); a wrong one's is far above.
TOLERANCE = 1e-6

# The plain difference D(h) ends a check only within this share of its tolerance: its error
# is the truncation term (h^2 / 6 times the third derivative) that the Richardson step
# cancels, and where f curves sharply enough for that to near the tolerance, it would take
# the check's margin. In the default suite, D(1e-5) alone ended 4,188 of 4,388 checks.
PLAIN_SHARE = 0.01


class GradientCheck(NamedTuple):
    error: float  # the plain difference's that ended the check, or the smallest over the steps
    numeric: np.ndarray  # the estimates at the step that gave it (NaN: across a kink, not judged)


def check_gradient(
    f: Probe,
    x: np.ndarray,
    analytic: np.ndarray,
    indices: np.ndarray,
    tolerance: float = TOLERANCE,
    steps: tuple[float, ...] = (1e-5, 1e-4),
    f_terms: float = 0.0,
    noise: float | None = None,
) -> GradientCheck:
    """check_directions along the entries of x at indices: each estimate is one entry of df/dx."""
    directions = [int(i) for i in indices]
    return check_directions(f, x, analytic, directions, tolerance, steps, f_terms, noise)


def check_directions(
    f: Probe,
    x: np.ndarray,
    analytic: np.ndarray,
    directions: list[int | np.ndarray],
    tolerance: float = TOLERANCE,
    steps: tuple[float, ...] = (1e-5, 1e-4),
    f_terms: float = 0.0,
    noise: float | None = None,
    region: bytes | None | object = _AT_X,
) -> GradientCheck:
    """The smallest relative error, over steps, of the analytic gradient's derivatives along
    directions (flat indices of x, or arrays shaped like x) against finite differences.

    A random direction weighs every entry of the gradient at once (PyTorch's gradcheck fast
    mode): one difference checks a whole tensor. A finite difference goes wrong in two ways:
    rounding, which shrinks as h grows (a loss computed through cancelling sums rounds at
    far more than eps * |f|), and curvature, which shrinks as h shrinks. A correct gradient
    agrees at one of the steps; a wrong one at none. The plain difference at the first step,
    at half the evaluations, ends the search if it is within PLAIN_SHARE of the tolerance;
    otherwise each step with the Richardson estimate, until one is within it. Kinks are
    stepped around (directional_derivative); a direction that cannot avoid one is left out
    (NaN; the error is NaN if none is judged). f_terms, when f is a sum, is the sum of its
    terms' magnitudes: its rounding is at least eps * f_terms even where the measurement saw
    none (f flat in x, as for a key bias). noise, when given, is f's rounding as
    rounding_noise measured it (once for many tensors of one f); region, when given, is
    region_at(f) (also once for many tensors: x is restored bit for bit).
    """
    _check_nudgeable(x)
    expected = np.array([_along(analytic, d) for d in directions])
    if noise is None:
        busiest = directions[int(np.argmax(np.abs(expected)))]  # one that f depends on
        noise = rounding_noise(f, x, busiest)
    noise = max(noise, np.finfo(np.float64).eps * f_terms)
    if region is _AT_X:
        region = region_at(f)  # once for every direction and step
    attempt = _Attempt(f, x, expected, directions, noise, region)
    plain = attempt.at(steps[0], richardson=False)
    if plain.error < tolerance * PLAIN_SHARE:
        return plain
    best = GradientCheck(np.nan, np.full(len(directions), np.nan))  # NaN error: none judged
    for h in steps:
        check = attempt.at(h)
        if np.isnan(check.error):  # every direction crossed a kink: nothing judged
            continue
        if not check.error >= best.error:  # smaller, or the first judged
            best = check
        if best.error < tolerance:
            break
    return best


class _Attempt(NamedTuple):
    """check_directions' estimates at one step: f, x and what is compared, fixed."""

    f: Probe
    x: np.ndarray
    expected: np.ndarray  # the analytic derivative along each direction
    directions: list
    noise: float
    region: bytes | None

    def at(self, h: float, richardson: bool = True) -> GradientCheck:
        """The relative error at step h (NaN if every direction crosses a kink)."""
        estimates = [
            directional_derivative(self.f, self.x, d, h, region=self.region, richardson=richardson)
            for d in self.directions
        ]
        numeric = np.array([np.nan if e is None else e for e in estimates])
        judged = ~np.isnan(numeric)
        if not judged.any():
            return GradientCheck(np.nan, numeric)
        floor = noise_floor(self.noise, int(judged.sum()), h)
        return GradientCheck(relative_error(self.expected[judged], numeric[judged], floor), numeric)


def _along(gradient: np.ndarray, direction: int | np.ndarray) -> float:
    """The derivative along direction that gradient predicts: an entry, or a dot product."""
    if isinstance(direction, int):
        return float(gradient.reshape(-1)[direction])
    return float(np.vdot(gradient, direction))


def sample_indices(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    """count distinct flat indices (all of them when size <= count)."""
    if size <= count:
        return np.arange(size)
    return np.sort(rng.choice(size, count, replace=False))
