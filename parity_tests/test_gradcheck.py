"""The finite-difference witness itself (numpy_engine/gradcheck.py), on functions whose
derivatives are known exactly: a checker that passed a wrong gradient, or failed a right
one, would make every test built on it say nothing."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from numpy_engine.checks import InputError, InputTypeError
from numpy_engine.gradcheck import (
    PLAIN_SHARE,
    check_directions,
    check_gradient,
    directional_derivative,
    noise_floor,
    numerical_gradient,
    relative_error,
    rounding_noise,
    sample_indices,
)
from parity_tests import helpers
from parity_tests import layer_cases as cases
from parity_tests.helpers import assert_matches_finite_differences

EPS = np.finfo(np.float64).eps


def cubic(x: np.ndarray):
    """sum(x^3): its central difference is off by exactly h^2 an entry, which one
    Richardson step cancels."""
    return lambda: float(np.sum(x**3))


def relu_sum(x: np.ndarray):
    """sum(relu(x)), naming its smooth piece by the signs of x."""
    return lambda: (float(np.sum(np.maximum(x, 0.0))), (x > 0).tobytes())


def test_richardson_cancels_the_h_squared_term():
    x = np.array([0.5, -1.25, 2.0])
    numeric = numerical_gradient(cubic(x), x, h=1e-2)
    assert np.abs(numeric - 3 * x**2).max() <= 1e-10  # a plain central difference: 1e-4


def test_every_entry_by_default_or_the_indices_given():
    x = np.array([[0.5, -1.25], [2.0, 0.75]])
    assert np.abs(numerical_gradient(cubic(x), x) - (3 * x**2).ravel()).max() <= 1e-8
    some = numerical_gradient(cubic(x), x, np.array([3, 1]))
    assert np.abs(some - 3 * x.ravel()[[3, 1]] ** 2).max() <= 1e-8


@pytest.mark.parametrize("direction", [2, "array"])
def test_x_is_restored_bit_for_bit(direction):
    x = np.random.default_rng(0).standard_normal(5)
    before = x.copy()
    d = np.random.default_rng(1).standard_normal(5) if direction == "array" else direction
    derivative = directional_derivative(cubic(x), x, d)
    expected = 3 * x[2] ** 2 if direction == 2 else float(np.dot(3 * x**2, d))
    assert abs(derivative - expected) <= 1e-8 * max(1.0, abs(expected))
    assert np.array_equal(x, before)
    numerical_gradient(cubic(x), x)
    check_directions(cubic(x), x, 3 * x**2, [0, d])
    assert np.array_equal(x, before)


def test_a_step_across_a_kink_shrinks_until_it_stays_on_one_side():
    """relu'(x) at x = 3e-6: steps of 1e-5 (and its half) cross 0 and would measure the
    kink's jump; 1e-6 stays on the positive side."""
    x = np.array([3e-6, -0.5, 0.3])
    assert np.abs(numerical_gradient(relu_sum(x), x) - [1.0, 0.0, 1.0]).max() <= 1e-9
    assert abs(directional_derivative(relu_sum(x), x, 0, smallest_h=1e-6) - 1.0) <= 1e-9
    assert directional_derivative(relu_sum(x), x, 0, smallest_h=2e-6) is None
    at_the_bound = directional_derivative(relu_sum(x), x, 0, h=1e-6, smallest_h=1e-6)
    assert abs(at_the_bound - 1.0) <= 1e-9  # a step of smallest_h itself is tried
    near = np.array([1.5e-8])  # by default the steps go 1e-5, 1e-6, ... down to 1e-8
    assert abs(numerical_gradient(relu_sum(near), near)[0] - 1.0) <= 1e-6
    assert abs(directional_derivative(relu_sum(near), near, 0) - 1.0) <= 1e-6
    nearer = near / 2
    assert np.isnan(numerical_gradient(relu_sum(nearer), nearer)[0])  # 1e-8 crosses it


