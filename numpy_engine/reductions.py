"""Sums and dot products over an axis, written the way that is fast in NumPy.

NumPy's reductions along a short last axis (`x.sum(axis=-1)`, `x.max(axis=-1)` over rows
of 4 to 256 numbers) walk each row separately and are slow: on this project's machines
a row sum over a (1024, 64) float32 array took 31 us against 5 us as a matrix-vector
product, a column sum 27 us against 5 us, and a row max over a (4096, 32) array 500 us,
more than the softmax's exp. So sums become products with a vector of ones (BLAS),
and dot products become `np.vecdot`. docs/performance.md has the measurements.

The 2-D products here are `np.dot(a, b)`, not `a @ b`: the same BLAS call (the same bits at
every shape tried), for ~0.25 us less a call (matmul is a generalized ufunc, whose dispatch
costs more), a third of a small product's time: the copy model's step makes ~50 of them.
Their outputs are vectors. A matrix output costs `np.dot` more per entry than `@` (char-lm's
products 1-4% more), so the layers' products keep `@`.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=128)
def _filled(n: int, dtype: np.dtype, value: float = 1.0) -> np.ndarray:
    """A read-only (n,) vector of value (shared by every caller)."""
    vector = np.full(n, value, dtype=dtype)
    vector.flags.writeable = False
    return vector


def sum_leading(x: np.ndarray) -> np.ndarray:
    """x (..., C) summed over every axis but the last: (C,). A bias or layernorm gradient."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C)
    return np.dot(_filled(x2.shape[0], x2.dtype), x2)  # ones (N,)


def mean_leading(x: np.ndarray) -> np.ndarray:
    """x (..., C) averaged over every axis but the last: (C,), the mean row."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C)
    return np.dot(_filled(x2.shape[0], x2.dtype, 1.0 / x2.shape[0]), x2)  # 1/N (N,)


def sum_last(x: np.ndarray) -> np.ndarray:
    """x (..., C) summed over the last axis, keeping it: (..., 1).

    Over 3-D or 4-D x, matmul makes one matrix-vector product per leading index; as (N, C)
    rows it is one: (32, 4, 3, 3) float32 4.8 -> 1.5 us, (32, 4, 32, 32) 13.8 -> 10.3 us."""
    return _last_times(x, _filled(x.shape[-1], x.dtype))  # times ones


def _last_times(x: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """x (..., C) @ vector (C,), keeping the last axis: (..., 1)."""
    if x.ndim >= 2 and x.flags.c_contiguous and x.shape[-1] > 0:  # (-1, 0) is no shape
        return np.dot(x.reshape(-1, x.shape[-1]), vector).reshape(*x.shape[:-1], 1)
    return (x @ vector)[..., None]


def dot_last(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum(a * b) over the last axis, keeping it: (..., 1), without the (..., C) product."""
    return np.vecdot(a, b)[..., None]


def mean_last(x: np.ndarray) -> np.ndarray:
    """x (..., C) averaged over the last axis, keeping it: (..., 1): one product with a
    vector of 1/C (the same bits as the sum times 1/C where C is a power of two; on the
    copy model's small arrays the call fewer made its step 0.6-1.3% faster)."""
    C = x.shape[-1]
    return _last_times(x, _filled(C, x.dtype, 1.0 / C if C else 0.0))


def mean_second_last(x: np.ndarray) -> np.ndarray:
    """x (..., T, C) averaged over its second-to-last axis, keeping it: (..., 1, C), as one
    product with a vector of 1/T ((T,) @ (..., T, C) gives (..., C))."""
    T = x.shape[-2]
    return (_filled(T, x.dtype, 1.0 / T if T else 0.0) @ x)[..., None, :]
