"""The parity rules themselves (crosscheck/compare.py): a rule that passed a result just
outside its bound, or measured the bound wrong, would let a wrong gradient through every
parity test that uses it."""

from __future__ import annotations

import numpy as np
import pytest

from crosscheck.compare import (
    FLOAT32_TINY,
    FLOAT32_UNIT,
    FLOAT64_ATOL,
    FLOAT64_RTOL,
    Comparison,
    compare,
    float32_checks,
    float64_ok,
    sensitivities,
)

U = FLOAT32_UNIT


def test_compare_reports_the_normwise_difference_and_the_worst_entry():
    ours = np.array([[1.0, 2.0], [3.0, 4.5]])
    ref = np.array([[1.0, 2.25], [3.0, 4.0]])
    c = compare("w", ours, ref)
    assert (c.name, c.shape, c.max_abs, c.worst_index) == ("w", (2, 2), 0.5, (1, 1))
    assert (c.ours_value, c.ref_value) == (4.5, 4.0)
    assert c.diff_norm == np.hypot(0.25, 0.5) and c.ref_norm == np.linalg.norm(ref)
    assert c.rel == c.diff_norm / c.ref_norm
    assert c.describe() == (
        "w (2, 2): normwise relative difference 1.003e-01, max abs 5.000e-01 at (1, 1): "
        "ours 4.5 vs reference 4.0"
    )
    assert compare("small", np.array([0.3]), np.array([0.25])).rel == (0.3 - 0.25) / 0.25
    assert compare("z", np.zeros(3), np.zeros(3)).rel == 0.0
    assert compare("z", np.array([0.0, 1e-30]), np.zeros(2)).rel == np.inf
    empty = compare("e", np.zeros((0, 3)), np.zeros((0, 3)))
    assert (empty.max_abs, empty.worst_index, empty.rel) == (0.0, (), 0.0)
    assert np.isnan(empty.ours_value) and float64_ok(empty)
    scalar = compare("s", np.float64(2.0), np.float64(2.5))
    assert scalar.shape == scalar.worst_index == ()
    assert (scalar.ours_value, scalar.max_abs) == (2.0, 0.5)
    with pytest.raises(AssertionError, match=r"w: shape \(2,\) differs from the reference's"):
        compare("w", np.zeros(2), np.zeros(3))


def comparison(diff_norm: float, ref_norm: float) -> Comparison:
    rel = diff_norm / ref_norm if ref_norm else np.inf
    return Comparison("t", (1,), diff_norm, rel, diff_norm, ref_norm, (0,), 0.0, 0.0)


@pytest.mark.parametrize("ref_norm", [0.0, 1.0, 1e6])
def test_float64_rule_passes_up_to_its_bound_and_no_further(ref_norm):
    bound = FLOAT64_ATOL + FLOAT64_RTOL * ref_norm
    assert (FLOAT64_ATOL, FLOAT64_RTOL) == (1e-12, 1e-10)
    assert float64_ok(comparison(bound, ref_norm))
    assert not float64_ok(comparison(bound * (1 + 1e-9), ref_norm))


def test_float32_bound_is_32_times_the_sensitivity_or_its_floor():
    golden = {"a": np.ones(4), "b": np.zeros(9)}
    ours = {"a": np.array([1.0, 1.0, 1.0, 1.0 + 5e-5], np.float32), "b": np.zeros(9, np.float32)}
    checks = float32_checks(ours, golden, {"a": 1e-6, "b": 1e-9})
    assert checks["a"].bound == 32 * (1e-6 + FLOAT32_TINY * 2)
    assert checks["b"].bound == 32 * (0.05 * 1e-6 + FLOAT32_TINY * 3)  # the floor, not 1e-9
    error = float(np.float32(1.0 + 5e-5)) - 1.0  # normwise, in float64
    assert checks["a"].error == error and not checks["a"].ok and checks["b"].ok
    assert (checks["a"].sensitivity, checks["a"].golden_norm) == (1e-6, 2.0)
    within = float32_checks(ours, golden, {"a": error / 32, "b": 0.0})["a"]
    assert within.ok and within.error <= within.bound  # error == 32 S, plus the underflow term
    exact = float32_checks(ours, golden, {"a": 0.0, "b": 0.0})  # nothing moves: underflow only
    assert exact["b"].bound == 32 * FLOAT32_TINY * 3 and exact["b"].ok