def test_an_entry_on_the_kink_itself_is_nan_and_not_judged():
    x = np.array([0.0, 0.3])
    assert np.isnan(numerical_gradient(relu_sum(x), x)[0])
    check = check_directions(relu_sum(x), x, np.array([5.0, 1.0]), [0, 1])
    assert check.error <= 1e-10 and np.isnan(check.numeric[0])  # entry 0 is left out
    none_judged = check_directions(relu_sum(x), x, np.array([5.0, 1.0]), [0])
    assert np.isnan(none_judged.error) and np.isnan(none_judged.numeric).all()


@pytest.mark.parametrize("check", ["numerical_gradient", "check_directions"])
def test_x_must_be_float64_and_contiguous(check):
    def run(x):
        if check == "numerical_gradient":
            return numerical_gradient(cubic(x), x)
        return check_directions(cubic(x), x, 3 * x**2, [0])

    with pytest.raises(InputTypeError, match="x must be float64 for finite differences, got"):
        run(np.ones(3, np.float32))
    with pytest.raises(InputError, match="x must be contiguous so that it can be nudged"):
        run(np.ones((3, 4))[:, :2])  # rows apart: reshape(-1) copies


def test_relative_error_is_normwise_with_a_floor():
    analytic, numeric = np.array([0.3, 0.4]), np.array([0.3, 0.45])
    expected = np.linalg.norm(analytic - numeric) / np.hypot(0.3, 0.45)  # below 1: no floor
    assert abs(relative_error(analytic, numeric) - expected) <= 1e-15
    assert relative_error(np.array([3.0, 4.0]), np.array([0.0, 4.0]), floor=6.0) == 0.5
    assert relative_error(np.zeros(2), np.zeros(2)) == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_gradient_that_is_not_finite_fails_the_finite_difference_check(bad):
    """A NaN or inf entry, in the analytic gradient or the estimate, is an infinite error:
    a NaN gradient used to read 0, passing every check."""
    assert relative_error(np.array([1.0, bad]), np.array([1.0, 2.0])) == np.inf
    assert relative_error(np.array([1.0, 2.0]), np.array([bad, 2.0])) == np.inf
    x = np.array([1.0, 2.0])
    check = check_directions(lambda: float(np.sum(x**2)), x, np.array([bad, 4.0]), [np.ones(2)])
    assert check.error == np.inf and not check.error < 1e-6


def test_rounding_noise_is_read_from_nine_values_delta_apart():
    """Alternating +-e on a smooth f: every third difference is 8e, so the estimate is
    sqrt(64 e^2 / 20), whatever f's slope and curvature. A flat f: eps * |f|, its floor."""
    x, seen = np.array([1.5, -0.5]), []

    def alternating():
        steps = (x[0] - 1.5) / 1e-6
        seen.append(steps)
        return float(np.sum(x**3) + 5 * x[0] + 1e-9 * (-1) ** round(steps))

    noise = rounding_noise(alternating, x, 0)
    assert np.abs(np.array(seen) - np.arange(-4, 5)).max() <= 1e-6
    assert abs(noise - 1e-9 * np.sqrt(64 / 20)) <= 1e-12
    assert rounding_noise(lambda: 3.25, x, 1) == EPS * 3.25
    x = np.array([1.0])  # f = x exactly, at steps of a power of two: no rounding at all
    assert rounding_noise(lambda: float(x[0]), x, 0, delta=2.0**-20) == EPS * 1.0  # |f(x)|
    assert noise_floor(2e-16, 4, 1e-5) == 3e7 * 2e-16 / 1e-5 * 2


def test_a_right_gradient_passes_and_a_wrong_one_fails():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(6)
    right, wrong = 3 * x**2, 3 * x**2 * (1 + 1e-3)
    directions = [rng.standard_normal(6), 4]
    assert check_directions(cubic(x), x, right, directions).error <= 1e-9
    assert check_directions(cubic(x), x, wrong, directions).error >= 5e-4
    assert check_gradient(cubic(x), x, right, np.array([1, 4])).error <= 1e-9
    assert check_gradient(cubic(x), x, wrong, np.array([1, 4])).error >= 5e-4
    tiny = lambda: 1e-9 * float(np.sum(x**3))  # noqa: E731  (its rounding is 1e-25, not eps)
    assert check_gradient(tiny, x, 3e-9 * x**2 * 1.001, np.array([1])).error >= 5e-4


