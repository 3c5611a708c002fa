"""Monte Carlo arithmetic: how far float32's rounding of every operation moves a computation.

A float64 run whose arrays are RandomlyRounded multiplies each floating-point result of a
NumPy operation by (1 + u r), r uniform in [-1, 1] and drawn afresh for every entry, u = 2^-24:
float32's rounding of that result, at random (Parker's Monte Carlo arithmetic, as Verificarlo
and CADNA apply it). The spread of a few such runs around the unrounded one is the error the
algorithm's own float32 rounding makes, intermediate results included; a perturbation of the
inputs alone (compare.sensitivities) sees only the inputs' rounding. The two differ where
a later step cancels most of an intermediate: a layernorm's backward over 3 channels removes
2 of 3 directions of its upstream gradient, so that gradient's own rounding, which no
perturbation of the weights reproduces, can reach a result 34x smaller (test_dropout.py).

What the emulation leaves out, each making the spread smaller than float32's error, never
larger: a reduction or matrix product is rounded once, at its result (float32 rounds every
partial sum as well); an array made with np.zeros or np.empty and written into, or passed
through np.asarray, carries no further rounding until it meets a rounded operand again.
Over 800 float32 model draws (docs/gradients.md) the engine's error read at most 10.5x
the spread of 4 runs on a tensor; the bound allows 32x.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from crosscheck.compare import FLOAT32_UNIT, sensitivities
from numpy_engine import threads

# Results these ufuncs return are exact in any binary floating point: no rounding to add.
EXACT_UFUNCS = {
    np.maximum,
    np.minimum,
    np.fmax,
    np.fmin,
    np.negative,
    np.positive,
    np.absolute,
    np.sign,
    np.copysign,
    np.floor,
    np.ceil,
    np.trunc,
    np.rint,
}
# Array functions that compute (not move) values, rounded at their result like a ufunc
# (np.matmul and the @ operator are ufuncs: __array_ufunc__ rounds them).
COMPUTING_FUNCTIONS = {np.dot, np.einsum, np.tensordot, np.inner, np.vdot}

_rng: list[np.random.Generator] = []  # the active generator, while randomly_rounding runs


@contextmanager
def randomly_rounding(rng: np.random.Generator):
    """RandomlyRounded arrays round their results with rng's draws inside the block (outside
    it they compute exactly, as plain arrays). The engine runs on one thread meanwhile: its
    threads would draw from rng in whatever order they ran, and a run would not repeat."""
    engine_threads = threads.threads()
    threads.set_threads(1)
    _rng.append(rng)
    try:
        yield
    finally:
        _rng.pop()
        threads.set_threads(engine_threads)


class RandomlyRounded(np.ndarray):
    """A float64 array whose operations' results are rounded at random by float32's u."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*(_plain(x) for x in inputs), **kwargs)
        if method == "at":  # np.add.at(a, ...) writes into a, returns None
            _round(_plain(inputs[0]))
            return None
        results = tuple(_as_array(r) for r in (result if isinstance(result, tuple) else (result,)))
        if ufunc not in EXACT_UFUNCS:
            for value in results:
                _round(value)
        if out is not None:  # the caller's arrays, as given
            return out[0] if len(out) == 1 else out
        return _rounded(results if isinstance(result, tuple) else results[0])

    def __array_function__(self, func, types, args, kwargs):
        if func not in COMPUTING_FUNCTIONS:
            return super().__array_function__(func, types, args, kwargs)
        args = tuple(_plain(a) for a in args)
        out = kwargs.get("out")
        if out is not None:
            kwargs = {**kwargs, "out": _plain(out)}
        result = _as_array(func(*args, **kwargs))
        _round(result)
        return out if out is not None else _rounded(result)


def _plain(x):
    return x.view(np.ndarray) if isinstance(x, RandomlyRounded) else x


def _as_array(result):
    """A NumPy scalar result as a 0-d array, which _round can change in place."""
    return np.asarray(result) if isinstance(result, np.floating) else result


def _rounded(result):
    """Results handed back as RandomlyRounded, so the operations that use them round too."""
    if isinstance(result, tuple):
        return tuple(_rounded(r) for r in result)
    if isinstance(result, np.ndarray) and result.dtype.kind == "f":
        return result.view(RandomlyRounded)
    return result


def _round(value) -> None:
    """value *= 1 + u r, in place, for each entry of a floating-point array."""
    if _rng and isinstance(value, np.ndarray) and value.dtype.kind == "f":
        factor = _rng[-1].uniform(-1.0, 1.0, value.shape)  # one array the size of value
        factor *= FLOAT32_UNIT
        factor += 1.0
        value *= factor


# The spread's runs. Against 16, over 800 model draws (docs/gradients.md): each draw's worst
# error/bound moved by 0.61x to 2.27x, the worst of them 0.142 against 0.111; 4 runs cost the
# tests 3 s, 16 cost 13 s.
ROUNDED_RUNS = 4


def rounding_spread(
    run: Callable[[dict], dict],
    inputs: dict,
    rng: np.random.Generator,
    runs: int = ROUNDED_RUNS,
    base: dict | None = None,
) -> dict[str, float]:
    """How far each output of run moves, in norm (the RMS over runs), when every operation's
    result is rounded at random by float32's u. run(inputs) -> {name: array}, in float64,
    called runs times with each input a RandomlyRounded view (run must compute from those
    views: a model must read its weights from them, see rounded_params), and once as given
    unless base is that run's result."""
    base = run(inputs) if base is None else base
    total = dict.fromkeys(base, 0.0)
    for _ in range(runs):
        rounded = {key: np.asarray(value).view(RandomlyRounded) for key, value in inputs.items()}
        with randomly_rounding(rng):
            out = run(rounded)
        for key, value in base.items():
            total[key] += float(np.linalg.norm(_plain(np.asarray(out[key])) - value)) ** 2
    return {key: float(np.sqrt(value / runs)) for key, value in total.items()}


@contextmanager
def rounded_params(model):
    """model.params seen as RandomlyRounded views inside the block, so that its forward and
    backward round at random (under randomly_rounding); the plain views again after."""
    plain = model.params
    model.params = {key: value.view(RandomlyRounded) for key, value in plain.items()}
    try:
        yield
    finally:
        model.params = plain


class Golden(NamedTuple):
    """What a float32 model run is judged by (compare.float32_checks)."""

    results: dict  # the float64 engine's, on the float32 run's weights and inputs
    sensitivity: dict  # each result's, to float32 rounding of the weights and inputs
    spread: dict  # each result's, under every operation rounded at random


def model_golden(model32, compute: Callable, rng: np.random.Generator, extra=None) -> Golden:
    """The golden run of a float32 model: compute(model, inputs) -> {name: array} on its
    float32 weights in float64, inputs holding the weights and extra (further inputs, as an
    upstream gradient, already rounded to float32 and held in float64)."""
    exact = model32.with_dtype("float64")
    inputs = {key: value.copy() for key, value in exact.params.items()} | (extra or {})

    def run(values: dict) -> dict:
        exact.load_params({key: values[key] for key in exact.params})  # a copy, into its own
        if not isinstance(values[next(iter(exact.params))], RandomlyRounded):
            return compute(exact, values)
        with rounded_params(exact):
            return compute(exact, values)

    results = run(inputs)
    sensitivity = sensitivities(run, inputs, rng, per_input=False)
    return Golden(results, sensitivity, rounding_spread(run, inputs, rng, base=results))