def test_a_models_rounding_spread_raises_its_scale_and_its_floor_where_larger():
    """A whole model's scale is max(sensitivity, spread) per tensor, and the floor 5% of the
    largest such scale; where the spread is smaller, or not given, the sensitivity rules."""
    golden = {"a": np.ones(4), "b": np.zeros(9)}
    ours = {"a": np.array([1.0, 1.0, 1.0, 1.0 + 5e-5], np.float32), "b": np.zeros(9, np.float32)}
    sensitivity = {"a": 1e-6, "b": 1e-9}
    checks = float32_checks(ours, golden, sensitivity, {"a": 4e-6, "b": 1e-12})
    assert checks["a"].bound == 32 * (4e-6 + FLOAT32_TINY * 2) and checks["a"].ok
    assert checks["b"].bound == 32 * (0.05 * 4e-6 + FLOAT32_TINY * 3)
    assert (checks["a"].spread, checks["a"].sensitivity) == (4e-6, 1e-6)
    smaller = float32_checks(ours, golden, sensitivity, {"a": 1e-7, "b": 0.0})
    without = float32_checks(ours, golden, sensitivity)
    assert [c.bound for c in smaller.values()] == [c.bound for c in without.values()]
    assert [c.spread for c in without.values()] == [0.0, 0.0]  # not measured


def test_float32_bound_allows_a_results_own_rounding_where_no_input_moves_it():
    """A float32 result is rounded as it is stored: where no input moves it (GELU's output at
    its minimum) and the case's other sensitivities are tiny, the bound is still 32 u of
    its norm, so a value a few u off passes and one 40 u off does not."""
    y = -0.17
    golden = {"y": np.array([y]), "dx": np.array([1e-3])}
    sensitivity = {"y": 0.0, "dx": 1e-12}

    def off_by(units):
        ours = {"y": np.array([y * (1 + units * U)]), "dx": np.array([1e-3], np.float32)}
        return float32_checks(ours, golden, sensitivity)["y"]

    assert off_by(2).bound == 32 * (U * abs(y) + FLOAT32_TINY)
    assert off_by(2).ok and off_by(2).ratio < 0.07
    assert not off_by(40).ok


def test_a_nan_error_is_the_worst_ratio_and_fails_its_check():
    """A float32 result with a NaN in it fails its check, and its ratio is inf, so that the
    worst ratio over many tensors or draws (Python's max keeps the first of two values that
    do not compare) cannot pass it over."""
    golden = {"a": np.ones(3), "b": np.ones(3)}
    ours = {"a": np.ones(3, np.float32), "b": np.array([1.0, np.nan, 1.0], np.float32)}
    checks = float32_checks(ours, golden, {"a": 1e-6, "b": 1e-6})
    assert checks["a"].ratio == 0.0 and checks["a"].ok
    off = float32_checks({"a": np.float32([1, 1, 1.01])}, {"a": golden["a"]}, {"a": 1e-3})["a"]
    assert off.ratio == off.error / off.bound and 0.31 < off.ratio < 0.32 and off.ok  # bound 0.032
    assert checks["b"].ratio == np.inf and not checks["b"].ok
    assert max(check.ratio for check in checks.values()) == np.inf
    assert max(check.error / check.bound for check in checks.values()) == 0.0  # what it fixes
    nothing = float32_checks({"c": np.ones(1, np.float32)}, {"c": np.ones(1)}, {"c": 0.0})["c"]
    assert nothing._replace(bound=0.0).ratio == 0.0  # an exact result under a zero bound
    assert nothing._replace(bound=0.0, error=1e-9).ratio == np.inf


