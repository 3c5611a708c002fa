"""How many NumPy calls one training step makes: the engine's per-call cost on small models.

A small model's step is bound by calls, not arithmetic: each NumPy call costs about a
microsecond of dispatch whatever its size. To count them, one step runs on an ndarray
subclass, `Counted`, that sees every call the engine's code makes on an array:

- every ufunc: arithmetic and in-place operators, np.exp, matmul (`@`), reductions
  (`.sum()`, `.max()`), each `ufunc.method` once;
- every NumPy function that dispatches on its arguments (np.where, np.concatenate, ...);
- every index read or write (`a[rows, top]`, `a[...] = b`).

Only the outermost call counts: a NumPy function that calls ufuncs inside is one call, as
it is one dispatch from the engine's code. (Array methods that NumPy writes in Python, such
as `.mean()`, are not seen themselves: they count as the ufunc calls they make.) Not
counted: attribute reads (`.shape`, `.T`), `.reshape` and other methods that make views,
array construction from Python (np.empty, np.arange with no array argument), and
`np.asarray` / `np.ascontiguousarray`, which do not dispatch on their argument (their result
is a plain array, so a product of it with another plain array would go unseen too: the
engine copies with `np.copy`). The step is not timed: the subclass is slow.
"""

from __future__ import annotations

import collections

import numpy as np

from numpy_engine.params import unflatten


class Counted(np.ndarray):
    """An ndarray that counts the NumPy calls made on it (class-wide tallies)."""

    calls: collections.Counter = collections.Counter()
    products: list = []  # (left shape, right shape, dtype) of each outermost matmul or np.dot
    _depth = 0  # > 0 inside a counted call: the calls it makes itself are not counted

    @classmethod
    def _count(cls, name: str, run):
        if cls._depth == 0:
            cls.calls[name] += 1
        cls._depth += 1
        try:
            return run()
        finally:
            cls._depth -= 1

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        inputs = tuple(_plain(x) for x in inputs)
        if ufunc is np.matmul and method == "__call__":
            Counted._note_product(*inputs)
        if out is not None:
            kwargs["out"] = tuple(_plain(x) for x in out)
        result = Counted._count(
            f"{ufunc.__name__}.{method}", lambda: getattr(ufunc, method)(*inputs, **kwargs)
        )
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _counted(result)

    def __array_function__(self, func, types, args, kwargs):
        args = tuple(_plain_nested(x) for x in args)
        kwargs = {key: _plain_nested(value) for key, value in kwargs.items()}
        if func is np.dot:
            Counted._note_product(*args[:2])
        return _counted(Counted._count(func.__name__, lambda: func(*args, **kwargs)))

    @classmethod
    def _note_product(cls, left, right) -> None:
        if cls._depth == 0:
            left, right = np.asarray(left), np.asarray(right)
            cls.products.append((left.shape, right.shape, np.result_type(left, right)))

    def __getitem__(self, index):
        index = _plain_nested(index)
        return _counted(Counted._count("index", lambda: self.view(np.ndarray)[index]))

    def __setitem__(self, index, value):
        index, value = _plain_nested(index), _plain(value)

        def write():
            self.view(np.ndarray)[index] = value

        Counted._count("index write", write)


def _plain(x):
    return x.view(np.ndarray) if isinstance(x, Counted) else x


def _plain_nested(x):
    if isinstance(x, tuple | list):
        return type(x)(_plain_nested(item) for item in x)
    return _plain(x)


def _counted(result):
    if isinstance(result, tuple):
        return tuple(_counted(item) for item in result)
    if type(result) is np.ndarray:
        return result.view(Counted)
    return result


def calls_per_step(model, optimizer, batch, step) -> tuple[collections.Counter, list]:
    """The NumPy calls of step(model, optimizer, batch), by name, and its matrix products
    (Counted.products), on a Counted copy of the model's parameter vector and of the batch
    (the model's own vector is put back after)."""
    flat, params = model.flat, model.params
    model.flat = flat.copy().view(Counted)
    model.params = unflatten(model.flat, params)
    Counted.calls.clear()
    Counted.products.clear()
    try:
        step(model, optimizer, tuple(np.asarray(x).view(Counted) for x in batch))
    finally:
        model.flat, model.params = flat, params
    return collections.Counter(Counted.calls), list(Counted.products)
