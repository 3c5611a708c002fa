"""Shared test helpers: one call checks a forward/backward pair against finite differences."""

from __future__ import annotations

from typing import Callable

import numpy as np

from numpy_engine.gradcheck import (
    noise_floor,
    numerical_gradient,
    relative_error,
    sample_indices,
)

FD_TOLERANCE = 1e-6  # float64 central differences; we see ~1e-8 and below
WORST_ERRORS: dict[str, float] = {}  # check name -> worst error, printed after the run


def record(name: str, error: float) -> None:
    WORST_ERRORS[name] = max(error, WORST_ERRORS.get(name, 0.0))


def assert_matches_finite_differences(
    name: str,
    forward: Callable[[dict], tuple],
    backward: Callable[[np.ndarray, object], dict],
    inputs: dict[str, np.ndarray],
    rng: np.random.Generator,
    entries: int = 12,
) -> None:
    """forward(inputs) -> (out, cache); backward(dout, cache) -> {input name: gradient}.

    The upstream gradient is random (never all ones), so every output entry is
    weighted differently; each input is nudged at `entries` sampled positions.
    """
    out, cache = forward(inputs)
    dout = rng.standard_normal(np.shape(out))
    analytic = backward(dout, cache)
    f_scale = float(np.sum(np.abs(out * dout)))  # rounding in the sum scales with its terms
    assert analytic.keys() == inputs.keys(), f"{name}: gradients for {sorted(analytic)}"
    for key, x in inputs.items():
        assert analytic[key].shape == x.shape, f"{name}: d{key} has shape {analytic[key].shape}"
        indices = sample_indices(rng, x.size, entries)
        numeric = numerical_gradient(lambda: float(np.sum(forward(inputs)[0] * dout)), x, indices)
        floor = noise_floor(f_scale, len(indices))
        error = relative_error(analytic[key].reshape(-1)[indices], numeric, floor)
        record(name, error)
        assert error < FD_TOLERANCE, (
            f"{name}: d{key} differs from finite differences, relative error {error:.3e}\n"
            f"analytic {analytic[key].reshape(-1)[indices]}\nnumeric  {numeric}"
        )


def random_visible(rng: np.random.Generator, shape: tuple, kind: str) -> np.ndarray | None:
    """A mask of the given kind for scores of shape (B, H, Tq, Tk), every row seeing a key."""
    B, H, Tq, Tk = shape
    if kind == "none":
        return None
    if kind == "causal":  # Tq == Tk here
        return np.tril(np.ones((Tq, Tk), dtype=bool))[None, None]
    if kind == "padding":
        visible = np.arange(Tk)[None, :] < rng.integers(1, Tk + 1, size=(B, 1))  # (B, Tk)
        return visible[:, None, None, :]
    visible = rng.random((B, H, Tq, Tk)) < 0.5  # "random"
    one_key_per_row = rng.integers(0, Tk, size=(B, H, Tq, 1))
    np.put_along_axis(visible, one_key_per_row, True, axis=-1)
    return visible
