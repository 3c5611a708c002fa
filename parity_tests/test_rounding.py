"""crosscheck/rounding.py: float32's rounding of every operation, emulated at random in float64,
and the spread it gives, which judges a whole model's float32 run (crosscheck/compare.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crosscheck.compare import FLOAT32_UNIT, sensitivities
from crosscheck.rounding import (
    RandomlyRounded,
    model_golden,
    randomly_rounding,
    rounded_params,
    rounding_spread,
)
from numpy_engine import threads
from parity_tests.float32_panel import model_case

U = FLOAT32_UNIT


def rounded(x: np.ndarray) -> RandomlyRounded:
    return np.asarray(x, dtype=np.float64).view(RandomlyRounded)


def test_a_product_rounds_each_entry_by_a_uniform_share_of_u():
    """Each entry times (1 + u r), r uniform in [-1, 1]: the change's norm is u ||x y|| times
    the RMS of r, 1/sqrt(3), to within 1% over 20,000 entries."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 20_000))
    spread = rounding_spread(lambda i: {"xy": i["x"] * i["y"]}, {"x": x, "y": y}, rng)
    expected = U / math.sqrt(3) * float(np.linalg.norm(x * y))
    assert spread["xy"] == pytest.approx(expected, rel=0.01)


def test_exact_operations_and_moves_add_no_rounding():
    """max, min, negation, |x|, where, reshapes and transposes return exact results."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 5))

    def run(i: dict) -> dict:
        x = i["x"]
        kept = np.where(x > 0, np.maximum(x, 0.5), -np.abs(np.minimum(x, -0.5)))
        return {"moved": kept.T.reshape(-1)[::2]}

    assert rounding_spread(run, {"x": x}, rng) == {"moved": 0.0}


@pytest.mark.parametrize(
    "operation",
    [
        lambda a, b: a @ b,
        lambda a, b: np.dot(a, b),
        lambda a, b: np.einsum("ij,jk->ik", a, b),
        lambda a, b: np.tensordot(a, b, axes=1),
        lambda a, b: np.matmul(a, b, out=np.empty((4, 4))),
        lambda a, b: np.add(a, b.T, out=np.empty((4, 4)).view(RandomlyRounded)),
        lambda a, b: a.sum(axis=0),
        lambda a, b: a.sum(),
        lambda a, b: np.exp(a),
    ],
    ids=[
        "@",
        "dot",
        "einsum",
        "tensordot",
        "matmul out=",
        "add out=",
        "sum",
        "sum to a scalar",
        "exp",
    ],
)
def test_every_computed_result_is_rounded_within_u(operation):
    """Each entry moves, and by at most u of itself (1 + u r, |r| <= 1)."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 4, 4))
    exact = operation(a, b)
    with randomly_rounding(rng):
        result = np.asarray(operation(rounded(a), rounded(b)))
    relative = np.abs(result / exact - 1)
    assert 0 < relative.min() and relative.max() <= U * (1 + 1e-12)


@pytest.mark.parametrize("operation", [np.dot, np.add], ids=["dot", "add"])
def test_a_result_written_into_out_is_rounded_there_and_out_returned(operation):
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((2, 4, 4))
    out = rounded(np.empty((4, 4)))
    with randomly_rounding(rng):
        returned = operation(rounded(a), rounded(b), out=out)
    assert returned is out
    relative = np.abs(np.asarray(out) / operation(a, b) - 1)
    assert 0 < relative.min() and relative.max() <= U * (1 + 1e-12)


@pytest.mark.parametrize("shape", [(20,), ()], ids=["arrays", "scalars"])
def test_a_ufunc_of_two_results_rounds_both(shape):
    rng = np.random.default_rng(7)
    a, b = 10.0 + rng.random(shape), np.full(shape, 3.0)
    with randomly_rounding(rng):
        results = np.divmod(rounded(a), rounded(b))
    for result, exact in zip(results, np.divmod(a, b), strict=True):
        assert isinstance(result, RandomlyRounded)
        relative = np.abs(np.asarray(result) / exact - 1)
        assert 0 < relative.min() and relative.max() <= U * (1 + 1e-12)


