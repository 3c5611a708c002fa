"""Optimizers with PyTorch's exact update rules, and global-norm gradient clipping.

Both work on flat vectors: a model keeps all its parameters in one vector, model.flat,
with model.params its named views, and model.flat_grads(grads) lays the gradients out the
same way. A step is then a handful of whole-vector operations, whatever the number of
tensors:

    optimizer = AdamW(model.params, lr=3e-3)    # the params fix the state's layout and names
    loss, grads = model.loss_and_grads(*batch)
    flat_grads = model.flat_grads(grads)
    clip_grad_norm(flat_grads, max_norm=1.0)    # scales flat_grads in place
    optimizer.step(model.flat, flat_grads)      # updates model.flat, so model.params, in place

The state (step count, moments) is saved per parameter by `state_dict()` and restored by
`load_state_dict()`, keyed "<moment>.<param key>".
"""

from __future__ import annotations

import math

import numpy as np

from numpy_engine.blocking import slices
from numpy_engine.checks import InputError, InputTypeError
from numpy_engine.params import unflatten

BLOCK_BYTES = 1 << 20  # of each vector updated together (256K float32 entries)


def blocks(flat: np.ndarray) -> list[slice]:
    """Slices of flat, BLOCK_BYTES each. An update made of several whole-vector operations,
    run block by block, reads each array from memory once instead of once per operation:
    on a 124M-parameter model that is most of the optimizer's time. Measured there (float32,
    an AdamW step with clipping, one thread, sizes alternating in one process, median of 6):
    whole vectors 908 ms; blocks of 256 KB 304-306 ms, 512 KB 292, 1 MB 282-283, 2 MB 284,
    4 MB 325. Fewer blocks are fewer calls; past 2 MB the blocks' arrays leave the caches."""
    return slices(flat.size, flat.itemsize, BLOCK_BYTES)


def clip_grad_norm(flat_grads: np.ndarray, max_norm: float) -> float:
    """Scale the gradient vector in place so its L2 norm is at most max_norm; returns the
    norm before clipping.

    As torch.nn.utils.clip_grad_norm_ over all parameters: coef = max_norm / (norm + 1e-6),
    applied only when below 1.
    """
    norm = global_norm(flat_grads)
    coef = clip_coefficient(norm, max_norm)
    if coef is not None:
        flat_grads *= flat_grads.dtype.type(coef)
    return norm


def global_norm(flat: np.ndarray) -> float:
    """The L2 norm, its squares summed in float64 (block by block: no float64 copy of the
    whole vector; a float32 sum loses digits over many entries and overflows past 1.8e19)."""
    squares = 0.0
    for block in blocks(flat):
        part = flat[block].astype(np.float64)
        squares += float(np.dot(part, part))
    return math.sqrt(squares)


def clip_coefficient(norm: float, max_norm: float):
    """torch's max_norm / (norm + 1e-6) as a float32 or float64 scalar to multiply the
    gradients by, or None when it is not below 1 (no clipping)."""
    coef = max_norm / (norm + 1e-6)
    return coef if coef < 1.0 else None


