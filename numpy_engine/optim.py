"""Optimizers with PyTorch's exact update rules, and global-norm gradient clipping.

An optimizer updates a params dict in place from a grads dict with the same keys.
Its state (step count, moments) is a flat dict of arrays: inspectable, and saved
with the checkpoint by `state_dict()` / restored by `load_state_dict()`.
"""

from __future__ import annotations

import math

import numpy as np


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float) -> tuple[dict, float]:
    """Scale all gradients together so their global L2 norm is at most max_norm.

    As torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied only
    when below 1. Returns (clipped grads, the total norm before clipping).
    """
    total_norm = math.sqrt(
        sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values())
    )
    coef = max_norm / (total_norm + 1e-6)
    if coef >= 1.0:
        return dict(grads), total_norm
    return {key: g * g.dtype.type(coef) for key, g in grads.items()}, total_norm


class Optimizer:
    """What SGD, Adam and AdamW share: the step counter, per-parameter state, checks."""

    state_names: tuple[str, ...] = ()

    def __init__(self, params: dict[str, np.ndarray], lr: float) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        self.lr = lr
        self.step_count = 0
        self.state = {
            name: {key: np.zeros_like(p) for key, p in params.items()} for name in self.state_names
        }

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        if grads.keys() != params.keys():
            raise ValueError("grads must have exactly the keys of params")
        self.step_count += 1
        for key, param in params.items():
            self._update(key, param, grads[key])

    def _update(self, key: str, param: np.ndarray, grad: np.ndarray) -> None:
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
            raise ValueError(
                f"optimizer state: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}"
            )
        for name, per_param in self.state.items():
            for key, value in per_param.items():
                saved = flat[f"{name}.{key}"]
                if saved.shape != value.shape:
                    raise ValueError(f"optimizer state {name}.{key} has shape {saved.shape}, "
                                     f"expected {value.shape}")  # fmt: skip
                per_param[key] = np.array(saved, dtype=value.dtype)
        self.step_count = int(flat["step"])


class SGD(Optimizer):
    """p -= lr * d, d = g + wd p, with momentum buffer b = mu b + d (b = d on the first step)."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay

    def _update(self, key, param, grad):
        d = grad + self.weight_decay * param if self.weight_decay else grad
        if self.momentum:
            buf = self.state["momentum_buffer"]
            buf[key] = d.copy() if self.step_count == 1 else self.momentum * buf[key] + d
            d = buf[key]
        param -= self.lr * d


class Adam(Optimizer):
    """PyTorch's Adam: bias correction by step count, eps outside the square root.

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    weight_decay here is L2 (added to g), as torch.optim.Adam; AdamW decouples it.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):  # fmt: skip
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def _update(self, key, param, grad):
        beta1, beta2 = self.betas
        if self.weight_decay:
            grad = grad + self.weight_decay * param
        m, v = self.state["exp_avg"][key], self.state["exp_avg_sq"][key]
        m += (1 - beta1) * (grad - m)  # torch's lerp: m + (1 - b1)(g - m) = b1 m + (1 - b1) g
        v *= beta2
        v += (1 - beta2) * grad * grad
        step_size = self.lr / (1 - beta1**self.step_count)
        denom = (
            np.sqrt(v) / math.sqrt(1 - beta2**self.step_count) + self.eps
        )  # Python floats keep float32
        param -= step_size * (m / denom)


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * wd before the Adam step."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):  # fmt: skip
        super().__init__(params, lr, betas, eps, weight_decay=0.0)
        self.decoupled_weight_decay = weight_decay

    def _update(self, key, param, grad):
        param *= 1 - self.lr * self.decoupled_weight_decay
        super()._update(key, param, grad)
