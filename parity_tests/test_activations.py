"""The activations (activations.py): ReLU and GELU against finite differences and PyTorch,
GELU by both of its forms of exp(-2u), deep in its tails, in row blocks, without its
derivative, and each written into its own input, into strided arrays, and back.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_engine import activations as Act
from parity_tests import layer_cases as cases
from parity_tests.helpers import assert_all_close_float64, check_layer
from parity_tests.strategies import activations, seeds

small = st.integers(1, 4)


def rng_of(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# GELU's e = exp(-2u) by exp2 (AVX-512 machines) or exp (the rest): each machine runs one
# (activations.GELU_EXP), and these tests run both, wherever they run
EXP_FORMS = {"exp2": Act.exp_form(np.exp2), "exp": Act.exp_form(np.exp)}


@contextlib.contextmanager
def gelu_exp(name: str):
    """GELU computed with EXP_FORMS[name] inside the block (usable inside @given tests)."""
    chosen, Act.GELU_EXP = Act.GELU_EXP, EXP_FORMS[name]
    try:
        yield
    finally:
        Act.GELU_EXP = chosen


@pytest.mark.parametrize("exp", EXP_FORMS)
@given(kind=activations, B=small, T=small, C=small, mean=st.sampled_from([0.0, -6.0]), seed=seeds)
@example(kind="gelu", B=2, T=2, C=3, mean=-6.0, seed=0)  # 1 + tanh(u) would be rounding noise
def test_activation(exp, kind, B, T, C, mean, seed):
    rng = rng_of(seed)
    with gelu_exp(exp):
        check_layer(cases.activation(rng, kind, B, T, C, mean), rng)


@pytest.mark.parametrize("exp", EXP_FORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelus_exponent_is_capped_where_e_reaches_two_to_the_maxexp_less_two(exp, dtype):
    """The largest exponent of the dtype whose exp (or exp2) is at most 2^(maxexp - 2): e
    stays finite, and s = 1 / (1 + e) at the cap is still a normal number. exp's 126 ln 2
    rounds up in float32, where s would be subnormal: the cap is one step below it."""
    form, limit = EXP_FORMS[exp], dtype(2.0) ** (np.finfo(dtype).maxexp - 2)
    cap = form.cap[np.dtype(dtype)]
    assert cap.dtype == dtype and form.exp(cap) <= limit < form.exp(np.nextafter(cap, dtype(1e9)))
    assert 1 / (1 + form.exp(cap)) >= np.finfo(dtype).tiny
    if exp == "exp2":
        assert cap == np.finfo(dtype).maxexp - 2  # 126 and 1022: e reaches 2^cap exactly


def test_blocked_gelu_is_bit_identical_to_the_whole_array(monkeypatch):
    """GELU's chains run in row blocks of blocking.BLOCK_BYTES: forced here onto blocks of 3
    rows of an array of 10 (a short last block), the same bits as whole."""
    from numpy_engine import blocking

    rng = rng_of(0)
    x = (3 * rng.standard_normal((2, 5, 7))).astype(np.float32)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    whole, cache = Act.gelu_forward(x)
    whole_dx = Act.gelu_backward(dout, cache)
    monkeypatch.setattr(blocking, "BLOCK_BYTES", 3 * 7 * 4)
    blocked, cache = Act.gelu_forward(x)
    assert np.array_equal(blocked, whole)
    assert np.array_equal(Act.gelu_backward(dout, cache), whole_dx)


@pytest.mark.parametrize("for_backward", [True, False])
@pytest.mark.parametrize("kind", ["relu", "gelu"])
def test_activation_forward_into_its_own_input_is_the_fresh_result(kind, for_backward):
    """ffn_forward writes the activation over fc1's fresh output (act_forward(h, out=h)): the
    same bits and the same backward as into a fresh array, in h itself."""
    act_forward, act_backward = Act.ACTIVATIONS[kind]
    rng = rng_of(1)
    x = np.concatenate([[0.0, -0.0, -40.0, 40.0], 3 * rng.standard_normal(40)]).astype(np.float32)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    fresh, fresh_cache = act_forward(x, for_backward)
    into = x.copy()
    out, cache = act_forward(into, for_backward, out=into)
    assert out is into
    assert np.array_equal(out, fresh)
    if for_backward or kind == "relu":
        assert np.array_equal(act_backward(dout, cache), act_backward(dout, fresh_cache))


@pytest.mark.parametrize("strided", ["x", "out"])
@pytest.mark.parametrize("for_backward", [True, False])
@pytest.mark.parametrize("kind", ["relu", "gelu"])
def test_activation_of_strided_arrays_is_the_contiguous_result(kind, for_backward, strided):
    """An x or an out whose rows are not views of it (a transposed array: GELU's row blocks
    would read or write copies) gets the same bits, and the same backward, as contiguous
    arrays: GELU writes into arrays of its own then."""
    act_forward, act_backward = Act.ACTIVATIONS[kind]
    rng = rng_of(2)
    x, dout = (3 * rng.standard_normal((2, 3, 6))).astype(np.float32), rng.standard_normal(6)
    fresh, fresh_cache = act_forward(x, for_backward)
    transposed = np.zeros((3, 2, 6), np.float32).transpose(1, 0, 2)  # (2, 3, 6), strided
    if strided == "x":
        transposed[...] = x
        out, cache = act_forward(transposed, for_backward)
    else:
        out, cache = act_forward(x, for_backward, out=transposed)
    assert np.array_equal(out, fresh)
    if for_backward or kind == "relu":
        assert np.array_equal(act_backward(dout, cache), act_backward(dout, fresh_cache))


@pytest.mark.parametrize("kind", ["relu", "gelu"])
def test_activation_backward_into_its_own_dout_is_the_fresh_result(kind):
    """ffn_backward writes dh over da (act_backward(da, cache, out=da)): the same bits as a
    fresh dh, in da itself; the cache is left as it was, for another backward."""
    act_forward, act_backward = Act.ACTIVATIONS[kind]
    rng = rng_of(0)
    x = np.concatenate([[0.0, -0.0], 3 * rng.standard_normal(40)]).astype(np.float32)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    _, cache = act_forward(x)
    kept = cache.copy()
    fresh = act_backward(dout, cache)
    into = dout.copy()
    assert act_backward(into, cache, out=into) is into
    assert np.array_equal(into, fresh)
    assert np.array_equal(cache, kept)


@pytest.mark.parametrize("exp", EXP_FORMS)
@pytest.mark.parametrize(("dtype", "tail"), [(np.float32, (9.0, 12.0)), (np.float64, (20.0, 23.0))])
def test_gelu_deep_in_its_tails_raises_no_floating_point_error(dtype, tail, exp):
    """Far in the tails e = exp(-2u) leaves the float range: it underflows in the upper tail
    and is capped in the lower (float32 x below ~-10.0, float64 ~-21.1). An earlier backward
    took 1 / e, which overflowed where e was below 1 / dtype's max (float32 x ~10.0-10.7,
    float64 ~21.1-21.5): under training's errstate (overflow and division by zero raise) it
    stopped `train char-lm --steps 2000` at step 1999 as a divergence. Both tails, through
    the cap, against torch's float64 GELU."""
    import torch

    x = np.concatenate([np.linspace(*tail, 3001), -np.linspace(*tail, 3001)]).astype(dtype)
    dout = rng_of(0).standard_normal(x.shape).astype(dtype)
    with np.errstate(over="raise", divide="raise"), gelu_exp(exp):
        out, cache = Act.gelu_forward(x)
        dx = Act.gelu_backward(dout, cache)
    x_ref = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    out_ref = torch.nn.functional.gelu(x_ref, approximate="tanh")
    out_ref.backward(torch.tensor(dout, dtype=torch.float64))
    ours, ref = {"out": out, "dx": dx}, {"out": out_ref.detach().numpy(), "dx": x_ref.grad.numpy()}
    if dtype == np.float64:
        assert_all_close_float64("gelu tails", ours, ref)
    for key, value in ours.items():  # float32: its rounding, ~1e-7 (seen 1.0e-7 and 1.5e-8)
        error = np.linalg.norm(value - ref[key]) / np.linalg.norm(ref[key])
        assert error <= 1e-6, f"{key}: {error:.2e}"


@pytest.mark.parametrize("exp", EXP_FORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_without_its_derivative_is_the_same_output(dtype, exp):
    """for_backward=False (decoding) leaves out the derivative the backward would read: no
    cache, and the output within two roundings (x / (1 + e) against x (1 / (1 + e))), tails
    included; where e is capped at a power of two (exp2's 2^cap), both are x 2^-cap exactly."""
    x = np.concatenate([np.linspace(-25, 25, 2002), [-1e3, 1e3]]).astype(dtype).reshape(3, -1)
    with gelu_exp(exp):
        out, slope = Act.gelu_forward(x)
        forward_only, cache = Act.gelu_forward(x, for_backward=False)
    assert cache is None and slope.shape == x.shape
    np.testing.assert_allclose(forward_only, out, rtol=2 * np.finfo(dtype).eps, atol=0)
    capped = x < -22  # past float32 x ~ -10.0 and float64 ~ -21.1
    assert capped.sum() > 10
    if exp == "exp2":
        assert np.array_equal(forward_only[capped], out[capped])
