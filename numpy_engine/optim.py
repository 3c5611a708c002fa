"""Optimizers with PyTorch's exact update rules, and global-norm gradient clipping.

An optimizer updates a params dict in place from a grads dict with the same keys.
Its state (step count, moments) is a flat dict of arrays: inspectable, and saved
with the checkpoint by `state_dict()` / restored by `load_state_dict()`.
"""

from __future__ import annotations

import math

import numpy as np

from numpy_engine.checks import InputError


def flatten(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """All arrays, raveled and concatenated in key order: one call instead of one per tensor."""
    return np.concatenate(list(arrays.values()), axis=None)  # axis=None ravels each


def unflatten(flat: np.ndarray, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Views into flat shaped like each array of `like`, in key order."""
    out, offset = {}, 0
    for key, a in like.items():
        out[key] = flat[offset : offset + a.size].reshape(a.shape)
        offset += a.size
    return out


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float) -> tuple[dict, float]:
    """Scale all gradients together so their global L2 norm is at most max_norm.

    As torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied only
    when below 1. Returns (clipped grads, the total norm before clipping); the input
    is not modified. The norm is summed in float64 over one flat copy of all gradients.
    """
    flat = flatten(grads)
    total_norm, clipped = clip_flat(flat, max_norm)
    return (unflatten(flat, grads) if clipped else dict(grads)), total_norm


def clip_flat(flat: np.ndarray, max_norm: float) -> tuple[float, bool]:
    """clip_grad_norm on one flat gradient vector, scaled in place: (norm before, clipped?)."""
    flat64 = flat if flat.dtype == np.float64 else flat.astype(np.float64)
    total_norm = math.sqrt(float(np.dot(flat64, flat64)))
    coef = max_norm / (total_norm + 1e-6)
    if coef >= 1.0:
        return total_norm, False
    flat *= flat.dtype.type(coef)
    return total_norm, True


class Optimizer:
    """What SGD, Adam and AdamW share: the step counter, state, and one flat update per step.

    Every step concatenates the gradients into one vector and updates all parameters
    with a handful of whole-vector operations. When the params are views into one flat
    buffer (as the engine's models allocate them), that buffer is updated in place;
    otherwise the update is written back tensor by tensor.
    """

    state_names: tuple[str, ...] = ()

    def __init__(self, params: dict[str, np.ndarray], lr: float) -> None:
        if not lr > 0:
            raise InputError(f"lr must be positive, got {lr}")
        self.lr = lr
        self.step_count = 0
        self.keys = list(params)
        total = sum(p.size for p in params.values())
        dtype = next(iter(params.values())).dtype
        self.flat_state = {name: np.zeros(total, dtype=dtype) for name in self.state_names}
        self.state = {name: unflatten(flat, params) for name, flat in self.flat_state.items()}
        self._views = dict(params)  # the arrays seen at construction
        self._buffer = _shared_buffer(params)

    def step(
        self,
        params: dict[str, np.ndarray],
        grads: dict[str, np.ndarray],
        max_grad_norm: float | None = None,
    ) -> float | None:
        """Update params in place from grads. With max_grad_norm, first clip the gradients as
        clip_grad_norm does (on the flat copy this step makes anyway) and return their norm
        before clipping; grads itself is never modified."""
        if list(grads) != self.keys or list(params) != self.keys:
            raise InputError("params and grads must have exactly the optimizer's keys, in order")
        self.step_count += 1
        in_place = self._buffer is not None and all(params[k] is self._views[k] for k in self.keys)
        flat_params = self._buffer if in_place else flatten(params)
        flat_grads = flatten(grads)
        norm = None if max_grad_norm is None else clip_flat(flat_grads, max_grad_norm)[0]
        self._update(flat_params, flat_grads)
        if not in_place:
            for key, value in unflatten(flat_params, params).items():
                params[key][...] = value
        return norm

    def _update(self, param: np.ndarray, grad: np.ndarray) -> None:
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


def _shared_buffer(params: dict[str, np.ndarray]) -> np.ndarray | None:
    """The flat array that all params are consecutive views of, in key order, if there is one."""
    first = next(iter(params.values()))
    base = first.base
    if base is None or base.ndim != 1 or base.size != sum(p.size for p in params.values()):
        return None
    offset = 0
    for p in params.values():
        if p.base is not base or not p.flags.c_contiguous:
            return None
        start = p.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        if start != offset * base.itemsize:
            return None
        offset += p.size
    return base


class SGD(Optimizer):
    """p -= lr * d, d = g + wd p, with momentum buffer b = mu b + d (b = d on the first step)."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay

    def _update(self, param, grad):
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

    def _update(self, param, grad):
        beta1, beta2 = self.betas
        if self.weight_decay:
            grad = grad + self.weight_decay * param
        m, v = self.flat_state["exp_avg"], self.flat_state["exp_avg_sq"]
        m += (1 - beta1) * (grad - m)  # torch's lerp: m + (1 - b1)(g - m) = b1 m + (1 - b1) g
        v *= beta2
        v += (1 - beta2) * grad * grad
        step_size = self.lr / (1 - beta1**self.step_count)
        denom = np.sqrt(v)
        denom /= math.sqrt(1 - beta2**self.step_count)  # Python floats keep float32 float32
        denom += self.eps
        param -= step_size * (m / denom)


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

    def _update(self, param, grad):
        param *= 1 - self.lr * self.decoupled_weight_decay
        super()._update(param, grad)