def test_scatter_adds_are_rounded_where_they_write():
    """np.add.at(a, indices, values) rounds a, the array it writes into."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal(5)
    exact = table.copy()
    np.add.at(exact, [0, 2, 2], [1.0, 2.0, 3.0])
    into = rounded(table.copy())
    with randomly_rounding(rng):
        np.add.at(into, [0, 2, 2], [1.0, 2.0, 3.0])
    relative = np.abs(np.asarray(into) / exact - 1)
    assert 0 < relative.min() and relative.max() <= U * (1 + 1e-12)


def test_outside_the_block_the_arrays_compute_exactly():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((2, 100))
    assert np.array_equal(np.asarray(rounded(x) * rounded(y) @ rounded(y)), x * y @ y)


def test_a_cancelled_intermediate_shows_in_the_spread_not_in_the_sensitivity():
    """(x + 1) - 1 for x ~ 1e-3: the intermediate x + 1 is rounded by u of 1, a thousand times
    u of x. Moving the input x by u of itself moves the result by u ||x||; float32 makes the
    error of the intermediate's rounding, and the spread sees it within a factor of 2."""
    rng = np.random.default_rng(5)
    x = (1e-3 * rng.standard_normal(1000)).astype(np.float32).astype(np.float64)

    def run(i: dict) -> dict:
        return {"y": (i["x"] + 1.0) - 1.0}

    sensitivity = sensitivities(run, {"x": x}, rng)["y"]
    spread = rounding_spread(run, {"x": x}, rng)["y"]
    x32 = x.astype(np.float32)
    error = float(np.linalg.norm(((x32 + np.float32(1)) - np.float32(1)) - x))
    assert sensitivity < 2 * U * np.linalg.norm(x)
    assert spread > 300 * sensitivity
    assert spread / 2 < error < 2 * spread


def test_rounded_params_shows_a_model_its_weights_rounding_and_gives_back_its_own():
    model, batch = model_case("gpt", 0)
    views = model.params
    logits, _ = model.forward(*batch[:-1])
    with rounded_params(model), randomly_rounding(np.random.default_rng(6)):
        assert all(isinstance(value, RandomlyRounded) for value in model.params.values())
        moved, _ = model.forward(*batch[:-1])
    assert model.params is views
    difference = np.abs(np.asarray(moved) - logits).max()
    assert 0 < difference < 1e3 * U * np.abs(logits).max()


def test_a_models_golden_run_moves_its_weights_and_rounds_its_operations():
    """model_golden: the float64 run on the float32 weights, the change when those weights
    move by u (2.1 u of the logits' norm here) and when every operation rounds (1.5 u)."""
    model, batch = model_case("gpt", 0)
    model32 = model.with_dtype("float32")

    def compute(exact, _inputs: dict) -> dict:
        return {"logits": exact.forward(*batch[:-1])[0]}

    golden = model_golden(model32, compute, np.random.default_rng(9))
    expected, _ = model32.with_dtype("float64").forward(*batch[:-1])
    assert np.array_equal(golden.results["logits"], expected)
    scale = U * np.linalg.norm(expected)
    assert 0.5 * scale < golden.sensitivity["logits"] < 8 * scale
    assert 0.5 * scale < golden.spread["logits"] < 8 * scale


def test_the_engine_rounds_on_one_thread_and_gets_its_threads_back():
    """Its threads would draw the roundings in whatever order they ran: a run would not
    repeat (the attention of a long sequence runs by pieces on them)."""
    before = threads.threads()
    threads.set_threads(2)
    try:
        with randomly_rounding(np.random.default_rng(10)):
            assert threads.threads() == 1
        assert threads.threads() == 2
    finally:
        threads.set_threads(before)