def nudges_seen(f, x):
    """f, and the distinct distances from x at which it was evaluated (to 6 digits)."""
    start, seen = x.copy(), set()

    def recorded():
        seen.add(float(f"{np.abs(x - start).max():.6g}"))  # as x + h - x rounds
        return f()

    return recorded, seen


@pytest.mark.parametrize("checker", ["check_gradient", "check_directions"])
def test_the_default_steps_are_tried_in_turn_until_one_is_within_1e_6(checker):
    """Noise is measured 1e-6 apart; then the step 1e-5 plain, then 1e-5 and 1e-4 each with
    its half (Richardson): the plain 1e-5 is within a hundredth of 1e-6 of a gradient off by
    5e-9, and no step within 1e-6 of one off by 1.5e-6."""
    x = np.array([0.7, -0.2])
    noise_points = {0.0, 1e-6, 2e-6, 3e-6, 4e-6}
    for off_by, steps in [(5e-9, {1e-5}), (1.5e-6, {1e-5, 5e-6, 1e-4, 5e-5})]:
        f, seen = nudges_seen(cubic(x), x)
        analytic = 3 * x**2 * (1 + off_by)
        if checker == "check_gradient":
            check = check_gradient(f, x, analytic, np.array([0, 1]))
        else:
            check = check_directions(f, x, analytic, [0, 1])
        assert abs(check.error - off_by) <= 1e-9
        assert seen == noise_points | steps


def test_an_error_equal_to_the_tolerance_is_not_within_it():
    x = np.array([0.5])
    analytic = np.array([2.0 + 2.0**-10])
    error = relative_error(analytic, np.array([2.0]))  # f = 2x: every difference exactly 2
    f, seen = nudges_seen(lambda: float(2 * x[0]), x)
    check = check_directions(f, x, analytic, [0], error, steps=(2.0**-10, 2.0**-8), noise=0.0)
    assert check.error == error and 2.0**-8 in seen  # the second step was tried


def test_the_best_of_the_steps_is_kept_and_the_first_within_tolerance_ends_the_search():
    """A loss whose rounding swamps the small step: the larger step measures the gradient."""
    x = np.array([0.7, -0.2])
    rough = lambda: float(np.float32(np.sum(x**3) + 10.0) - np.float32(10.0))  # noqa: E731
    small = check_directions(rough, x, 3 * x**2, [0, 1], steps=(1e-5,), noise=1e-18)
    assert small.error >= 1e-2  # float32's resolution at 10, 1e-6, over 2e-5
    check = check_directions(rough, x, 3 * x**2, [0, 1], steps=(1e-5, 1e-2), noise=1e-18)
    assert check.error <= 1e-3 and np.abs(check.numeric - 3 * x**2).max() <= 1e-3
    calls = []

    def counted():
        calls.append(1)
        return float(np.sum(x**3))

    check_directions(counted, x, 3 * x**2, [0], steps=(1e-5, 1e-4), noise=1e-16)
    assert len(calls) == 1 + 2  # f at x, then one step's plain central difference
    calls.clear()  # x's region given (region_at, once for many tensors): f at x is not asked
    check_directions(counted, x, 3 * x**2, [0], steps=(1e-5, 1e-4), noise=1e-16, region=None)
    assert len(calls) == 2


