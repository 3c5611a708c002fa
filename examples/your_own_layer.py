"""Add a layer of your own: RMSNorm, its backward derived by hand and checked three ways.

Run: python examples/your_own_layer.py    (a second; the PyTorch check needs the test extra)

RMSNorm (LLaMA's norm) is layernorm without the mean: each row is divided by its root mean
square, then scaled. The engine has no RMSNorm; this script writes one the way every layer
in numpy_engine/layers.py (and activations.py) is written, a pure forward that returns
(out, cache) and a backward that returns (dx, {parameter gradients}), and checks the
backward as the test suite checks the engine's:

1. against central finite differences (numpy_engine.gradcheck) in float64, along random
   directions: one difference weighs every entry of a gradient at once;
2. against PyTorch autograd, every entry, in float64 (when torch is installed);
3. and it shows the finite-difference check catching a backward with one term left out.

The script exits 1 if a check does not come out as it should.
"""

import sys

import numpy as np

from numpy_engine.gradcheck import check_directions, relative_error

EPS = 1e-6


def rmsnorm_forward(x, weight):
    """out = x / rms(x) * weight over the last axis, rms(x) = sqrt(mean(x^2) + EPS).
    x (..., C), weight (C,)."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)  # (..., 1)
    xhat = x * r  # (..., C)
    return xhat * weight, (xhat, r, weight)


def rmsnorm_backward(dout, cache):
    """Per row, with m = mean(x^2) over the row's C entries, r = (m + EPS)^(-1/2),
    xhat = x r and out = xhat w:

    - w scaled xhat in every row, so its gradient sums over the rows: dw = sum dout * xhat.
    - g = dout * w is the gradient at xhat. xhat_j = x_j r depends on x_i directly (j = i)
      and through r: dr/dx_i = -1/2 (m + EPS)^(-3/2) * 2 x_i / C = -r^3 x_i / C, so
      d xhat_j / d x_i = r delta_ij - x_j r^3 x_i / C = r (delta_ij - xhat_j xhat_i / C).
    - Summed against g_j: dx_i = r (g_i - xhat_i mean(g * xhat)).

    Layernorm's dx (docs/gradients.md#layernorm) has one more term, -mean(g): the path
    through its mean, which RMSNorm does not subtract."""
    xhat, r, weight = cache
    g = dout * weight  # (..., C)
    dx = r * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, {"weight": weight_gradient(dout, xhat)}


def weight_gradient(dout, xhat):
    """forward was out = xhat * w, w shared by every row: dw = sum over the rows of dout * xhat."""
    return (dout * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)  # (C,)


def rmsnorm_backward_without_r_path(dout, cache):
    """A wrong backward, for part 3: it treats r as a constant (drops the path through r)."""
    xhat, r, weight = cache
    return r * dout * weight, {"weight": weight_gradient(dout, xhat)}


def finite_difference_errors(backward, x, weight, dout, rng):
    """The relative error of backward's dx and dweight along three random directions each,
    against central differences of L = sum(out * dout) (whose gradient at out is dout)."""

    def loss():  # reads x and weight as they are now: check_directions nudges them in place
        return float(np.sum(rmsnorm_forward(x, weight)[0] * dout))

    dx, grads = backward(dout, rmsnorm_forward(x, weight)[1])
    errors = {}
    for name, value, grad in (("x", x, dx), ("weight", weight, grads["weight"])):
        directions = [rng.standard_normal(value.shape) for _ in range(3)]
        errors[name] = check_directions(loss, value, grad, directions).error
    return errors


def torch_errors(x, weight, dout):
    """The relative error of out, dx and dweight against PyTorch autograd, or None."""
    try:
        import torch
    except ImportError:
        return None
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(weight, requires_grad=True)
    out_t = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + EPS) * wt
    out_t.backward(torch.tensor(dout))  # autograd's own backward of the same forward
    out, cache = rmsnorm_forward(x, weight)
    dx, grads = rmsnorm_backward(dout, cache)
    return {
        "out": relative_error(out, out_t.detach().numpy()),
        "x": relative_error(dx, xt.grad.numpy()),
        "weight": relative_error(grads["weight"], wt.grad.numpy()),
    }


def main() -> int:
    rng = np.random.default_rng(0)
    B, T, C = 2, 5, 8
    x = rng.standard_normal((B, T, C)) + 0.5  # float64: finite differences need its digits
    weight = 1.0 + 0.1 * rng.standard_normal(C)
    dout = rng.standard_normal((B, T, C))
    failed = False

    print("1. finite differences (relative error, a correct backward: below 1e-6)")
    for name, error in finite_difference_errors(rmsnorm_backward, x, weight, dout, rng).items():
        print(f"   d{name}: {error:.1e}")
        failed |= not error < 1e-6

    print("2. PyTorch autograd (relative error, every entry: below 1e-10)")
    errors = torch_errors(x, weight, dout)
    if errors is None:
        print("   torch is not installed: pip install -e '.[test]' for this check")
    for name, error in (errors or {}).items():
        print(f"   {name if name == 'out' else 'd' + name}: {error:.1e}")
        failed |= not error < 1e-10

    print("3. the same finite differences on a backward that drops the path through r")
    broken = finite_difference_errors(rmsnorm_backward_without_r_path, x, weight, dout, rng)
    print(f"   dx: {broken['x']:.1e}  (caught: far above 1e-6)")
    failed |= not broken["x"] > 1e-2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