class Optimizer:
    """What SGD, Adam and AdamW share: the step counter, the flat state, its named views."""

    state_names: tuple[str, ...] = ()

    def __init__(self, params: dict[str, np.ndarray], lr: float) -> None:
        if not lr > 0:
            raise InputError(f"lr must be positive, got {lr}")
        self.lr = lr
        self.step_count = 0
        self.size = sum(p.size for p in params.values())
        self.dtype = next(iter(params.values())).dtype
        self.flat_state = {name: np.zeros(self.size, self.dtype) for name in self.state_names}
        self.state = {name: unflatten(flat, params) for name, flat in self.flat_state.items()}

    def step(
        self, flat_params: np.ndarray, flat_grads: np.ndarray, max_grad_norm: float | None = None
    ) -> float | None:
        """Update flat_params in place from flat_grads. With max_grad_norm, first clip
        flat_grads (in place) as clip_grad_norm does and return their norm before clipping."""
        for name, flat in (("flat_params", flat_params), ("flat_grads", flat_grads)):
            if not isinstance(flat, np.ndarray) or flat.shape != (self.size,):
                got = getattr(flat, "shape", type(flat).__name__)
                raise InputError(f"{name} must be a vector of {self.size} entries, got {got}")
            if flat.dtype != self.dtype:
                raise InputTypeError(f"{name} must have dtype {self.dtype}, got {flat.dtype}")
        self.step_count += 1
        norm = coef = None
        if max_grad_norm is not None:
            norm = global_norm(flat_grads)
            coef = clip_coefficient(norm, max_grad_norm)
        self._update(flat_params, flat_grads, coef)
        return norm

    def _update(self, param: np.ndarray, grad: np.ndarray, coef: float | None) -> None:
        """Update param in place from grad, clipped first (in place) by coef unless None."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        """{"step": int array, "<state>.<param key>": array}, flat, for an .npz checkpoint."""
        flat = {"step": np.array(self.step_count)}
        for name, per_param in self.state.items():
            flat.update({f"{name}.{key}": value.copy() for key, value in per_param.items()})
        return flat

    def load_state_dict(self, flat: dict[str, np.ndarray]) -> None:
        expected = self.state_dict()
        missing, extra = expected.keys() - flat.keys(), flat.keys() - expected.keys()
        if missing or extra:
            raise InputError(
                f"optimizer state: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}"
            )
        for name, per_param in self.state.items():
            for key, value in per_param.items():
                saved = flat[f"{name}.{key}"]
                if saved.shape != value.shape:
                    raise InputError(
                        f"optimizer state {name}.{key} has shape {saved.shape}, "
                        f"expected {value.shape}"
                    )
                value[...] = saved  # into the flat state's view
        self.step_count = int(flat["step"])


class SGD(Optimizer):
    """p -= lr * d, d = g + wd p, with momentum buffer b = mu b + d (b = d on the first step)."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay

    def _update(self, param, grad, coef):
        if coef is not None:
            grad *= grad.dtype.type(coef)
        d = grad + self.weight_decay * param if self.weight_decay else grad
        if self.momentum:
            buf = self.flat_state["momentum_buffer"]
            if self.step_count == 1:
                buf[...] = d
            else:
                buf *= self.momentum
                buf += d
            d = buf
        param -= self.lr * d


class Adam(Optimizer):
    """PyTorch's Adam: bias correction by step count, eps outside the square root.

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    (computed block by block, each block while it is in cache; see _update_block)
    weight_decay here is L2 (added to g), as torch.optim.Adam; AdamW decouples it.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def _update(self, param, grad, coef):
        m, v = self.flat_state["exp_avg"], self.flat_state["exp_avg_sq"]
        pieces = blocks(param)
        scratch = np.empty((2, pieces[0].stop), param.dtype)  # the first (largest) block's
        coef = None if coef is None else grad.dtype.type(coef)
        # p -= lr / c1 * m / (sqrt(v) / c2 + eps), c1 = 1 - b1^t, c2 = sqrt(1 - b2^t), as
        # p -= (lr c2 / c1) * m / (sqrt(v) + eps c2): the same value, one pass fewer
        beta1, beta2 = self.betas
        c2 = math.sqrt(1 - beta2**self.step_count)
        step = (self.lr * c2 / (1 - beta1**self.step_count), self.eps * c2)
        for block in pieces:
            n = block.stop - block.start
            if coef is not None:
                grad[block] *= coef  # clipping, while the block is in cache
            self._update_block(param[block], grad[block], m[block], v[block], scratch[:, :n], step)

    def _update_block(self, param, grad, m, v, scratch, step) -> None:
        """The update on one block, in place, in torch's order of operations; step is
        (step size, eps) with the bias corrections folded in (see _update)."""
        beta1, beta2 = self.betas
        step_size, eps = step
        tmp, decayed = scratch
        if self.weight_decay:  # L2: grad + weight_decay * param
            np.multiply(param, self.weight_decay, out=decayed)
            grad = np.add(grad, decayed, out=decayed)
        np.subtract(grad, m, out=tmp)  # torch's lerp: m + (1 - b1)(g - m) = b1 m + (1 - b1) g
        tmp *= 1 - beta1
        m += tmp
        np.multiply(grad, 1 - beta2, out=tmp)  # v = b2 v + (1 - b2) g^2
        tmp *= grad
        v *= beta2
        v += tmp
        np.sqrt(v, out=tmp)
        tmp += eps  # Python floats keep float32 float32
        np.divide(m, tmp, out=tmp)
        tmp *= step_size
        param -= tmp


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * wd before the Adam step."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, lr, betas, eps, weight_decay=0.0)
        self.decoupled_weight_decay = weight_decay

    def _update_block(self, param, grad, m, v, scratch, step) -> None:
        param *= 1 - self.lr * self.decoupled_weight_decay
        super()._update_block(param, grad, m, v, scratch, step)