@pytest.mark.parametrize("h", [1e-2, 1e-3])
def test_the_richardson_step_follows_a_plain_difference_not_within_a_hundredth_of_tolerance(h):
    """On sum(x^3) the plain difference is off by h^2 an entry: at h = 1e-2, 7e-5 of the
    gradient at 0.7, over the tolerance; at 1e-3, 7e-7, within it but not within its
    hundredth (PLAIN_SHARE). Either way the extrapolated estimate, exact for a cubic, is
    taken."""
    x = np.array([0.7, -0.2])
    f, seen = nudges_seen(cubic(x), x)
    check = check_directions(f, x, 3 * x**2, [0, 1], steps=(h,), noise=1e-16)
    assert check.error <= 1e-12 and np.abs(check.numeric - 3 * x**2).max() <= 1e-12
    assert seen == {0.0, h, h / 2}  # x, the plain step, then the half step
    assert PLAIN_SHARE == 0.01


def test_f_terms_raise_the_noise_for_a_gradient_that_is_truly_zero():
    """f flat in x (a key bias): the difference is pure rounding. Judged against
    eps * f_terms, a zero analytic gradient passes; judged against nothing, it cannot."""
    x = np.array([0.25])
    flat = lambda: float(np.float64(1e8) + x[0] * 1e-30 - np.float64(1e8))  # noqa: E731
    assert check_directions(flat, x, np.zeros(1), [0], f_terms=1e8).error <= 1e-6
    tiny = check_directions(flat, x, np.array([1e-12]), [0], noise=0.0)
    assert tiny.error == 1.0  # the estimate is 0, the analytic value is not


def test_the_layer_witness_fails_a_gradient_wrong_in_one_entry_of_64(monkeypatch):
    """Each tensor is checked along random directions, so every entry weighs in: an error
    in one entry of a (8, 8) weight, which 12 sampled entries would miss 4 times in 5."""
    rng = np.random.default_rng(0)
    case = cases.linear(rng, 2, 3, 8, 8)

    def wrong_in_one_entry(dout, cache):
        grads = case.backward(dout, cache)
        grads["weight"][5, 3] *= 1.01
        return grads

    assert_matches_finite_differences(case.name, case.forward, case.backward, case.inputs, rng)
    monkeypatch.setattr(helpers, "record", lambda name, error: None)  # not a worst error
    with pytest.raises(AssertionError, match="dweight differs from finite differences"):
        assert_matches_finite_differences(
            case.name, case.forward, wrong_in_one_entry, case.inputs, rng
        )


def test_the_layer_witness_steps_around_relus_kink_only_with_the_region(monkeypatch):
    """An input 3e-7 from ReLU's kink: steps of 1e-5 and 1e-4 along a random direction cross
    it and measure the jump; the region (which inputs are positive) shrinks the step."""
    rng = np.random.default_rng(1)
    case = cases.activation(rng, "relu", 2, 3, 4)
    case.inputs["x"][0, 0, 0] = 3e-7
    args = (case.name, case.forward, case.backward, case.inputs)
    assert_matches_finite_differences(*args, rng, case.region)
    monkeypatch.setattr(helpers, "record", lambda name, error: None)
    with pytest.raises(AssertionError, match="dx differs from finite differences"):
        assert_matches_finite_differences(*args, rng)


def test_sample_indices_are_distinct_sorted_and_all_when_few():
    rng = np.random.default_rng(0)
    picked = sample_indices(rng, 100, 7)
    assert len(set(picked.tolist())) == 7 and np.all(np.diff(picked) > 0) and picked.max() < 100
    untouched = np.random.default_rng(5)
    assert sample_indices(untouched, 5, 5).tolist() == [0, 1, 2, 3, 4]  # without a draw
    assert untouched.integers(1 << 30) == np.random.default_rng(5).integers(1 << 30)
    assert sample_indices(rng, 3, 8).tolist() == [0, 1, 2]


