"""Input checks shared by the models: each failure names the argument and what was expected."""

from __future__ import annotations

import math

import numpy as np


class InputError(ValueError):
    """Bad input from a user or caller: the message names the argument and what was expected.

    The command line reports these as one line and exit status 2; any other exception is a
    bug in the engine and surfaces as one."""


class InputTypeError(InputError, TypeError):
    """An argument of the wrong type (an InputError, and a TypeError for callers that ask)."""


def check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise InputError(f"{name} must be positive, got {value}")


def check_number_in(name: str, value: object, low: float, high: float = math.inf) -> None:
    """low <= value < high, value a real number (not a bool); NaN is refused."""
    if not (_is_real(value) and low <= value < high):  # False for NaN too
        if high < math.inf:
            raise InputError(f"{name} must be a number in [{low:g}, {high:g}), got {value}")
        raise InputError(f"{name} must be a finite number >= {low:g}, got {value}")


def check_positive_finite(name: str, value: object) -> None:
    """0 < value < inf, value a real number (not a bool); NaN is refused."""
    if not (_is_real(value) and 0 < value < math.inf):
        raise InputError(f"{name} must be a positive finite number, got {value}")


def check_clipping_norm(name: str, value: object) -> None:
    """A norm to clip gradients to: above 0, inf allowed (clips nothing: torch's idiom for
    the norm alone); NaN is refused."""
    if not (_is_real(value) and value > 0):  # False for NaN too
        raise InputError(f"{name} must be a positive number (inf clips nothing), got {value}")


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def check_non_negative_int(name: str, value: object) -> None:
    """An int >= 0: a count, or a seed as NumPy's default_rng takes one (its own refusal
    names no argument)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InputError(f"{name} must be a non-negative int, got {value!r}")


def check_choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise InputError(f"{name} must be one of {choices}, got {value!r}")


def as_array(name: str, value: object) -> np.ndarray:
    """np.asarray, with a message naming the argument when the value is not array-like."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as error:  # ragged nested lists, for one
        raise InputTypeError(
            f"{name} must be an array, got {type(value).__name__} ({error})"
        ) from None


def check_token_ids(name: str, ids: object, vocab_size: int) -> np.ndarray:
    """A non-empty (batch, time) integer array with every id in [0, vocab_size)."""
    arr = as_array(name, ids)
    if arr.dtype.kind not in "iu":
        raise InputTypeError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise InputError(f"{name} must have shape (batch, time), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise InputError(f"{name} is an empty batch: shape {arr.shape}")
    if arr.shape[1] == 0:
        raise InputError(f"{name} has no time steps: shape {arr.shape}")
    outside = (arr < 0) | (arr >= vocab_size)
    if outside.any():
        b, t = np.argwhere(outside)[0]
        raise InputError(
            f"{name}[{b}, {t}] = {arr[b, t]} is outside the vocabulary [0, {vocab_size})"
        )
    return arr


def check_targets(
    name: str, targets: object, shape: tuple, vocab_size: int, ignore_index: int, like: str
) -> np.ndarray:
    """Class ids in [0, vocab_size) or ignore_index, shaped like the logits' leading axes."""
    arr = as_array(name, targets)
    if arr.dtype.kind not in "iu":
        raise InputTypeError(f"{name} must hold integer class ids, got dtype {arr.dtype}")
    if arr.shape != shape:
        raise InputError(f"{name} must have shape {shape} like {like}, got {arr.shape}")
    outside = ((arr < 0) | (arr >= vocab_size)) & (arr != ignore_index)
    if outside.any():
        b, t = np.argwhere(outside)[0]
        raise InputError(
            f"{name}[{b}, {t}] = {arr[b, t]} is outside the vocabulary [0, {vocab_size}) "
            f"and is not ignore_index={ignore_index}"
        )
    if (arr == ignore_index).all():
        raise InputError(
            f"{name}: every target equals ignore_index={ignore_index} (all padding); "
            "there is nothing to compute a loss over"
        )
    return arr


def check_same_batch(name_a: str, a: np.ndarray, name_b: str, b: np.ndarray) -> None:
    if a.shape[0] != b.shape[0]:
        raise InputError(
            f"{name_a} and {name_b} must have the same batch size, "
            f"got {a.shape[0]} and {b.shape[0]}"
        )


def check_upstream_gradient(name: str, grad: object, shape: tuple, dtype: np.dtype) -> np.ndarray:
    if not isinstance(grad, np.ndarray) or grad.dtype.kind != "f":
        raise InputTypeError(f"{name} must be a float ndarray, got {type(grad).__name__}")
    if grad.shape != shape:
        raise InputError(f"{name} must have shape {shape} (like the logits), got {grad.shape}")
    check_finite(name, grad)
    return grad.astype(dtype, copy=False)


def check_finite(name: str, array: np.ndarray) -> None:
    if not np.isfinite(array).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
        raise InputError(f"{name} must be finite, but {name}{list(bad)} = {array[bad]}")
