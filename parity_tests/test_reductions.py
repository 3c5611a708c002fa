"""The fast reductions and the softmax's skipped row max, against NumPy's textbook forms."""

from __future__ import annotations

import platform
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_engine import softmax as S
from numpy_engine.memory import CACHE_LINE, aligned_empty, aligned_zeros, keep_freed_memory
from numpy_engine.models import MiniGPT
from numpy_engine.optim import AdamW
from numpy_engine.reductions import (
    dot_last,
    mean_last,
    mean_leading,
    mean_second_last,
    sum_last,
    sum_leading,
)
from parity_tests.strategies import seeds

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@given(shape=shapes, seed=seeds, transposed=st.booleans())
def test_reductions_equal_numpys_sums(shape, seed, transposed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    b = rng.standard_normal(shape)
    if transposed:  # a non-contiguous view
        a, b = a.T, b.T
    lead = tuple(range(a.ndim - 1))
    np.testing.assert_allclose(sum_leading(a), a.sum(axis=lead), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(sum_last(a), a.sum(axis=-1, keepdims=True), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(mean_last(a), a.mean(axis=-1, keepdims=True), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(mean_leading(a), a.mean(axis=lead), rtol=1e-13, atol=1e-14)
    if a.ndim >= 2:
        expected = a.mean(axis=-2, keepdims=True)
        np.testing.assert_allclose(mean_second_last(a), expected, rtol=1e-13, atol=1e-14)
    expected_dot = (a * b).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(dot_last(a, b), expected_dot, rtol=1e-13, atol=1e-14)
    assert sum_leading(a.astype(np.float32)).dtype == np.float32  # no silent upcast


@pytest.mark.parametrize("shape", [(2, 3, 0), (2, 0), (0,)])
def test_rows_of_no_entries_sum_to_zero(shape):
    """sum_last and mean_last over an empty last axis: zeros (..., 1), as a product with an
    empty vector gives (a reshape to (-1, 0) would be no shape)."""
    x = np.ones(shape)
    for reduce in (sum_last, mean_last):
        result = reduce(x)
        assert result.shape == (*shape[:-1], 1) and not result.any(), reduce.__name__


def textbook_softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize(
    "offset, path",
    [
        (0.0, "no row max"),
        (800.0, "max above 60"),
        (-30.0, "rows summing below 1e-8"),
        (-800.0, "every exp underflows"),
    ],
)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_softmax_last_equals_the_textbook_on_every_path(offset, path, dtype):
    rng = np.random.default_rng(0)
    scores = (rng.standard_normal((3, 4, 5)) + offset).astype(dtype)
    scores[0, 1, 2:] = -np.inf  # hidden entries
    expected = textbook_softmax(scores.astype(np.float64))
    weights = S.softmax_last(scores.copy())
    assert np.isfinite(weights).all(), path
    assert weights[0, 1, 2:].tolist() == [0.0, 0.0, 0.0]
    tolerance = 1e-14 if dtype == "float64" else 1e-6
    np.testing.assert_allclose(weights, expected, rtol=tolerance, atol=tolerance, err_msg=path)
    # into a given array (attention's batch groups write their rows of the weights so): the
    # same bits, and that array is what it returns
    out = np.full_like(scores, np.nan)
    assert S.softmax_last(scores.copy(), out=out) is out, path
    np.testing.assert_array_equal(out, weights, err_msg=path)


def test_softmax_last_propagates_nan_as_the_textbook_does():
    scores = np.zeros((2, 3))
    scores[1, 0] = np.nan
    weights = S.softmax_last(scores.copy())
    assert np.isnan(weights[1]).all() and np.allclose(weights[0], 1 / 3)


REUSE_PROBE = """
import resource, numpy as np
from numpy_engine.memory import keep_freed_memory
print(keep_freed_memory() if {keep} else None)
np.ones(16 << 20, np.float32)  # 64 MiB made, touched and freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
np.empty(16 << 20, np.float32).fill(1.0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_keep_freed_memory_reuses_a_freed_64_mib_array_where_there_is_glibc():
    """Past glibc's 32 MiB ceiling on its mmap threshold too: a 64 MiB array freed and made
    again comes back without page faults (measured: 0), where under glibc's own settings it
    takes fresh pages (544 faults; at least 32, pages being at most 2 MiB). Each in a fresh
    process: in one that has run other tests the heap's state is theirs."""
    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is on_glibc  # True: glibc accepted both settings
    if not on_glibc:
        return
    faults = {}
    for keep in (True, False):
        code = REUSE_PROBE.format(keep=keep)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        kept, faults[keep] = out.stdout.split()
        assert kept == str(keep if keep else None)
    assert int(faults[True]) < 16 and int(faults[False]) >= 32


@pytest.mark.parametrize("shape", [7, (3, 5), (0,), (2, 0, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_aligned_arrays_start_on_a_cache_line_with_numpys_shape_and_dtype(shape, dtype):
    for _ in range(8):  # NumPy's own arrays start on a line one time in four
        empty, zeros = aligned_empty(shape, dtype), aligned_zeros(shape, dtype)
        for array in (empty, zeros):
            assert array.shape == np.empty(shape).shape and array.dtype == dtype
            assert array.flags.c_contiguous and array.flags.writeable
            # an array of no entries has no data to align (NumPy points it anywhere)
            assert array.size == 0 or array.ctypes.data % CACHE_LINE == 0
        assert not zeros.any()


def test_the_optimizers_vectors_start_on_cache_lines():
    """The parameters, moments and scratch the optimizer walks block by block."""
    model = MiniGPT(MiniGPT.config_class(), seed=0)
    optimizer = AdamW(model.params)
    vectors = [model.flat, optimizer.scratch, *optimizer.flat_state.values()]
    assert [v.ctypes.data % CACHE_LINE for v in vectors] == [0] * 4


def test_softmax_backward_takes_a_single_dominant_entry_as_minus_the_others():
    """A weight over 1/2 gets minus the sum of its row's other entries (exactly); a row whose
    largest weight is at most 1/2, or with two over 1/2 (possible only by rounding), keeps the
    textbook w (dw - sum(w dw)). A non-contiguous dweights gives the same result."""
    over = np.nextafter(np.float32(0.5), np.float32(1))
    # the dominant weight sits off column 0 of row 1, so a flat index is never its row number
    weights = np.array(
        [[over, over, 0.0, 0.0], [0.06, 0.9, 0.04, 0.0], [0.3, 0.3, 0.4, 0.0]], np.float32
    )
    dweights = np.random.default_rng(0).standard_normal(weights.shape).astype(np.float32)
    textbook = weights * (dweights - np.vecdot(dweights, weights)[:, None])
    got = S.softmax_backward(dweights.copy(), weights)
    assert got[1, 1] == -(got[1, 0] + got[1, 2] + got[1, 3])
    assert got[1, 1] != textbook[1, 1]  # the fix changed it: it is not the textbook's value
    np.testing.assert_array_equal(got[1, [0, 2, 3]], textbook[1, [0, 2, 3]])
    np.testing.assert_array_equal(got[[0, 2]], textbook[[0, 2]])
    strided = np.asfortranarray(dweights)
    np.testing.assert_array_equal(S.softmax_backward(strided, weights), got)
    # the row with two over 1/2 as the only one with any: its row number is 0
    rows = [0, 2]
    alone = S.softmax_backward(dweights[rows].copy(), weights[rows])
    np.testing.assert_array_equal(alone, textbook[rows])
    # the row with two over 1/2 after a row with one, and a largest weight of exactly 1/2
    # (not over it): both keep the textbook's values
    rows = [1, 0, 3]
    weights = np.concatenate([weights, [[0.5, 0.3, 0.2, 0.0]]]).astype(np.float32)
    last = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32)
    dweights = np.concatenate([dweights, last])
    textbook = weights * (dweights - np.vecdot(dweights, weights)[:, None])
    got = S.softmax_backward(dweights[rows].copy(), weights[rows])
    np.testing.assert_array_equal(got[1:], textbook[rows[1:]])
    assert textbook[3, 0] != -(textbook[3, 1] + textbook[3, 2] + textbook[3, 3])  # it can tell


def test_available_bytes_reads_memavailable_in_kib(monkeypatch):
    import builtins
    import io

    from numpy_engine import memory

    real_open = builtins.open

    def available_from(meminfo: str):
        def fake_open(path, *args, **kwargs):
            if path == "/proc/meminfo":
                return io.StringIO(meminfo)
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", fake_open)
        return memory.available_bytes()

    known = "MemTotal:  4000 kB\nMemFree:  1500 kB\nMemAvailable:  3000 kB\n"
    assert available_from(known) == 3000 * 1024
    for unknown in ["MemTotal:  4000 kB\n", "MemAvailable:\n", "MemAvailable: lots kB\n"]:
        assert available_from(unknown) is None, unknown


def test_check_fits_says_both_sizes_in_gib():
    from numpy_engine import memory

    available = 3 * 2**29  # 1.5 GiB
    memory.check_fits("a step", available, available)
    memory.check_fits("a step", 2**40, None)  # unknown: nothing is refused
    with pytest.raises(ValueError, match=r"^a step would need about 3\.0 GiB for one training "):
        memory.check_fits("a step", 3 * 2**30, available)
    with pytest.raises(ValueError, match=r"step; 1\.5 GiB are available$"):
        memory.check_fits("a step", available + 1, available)