def test_the_docs_section_on_the_witness_quotes_its_settings():
    """docs/gradients.md explains the witness with the numbers it runs with: the steps, the
    smallest step, the noise's points and spacing, the headroom, the tolerance and the
    directions a tensor; a change to one of them makes this fail until the page says it."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "gradients.md").read_text()
    start = text.index("## Finite differences: the torch-free witness")
    section = re.sub(r"\s+", " ", text[start : text.index("\n## ", start + 1)])
    defaults = {
        name: inspect.signature(f).parameters[arg].default
        for name, f, arg in [
            ("steps", check_directions, "steps"),
            ("smallest", directional_derivative, "smallest_h"),
            ("delta", rounding_noise, "delta"),
            ("headroom", noise_floor, "headroom"),
            ("tolerance", check_directions, "tolerance"),
        ]
    }
    assert defaults["steps"] == (1e-5, 1e-4)
    assert "tries `h = 1e-5`, then `1e-4`" in section
    assert defaults["smallest"] == 1e-8 and "down to `1e-8`" in section
    assert defaults["delta"] == 1e-6 and "at 9 points `1e-6` apart" in section
    assert defaults["headroom"] == 3e7 and "headroom of 3e7" in section
    assert defaults["tolerance"] == helpers.FD_TOLERANCE == 1e-6
    assert "(relative error below 1e-6)" in section
    assert helpers.DIRECTIONS_PER_TENSOR == 2 and "its own two directions" in section


def test_a_plain_difference_exactly_a_hundredth_of_the_tolerance_off_is_set_aside():
    """f = 2x: every difference is exactly 2, so the plain one is off by exactly the error of
    an analytic 2 + 2^-10; with that error a hundredth of the tolerance, the Richardson step
    (its half step seen) decides."""
    x = np.array([0.5])
    analytic = np.array([2.0 + 2.0**-10])
    error = relative_error(analytic, np.array([2.0]))
    tolerance = error / PLAIN_SHARE
    assert tolerance * PLAIN_SHARE == error
    f, seen = nudges_seen(lambda: float(2 * x[0]), x)
    check = check_directions(f, x, analytic, [0], tolerance, steps=(2.0**-10, 2.0**-8), noise=0.0)
    half, second = (float(f"{h:.6g}") for h in (2.0**-11, 2.0**-8))  # as nudges_seen reads them
    assert check.error == error and half in seen and second not in seen


def bumped(x: np.ndarray, bumps: dict[float, float]):
    """2 x[0], plus sign(d) bumps[|d|] where x[0] is d from where it started: a Richardson
    step whose half step lands on a bump is off by 8 bump / 3h, the plain one never."""
    start = x[0]

    def f():
        d = x[0] - start
        return float(2 * x[0] + np.sign(d) * bumps.get(float(f"{abs(d):.6g}"), 0.0))

    return f


@pytest.mark.parametrize(
    "bumps, expected",
    [
        ({5e-6: 7.5e-9}, 2e-7 / 2.0000002),  # the second step's estimate is right: taken
        ({5e-6: 7.5e-9, 5e-5: 7.5e-7}, 0.0019998 / 2.002),  # the second is worse: the first kept
    ],
)
def test_once_the_plain_difference_is_set_aside_the_best_richardson_estimate_decides(
    bumps, expected
):
    """The analytic gradient is 1e-7 off, as the plain difference (2) reads it: within the
    tolerance, not its hundredth. The first step's Richardson estimate reads 2.002, and the
    second's 2 (right) or 2.02."""
    x = np.array([0.5])
    check = check_directions(bumped(x, bumps), x, np.array([2.0 + 2e-7]), [0], noise=1e-16)
    assert abs(check.error - expected) <= 1e-3 * expected


def test_a_later_step_that_no_direction_can_take_leaves_the_judged_one():
    """Steps 1e-5 and 3e-5 where f's region changes at every distance but 1e-5 and 5e-6:
    the second step shrinks past the smallest step in every direction (NaN, not judged),
    and the first step's error, 0.002 / 2.002, is what the check returns."""
    x = np.array([0.5])
    start = x.copy()

    def f():
        distance = float(f"{np.abs(x - start).max():.6g}")
        return float(2 * x[0]), b"x" if distance in (0.0, 1e-5, 5e-6) else b"elsewhere"

    check = check_directions(f, x, np.array([2.002]), [0], steps=(1e-5, 3e-5), noise=1e-16)
    assert abs(check.error - 0.002 / 2.002) <= 1e-9