def test_the_worst_error_table_keeps_a_nan_as_inf():
    """The table printed after a run (helpers.record): a NaN, after a number or before one,
    stays the worst as inf."""
    from parity_tests.helpers import keep_worst

    worst: dict[str, float] = {}
    for error in (1e-12, float("nan"), 1e-9):
        keep_worst(worst, "check", error)
    assert worst == {"check": np.inf}
    keep_worst(worst, "other", 1e-12)
    keep_worst(worst, "other", 1e-14)
    assert worst["other"] == 1e-12


def test_sensitivity_of_few_entries_moves_each_in_turn():
    """y = 3 x: moving each x_i by u x_i moves y by 3 u x_i; in quadrature, 3 u ||x||.
    z = x_0 x_1: each of the two moves z by u |x_0 x_1|, so sqrt(2) u |x_0 x_1|."""
    x = np.array([0.5, -2.0, 4.0])

    def run(inputs):
        x = inputs["x"]
        return {"y": 3 * x, "z": x[0] * x[1]}

    s = sensitivities(run, {"x": x}, np.random.default_rng(0))
    assert abs(s["y"] - 3 * U * np.linalg.norm(x)) <= 1e-6 * s["y"]
    assert abs(s["z"] - np.sqrt(2) * U * 1.0) <= 1e-6 * s["z"]


def test_sensitivity_of_many_entries_is_at_least_all_moved_up_together():
    """Over 16 entries: u x all at once (exact here, where y is linear in x), or the RMS of
    random moves, whichever is larger; inputs and groups add in quadrature."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(40), rng.standard_normal(40)

    def run(inputs):
        return {"y": np.array([inputs["x"] @ inputs["w"]]), "x2": 2 * inputs["x"]}

    s = sensitivities(run, {"x": x, "w": w}, np.random.default_rng(0))
    assert abs(s["x2"] - 2 * U * np.linalg.norm(x)) <= 1e-6 * s["x2"]  # up: exact
    up = U * abs(x @ w)
    random_rms = U * np.sqrt(np.sum((x * w) ** 2))  # for each input alone
    assert np.sqrt(2) * max(up, 0.5 * random_rms) <= s["y"] <= 3 * np.sqrt(2) * random_rms
    together = sensitivities(run, {"x": x, "w": w}, np.random.default_rng(0), per_input=False)
    # w does not move x2: at least its exact "up", and the RMS of 16 random moves of x alone
    assert s["x2"] * (1 - 1e-6) <= together["x2"] <= 1.2 * s["x2"]


@pytest.mark.parametrize(
    ("size", "per_input", "calls"),
    [(16, True, 1 + 16), (17, True, 1 + 1 + 2), (16, False, 1 + 16), (17, False, 1 + 1 + 16)],
)
def test_up_to_16_entries_move_one_at_a_time_and_more_move_up_and_then_at_random(
    size, per_input, calls
):
    """A group of more than 16 entries moves up once, then at random: twice for one input's
    group, 16 times (JOINT_DRAWS) where every input moves at once."""
    counted = []

    def run(inputs):
        counted.append(1)
        return {"y": 2 * inputs["x"]}

    sensitivities(run, {"x": np.ones(size)}, np.random.default_rng(0), per_input)
    assert len(counted) == calls


@pytest.mark.parametrize(("per_input", "calls"), [(True, 1 + 2 * (1 + 2)), (False, 1 + 1 + 16)])
def test_inputs_move_one_group_each_or_all_in_one_group(per_input, calls):
    """Two inputs of 17 entries: a group each (up, then twice at random, for each), or one
    group of all 34 (up, then 16 times at random)."""
    counted = []

    def run(inputs):
        counted.append(1)
        return {"y": inputs["x"] + inputs["w"]}

    inputs = {"x": np.ones(17), "w": np.ones(17)}
    sensitivities(run, inputs, np.random.default_rng(0), per_input)
    assert len(counted) == calls
